"""The obligation registry and runner behind `pagedkv prove` and `pagedkv check`.

A profile names the bounds of each kind of obligation. `obligations(profile)` lists them as tasks
(a function name and its arguments), so the runner can spread them over worker processes: Z3 terms
are built inside the worker that solves them.
"""
import multiprocessing
import os
import signal
import time
from dataclasses import asdict, dataclass

from . import contracts, explicit_bmc
from .encoding import Bounds, Machine
from .obligations import (CASES, WRITING_OPS, ObligationResult, atomicity, bmc, cases_cover, exclusivity,
                          induction, initiation, no_leak, step_composition, step_unrolling, witnesses)
from .ops import OPS

__all__ = ["ObligationResult", "PROFILES", "run_proofs", "run_proof_check", "obligations"]


@dataclass(frozen=True)
class Profile:
    induction: tuple            # Bounds for initiation, induction, atomicity, exclusivity
    bmc: Bounds
    bmc_depth: int
    solver_timeout_s: float
    crosshair_per_condition_s: float
    crosshair_timeout_s: float
    crosshair_targets: tuple = ("blocks.py",)   # spec files whose docstring contracts CrossHair checks
    explicit_depth: int = 6     # explicit-state BMC of the executable spec (proofs/explicit_bmc.py)
    # crosshair check of proofs/scenarios.py (strict: vacuous fails). The budget is wall-clock: at 1 s
    # per condition a 2-core box 2-4x slower than the one it was tuned on left step_scenario unable to
    # meet its precondition (vacuous) at idle; 3 s met it there, 4 s leaves a margin for load.
    scenario_per_condition_s: float = contracts.SCENARIO_PER_CONDITION_S
    scenario_timeout_s: float = 600       # its whole subprocess (28 conditions)


# Smallest bounds where a pool runs out (N=4 blocks, prompts of up to T*B=6 tokens), a block is
# shared by three tables (S=3) and a cached block is evicted (prefix caching on); C=2 CPU blocks
# so a swap can fail for want of CPU blocks.
CI_BOUNDS = Bounds(num_blocks=4, block_size=2, max_seqs=3, max_blocks_per_seq=3, num_cpu_blocks=2)

PROFILES = {
    "ci": Profile(induction=(CI_BOUNDS,), bmc=CI_BOUNDS, bmc_depth=2, solver_timeout_s=120,
                  crosshair_per_condition_s=2, crosshair_timeout_s=90),
    # pytest's profile: two blocks per table and shallow BMC, same obligations.
    "quick": Profile(induction=(Bounds(4, 2, 3, 2, 2),), bmc=Bounds(4, 2, 3, 2, 2), bmc_depth=2,
                     solver_timeout_s=120, crosshair_per_condition_s=1, crosshair_timeout_s=60, explicit_depth=5),
    "deep": Profile(induction=(Bounds(5, 2, 4, 3, 3), Bounds(4, 3, 3, 2, 2), Bounds(4, 2, 3, 3, 2, prefix_caching=False)),
                    bmc=CI_BOUNDS, bmc_depth=3, solver_timeout_s=900,
                    crosshair_per_condition_s=20, crosshair_timeout_s=900,
                    crosshair_targets=("blocks.py", "kvspec.py"), explicit_depth=7,
                    scenario_per_condition_s=10, scenario_timeout_s=900),
}

MULTI_CASE_OPS = sorted({c.op for c in CASES if sum(d.op == c.op for d in CASES) > 1})


def obligations(profile: str) -> list:
    """Tasks: (function name, args). Each task returns a list of ObligationResult."""
    p = PROFILES[profile]
    tasks = []
    for b in p.induction:
        tasks.append(("initiation", (b,)))
        tasks += [("induction", (b, case.name, p.solver_timeout_s)) for case in CASES]
        tasks += [("step_composition", (b, p.solver_timeout_s)), ("step_unrolling", (b, p.solver_timeout_s)),
                  ("no_leak", (b, p.solver_timeout_s))]
        tasks += [("cases_cover", (b, op, p.solver_timeout_s)) for op in MULTI_CASE_OPS]
        tasks += [("atomicity", (b, op, p.solver_timeout_s)) for op in OPS]
        tasks += [("exclusivity", (b, op, p.solver_timeout_s)) for op in WRITING_OPS]
    tasks += [("bmc", (p.bmc, p.bmc_depth, p.solver_timeout_s * 3)),
              ("witnesses", (p.bmc,)),
              ("explicit_bmc", (explicit_bmc.Alphabet(), p.explicit_depth))]
    tasks += [("crosshair_check", (target, p.crosshair_per_condition_s, p.crosshair_timeout_s))
              for target in p.crosshair_targets]
    tasks.append(("crosshair_scenarios", (p.scenario_per_condition_s, p.scenario_timeout_s)))
    return tasks


