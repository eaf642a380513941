"""`pagedkv check`: the CI gate. Runs every verification the project has and prints one table."""

import importlib
import time
import traceback
import xml.etree.ElementTree as ET

import click

from pagedkv.fuzz.findings import counterexamples
from pagedkv.cli.common import OutputFile, format_duration, human_console, json_option, write_json

#: (check name, "module:function", what it checks); each function takes the profile name and returns
#: a dict with "covered" (what it exercised), "passed" and "detail", and optionally "counterexamples"
#: (a list of {"error": ..., "program": ...}: the failure and the shrunk program that shows it).
CHECKS = [
    ("spec-stateful", "pagedkv.fuzz.spec_machine:run_spec_check", "Hypothesis state machine over the spec"),
    ("proofs", "pagedkv.proofs.report:run_proof_check", "pagedkv prove: Z3 and CrossHair obligations"),
    ("differential", "pagedkv.fuzz.differential:run_differential_check", "BlockManager and Scheduler vs the spec"),
    ("conformance", "pagedkv.fuzz.campaign:run_conformance_check", "the conformance harness on spec and impl"),
    ("kernels", "pagedkv.fuzz.kernel_kit.check:run_kernel_check", "Triton kernels (or --kernel's) vs dense attention"),
    ("kernel-state", "pagedkv.fuzz.kernel_machine:run_kernel_state_check",
     "BlockManager + Scheduler + kernels on one poisoned cache"),
    ("engine", "pagedkv.impl.engine:run_engine_check", "the tiny engine vs the dense model, token for token"),
]
CHECK_NAMES = [name for name, _, _ in CHECKS]
#: The checks that take a kernel under test (`--kernel module:factory`, see pagedkv.fuzz.kernel_kit).
KERNEL_CHECKS = ("kernels", "kernel-state")

#: Seconds each check took with --profile ci on the project's 2-core machine (no GPU, kernels under
#: Triton's interpreter) while other work shared it (load 6-13); shown as the expected duration
#: until this machine has a run of its own to go by (progress.expected_seconds).
EXPECTED_CI_S = {"spec-stateful": 20, "proofs": 140, "differential": 230, "conformance": 35, "kernels": 30,
                 "kernel-state": 250, "engine": 45}


def run_check(name: str, target: str, profile: str, kernel: str | None = None) -> dict:
    module_name, function_name = target.split(":")
    started = time.perf_counter()
    try:
        extra = {"kernel": kernel} if kernel and name in KERNEL_CHECKS else {}
        result = getattr(importlib.import_module(module_name), function_name)(profile, **extra)
    except Exception as error:  # a crashing check is a failed check, reported with its cause
        result = {"covered": "-", "passed": False, "counterexamples": counterexamples(error),
                  "detail": f"{type(error).__name__}: {error}\n{traceback.format_exc(limit=3)}"}
    return {"check": name, "covered": result["covered"], "passed": bool(result["passed"]),
            "detail": result.get("detail", ""), "counterexamples": list(result.get("counterexamples", [])),
            "seconds": round(time.perf_counter() - started, 2)}


def failure_text(row: dict) -> str:
    parts = [row["detail"]] if row["detail"] else []
    many = len(row["counterexamples"])
    for number, example in enumerate(row["counterexamples"], 1):
        parts.append(f"counterexample {number}/{many}: {example['error']}\n{example['program']}".rstrip())
    return "\n".join(parts)


def write_junit(path: str, profile: str, rows: list) -> None:
    suite = ET.Element("testsuite", name=f"pagedkv-check-{profile}", tests=str(len(rows)),
                       failures=str(sum(not row["passed"] for row in rows)),
                       time=str(sum(row["seconds"] for row in rows)))
    for row in rows:
        case = ET.SubElement(suite, "testcase", classname="pagedkv.check", name=row["check"],
                             time=str(row["seconds"]))
        ET.SubElement(case, "system-out").text = row["covered"]
        if not row["passed"]:
            ET.SubElement(case, "failure", message=row["detail"].splitlines()[0] if row["detail"] else "failed"
                          ).text = failure_text(row)
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)


