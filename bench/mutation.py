"""Mutation score of pagedkv's own checks: do they notice when the code under them is wrong?

    python bench/mutation.py --sample 12 --checks unit,differential --jobs 2     # a short look
    python bench/mutation.py --sample 30 --seed 0 --jobs 2 --results pilot.jsonl # the CI-sized sample
    python bench/mutation.py --sample 200 --seed 0 --jobs 2 --root /tmp/snap --results full.jsonl
    python bench/mutation.py --survivors-of full.jsonl --results rejudge.jsonl   # the survivors, on newer code
    python bench/mutation.py --list --files impl/alloc/prefix_cache.py           # the mutation points

Each mutant is one small change to one file of the spec, the allocator, the prefix cache, the pool,
the row tables or the scheduler: a comparison flipped (< <=, == !=, in / not in), an arithmetic
operator swapped, an integer constant moved by one, True/False or and/or swapped, a `not` dropped,
a statement deleted (an assignment, a call, a raise) or the first two arguments of a call swapped.
Mutants are drawn with a fixed seed from every point of the chosen files, so a run is repeatable;
known-equivalent mutants (no observable behaviour changes; bench/mutation_equivalent.json, each with
its reason and the commit it was judged on) stay in the draw, so listing one never changes which others are drawn, and are left out
of the score.

A mutant runs in an overlay: a temporary `pagedkv` package whose rooms are links to the measured
checkout (`--root`, default this one) except the mutated room, a copy with the one change; PYTHONPATH
puts it ahead of the installed (editable) pagedkv, so the checks, their subprocesses included,
import the mutant. The checks run in a fixed order, `unit` first: it is the cheapest and kills most,
and once it kills no other check can be the only one to kill that mutant, so the rest are skipped.
A mutant `unit` misses runs every other check of its room, so the kills each of those checks makes
that no other check makes are exact. Every check stops at its first failure (pytest -x), draws
with a fixed seed, keeps a fresh Hypothesis database per mutant (a saved failure of one mutant
would otherwise be replayed on the next), shrinks for at most `--shrink-seconds`, and has a timeout
of `--timeout-factor` times its time on the unmutated code (at least `--min-timeout`): a check that
runs out of it has found a hang, which kills the mutant because the same check finished on the
unmutated code. Each judged mutant is appended to a JSONL results file as it finishes, so an
interrupted run resumes where it stopped.
"""

import argparse
import ast
import difflib
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EQUIVALENT_FILE = Path(__file__).with_name("mutation_equivalent.json")

TARGETS = ("spec/kvspec.py", "impl/alloc/block_manager.py", "impl/alloc/prefix_cache.py",
           "impl/alloc/block_pool.py", "impl/alloc/rows.py", "impl/sched/scheduler.py")
ROOMS = ("spec", "impl", "kernels", "proofs", "fuzz", "cli")

#: `python -m MODULE ARGS...` with Hypothesis' shrink phase capped at PAGEDKV_MUTATION_SHRINK_S
#: seconds (Hypothesis' own cap is 300 s): once a check fails the verdict is known, and shrinking
#: was most of a killed mutant's time. Fixed text; the module and its arguments arrive as argv.
CAPPED_SHRINK = ("import os, runpy, sys\n"
                 "from hypothesis.internal.conjecture import engine\n"
                 "engine.MAX_SHRINKING_SECONDS = float(os.environ['PAGEDKV_MUTATION_SHRINK_S'])\n"
                 "sys.argv = sys.argv[1:]\n"
                 "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)\n")


def capped(module: str, *args: str) -> tuple:
    return (sys.executable, "-c", CAPPED_SHRINK, module, *args)


@dataclass(frozen=True)
class Check:
    argv: tuple
    judges: tuple                  # which targets it judges: "spec", "impl" or both
    db_option: str = ""            # the option that points its example database at the mutant's own


