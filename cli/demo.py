"""`pagedkv demo`: generate with a tiny transformer on the paged cache and check it against a dense model."""
import json

import click


@click.command()
@click.option("--new-tokens", type=int, default=6, show_default=True, help="Tokens each sequence generates.")
@click.option("--only", multiple=True, help="Run only the named scenario(s).")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
def demo(new_tokens, only, as_json):
    """Run the engine scenarios (mixed batch, parallel sampling, prefix caching, preemption by recompute
    and by swap) on the real scheduler, block manager and kernels; compare with a dense reference."""
    from pagedkv.impl import engine

    unknown = set(only) - set(engine.SCENARIOS)
    if unknown:
        raise click.UsageError(f"unknown scenario(s) {sorted(unknown)}; known: {list(engine.SCENARIOS)}")
    if new_tokens < 1:
        raise click.UsageError("--new-tokens must be >= 1")
    model = engine.TinyTransformer(engine.ModelConfig())
    rows = []
    for name in (n for n in engine.SCENARIOS if not only or n in only):
        rows.append(engine.run_scenario(name, model, new_tokens))
        if not as_json:
            click.echo(f"{name}: {'ok' if rows[-1]['passed'] else 'FAILED'} ({rows[-1]['seconds']:.1f} s)", err=True)
    if as_json:
        click.echo(json.dumps(rows))
    else:
        _print_table(rows, model.cfg)
    raise SystemExit(0 if all(r["passed"] for r in rows) else 1)


def _print_table(rows, cfg) -> None:
    from rich.console import Console
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
    Console(width=max(Console().width, 110)).print(table)   # readable when piped, too
