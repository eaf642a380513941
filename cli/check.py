"""`pagedkv check`: the CI gate. Runs every verification the project has and prints one table."""

import importlib
import json
import time
import traceback
import xml.etree.ElementTree as ET

import click

#: (check name, "module:function"); each function takes the profile name and returns a dict with
#: "covered" (what it exercised), "passed" and "detail".
CHECKS = [
    ("spec-stateful", "pagedkv.fuzz.spec_machine:run_spec_check"),
    ("proofs", "pagedkv.proofs.report:run_proof_check"),
    ("differential", "pagedkv.fuzz.differential:run_differential_check"),
    ("conformance", "pagedkv.fuzz.campaign:run_conformance_check"),
    ("kernels", "pagedkv.kernels.check:run_kernel_check"),
    ("kernel-state", "pagedkv.fuzz.kernel_machine:run_kernel_state_check"),
    ("engine", "pagedkv.impl.engine:run_engine_check"),
]


def run_check(name: str, target: str, profile: str) -> dict:
    module_name, function_name = target.split(":")
    started = time.perf_counter()
    try:
        result = getattr(importlib.import_module(module_name), function_name)(profile)
    except Exception as error:  # a crashing check is a failed check, reported with its cause
        result = {"covered": "-", "passed": False,
                  "detail": f"{type(error).__name__}: {error}\n{traceback.format_exc(limit=3)}"}
    return {"check": name, "covered": result["covered"], "passed": bool(result["passed"]),
            "detail": result.get("detail", ""), "seconds": round(time.perf_counter() - started, 2)}


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
                          ).text = row["detail"]
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)


def print_table(profile: str, rows: list) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"pagedkv check --profile {profile}")
    for column in ("check", "covered", "result", "seconds"):
        table.add_column(column, overflow="fold")
    for row in rows:
        result = "[green]PASS[/green]" if row["passed"] else "[red]FAIL[/red]"
        table.add_row(row["check"], row["covered"], result, f"{row['seconds']:.1f}")
    console = Console()
    console.print(table)
    for row in rows:
        if not row["passed"] and row["detail"]:
            console.print(f"[red]{row['check']}[/red]: {row['detail']}", markup=True, highlight=False)


@click.command()
@click.option("--profile", type=click.Choice(["ci", "dev", "deep"]), default="ci", show_default=True,
              help="Effort: ci is deterministic and bounded; deep raises every bound.")
@click.option("--only", multiple=True, help="Run only the named check(s).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write the results as JSON.")
@click.option("--junit", "junit_path", type=click.Path(dir_okay=False), help="Write a JUnit XML report.")
def check(profile, only, json_path, junit_path):
    """Run every verification (stateful spec check, proofs, differential, conformance, kernels)."""
    import pagedkv.fuzz.profiles  # noqa: F401  registers the Hypothesis profiles

    unknown = set(only) - {name for name, _ in CHECKS}
    if unknown:
        raise click.UsageError(f"unknown check(s) {sorted(unknown)}; known: {[n for n, _ in CHECKS]}")
    rows = [run_check(name, target, profile) for name, target in CHECKS if not only or name in only]
    print_table(profile, rows)
    if json_path:
        with open(json_path, "w") as out:
            json.dump({"profile": profile, "passed": all(r["passed"] for r in rows), "checks": rows}, out, indent=2)
    if junit_path:
        write_junit(junit_path, profile, rows)
    raise SystemExit(0 if all(row["passed"] for row in rows) else 1)