PYTEST = ("pytest", "-q", "-x", "-rf", "-p", "no:cacheprovider", "-p", "no:randomly", "--hypothesis-seed=0")
#: In the order they run. GATE runs first; the others run only on mutants it does not kill.
CHECKS = {
    # Every spec and impl suite (new test files join by themselves) but those of the engine and the
    # simulator, rooms downstream of the targets whose suites take minutes, not seconds.
    "unit": Check(capped(*PYTEST, "tests/spec", "tests/impl", *(f"--ignore=tests/impl/test_{name}.py" for name in
                                                                ("engine", "simulator", "planner", "trace"))),
                  ("spec", "impl")),
    "differential": Check(capped(*PYTEST, "tests/fuzz/test_differential.py", "-k", "not scheduler"), ("spec", "impl")),
    "scheduler": Check(capped(*PYTEST, "tests/fuzz/test_differential.py", "-k", "scheduler"), ("impl",)),
    "conformance": Check(capped("pagedkv", "fuzz", "impl", "--profile", "ci"), ("impl",), "--db"),
    "spec-stateful": Check(capped(*PYTEST, "tests/fuzz/test_spec_machine.py"), ("spec",)),
    "conformance-spec": Check(capped("pagedkv", "fuzz", "spec", "--profile", "ci"), ("spec",), "--db"),
}
GATE = "unit"
KILLS = ("killed", "hang")


# ---------------------------------------------------------------- mutation points

_COMPARE_SWAPS = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
                  ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
_BINOP_SWAPS = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.FloorDiv: ast.Mult, ast.Mult: ast.FloorDiv,
                ast.Mod: ast.FloorDiv, ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd}
_DELETABLE = (ast.Assign, ast.AugAssign, ast.Expr, ast.Raise)


@dataclass(frozen=True)
class Mutant:
    file: str
    index: int         # the index-th mutation point of the file, in traversal order
    line: int
    kind: str          # e.g. "compare Lt->LtE", "delete Assign", "constant 1->2"
    where: str         # enclosing function, kind and source of the node: stable while lines move

    @property
    def ident(self) -> str:
        return f"{self.file}::{self.where}"


def _children(node):
    """Child nodes to search, skipping what cannot change behaviour: annotations, docstrings,
    f-string pieces (messages)."""
    for name, value in ast.iter_fields(node):
        if name in ("annotation", "returns", "type_comment") or isinstance(node, ast.JoinedStr):
            continue
        for child in (value if isinstance(value, list) else [value]):
            if isinstance(child, ast.AST):
                yield child


def _is_docstring(node) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _points(node):
    """(node, kind, apply) for every mutation of `node` itself; `apply(node)` mutates it in place
    and returns the replacement node (the same node, or a new one)."""
    if isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            if type(op) in _COMPARE_SWAPS:
                new = _COMPARE_SWAPS[type(op)]
                yield f"compare {type(op).__name__}->{new.__name__}", lambda n, i=i, new=new: _set_op(n, i, new)
    elif isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in _BINOP_SWAPS:
        new = _BINOP_SWAPS[type(node.op)]
        yield f"arith {type(node.op).__name__}->{new.__name__}", lambda n, new=new: _set_attr(n, "op", new())
    elif isinstance(node, ast.BoolOp):
        new = ast.Or if isinstance(node.op, ast.And) else ast.And
        yield f"bool {type(node.op).__name__}->{new.__name__}", lambda n, new=new: _set_attr(n, "op", new())
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        yield "drop not", lambda n: n.operand
    elif isinstance(node, ast.Constant) and type(node.value) is bool:
        yield f"constant {node.value}->{not node.value}", lambda n: _set_attr(n, "value", not n.value)
    elif isinstance(node, ast.Constant) and type(node.value) is int:
        yield f"constant {node.value}->{node.value + 1}", lambda n: _set_attr(n, "value", n.value + 1)
    elif isinstance(node, ast.Call) and len(node.args) >= 2 and not any(isinstance(a, ast.Starred) for a in node.args[:2]):
        yield "swap args", lambda n: _set_attr(n, "args", [n.args[1], n.args[0], *n.args[2:]])
    if isinstance(node, _DELETABLE) and not _is_docstring(node):
        yield f"delete {type(node).__name__}", lambda n: ast.Pass(lineno=n.lineno, col_offset=n.col_offset)


def _set_op(node, i, new):
    node.ops[i] = new()
    return node


def _set_attr(node, name, value):
    setattr(node, name, value)
    return node


