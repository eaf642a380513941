"""`pagedkv prove`: run the proof obligations (Z3 induction and BMC, CrossHair contracts)
and print one row per obligation."""
import json

import click


@click.command()
@click.option("--profile", type=click.Choice(["ci", "deep"]), default="ci", show_default=True,
              help="ci: the smallest bounds that still exhaust pools, share a block three ways and evict; "
                   "deep: larger bounds, deeper BMC, longer CrossHair runs.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write the results as JSON.")
@click.option("--workers", type=int, default=0, show_default=True, help="Worker processes (0: one per core).")
def prove(profile, json_path, workers):
    """Prove the spec's invariants and contracts; exit non-zero if any obligation fails."""
    from rich.console import Console
    from rich.table import Table

    from pagedkv.proofs.report import as_json, run_proofs

    results = run_proofs(profile, workers)
    table = Table(title=f"pagedkv prove --profile {profile}")
    for column in ("obligation", "kind", "bounds", "result", "seconds"):
        table.add_column(column, overflow="fold")
    for r in results:
        table.add_row(r.name, r.kind, r.bounds, "[green]PASS[/green]" if r.passed else "[red]FAIL[/red]",
                      f"{r.seconds:.1f}")
    console = Console(width=160)
    console.print(table)
    failed = [r for r in results if not r.passed]
    for r in failed:
        console.print(f"[red]{r.name}[/red]\n{r.detail}", highlight=False)
    console.print(f"{len(results) - len(failed)}/{len(results)} obligations hold")
    if json_path:
        with open(json_path, "w") as out:
            json.dump({"profile": profile, "passed": not failed, "obligations": as_json(results)}, out, indent=2)
    raise SystemExit(1 if failed else 0)
