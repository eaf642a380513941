"""Mutation score of pagedkv's own checks: do they notice when the code under them is wrong?

    python bench/mutation.py --sample 200 --seed 0          # the full measure (hours on 2 cores)
    python bench/mutation.py --sample 12 --checks unit,differential   # a short look
    python bench/mutation.py --list --files impl/alloc/prefix_cache.py   # the mutation points

Each mutant is one small change to one file of the spec, the allocator, the prefix cache, the pool
or the scheduler: a comparison flipped (< <=, == !=, in / not in), an arithmetic operator swapped,
an integer constant moved by one, True/False or and/or swapped, a `not` dropped, a statement deleted
(an assignment, a call, a raise) or the first two arguments of a call swapped. Mutants are drawn
with a fixed seed from every point of the chosen files, so a run is repeatable.

A mutant runs in an overlay: a temporary `pagedkv` package whose rooms are links to this checkout
except the mutated room, which is a copy with the one change; PYTHONPATH puts it ahead of the
installed (editable) pagedkv, so the checks, their subprocesses included, import the mutant. Every
check of the mutant's room runs, each with its own timeout (a check that hangs has found a hang and
kills the mutant; Hypothesis' shrinking is bounded by the same timeout), so the report can say which
check kills which mutant, and which kills some mutant that no other check kills.

Mutants known to be equivalent (no observable behaviour changes) are listed, with the reason, in
bench/mutation_equivalent.json and left out of the score. The first run of any session checks that
every check passes on the unmutated code; a check that fails there would kill every mutant.
"""

import argparse
import ast
import difflib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EQUIVALENT_FILE = Path(__file__).with_name("mutation_equivalent.json")

TARGETS = ("spec/kvspec.py", "impl/alloc/block_manager.py", "impl/alloc/prefix_cache.py",
           "impl/alloc/block_pool.py", "impl/alloc/rows.py", "impl/sched/scheduler.py")
ROOMS = ("spec", "impl", "kernels", "proofs", "fuzz", "cli")

CLI = [sys.executable, "-c", "from pagedkv.cli.main import main; main()"]
PYTEST = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p", "no:randomly"]
#: check name -> (argv, which targets it judges: "spec", "impl" or both).
CHECKS = {
    "unit": (PYTEST + ["tests/spec", "tests/impl/test_block_manager.py", "tests/impl/test_scheduler.py",
                       "tests/impl/test_spec_agreement.py", "tests/impl/test_fault_injection.py",
                       "tests/impl/test_copy_order.py", "tests/impl/test_scheduler_faults.py"],
             ("spec", "impl")),
    "spec-stateful": (PYTEST + ["tests/fuzz/test_spec_machine.py"], ("spec",)),
    "differential": (PYTEST + ["tests/fuzz/test_differential.py", "-k", "not scheduler"], ("spec", "impl")),
    "scheduler": (PYTEST + ["tests/fuzz/test_differential.py", "-k", "scheduler"], ("impl",)),
    "conformance": (CLI + ["fuzz", "impl", "--profile", "ci"], ("impl",)),
    "conformance-spec": (CLI + ["fuzz", "spec", "--profile", "ci"], ("spec",)),
}


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


def mutation_points(file: str) -> list:
    tree = ast.parse((ROOT / file).read_text())
    points, seen = [], {}
    for node, _, scope in _walk(tree):
        for kind, _apply in _points(node):
            where = f"{scope or '<module>'}: {kind}: {ast.unparse(node).splitlines()[0][:60]}"
            seen[where] = seen.get(where, 0) + 1
            points.append(Mutant(file, len(points), getattr(node, "lineno", 0), kind, f"{where} #{seen[where]}"))
    return points


def mutated_source(mutant: Mutant) -> str:
    tree = ast.parse((ROOT / mutant.file).read_text())
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