def _walk(tree):
    """Every node in a fixed order (depth first), with its parent and the dotted name of the
    function or class it is in, so a point can be found again in a copy of the tree."""
    stack = [(tree, None, "")]
    while stack:
        node, parent, scope = stack.pop()
        yield node, parent, scope
        inner = f"{scope}.{node.name}".lstrip(".") if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else scope
        stack.extend((child, node, inner) for child in reversed(list(_children(node))))


def mutation_points(file: str, root: Path = ROOT) -> list:
    tree = ast.parse((root / file).read_text())
    points, seen = [], {}
    for node, _, scope in _walk(tree):
        for kind, _apply in _points(node):
            where = f"{scope or '<module>'}: {kind}: {ast.unparse(node).splitlines()[0][:60]}"
            seen[where] = seen.get(where, 0) + 1
            points.append(Mutant(file, len(points), getattr(node, "lineno", 0), kind, f"{where} #{seen[where]}"))
    return points


def mutated_source(mutant: Mutant, root: Path = ROOT) -> str:
    tree = ast.parse((root / mutant.file).read_text())
    index = 0
    for node, parent, _ in _walk(tree):
        for _kind, apply in _points(node):
            if index == mutant.index:
                replacement = apply(node)
                if replacement is not node:
                    _replace_child(parent, node, replacement)
                return ast.unparse(ast.fix_missing_locations(tree))
            index += 1
    raise ValueError(f"{mutant.ident}: no such mutation point")


def _replace_child(parent, old, new) -> None:
    for name, value in ast.iter_fields(parent):
        if value is old:
            setattr(parent, name, new)
            return
        if isinstance(value, list) and any(v is old for v in value):
            value[[i for i, v in enumerate(value) if v is old][0]] = new
            return


def diff_of(mutant: Mutant, root: Path = ROOT) -> str:
    original = ast.unparse(ast.parse((root / mutant.file).read_text())).splitlines()
    mutated = mutated_source(mutant, root).splitlines()
    return "\n".join(difflib.unified_diff(original, mutated, mutant.file, mutant.file + " (mutant)", n=1, lineterm=""))


# ---------------------------------------------------------------- running checks on a mutant

def overlay(mutant, workdir: Path, root: Path = ROOT) -> Path:
    """A `pagedkv` package in `workdir` whose rooms link to `root`'s, except the mutant's room, a
    copy carrying the change (no mutant: every room linked). Returns the directory to put first on
    PYTHONPATH."""
    package = workdir / "pagedkv"
    package.mkdir(parents=True)
    for top in (root / "cli" / "top").glob("*.py"):   # the top-level name: version, `python -m pagedkv`
        shutil.copy(top, package / top.name)
    room = mutant.file.split("/")[0] if mutant else None
    for name in ROOMS:
        if name == room:
            shutil.copytree(root / name, package / name, ignore=shutil.ignore_patterns("__pycache__"))
            (package / mutant.file).write_text(mutated_source(mutant, root))
        else:
            (package / name).symlink_to(root / name, target_is_directory=True)
    return workdir


@dataclass
class Outcome:
    check: str
    verdict: str        # "killed", "survived" or "hang" (ran out of its timeout; kills too)
    seconds: float
    tail: str = ""

    @property
    def kills(self) -> bool:
        return self.verdict in KILLS


class BaselineFails(RuntimeError):
    """A check fails or hangs on the unmutated code: it would 'kill' every mutant."""


