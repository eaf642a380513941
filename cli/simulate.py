"""`pagedkv simulate`: replay a trace through the paged or the contiguous KV allocator, in simulated time.

Option names follow vLLM where vLLM has one (`--enable-prefix-caching`, `--max-model-len`,
`--swap-space`, `--kv-cache-dtype`, `--tensor-parallel-size`/`-tp`, `--block-size`, `--max-num-seqs`).
"""
import click

from pagedkv.cli.common import Finite, InputFile, OutputDir, human_console, json_option, write_json
from pagedkv.cli.plan import MAX_POOL_GIB, resolve_shape, shape_options, tp_option

#: The simulated pool is real memory (the BlockManager keeps every slot's token id and a free list of
#: blocks), so it is bounded: 2**22 blocks and 2**26 token slots take up to about 0.7 GiB.
MAX_BLOCKS, MAX_SLOTS = 2**22, 2**26
MAX_SEQ_LEN = 2**24     # token positions the simulator numbers
#: The default model shape: Llama-3-8B's (32 layers, 8 KV heads of 128, bf16: 128 KiB per token).
DEFAULT_SHAPE = {"layers": 32, "kv_heads": 8, "head_dim": 128, "dtype": "bf16"}


def _sizes(_ctx, _param, text: str) -> list:
    try:
        sizes = sorted({int(s) for s in text.split(",") if s.strip()})
    except ValueError:
        raise click.BadParameter(f"expected comma-separated block sizes, got {text!r}") from None
    if sizes and not 1 <= min(sizes) <= max(sizes) <= 65_536:
        raise click.BadParameter("block sizes must be integers in 1..65536")
    return sizes


def _blocks(name: str, pool_bytes: int, block_bytes: int, block_size: int) -> int:
    blocks = pool_bytes // block_bytes
    if blocks < 1:
        raise click.UsageError(f"{name}: the pool holds no whole block of {block_size} tokens "
                               f"({block_bytes:,} bytes)")
    if blocks > MAX_BLOCKS or blocks * block_size > MAX_SLOTS:
        raise click.UsageError(f"{name}: {blocks:,} blocks of {block_size} tokens; the simulator holds at most "
                               f"{MAX_BLOCKS:,} blocks and {MAX_SLOTS:,} token slots (a smaller pool, or a larger "
                               f"block size)")
    return blocks


@click.command()
@click.argument("trace_file", type=InputFile())
@click.option("--allocator", type=click.Choice(["contiguous", "paged", "both"]), default="both", show_default=True)
@click.option("--enable-prefix-caching", "--prefix-caching", "prefix_caching", is_flag=True,
              help="Share cached full blocks between equal prompt prefixes (paged).")
@click.option("--block-size", type=click.IntRange(1, 65_536), default=16, show_default=True, help="Tokens per block.")
@click.option("--pool-blocks", type=click.IntRange(1, MAX_BLOCKS),
              help="Paged pool size in blocks (the contiguous pool gets the same bytes).")
@click.option("--pool-gib", type=Finite(0, MAX_POOL_GIB, min_open=True),
              help="Pool size in GiB of KV, at the model shape's bytes per token.")
@shape_options
@tp_option
@click.option("--max-model-len", "--max-seq-len", "max_seq_len", type=click.IntRange(1, MAX_SEQ_LEN), default=2048,
              show_default=True, help="Longest sequence (longer requests are rejected); what the contiguous "
                                      "baseline reserves per sample.")
@click.option("--swap-space", "--swap-gib", "swap_gib", type=Finite(0, MAX_POOL_GIB), default=0.0, show_default=True,
              help="Host swap space in GiB (paged).")
@click.option("--max-num-seqs", type=click.IntRange(1, 65_536), default=256, show_default=True,
              help="Most sequences in one batch.")
@click.option("--step-ms", type=Finite(0, 1e6, min_open=True), default=5.0, show_default=True,
              help="Cost model: fixed cost per step.")
@click.option("--prefill-us", type=Finite(0, 1e6, min_open=True), default=50.0, show_default=True,
              help="Cost model: per prompt token.")
@click.option("--decode-ms", type=Finite(0, 1e6), default=0.05, show_default=True,
              help="Cost model: per decoded sequence.")
