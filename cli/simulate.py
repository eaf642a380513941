"""`pagedkv simulate`: replay a trace through the paged or the contiguous KV allocator, in simulated time."""
import json

import click


def _sizes(text: str) -> list:
    try:
        sizes = sorted({int(s) for s in text.split(",") if s.strip()})
    except ValueError:
        raise click.BadParameter(f"expected comma-separated block sizes, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise click.BadParameter("block sizes must be integers >= 1")
    return sizes


@click.command()
@click.argument("trace_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--allocator", type=click.Choice(["contiguous", "paged", "both"]), default="both", show_default=True)
@click.option("--prefix-caching", is_flag=True, help="Share cached full blocks between equal prompt prefixes (paged).")
@click.option("--block-size", type=int, default=16, show_default=True)
@click.option("--pool-blocks", type=int, help="Paged pool size in blocks (the contiguous pool gets the same bytes).")
@click.option("--pool-gib", type=float, help="Pool size in GiB of KV, with the model shape below.")
@click.option("--layers", type=int, default=32, show_default=True)
@click.option("--kv-heads", type=int, default=8, show_default=True)
@click.option("--head-dim", type=int, default=128, show_default=True)
@click.option("--dtype", type=click.Choice(["fp32", "bf16", "fp16", "fp8"]), default="bf16", show_default=True)
@click.option("--max-seq-len", type=int, default=2048, show_default=True,
              help="Longest sequence; what the contiguous baseline reserves per sample.")
@click.option("--swap-gib", type=float, default=0.0, show_default=True, help="Host swap space (paged).")
@click.option("--max-num-seqs", type=int, default=256, show_default=True)
@click.option("--step-ms", type=float, default=5.0, show_default=True, help="Cost model: fixed cost per step.")
@click.option("--prefill-us", type=float, default=50.0, show_default=True, help="Cost model: per prompt token.")
@click.option("--decode-ms", type=float, default=0.05, show_default=True, help="Cost model: per decoded sequence.")
@click.option("--swap-gibps", type=float, default=25.0, show_default=True, help="Cost model: swap bandwidth.")
@click.option("--sweep", default="8,16,32,64,128", show_default=True,
              help="With --out: paged block sizes to sweep at the same pool bytes ('' skips).")
@click.option("--out", type=click.Path(file_okay=False), help="Write JSON/CSV summaries, timelines and PNG plots here.")
@click.option("--json", "as_json", is_flag=True, help="Print the summaries as JSON.")
def simulate(trace_file, allocator, prefix_caching, block_size, pool_blocks, pool_gib, layers, kv_heads, head_dim,
             dtype, max_seq_len, swap_gib, max_num_seqs, step_ms, prefill_us, decode_ms,
             swap_gibps, sweep, out, as_json):
    """Replay TRACE_FILE (see `pagedkv trace`) and report KV utilization, waste, concurrency, preemptions,
    prefix hits and simulated TTFT / inter-token latency."""
    from pagedkv.impl.sim import planner
    from pagedkv.impl.sim import report as sim_report
    from pagedkv.impl.sim import simulator as sim
    from pagedkv.impl.sim.trace import TraceError, read_trace

    if (pool_blocks is None) == (pool_gib is None):
        raise click.UsageError("give exactly one of --pool-blocks and --pool-gib")
    try:
        requests = read_trace(trace_file)
        per_token = planner.kv_bytes_per_token(layers, kv_heads, head_dim, dtype)
        pool_bytes = (pool_blocks * block_size * per_token if pool_blocks is not None
                      else planner.gib_to_bytes(pool_gib))
        swap_bytes = planner.gib_to_bytes(swap_gib) if swap_gib else 0
        cost = sim.CostModel(step_ms / 1e3, prefill_us / 1e6, decode_ms / 1e3, swap_gibps * 2**30)

        def config(kind, size):
            block_bytes = size * per_token
            return sim.SimConfig(kind, size, pool_bytes // block_bytes, per_token, max_seq_len, prefix_caching,
                                 swap_bytes // block_bytes, max_num_seqs, cost)

        kinds = sim.ALLOCATORS if allocator == "both" else (allocator,)
        results = [sim.simulate(requests, config(kind, block_size)) for kind in kinds]
        sweep_rows = ([sim_report.headline(sim.simulate(requests, config("paged", size)))
                       for size in _sizes(sweep)] if out and sweep.strip() else [])
    except (TraceError, planner.PlanError, ValueError, sim.SimulationStuck) as e:
        raise click.UsageError(str(e)) from e

    if as_json:
        click.echo(json.dumps({"cost_model": cost.describe(), "runs": [r.summary() for r in results],
                               "block_size_sweep": sweep_rows}))
    else:
        _print_table(results, cost.describe(), sweep_rows)
    if out:
        for path in sim_report.write_outputs(out, results, sweep_rows, cost.describe()):
            click.echo(f"wrote {path}", err=as_json)


_ROWS = [  # (label, summary key, format)
    ("KV utilization, mean", "utilization_mean", "{:.1%}"),
    ("KV utilization, min", "utilization_min", "{:.1%}"),
    ("tail-waste bound / expected", ("tail_bound_mean", "tail_expected_mean"), "{:.1%} / {:.1%}"),
    ("waste MiB, mean / peak", ("waste_mib_mean", "waste_mib_peak"), "{:,.1f} / {:,.1f}"),
    ("pool occupancy, mean", "pool_occupancy_mean", "{:.1%}"),
    ("concurrency, peak / mean", ("concurrency_peak", "concurrency_mean"), "{} / {:.1f}"),
    ("admissions delayed", "admissions_delayed", "{}"),
    ("out-of-memory events (fragmented)", ("oom_events", "fragmented_oom"), "{} ({})"),
    ("preempted: recompute / swap", ("preempt_recompute", "preempt_swap"), "{} / {}"),
    ("prefix hit rate", "prefix_hit_rate", "{:.1%}"),
    ("block-table length, mean / max", ("block_table_len_mean", "block_table_len_max"), "{:.1f} / {}"),
    ("TTFT P50 / P99 (ms)", ("ttft_p50_s", "ttft_p99_s"), "ms"),
    ("inter-token P50 / P99 (ms)", ("itl_p50_s", "itl_p99_s"), "ms"),
    ("simulated seconds / steps", ("simulated_s", "steps"), "{:.1f} / {}"),
]


def _cell(summary: dict, key, fmt: str) -> str:
    if fmt == "ms":
        return " / ".join(f"{summary[k] * 1e3:.1f}" for k in key)
    values = [summary[k] for k in key] if isinstance(key, tuple) else [summary[key]]
    return "-" if None in values else fmt.format(*values)


def _print_table(results, cost: str, sweep_rows) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    first = results[0].config
    table = Table(title=f"{results[0].summary()['pool_mib']:,.0f} MiB KV pool, block size {first.block_size}, "
                        f"max_seq_len {first.max_seq_len}")
    table.add_column("measure")
    for r in results:
        table.add_column(r.config.allocator + (" +prefix cache" if r.config.prefix_caching else ""), justify="right")
    summaries = [r.summary() for r in results]
    for label, key, fmt in _ROWS:
        table.add_row(label, *(_cell(s, key, fmt) for s in summaries))
    console.print(table)
    console.print(f"cost model: {cost}")
    if sweep_rows:
        sweep = Table(title="paged block-size sweep at fixed pool bytes")
        for name in ("B", "blocks", "util", "bound", "expected", "waste MiB", "table len", "preempted"):
            sweep.add_column(name, justify="right")
        for row in sweep_rows:
            sweep.add_row(str(row["block_size"]), f"{row['pool_blocks']:,}", f"{row['utilization_mean']:.1%}",
                          f"{row['tail_bound_mean']:.1%}", f"{row['tail_expected_mean']:.1%}",
                          f"{row['waste_mib_mean']:,.1f}", f"{row['block_table_len_mean']:.1f}",
                          str(row["preempt_recompute"] + row["preempt_swap"]))
        console.print(sweep)