@dataclass
class Bench:
    """How the checks run: the checkout measured (its sources are mutated, its tests run), the
    Hypothesis effort, the shrink cap, each check's timeout, and each check's outcome on the
    unmutated code, which every check must pass before it may judge a mutant."""
    root: Path = ROOT
    profile: str = "dev"
    shrink_s: float = 10.0
    timeout_factor: float = 5.0
    min_timeout: float = 60.0
    fixed_timeout: float = 0.0          # > 0: this timeout for every check instead of the derived one
    baseline_limit: float = 600.0
    baseline: dict = field(default_factory=dict)    # check -> Outcome on the unmutated code
    live: set = field(default_factory=set)          # running check processes, killed on interrupt
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def timeout(self, name: str) -> float:
        if self.fixed_timeout > 0:
            return self.fixed_timeout
        return max(self.min_timeout, self.timeout_factor * self.require(name).seconds)

    def require(self, name: str) -> Outcome:
        """The check's outcome on the unmutated code, run once; BaselineFails unless it passed."""
        with self.lock:
            if name not in self.baseline:
                with tempfile.TemporaryDirectory(prefix="pagedkv-baseline-") as tmp:
                    path = overlay(None, Path(tmp) / "overlay", self.root)
                    self.baseline[name] = run_check(name, path, self, Path(tmp) / name, self.baseline_limit)
            outcome = self.baseline[name]
        if outcome.kills:
            raise BaselineFails(f"{name} {outcome.verdict} on the unmutated code ({outcome.seconds} s): {outcome.tail}")
        return outcome

    def kill_live(self) -> None:
        for process in list(self.live):
            _kill_group(process)


def _kill_group(process) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)   # the check and whatever it started
    except ProcessLookupError:
        pass


def run_check(name: str, path: Path, bench: Bench, scratch: Path, timeout_s: float) -> Outcome:
    """One check against the package at `path`, with a fresh example database under `scratch`."""
    check = CHECKS[name]
    scratch.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(path), os.environ.get("PYTHONPATH")])),
               PYTHONDONTWRITEBYTECODE="1", PAGEDKV_PROFILE=bench.profile,
               PAGEDKV_MUTATION_SHRINK_S=str(bench.shrink_s), HYPOTHESIS_STORAGE_DIRECTORY=str(scratch / "hypothesis"))
    argv = list(check.argv) + ([check.db_option, str(scratch / "db")] if check.db_option else [])
    started = time.monotonic()
    process = subprocess.Popen(argv, cwd=bench.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    bench.live.add(process)
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(process)
        process.communicate()
        return Outcome(name, "hang", round(time.monotonic() - started, 1), f"no verdict after {timeout_s:.0f} s")
    finally:
        bench.live.discard(process)
    seconds = round(time.monotonic() - started, 1)
    if process.returncode == 0:
        return Outcome(name, "survived", seconds)
    return Outcome(name, "killed", seconds, _why(output))


def _why(output: str) -> str:
    """pytest's FAILED line (the test that noticed), else the last lines of the output."""
    lines = output.strip().splitlines()
    failed = [line for line in lines if line.startswith("FAILED ")]
    return (failed[0] if failed else " | ".join(lines[-3:]))[:600]


def checks_for(file: str, wanted) -> list:
    side = "spec" if file.startswith("spec/") else "impl"
    return [name for name, check in CHECKS.items() if side in check.judges and name in wanted]


@dataclass
class Result:
    mutant: Mutant
    outcomes: list = field(default_factory=list)
    diff: str = ""

    @property
    def killers(self) -> list:
        return [o.check for o in self.outcomes if o.kills]

    @property
    def gated(self) -> bool:
        """Killed by the gate, so the other checks did not run."""
        return bool(self.outcomes) and self.outcomes[0].check == GATE and self.outcomes[0].kills

    def record(self, commit: str, setup: str) -> dict:
        return {"ident": self.mutant.ident, "mutant": asdict(self.mutant), "diff": self.diff, "commit": commit,
                "setup": setup, "outcomes": [asdict(o) for o in self.outcomes]}

    @classmethod
    def from_record(cls, record: dict) -> "Result":
        return cls(Mutant(**record["mutant"]), [Outcome(**o) for o in record["outcomes"]], record["diff"])


def run_mutant(mutant: Mutant, wanted, bench: Bench) -> Result:
    """The mutant's checks in order; the gate's kill ends it (no other check can then kill alone)."""
    result = Result(mutant, diff=diff_of(mutant, bench.root))
    with tempfile.TemporaryDirectory(prefix="pagedkv-mutant-") as tmp:
        path = overlay(mutant, Path(tmp) / "overlay", bench.root)
        for name in checks_for(mutant.file, wanted):
            bench.require(name)   # the check passes unmutated, so its failure or hang is the mutant's
            outcome = run_check(name, path, bench, Path(tmp) / name, bench.timeout(name))
            result.outcomes.append(outcome)
            if name == GATE and outcome.kills:
                break
    return result


# ---------------------------------------------------------------- sampling, results file, report

def load_equivalent() -> dict:
    """ident -> why that mutant cannot change observable behaviour. Each entry also names the commit
    it was judged on: the code moves on, and a mutant whose point has gone stays checkable there."""
    return {ident: entry["reason"] for ident, entry in json.loads(EQUIVALENT_FILE.read_text()).items()}


def points_at(file: str, commit: str, root: Path = ROOT) -> list:
    """The mutation points of `file` as it was at `commit` of `root`'s repository."""
    shown = subprocess.run(["git", "-C", str(root), "show", f"{commit}:{file}"], capture_output=True, text=True)
    if shown.returncode:
        raise ValueError(f"{file} at {commit}: {shown.stderr.strip()}")
    with tempfile.TemporaryDirectory(prefix="pagedkv-points-") as tmp:
        (Path(tmp) / file).parent.mkdir(parents=True)
        (Path(tmp) / file).write_text(shown.stdout)
        return mutation_points(file, Path(tmp))


def sample(files, count: int, seed: int, root: Path = ROOT) -> list:
    """`count` mutants drawn with `seed` from every point of `files` (equivalent ones included, so the
    draw does not depend on the list of them)."""
    points = [m for f in files for m in mutation_points(f, root)]
    return random.Random(seed).sample(points, min(count, len(points)))


def commit_of(root: Path) -> str:
    """`root`'s commit, with `+changes` when its measured rooms differ from it."""
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True)
    if head.returncode:
        return "unknown"
    changed = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", *ROOMS],
                             capture_output=True, text=True).stdout.strip()
    return head.stdout.strip() + ("+changes" if changed else "")


