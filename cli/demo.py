"""`pagedkv demo`: generate with a tiny transformer on the paged cache and check it against a dense model."""
import click

from pagedkv.cli.common import human_console, json_option, write_json

#: pagedkv.impl.engine.SCENARIOS, restated so that a usage error never waits for torch to load
#: (a test keeps the two in step).
SCENARIOS = ("mixed", "parallel", "prefix", "preempt-recompute", "preempt-swap")
#: The preemption scenarios run three sequences of up to 16 prompt tokens in a 5-block pool of 16
#: slots: a sequence may grow to 80 tokens, so 64 new tokens is the most every scenario can hold.
MAX_NEW_TOKENS = 64


@click.command(short_help="A tiny transformer generating on the paged cache, checked against a dense model.")
@click.option("--new-tokens", type=click.IntRange(1, MAX_NEW_TOKENS), default=6, show_default=True,
              help="Tokens each sequence generates.")
@click.option("--only", multiple=True, type=click.Choice(SCENARIOS), help="Run only the named scenario (repeatable).")
@json_option
def demo(new_tokens, only, json_path):
    """Run the engine scenarios (mixed batch, parallel sampling, prefix caching, preemption by recompute
    and by swap) on the real scheduler, block manager and kernels; compare with a dense reference."""
    from pagedkv.cli.progress import Step, StepProgress

    chosen = [name for name in SCENARIOS if not only or name in only]
    steps = {name: Step(f"{number}/{len(chosen)} {name}") for number, name in enumerate(chosen, 1)}
    rows = []
    with StepProgress("demo", steps) as progress:
        from pagedkv.impl import engine

        model = engine.TinyTransformer(engine.ModelConfig())
        for name in chosen:
            progress.begin(name)
            rows.append(engine.run_scenario(name, model, new_tokens))
            progress.advance(name, failed=not rows[-1]["passed"])
    if json_path:
        write_json(json_path, rows)
    _print_table(human_console(json_path), rows, model.cfg)
    raise SystemExit(0 if all(r["passed"] for r in rows) else 1)


def _print_table(console, rows, cfg) -> None:
    from rich.table import Table

    table = Table(title=f"paged engine vs dense reference ({cfg.layers} layers, {cfg.q_heads}/{cfg.kv_heads} "
                        f"query/KV heads, head_dim {cfg.head_dim}, float32, block size 16)")
    for column in ("scenario", "seqs", "tokens", "match", "max |dlogit|", "preempt rec/swap", "cached tok",
                   "COW", "s"):
        table.add_column(column, justify="right", overflow="fold")
    for r in rows:
        table.add_row(r["scenario"], str(r["sequences"]), str(r["tokens"]),
                      "[green]yes[/green]" if r["passed"] else "[red]NO[/red]", f"{r['max_logit_diff']:.1e}",
                      f"{r['preempt_recompute']} / {r['preempt_swap']}", str(r["cached_tokens"]),
                      str(r["cow_copies"]), f"{r['seconds']:.1f}")
    console.print(table)