def diff_of(mutant: Mutant) -> str:
    original = ast.unparse(ast.parse((ROOT / mutant.file).read_text())).splitlines()
    mutated = mutated_source(mutant).splitlines()
    return "\n".join(line for line in difflib.unified_diff(original, mutated, mutant.file, mutant.file + " (mutant)",
                                                           n=1, lineterm=""))


# ---------------------------------------------------------------- running checks on a mutant

def overlay(mutant, workdir: Path) -> Path:
    """A `pagedkv` package in `workdir` whose rooms link to this checkout, except the mutant's room,
    a copy carrying the change. Returns the directory to put first on PYTHONPATH."""
    package = workdir / "pagedkv"
    package.mkdir(parents=True)
    top = ROOT / "cli" / "top" / "__init__.py"
    if top.exists():
        shutil.copy(top, package / "__init__.py")
    room = mutant.file.split("/")[0] if mutant else None
    for name in ROOMS:
        if name == room:
            shutil.copytree(ROOT / name, package / name, ignore=shutil.ignore_patterns("__pycache__"))
            (package / mutant.file).write_text(mutated_source(mutant))
        else:
            (package / name).symlink_to(ROOT / name, target_is_directory=True)
    return workdir


@dataclass
class Outcome:
    check: str
    verdict: str        # "killed", "survived", "hang" (a timeout kills too)
    seconds: float
    tail: str = ""


def run_check(name: str, path: Path, timeout_s: float) -> Outcome:
    argv, _ = CHECKS[name]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(path), os.environ.get("PYTHONPATH")])),
               PYTHONDONTWRITEBYTECODE="1")
    started = time.monotonic()
    try:
        done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return Outcome(name, "hang", round(time.monotonic() - started, 1), f"no verdict after {timeout_s:.0f} s")
    verdict = "survived" if done.returncode == 0 else "killed"
    tail = "" if done.returncode == 0 else " | ".join((done.stdout + done.stderr).strip().splitlines()[-3:])
    return Outcome(name, verdict, round(time.monotonic() - started, 1), tail)


def checks_for(file: str, wanted) -> list:
    side = "spec" if file.startswith("spec/") else "impl"
    return [name for name, (_, judges) in CHECKS.items() if side in judges and name in wanted]


@dataclass
class Result:
    mutant: Mutant
    outcomes: list = field(default_factory=list)

    @property
    def killers(self) -> list:
        return [o.check for o in self.outcomes if o.verdict != "survived"]


def run_mutant(mutant: Mutant, wanted, timeout_s: float) -> Result:
    with tempfile.TemporaryDirectory(prefix="pagedkv-mutant-") as tmp:
        path = overlay(mutant, Path(tmp))
        return Result(mutant, [run_check(name, path, timeout_s) for name in checks_for(mutant.file, wanted)])


# ---------------------------------------------------------------- sampling and the report

def load_equivalent() -> dict:
    """ident -> why that mutant cannot change observable behaviour."""
    return json.loads(EQUIVALENT_FILE.read_text())


def sample(files, count: int, seed: int, equivalent: dict) -> tuple:
    points = [m for f in files for m in mutation_points(f)]
    known = [m for m in points if m.ident in equivalent]
    candidates = [m for m in points if m.ident not in equivalent]
    return random.Random(seed).sample(candidates, min(count, len(candidates))), known