def setup_of(bench: Bench, wanted) -> str:
    """What a verdict depends on beside the mutant and the commit: the checks' command lines, the
    effort and the shrink cap (timeouts follow the machine, not the setup)."""
    argv = {name: list(CHECKS[name].argv[3:]) for name in wanted}
    return hashlib.sha1(json.dumps([bench.profile, bench.shrink_s, argv]).encode()).hexdigest()[:12]


def load_results(path: Path, commit: str, setup: str) -> dict:
    """ident -> Result of a results file written by an earlier run of the same commit and setup.
    A last line cut off by an interrupted run is dropped (that mutant runs again)."""
    if not path.exists():
        return {}
    text = path.read_text()
    if text and not text.endswith("\n"):   # cut off mid-write: the next record must start a line
        path.write_text(text[:text.rfind("\n") + 1])
    results = {}
    for number, record in _records(path):
        if (record["commit"], record["setup"]) != (commit, setup):
            raise SystemExit(f"{path}:{number} was measured on {record['commit']} with setup {record['setup']}, "
                             f"not {commit} with {setup}: give another --results file")
        results[record["ident"]] = Result.from_record(record)
    return results


def _records(path: Path):
    """(line number, record) of each whole line: a line cut off by an interrupt is not one."""
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError:
            continue


def survivors_of(path: Path) -> list:
    """Idents of the mutants no check killed in a results file."""
    return [r["ident"] for _, r in _records(path) if not any(o["verdict"] in KILLS for o in r["outcomes"])]


def report(results: list, files, equivalent: dict) -> str:
    scored = [r for r in results if r.mutant.ident not in equivalent]
    lines = _file_scores(scored, files, len(results) - len(scored)) + [""] + _check_table(scored)
    wrong = [r for r in results if r.mutant.ident in equivalent and r.killers]
    lines += [f"listed as equivalent but killed by {', '.join(r.killers)}: {r.mutant.ident}" for r in wrong]
    hangs = [f"hang: {r.mutant.ident} under {o.check}" for r in results for o in r.outcomes if o.verdict == "hang"]
    lines += [""] + hangs if hangs else []
    survivors = [r for r in scored if not r.killers]
    if survivors:
        lines += ["", f"{len(survivors)} survivor(s):"]
        for r in survivors:
            lines += ["", r.mutant.ident, r.diff]
    return "\n".join(lines)


