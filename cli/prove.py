"""`pagedkv prove`: run the proof obligations (Z3 induction and BMC, CrossHair contracts)
and print one row per obligation."""
import click

from pagedkv.cli.common import human_console, json_option, write_json

#: Obligation groups, as shown in the progress display: task name -> group label.
GROUPS = {
    "initiation": "Z3 initiation", "induction": "Z3 induction", "step_composition": "Z3 step and no-leak lemmas",
    "step_unrolling": "Z3 step and no-leak lemmas", "no_leak": "Z3 step and no-leak lemmas",
    "cases_cover": "Z3 case coverage", "atomicity": "Z3 atomicity", "exclusivity": "Z3 write exclusivity",
    "bmc": "Z3 bounded model checking", "witnesses": "Z3 witness traces", "explicit_bmc": "explicit-state BMC",
    "crosshair_check": "CrossHair contracts", "crosshair_scenarios": "CrossHair contracts",
}
#: Seconds from the start of `pagedkv prove --profile ci --workers 2` until each group's last
#: obligation finished (groups run side by side), measured on the project's 2-core machine while
#: other work shared it (the whole run: 138 s; about 80 s on an idle machine).
EXPECTED_CI_S = {
    "Z3 witness traces": 1, "Z3 bounded model checking": 5, "Z3 initiation": 28, "explicit-state BMC": 28,
    "CrossHair contracts": 67, "Z3 induction": 75, "Z3 case coverage": 93, "Z3 step and no-leak lemmas": 124,
    "Z3 write exclusivity": 130, "Z3 atomicity": 138,
}


def proof_steps(tasks: list, profile: str) -> dict:
    from pagedkv.cli.progress import Step, expected_seconds

    expected = expected_seconds(f"prove {profile}", EXPECTED_CI_S if profile == "ci" else {})
    steps = {}
    for name, _args in tasks:
        label = GROUPS.get(name, name)
        step = steps.setdefault(label, Step(label, total=0, expected_s=expected.get(label)))
        step.total += 1
    return steps


@click.command()
@click.option("--profile", type=click.Choice(["ci", "deep"]), default="ci", show_default=True,
              help="ci: the smallest bounds that still exhaust pools, share a block three ways and evict; "
                   "deep: larger bounds, deeper BMC, longer CrossHair runs.")
@json_option
@click.option("--workers", type=click.IntRange(0, 1024), default=0, show_default=True,
              help="Worker processes (0: one per core).")
def prove(profile, json_path, workers):
    """Prove the spec's invariants and contracts; exit non-zero if any obligation fails.

    Progress (per obligation group) goes to stderr. Ctrl-C stops the run, prints the obligations that
    finished, and exits with status 130."""
    from pagedkv.cli.progress import StepProgress, remember_seconds
    from pagedkv.proofs.report import as_json, obligations, run_proofs

    steps = proof_steps(obligations(profile), profile)
    finished = []

    def on_done(task, results):
        finished.extend(results)
        progress.advance(GROUPS.get(task[0], task[0]), failed=sum(not r.passed for r in results))

    interrupted = False
    with StepProgress(f"prove --profile {profile}", steps, announce=False) as progress:
        for key in steps:
            progress.begin(key)
        try:
            results = run_proofs(profile, workers, on_done=on_done)
        except KeyboardInterrupt:
            interrupted, results = True, finished
    remember_seconds(f"prove {profile}", steps)
    out = human_console(json_path)
    _print_results(out, profile, results)
    failed = [r for r in results if not r.passed]
    total = sum(step.total for step in steps.values())
    if interrupted:
        out.print(f"[yellow]interrupted[/yellow]: {len(results)} obligation results of {total} tasks finished; "
                  f"{len(results) - len(failed)} hold", highlight=False, soft_wrap=True)
    else:
        out.print(f"{len(results) - len(failed)}/{len(results)} obligations hold", highlight=False, soft_wrap=True)
    if json_path:
        write_json(json_path, {"profile": profile, "passed": not failed and not interrupted,
                               "interrupted": interrupted, "obligations": as_json(results)})
    raise SystemExit(130 if interrupted else 1 if failed else 0)


def _print_results(out, profile: str, results: list) -> None:
    from rich.table import Table

    table = Table(title=f"pagedkv prove --profile {profile}")
    table.add_column("obligation", ratio=1)
    for column in ("kind", "bounds", "result", "seconds"):
        table.add_column(column)
    for r in results:
        table.add_row(r.name, r.kind, r.bounds, "[green]PASS[/green]" if r.passed else "[red]FAIL[/red]",
                      f"{r.seconds:.1f}")
    out.print(table)
    for r in results:
        if not r.passed:
            out.print(f"[red]{r.name}[/red]\n{r.detail}", highlight=False, soft_wrap=True)