def print_table(console, profile: str, rows: list, not_run: list, interrupted: bool = False) -> None:
    from rich.table import Table

    table = Table(title=f"pagedkv check --profile {profile}")
    for column in ("check", "covered", "result", "seconds"):
        table.add_column(column, overflow="fold")
    for row in rows:
        result = "[green]PASS[/green]" if row["passed"] else "[red]FAIL[/red]"
        table.add_row(row["check"], row["covered"], result, f"{row['seconds']:.1f}")
    for number, name in enumerate(not_run):   # after Ctrl-C, the first of them was running
        table.add_row(name, "-", "[yellow]interrupted[/yellow]" if number == 0 and interrupted else "not run", "-")
    console.print(table)
    for row in rows:
        if not row["passed"]:
            console.print(f"[red]{row['check']}[/red]: {failure_text(row) or 'failed'}", highlight=False, soft_wrap=True)


CHECK_HELP = "Run every verification and print one table; exit 1 if any check fails.\n\n\b\nChecks:\n" + "\n".join(
    f"  {name:14} {what}" for name, _, what in CHECKS) + """

Progress goes to stderr. Ctrl-C stops the run, prints the checks that finished, and exits with 130."""


@click.command(help=CHECK_HELP)
@click.option("--profile", type=click.Choice(["ci", "dev", "deep"]), default="ci", show_default=True,
              help="Effort: ci is deterministic and bounded; deep raises every bound.")
@click.option("--only", multiple=True, type=click.Choice(CHECK_NAMES), help="Run only the named check (repeatable).")
@json_option
@click.option("--junit", "junit_path", type=OutputFile(dash=False), metavar="FILE", help="Write a JUnit XML report.")
@click.option("--kernel", metavar="MODULE:FACTORY",
              help="Test this paged-attention kernel (a factory of the kernel protocol, or 'pagedkv') in the "
                   "kernels and kernel-state checks (default: pagedkv's own kernels).")
def check(profile, only, json_path, junit_path, kernel):
    import pagedkv.fuzz.profiles  # noqa: F401  registers the Hypothesis profiles
    from pagedkv.cli.progress import Step, StepProgress, expected_seconds, remember_seconds

    selected = [(name, target) for name, target, _ in CHECKS if not only or name in only]
    if kernel:
        _check_kernel_target(kernel, [name for name, _ in selected])
    expected = expected_seconds(f"check {profile}", EXPECTED_CI_S if profile == "ci" else {})
    steps = {name: Step(f"{number}/{len(selected)} {name}", expected_s=expected.get(name))
             for number, (name, _) in enumerate(selected, 1)}
    rows, interrupted = [], False
    with StepProgress(f"check --profile {profile}", steps) as progress:
        try:
            for name, target in selected:
                progress.begin(name)
                rows.append(run_check(name, target, profile, kernel))
                progress.advance(name, failed=not rows[-1]["passed"])
        except KeyboardInterrupt:
            interrupted = True
    if not kernel:   # another kernel's durations say nothing about the next plain run
        remember_seconds(f"check {profile}", steps)
    not_run = [name for name, _ in selected[len(rows):]]
    out = human_console(json_path)
    print_table(out, profile, rows, not_run, interrupted)
    passed = all(row["passed"] for row in rows) and not interrupted
    if interrupted:
        out.print(f"[yellow]interrupted[/yellow] after {format_duration(sum(r['seconds'] for r in rows))}: "
                  f"{len(rows)} of {len(selected)} checks finished", highlight=False, soft_wrap=True)
    if json_path:
        write_json(json_path, {"profile": profile, "passed": passed, "interrupted": interrupted, "checks": rows,
                               "not_run": not_run})
    if junit_path:
        write_junit(junit_path, profile, rows)
    raise SystemExit(130 if interrupted else 0 if passed else 1)


def _check_kernel_target(kernel: str, names: list) -> None:
    """Refuse a --kernel that no selected check takes, or that cannot be loaded, before anything runs."""
    from pagedkv.fuzz.kernel_kit import KernelTargetError, load_kernel

    if not set(names) & set(KERNEL_CHECKS):
        raise click.UsageError(f"--kernel applies to the {' and '.join(KERNEL_CHECKS)} checks; none is selected")
    try:
        load_kernel(kernel)
    except KernelTargetError as error:
        raise click.BadParameter(str(error), param_hint="--kernel") from None