@click.option("--swap-gibps", type=Finite(0, 1e6, min_open=True), default=25.0, show_default=True,
              help="Cost model: swap bandwidth in GiB/s.")
@click.option("--sweep", default="8,16,32,64,128", show_default=True, callback=_sizes,
              help="With --out: paged block sizes to sweep at the same pool bytes ('' skips).")
@click.option("--out", type=OutputDir(), help="Write JSON/CSV summaries, timelines and PNG plots here.")
@json_option
def simulate(trace_file, allocator, prefix_caching, block_size, pool_blocks, pool_gib, model_config, layers, kv_heads,
             head_dim, dtype, tp, max_seq_len, swap_gib, max_num_seqs, step_ms, prefill_us, decode_ms, swap_gibps,
             sweep, out, json_path):
    """Replay TRACE_FILE (see `pagedkv trace`) and report KV utilization, waste, concurrency, rejections,
    preemptions, prefix hits and simulated TTFT / inter-token latency.

    The model shape defaults to Llama-3-8B's (32 layers, 8 KV heads, head_dim 128, bf16).
    Exit status: 0, 1 when the simulator rejected every request, 2 on a usage error.
    """
    if (pool_blocks is None) == (pool_gib is None):
        raise click.UsageError("give exactly one of --pool-blocks and --pool-gib")
    defaults = {} if model_config else DEFAULT_SHAPE
    # auto is the model's own dtype: the config's, or the default shape's (bf16).
    given = {"layers": layers, "kv_heads": kv_heads, "head_dim": head_dim, "dtype": None if dtype == "auto" else dtype}
    shape = resolve_shape(model_config, **{key: defaults.get(key) if value is None else value
                                           for key, value in given.items()})
    from pagedkv.cli.progress import Step, StepProgress
    from pagedkv.impl.sim import planner, report
    from pagedkv.impl.sim import simulator as sim
    from pagedkv.impl.sim.trace import TraceError, read_trace

    try:
        per_token = planner.kv_bytes_per_token(shape["layers"], shape["kv_heads"], shape["head_dim"], shape["dtype"],
                                               tp)
    except planner.PlanError as e:
        raise click.UsageError(str(e)) from e
    pool_bytes = (pool_blocks * block_size * per_token if pool_blocks is not None else planner.gib_to_bytes(pool_gib))
    swap_bytes = planner.gib_to_bytes(swap_gib) if swap_gib else 0
    cost = sim.CostModel(step_ms / 1e3, prefill_us / 1e6, decode_ms / 1e3, swap_gibps * 2**30)
    sweep = sweep if out else []

    def config(kind, size):
        blocks = _blocks("--pool-gib" if pool_gib is not None else "--pool-blocks", pool_bytes, size * per_token, size)
        # The CPU pool is real memory too: clipped to the bounds the GPU pool must meet.
        cpu_blocks = min(swap_bytes // (size * per_token), MAX_BLOCKS, MAX_SLOTS // size)
        return sim.SimConfig(kind, size, blocks, per_token, max_seq_len, prefix_caching, cpu_blocks, max_num_seqs,
                             cost)

    kinds = sim.ALLOCATORS if allocator == "both" else (allocator,)
    configs = [config(kind, block_size) for kind in kinds]
    sweep_configs = [config("paged", size) for size in sweep]
    try:
        requests = read_trace(trace_file)
    except TraceError as e:
        raise click.UsageError(str(e)) from e
    if not requests:
        raise click.UsageError(f"{trace_file} holds no requests: nothing to simulate")
    # The sweep's run at --block-size is the paged run itself: each distinct configuration runs once.
    distinct = list(dict.fromkeys(configs + sweep_configs))
    steps = {c: Step(f"{number}/{len(distinct)} " + ("contiguous" if c.allocator == "contiguous" else
                                                      f"paged, B={c.block_size}"))
             for number, c in enumerate(distinct, 1)}
    done = {}
    with StepProgress(f"simulate {len(requests):,} requests", steps, verdicts=False, plain=False) as progress:
        for c in distinct:
            progress.begin(c)
            try:
                done[c] = sim.simulate(requests, c)
            except sim.SimulationStuck as e:
                raise click.ClickException(f"the simulation stopped: {e}") from e
            progress.advance(c)
    results, sweep_rows = [done[c] for c in configs], [report.headline(done[c]) for c in sweep_configs]

    summaries = [r.summary() for r in results]
    if json_path:
        write_json(json_path, {"cost_model": cost.describe(), "runs": summaries, "block_size_sweep": sweep_rows})
    human = human_console(json_path)
    _print_table(human, results, summaries, cost.describe(), sweep_rows)
    for note in no_effect_notes(requests, summaries, prefix_caching, swap_bytes, block_size):
        human.print(f"note: {note}", style="yellow", highlight=False, soft_wrap=True)
    if out:
        for path in report.write_outputs(out, results, sweep_rows, cost.describe()):
            human.print(f"wrote {path}", highlight=False, soft_wrap=True)
    for s in summaries:
        if 0 < s["rejected"] < len(requests):
            human.print(f"note: {s['allocator']} rejected {s['rejected']:,} of {len(requests):,} requests: "
                        f"{s['rejected_too_long']:,} longer than --max-model-len {max_seq_len}, "
                        f"{s['rejected_too_large']:,} larger than the whole pool", style="yellow", highlight=False, soft_wrap=True)
    everything_rejected = [s["allocator"] for s in summaries if s["rejected"] == len(requests)]
    if everything_rejected:
        human.print(f"[red]error:[/red] {', '.join(everything_rejected)}: every one of the {len(requests)} requests "
                    f"was rejected (longer than --max-model-len {max_seq_len}, or larger than the whole pool); "
                    "nothing was simulated", highlight=False, soft_wrap=True)
        raise SystemExit(1)


def no_effect_notes(requests, summaries, prefix_caching: bool, swap_bytes: int, block_size: int) -> list:
    """Settings that cannot have changed the result, so that nobody reads a comparison into them."""
    notes = []
    grouped = [r for r in requests if r.prefix_group is not None and r.prefix_len > 0]
    kinds = {s["allocator"] for s in summaries}
    if prefix_caching:
        if "contiguous" in kinds:
            notes.append("--enable-prefix-caching has no effect on the contiguous allocator (it cannot share "
                         "a reservation)")
        if not grouped:
            notes.append("--enable-prefix-caching had no effect: no request in the trace has a shared prefix "
                         "(prefix_group with prefix_len > 0)")
        elif max(r.prefix_len for r in grouped) < block_size:
            notes.append(f"--enable-prefix-caching had no effect: every shared prefix is shorter than one block "
                         f"({block_size} tokens), and only full blocks are shared")
    elif grouped and "paged" in kinds:
        notes.append(f"{len(grouped)} requests share prefixes, but prefix caching is off "
                     "(--enable-prefix-caching shares them)")
    if swap_bytes and kinds == {"contiguous"}:
        notes.append("--swap-space has no effect on the contiguous allocator (it never preempts)")
    elif swap_bytes and not any(s["preempt_swap"] for s in summaries):
        notes.append("--swap-space had no effect: no sequence was swapped out")
    return notes


_ROWS = [  # (label, summary key, format)
    ("requests simulated / rejected", ("requests", "rejected"), "{:,} / {:,}"),
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
    if not summary["steps"] and key != ("requests", "rejected"):
        return "-"     # nothing ran: a 0.0% would read as a measurement
    if fmt == "ms":
        return " / ".join(f"{summary[k] * 1e3:.1f}" for k in key)
    values = [summary[k] for k in key] if isinstance(key, tuple) else [summary[key]]
    return "-" if None in values else fmt.format(*values)


def _print_table(console, results, summaries, cost: str, sweep_rows) -> None:
    from rich.table import Table

    first = results[0].config
    table = Table(title=f"{summaries[0]['pool_mib']:,.0f} MiB KV pool, block size {first.block_size}, "
                        f"max_model_len {first.max_seq_len}")
    table.add_column("measure")
    for r in results:
        table.add_column(r.config.allocator + (" +prefix cache" if r.config.prefix_caching else ""), justify="right")
    for label, key, fmt in _ROWS:
        table.add_row(label, *(_cell(s, key, fmt) for s in summaries))
    console.print(table)
    console.print(f"cost model: {cost}", highlight=False, soft_wrap=True)
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