def _file_scores(scored: list, files, equivalent_count: int) -> list:
    lines = [f"{'file':34} {'killed':>7} {'scored':>7} {'score':>7}"]
    for file in files:
        mine = [r for r in scored if r.mutant.file == file]
        if mine:
            killed = sum(bool(r.killers) for r in mine)
            lines.append(f"{file:34} {killed:7d} {len(mine):7d} {killed / len(mine):7.1%}")
    killed = sum(bool(r.killers) for r in scored)
    lines.append(f"{'all':34} {killed:7d} {len(scored):7d} {killed / max(len(scored), 1):7.1%}"
                 f"   (+{equivalent_count} drawn that are listed as equivalent, left out)")
    return lines


def _check_table(scored: list) -> list:
    """Per check: the mutants it judged, those it killed, and those it alone killed. The gate's
    `only it` is not measured (its kill stops the run); every other check's is exact."""
    lines = [f"{'check':18} {'judged':>7} {'kills':>6} {'only it':>8}"]
    for name in CHECKS:
        judged = [r for r in scored if name in (o.check for o in r.outcomes)]
        if judged:
            kills = [r for r in judged if name in r.killers]
            alone = "-" if name == GATE else str(sum(r.killers == [name] for r in kills))
            lines.append(f"{name:18} {len(judged):7d} {len(kills):6d} {alone:>8}")
    return lines


# ---------------------------------------------------------------- the command

def parse(argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT,
                        help="checkout to measure: its sources are mutated, its tests run (default: this one)")
    parser.add_argument("--files", default=",".join(TARGETS), help="comma-separated files to mutate")
    parser.add_argument("--sample", type=int, default=200, help="mutants to draw (default 200)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checks", default=",".join(CHECKS), help=f"comma-separated, of {', '.join(CHECKS)}")
    parser.add_argument("--profile", choices=("ci", "dev", "deep"), default="dev", help="effort of the pytest checks")
    parser.add_argument("--jobs", type=int, default=1, help="mutants judged at once")
    parser.add_argument("--shrink-seconds", type=float, default=10.0, help="cap on one check's shrinking")
    parser.add_argument("--timeout-factor", type=float, default=5.0,
                        help="a check's timeout: this times its time on the unmutated code ...")
    parser.add_argument("--min-timeout", type=float, default=60.0, help="... and at least this many seconds")
    parser.add_argument("--timeout", type=float, default=0.0, help="one fixed timeout for every check instead")
    parser.add_argument("--results", type=Path, help="JSONL file of judged mutants: appended, and resumed from")
    parser.add_argument("--only", action="append", default=[], metavar="IDENT",
                        help="judge this mutant (as --list prints it) instead of a sample; repeatable")
    parser.add_argument("--survivors-of", type=Path, metavar="RESULTS",
                        help="judge again the survivors of this results file (by ident, on --root's code)")
    parser.add_argument("--fail-under", type=float, default=0.0, metavar="PERCENT",
                        help="exit 2 when the score is under this (for CI)")
    parser.add_argument("--list", action="store_true", help="list the mutation points and stop")
    args = parser.parse_args(argv)
    args.files = [f for f in args.files.split(",") if f]
    args.checks = [c for c in args.checks.split(",") if c]
    unknown = [f for f in args.files if not (args.root / f).is_file()] + [c for c in args.checks if c not in CHECKS]
    if unknown:
        parser.error(f"unknown files or checks: {unknown}")
    if args.sample < 1 or args.jobs < 1 or not (args.shrink_seconds > 0 and args.timeout_factor > 0
                                                and args.min_timeout > 0 and args.timeout >= 0
                                                and 0 <= args.fail_under <= 100):
        parser.error("--sample, --jobs, --shrink-seconds, --timeout-factor and --min-timeout must be positive, "
                     "--fail-under a percentage")
    if args.survivors_of and not args.survivors_of.is_file():
        parser.error(f"no results file {args.survivors_of}")
    return args


def chosen(args) -> tuple:
    """The mutants to judge, and the idents asked for that no longer exist in --root's code."""
    idents = list(args.only) + (survivors_of(args.survivors_of) if args.survivors_of else [])
    if not idents:
        return sample(args.files, args.sample, args.seed, args.root), []
    by_ident = {m.ident: m for f in TARGETS if (args.root / f).is_file() for m in mutation_points(f, args.root)}
    return [by_ident[i] for i in idents if i in by_ident], [i for i in idents if i not in by_ident]


