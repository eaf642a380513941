"""CrossHair runs: `crosshair check` of the spec's docstring contracts (PEP 316) and
`crosshair diffbehavior` of production twins of the spec's pure helpers, each as a subprocess with
a time limit, its output parsed into a pass/fail and a detail line.

Adding a twin is one line in `TWINS`: (spec helper in pagedkv.spec.blocks, production function).
`diffbehavior` knows nothing of preconditions, so each side is wrapped in a generated function that
returns None outside the spec helper's `pre:` lines (copied from its docstring): only inputs inside
the contract are compared. The wrappers are generated text run by the subprocess; this package
itself imports only the spec.
"""
import inspect
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

from pagedkv.spec import blocks

SPEC_DIR = Path(blocks.__file__).parent

#: spec helper name -> production twin with the same semantics (module.function).
TWINS = {
    "blocks_needed": "pagedkv.impl.hashing.blocks_needed",
    "slot_of": "pagedkv.impl.hashing.slot_of",
}

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


def _preconditions(fn) -> list:
    return [line.strip()[len("pre:"):].strip() for line in (fn.__doc__ or "").splitlines()
            if line.strip().startswith("pre:")]


def twin_module(helper: str, twin: str) -> str:
    """Source of a module with `spec_side` and `impl_side`, both guarded by the helper's pre:."""
    fn = getattr(blocks, helper)
    signature = inspect.signature(fn)
    params = ", ".join(signature.parameters)
    guard = " and ".join(f"({p})" for p in _preconditions(fn)) or "True"
    module, name = twin.rsplit(".", 1)
    return textwrap.dedent(f"""\
        from typing import *
        from pagedkv.spec.blocks import {helper} as _spec
        from {module} import {name} as _impl

        def spec_side{signature}:
            if not ({guard}):
                return None
            return _spec({params})

        def impl_side{signature}:
            if not ({guard}):
                return None
            return _impl({params})
        """)


def diff_behavior(helper: str, per_condition_s: float, timeout_s: float) -> CrosshairOutcome:
    """`crosshair diffbehavior` of the spec helper and its production twin, inside the contract."""
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "twin_under_test.py").write_text(twin_module(helper, TWINS[helper]))
        return _crosshair(["diffbehavior", f"--per_condition_timeout={per_condition_s}",
                           "--exception_equivalence=SAME_TYPE",
                           "twin_under_test.spec_side", "twin_under_test.impl_side"], timeout_s, extra_path=tmp)