def report(results: list, files, equivalent_count: int) -> str:
    lines = [f"{'file':34} {'killed':>7} {'total':>6} {'score':>7}"]
    for file in files:
        mine = [r for r in results if r.mutant.file == file]
        if mine:
            killed = sum(bool(r.killers) for r in mine)
            lines.append(f"{file:34} {killed:7d} {len(mine):6d} {killed / len(mine):7.1%}")
    killed = sum(bool(r.killers) for r in results)
    lines.append(f"{'all':34} {killed:7d} {len(results):6d} {killed / max(len(results), 1):7.1%}"
                 f"   ({equivalent_count} known-equivalent points left out)")
    lines.append("")
    lines.append(f"{'check':18} {'kills':>6} {'only it':>8}")
    for name in CHECKS:
        kills = [r for r in results if name in r.killers]
        alone = [r for r in kills if r.killers == [name]]
        if any(name in (o.check for o in r.outcomes) for r in results):
            lines.append(f"{name:18} {len(kills):6d} {len(alone):8d}")
    hangs = [(r.mutant.ident, o.check) for r in results for o in r.outcomes if o.verdict == "hang"]
    if hangs:
        lines.append("")
        lines += [f"hang: {ident} under {check}" for ident, check in hangs]
    survivors = [r for r in results if not r.killers]
    if survivors:
        lines += ["", f"{len(survivors)} survivor(s):"]
        for r in survivors:
            lines += ["", r.mutant.ident, diff_of(r.mutant)]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", default=",".join(TARGETS), help="comma-separated files to mutate")
    parser.add_argument("--sample", type=int, default=200, help="mutants to draw (default 200)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checks", default=",".join(CHECKS), help=f"comma-separated, of {', '.join(CHECKS)}")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per check per mutant")
    parser.add_argument("--json", help="write every outcome to this file")
    parser.add_argument("--list", action="store_true", help="list the mutation points and stop")
    parser.add_argument("--only", action="append", default=[], metavar="IDENT",
                        help="run this mutant (as --list prints it) instead of a sample; repeatable")
    parser.add_argument("--no-baseline", action="store_true", help="skip running the checks on the original")
    args = parser.parse_args(argv)
    files = [f for f in args.files.split(",") if f]
    wanted = [c for c in args.checks.split(",") if c]
    unknown = [f for f in files if not (ROOT / f).is_file()] + [c for c in wanted if c not in CHECKS]
    if unknown or args.sample < 1 or not args.timeout > 0:
        parser.error(f"unknown files or checks {unknown}, or a sample/timeout that is not positive")
    equivalent = load_equivalent()
    if args.list:
        for file in files:
            for m in mutation_points(file):
                print(m.ident + ("   [equivalent]" if m.ident in equivalent else ""))
        return 0
    if not args.no_baseline:
        sides = {"spec" if f.startswith("spec/") else "impl" for f in files}
        names = sorted({c for side in sides for c in checks_for(side + "/", wanted)})
        with tempfile.TemporaryDirectory(prefix="pagedkv-baseline-") as tmp:
            path = overlay(None, Path(tmp))
            for name in names:
                outcome = run_check(name, path, args.timeout)
                print(f"baseline {name}: {outcome.verdict} in {outcome.seconds} s", flush=True)
                if outcome.verdict != "survived":
                    print(f"the check fails on the unmutated code: {outcome.tail}", file=sys.stderr)
                    return 1
    mutants, known = sample(files, args.sample, args.seed, equivalent)
    if args.only:
        by_ident = {m.ident: m for f in files for m in mutation_points(f)}
        missing = [i for i in args.only if i not in by_ident]
        if missing:
            parser.error(f"no such mutant: {missing}")
        mutants = [by_ident[i] for i in args.only]
    print(f"{len(mutants)} mutants (seed {args.seed}) of {len(files)} files; checks: {', '.join(wanted)}; "
          f"load {os.getloadavg()[0]:.1f}", flush=True)
    results = []
    for i, mutant in enumerate(mutants, 1):
        result = run_mutant(mutant, wanted, args.timeout)
        results.append(result)
        print(f"[{i}/{len(mutants)}] {mutant.ident}: {', '.join(result.killers) or 'SURVIVED'} "
              f"({sum(o.seconds for o in result.outcomes):.0f} s)", flush=True)
    print()
    print(report(results, files, len(known)))
    if args.json:
        Path(args.json).write_text(json.dumps([{"mutant": asdict(r.mutant), "ident": r.mutant.ident,
                                                "outcomes": [asdict(o) for o in r.outcomes]} for r in results],
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