def judge_all(pending: list, args, bench: Bench, sink) -> list:
    """Judge `pending` on `args.jobs` workers, handing each result to `sink` as it finishes."""
    done = []
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(run_mutant, m, args.checks, bench) for m in pending]
        try:
            for future in as_completed(futures):
                result = future.result()
                sink(result)
                done.append(result)
        except BaseException:
            for future in futures:
                future.cancel()
            bench.kill_live()
            raise
    return done


def main(argv=None) -> int:
    args = parse(argv)
    equivalent = load_equivalent()
    if args.list:
        for file in args.files:
            for m in mutation_points(file, args.root):
                print(m.ident + ("   [equivalent]" if m.ident in equivalent else ""))
        return 0
    signal.signal(signal.SIGTERM, signal.default_int_handler)   # a TERM stops cleanly, like ^C
    bench = Bench(args.root.resolve(), args.profile, args.shrink_seconds, args.timeout_factor, args.min_timeout,
                  args.timeout)
    commit = commit_of(bench.root)
    mutants, gone = chosen(args)
    for ident in gone:
        print(f"gone from {commit}: {ident}")
    setup = setup_of(bench, args.checks)
    earlier = load_results(args.results, commit, setup) if args.results else {}
    pending = [m for m in mutants if m.ident not in earlier and m.ident not in equivalent]
    started, load = time.monotonic(), os.getloadavg()[0]
    print(f"{len(mutants)} mutants (seed {args.seed}) of {bench.root} at {commit}; {len(pending)} to judge, "
          f"{len(mutants) - len(pending)} already judged or listed as equivalent; checks {', '.join(args.checks)}; "
          f"profile {args.profile} (setup {setup}); {args.jobs} job(s) on {os.cpu_count()} cores, load {load:.1f}", flush=True)
    try:
        for name in sorted({c for m in pending for c in checks_for(m.file, args.checks)}, key=list(CHECKS).index):
            print(f"unmutated {name}: {bench.require(name).seconds} s, timeout {bench.timeout(name):.0f} s", flush=True)
        results = judge_all(pending, args, bench, _sink(args.results, commit, setup, len(pending)))
    except BaselineFails as failure:
        print(failure, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; judged mutants are in the results file", file=sys.stderr)
        return 130
    judged = [earlier[m.ident] for m in mutants if m.ident in earlier] + results
    print(f"\n{len(results)} judged in {time.monotonic() - started:.0f} s (load {load:.1f} at the start, "
          f"{os.getloadavg()[0]:.1f} at the end)\n")
    print(report(judged + _equivalent_drawn(mutants, earlier, equivalent), args.files, equivalent))
    score = killed_share(judged, equivalent)
    if score < args.fail_under / 100:
        print(f"\nscore {score:.1%} is under --fail-under {args.fail_under:g}%", file=sys.stderr)
        return 2
    return 0


def killed_share(results: list, equivalent: dict) -> float:
    """Killed share of the judged mutants not listed as equivalent (1 when there are none)."""
    scored = [r for r in results if r.mutant.ident not in equivalent]
    return sum(bool(r.killers) for r in scored) / len(scored) if scored else 1.0


def _equivalent_drawn(mutants, earlier, equivalent) -> list:
    """Drawn mutants listed as equivalent and never judged: counted as drawn, left out of the score."""
    return [Result(m) for m in mutants if m.ident in equivalent and m.ident not in earlier]


def _sink(path, commit: str, setup: str, total: int):
    count = [0]

    def sink(result: Result) -> None:
        count[0] += 1
        if path:
            with path.open("a") as out:
                out.write(json.dumps(result.record(commit, setup)) + "\n")
        seconds = sum(o.seconds for o in result.outcomes)
        print(f"[{count[0]}/{total}] {result.mutant.ident}: {', '.join(result.killers) or 'SURVIVED'} "
              f"({seconds:.0f} s)", flush=True)
    return sink


if __name__ == "__main__":
    sys.exit(main())