def _explicit_result(alphabet, depth) -> list:
    started = time.perf_counter()
    passed, bounds, detail = explicit_bmc.check(alphabet, depth)
    return [ObligationResult(f"BMC (explicit state, the executable spec): every trace of ≤{depth} ops keeps "
                             "the invariants, fails atomically, and frees back to full", "BMC", bounds, passed,
                             round(time.perf_counter() - started, 2), detail)]


def _crosshair_result(name, kind, bounds, run) -> list:
    started = time.perf_counter()
    outcome = run()
    return [ObligationResult(name, kind, bounds, outcome.passed, round(time.perf_counter() - started, 2),
                             outcome.detail)]


TASKS = {
    "initiation": initiation,
    "induction": lambda b, case, t: induction(Machine(b), next(c for c in CASES if c.name == case), t),
    "step_composition": lambda b, t: [step_composition(Machine(b), t)],
    "step_unrolling": lambda b, t: [step_unrolling(Machine(b), t)],
    "no_leak": lambda b, t: [no_leak(Machine(b), t)],
    "cases_cover": lambda b, op, t: [cases_cover(Machine(b), op, t)],
    "atomicity": lambda b, op, t: [atomicity(Machine(b), op, t)],
    "exclusivity": lambda b, op, t: [exclusivity(Machine(b), op, t)],
    "bmc": lambda b, k, t: bmc(Machine(b), k, t),
    "witnesses": lambda b: witnesses(Machine(b)),
    "explicit_bmc": lambda alphabet, k: _explicit_result(alphabet, k),
    "crosshair_check": lambda target, per, t: _crosshair_result(
        f"contract: crosshair check spec/{target}", "contract", f"per condition {per}s",
        lambda: contracts.check_contracts(target, per, t)),
    "crosshair_scenarios": lambda per, t: _crosshair_result(
        "contract: crosshair check proofs/scenarios.py (KVSpec operations from driven states, "
        "vacuous = failed)", "contract", f"N=4 B=2 C=2 cache=on, prompts ≤5 tokens in {{0,1,2}}, per condition {per}s",
        lambda: contracts.check_scenarios(per, t)),
}


def _run_task(task) -> list:
    name, args = task
    try:
        return TASKS[name](*args)
    except Exception as error:  # a crashing obligation is a failed one, reported with its cause
        return [ObligationResult(f"{name}{args!r}", "error", "-", False, 0.0, f"{type(error).__name__}: {error}")]


def _run_numbered(numbered_task) -> tuple:
    number, task = numbered_task
    return number, _run_task(task)


def _quit_quietly(_signum, _frame):
    # Ctrl-C reaches every process of the terminal's foreground group. The parent reports the
    # interruption; a worker just leaves (SystemExit still kills its CrossHair subprocess on the way
    # out, and unlike KeyboardInterrupt it prints no traceback per worker).
    raise SystemExit(130)


def run_proofs(profile: str = "ci", workers: int = 0, on_done=None) -> list:
    """Run every obligation of the profile; `workers` processes (0: one per CPU core).
    `on_done(task, results)`, if given, is called in this process as each task finishes (progress)."""
    tasks = obligations(profile)
    workers = workers or os.cpu_count() or 1
    # The slowest tasks first, so the pool's tail stays short.
    order = sorted(range(len(tasks)),
                   key=lambda i: tasks[i][0] not in ("explicit_bmc", "bmc", "witnesses", "crosshair_check",
                                                    "crosshair_scenarios"))
    done = {}
    if workers == 1:
        finished = (_run_numbered((i, tasks[i])) for i in order)
        _collect(finished, tasks, done, on_done)
    else:
        with multiprocessing.get_context("fork").Pool(workers, initializer=signal.signal,
                                                      initargs=(signal.SIGINT, _quit_quietly)) as pool:
            _collect(pool.imap_unordered(_run_numbered, [(i, tasks[i]) for i in order], chunksize=1),
                     tasks, done, on_done)
    return [result for i in range(len(tasks)) for result in done[i]]


def _collect(finished, tasks, done: dict, on_done) -> None:
    for number, results in finished:
        done[number] = results
        if on_done:
            on_done(tasks[number], results)


def run_proof_check(profile: str) -> dict:
    """The `pagedkv check` entry: the proofs as one check row."""
    results = run_proofs("deep" if profile == "deep" else "ci")
    failed = [r for r in results if not r.passed]
    detail = "; ".join(f"{r.name}: {r.detail.splitlines()[0] if r.detail else 'failed'}" for r in failed[:5])
    return {"name": "proofs", "covered": f"{len(results)} obligations", "passed": not failed,
            "detail": detail or f"all {len(results)} obligations hold"}


def as_json(results: list) -> list:
    return [asdict(r) for r in results]
