"""CrossHair runs: `crosshair check` of the spec's docstring contracts (PEP 316) and of the driven
scenarios in proofs/scenarios.py, each as a subprocess with a time limit, its output parsed into a
pass/fail and a detail line.

The production allocator has no twins of the spec's pure helpers to compare by `diffbehavior`: it
calls the spec's own `blocks_needed` (pagedkv.spec.blocks), whose contract is checked here, so the
proved function is the one production runs. Its slot arithmetic is vectorised numpy, which CrossHair
cannot execute symbolically; the differential test checks it against the spec instead.
"""
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from pagedkv.spec import blocks

SPEC_DIR = Path(blocks.__file__).parent
#: proofs/scenarios.py, read as a file (it imports nothing of this package).
SCENARIOS = Path(__file__).with_name("scenarios.py")

_ERROR_LINE = re.compile(r"^(?P<where>[^\s:]+:\d+): error: (?P<what>.*)$")


@dataclass
class CrosshairOutcome:
    passed: bool
    detail: str


def _crosshair(args, timeout_s: float, extra_path: str = "") -> CrosshairOutcome:
    command = [sys.executable, "-m", "crosshair", *args]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [extra_path, os.environ.get("PYTHONPATH")])))
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return CrosshairOutcome(False, f"timed out after {timeout_s:.0f}s: {' '.join(args)}")
    errors = [m.group(0) for m in map(_ERROR_LINE.match, done.stdout.splitlines()) if m]
    if done.returncode == 0:
        return CrosshairOutcome(True, "no counterexample" + (f"; {done.stdout.strip()}" if done.stdout.strip() else ""))
    if errors:
        return CrosshairOutcome(False, "; ".join(errors))
    tail = (done.stdout + done.stderr).strip().splitlines()[-6:]
    return CrosshairOutcome(False, f"crosshair exited {done.returncode}: {' | '.join(tail)}")


def check_contracts(target: str, per_condition_s: float, timeout_s: float) -> CrosshairOutcome:
    """`crosshair check` of one spec file's PEP 316 contracts."""
    return _crosshair(["check", "--analysis_kind=PEP316", f"--per_condition_timeout={per_condition_s}",
                       str(SPEC_DIR / target)], timeout_s)


#: Seconds of CrossHair per scenario condition (wall clock: see proofs/report.py's Profile).
SCENARIO_PER_CONDITION_S = 4

_INFO_LINE = re.compile(r"^(?P<file>.+?):(?P<line>\d+): (?P<level>info|error): (?P<what>.*)$")
_VACUOUS = ("unable to meet precondition", "not analyzed")


def _functions(path: Path) -> dict:
    """Public top-level `def name(` -> (first line, last line, has a `pre:` line), from the file's
    text (the module is not imported here)."""
    lines = path.read_text().splitlines()
    starts = [(i, m.group(1)) for i, line in enumerate(lines, 1) if (m := re.match(r"def (\w+)\(", line))]
    ends = [start - 1 for start, _ in starts[1:]] + [len(lines)]
    return {name: (start, end, any(line.strip().startswith("pre:") for line in lines[start - 1:end]))
            for (start, name), end in zip(starts, ends) if not name.startswith("_")}


def check_scenarios(per_condition_s: float, timeout_s: float, path: Path = SCENARIOS,
                    skip: tuple = ()) -> CrosshairOutcome:
    """`crosshair check --report_all` of every public function of a scenario module (but `skip`),
    strictly: besides a counterexample, "Unable to meet precondition" / "not analyzed", a function
    with no reported condition, or one without a `pre:` line is a failure.

    Why "Not confirmed." counts as exercised: CrossHair 0.0.113 (core.analyze_calltree) starts each
    condition as failing its first `pre:` and clears that only when a path met every precondition
    and finished (not ignored); otherwise it reports "Unable to meet precondition" instead. So with
    a `pre:` line, "Not confirmed." means at least one path ran the `post:` and no path refuted it
    within the budget. A path through a callee whose own `post:` fails is ignored, not reported.
    """
    functions = {name: span for name, span in _functions(path).items() if name not in skip}
    owner = lambda line: next((n for n, (start, end, _) in functions.items() if start <= line <= end), None)  # noqa: E731
    args = ["check", "--analysis_kind=PEP316", "--report_all", f"--per_condition_timeout={per_condition_s}",
            *(f"{path}:{start}" for start, _, _ in functions.values())]
    try:
        done = subprocess.run([sys.executable, "-m", "crosshair", *args], capture_output=True, text=True,
                              timeout=timeout_s, cwd=path.parent)
    except subprocess.TimeoutExpired:
        return CrosshairOutcome(False, f"timed out after {timeout_s:.0f}s: crosshair check {path.name}")
    held, problems, seen = 0, [], set()
    problems += [f"{name}: no pre: line (a 'Not confirmed' would not show a path ran)"
                 for name, (_, _, has_pre) in functions.items() if not has_pre]
    for m in filter(None, map(_INFO_LINE.match, done.stdout.splitlines())):
        name, what = owner(int(m.group("line"))), m.group("what")
        seen.add(name)
        if m.group("level") == "error":
            problems.append(f"{name} (line {m.group('line')}): {what}")
        elif any(v in what.lower() for v in _VACUOUS):
            problems.append(f"{name}: vacuous ({what})")
        else:
            held += 1
    problems += [f"{name}: no condition analyzed" for name in functions if name not in seen]
    if done.returncode not in (0, 1) and not problems:
        tail = (done.stdout + done.stderr).strip().splitlines()[-6:]
        problems.append(f"crosshair exited {done.returncode}: {' | '.join(tail)}")
    skipped = f"; not checked: {', '.join(skip)}" if skip else ""
    if problems:
        return CrosshairOutcome(False, "; ".join(problems) + f" ({held} conditions exercised without "
                                       f"counterexample){skipped}")
    return CrosshairOutcome(True, f"{held} conditions of {len(functions)} scenarios exercised, "
                                  f"no counterexample, none vacuous{skipped}")
