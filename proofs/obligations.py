"""The proof obligations over the encoding: initiation, consecution (induction) per operation case
and invariant, failure atomicity, write exclusivity, bounded model checking, and the step
encoding's own unrolling bound. Each returns `ObligationResult`s; a failed one carries a
counterexample in domain terms (`Counterexample.render`)."""
import time
from dataclasses import dataclass

import z3

from pagedkv.spec import KVSpec

from .convert import describe, model_snapshot, snapshot, to_state
from .encoding import SWAPPED, WAITING, Bounds, Machine, Run, State, at, prefixes, same_state
from .ops import OPS, execute, model_args, render_call, symbolic_args
from .tie import evaluate
from .zinvariants import ALL, NAMED, STRENGTHENING, inductive_invariant


@dataclass
class ObligationResult:
    name: str
    kind: str        # initiation, induction, atomicity, exclusivity, BMC, contract
    bounds: str
    passed: bool
    seconds: float
    detail: str = ""


@dataclass
class Counterexample:
    call: str
    case: str
    broken: str
    before: dict
    after: dict

    def render(self) -> str:
        return (f"{self.broken} broken by {self.call} [{self.case}]\n before:\n{describe(self.before)}\n"
                f" after:\n{describe(self.after)}")


# ------------------------------------------------------------------ operation cases

@dataclass(frozen=True)
class Case:
    """One path of an operation, singled out so each is proved (and shown non-vacuous) on its own."""
    name: str
    op: str
    holds: object   # (machine, state, args) -> Bool over the pre-state


def _first_hit(m: Machine, s: State, args):
    _, (n, tokens) = args
    hits = m.cache_hits(s, n, prefixes(tokens))
    return hits[0][0] if hits else z3.BoolVal(False)


def _tail_refs(s: State, sid):
    return at(s.ref, at(at(s.table, sid), at(s.tlen, sid) - 1))


def _append_at_boundary(m: Machine, s: State, sid):
    return at(s.ntok, sid) % m.b.block_size == 0


CASES = [
    Case("add, no cache hit", "add", lambda m, s, a: z3.Not(_first_hit(m, s, a))),
    Case("add, cache hit", "add", _first_hit),
    Case("append, new block", "append", lambda m, s, a: z3.And(_append_at_boundary(m, s, a[0]), s.free_len > 0)),
    Case("append, new block by eviction", "append",
         lambda m, s, a: z3.And(_append_at_boundary(m, s, a[0]), s.free_len == 0)),
    Case("append, copy-on-write", "append",
         lambda m, s, a: z3.And(z3.Not(_append_at_boundary(m, s, a[0])), _tail_refs(s, a[0]) > 1)),
    Case("append, plain write", "append",
         lambda m, s, a: z3.And(z3.Not(_append_at_boundary(m, s, a[0])), _tail_refs(s, a[0]) == 1)),
    Case("fork", "fork", lambda m, s, a: z3.BoolVal(True)),
    Case("free", "free", lambda m, s, a: z3.BoolVal(True)),
    Case("preempt, recompute", "preempt_recompute", lambda m, s, a: z3.BoolVal(True)),
    Case("preempt, swap", "preempt_swap", lambda m, s, a: z3.BoolVal(True)),
    Case("resume, recompute", "resume", lambda m, s, a: at(s.status, a[0]) == WAITING),
    Case("resume, swap", "resume", lambda m, s, a: at(s.status, a[0]) == SWAPPED),
]


# ------------------------------------------------------------------ solving

def _solver(timeout_s: float) -> z3.Solver:
    solver = z3.Solver()
    solver.set("timeout", int(timeout_s * 1000))
    return solver


def _verdict(result) -> tuple:
    """(passed, detail) for a query that must be unsat."""
    if result == z3.unsat:
        return True, "proved"
    return False, "counterexample" if result == z3.sat else f"unknown ({result})"


@dataclass
class Transition:
    """An operation applied to a fresh symbolic state under the inductive invariant."""
    machine: Machine
    op_name: str
    pre: State
    args: list
    run: Run
    assumptions: list

    @staticmethod
    def build(machine: Machine, op_name: str) -> "Transition":
        b, op = machine.b, OPS[op_name]
        pre = State.fresh(b, "pre")
        args, domain = symbolic_args(b, op, "arg")
        run = execute(machine, op, pre, args)
        return Transition(machine, op_name, pre, args, run, [inductive_invariant(b, pre), *domain, *run.domain])

    def counterexample(self, model, case: str, broken: str) -> Counterexample:
        op = OPS[self.op_name]
        return Counterexample(render_call(op, model_args(model, op, self.args)), case, broken,
                              model_snapshot(model, self.pre), model_snapshot(model, self.run.state))


def _timed(name, kind, bounds, body) -> ObligationResult:
    started = time.perf_counter()
    passed, detail = body()
    return ObligationResult(name, kind, bounds, passed, round(time.perf_counter() - started, 2), detail)


# ------------------------------------------------------------------ obligations

def initiation(b: Bounds) -> list:
    """The spec's empty state (taken from a fresh KVSpec) satisfies every invariant and lemma."""
    kv = KVSpec(b.num_blocks, b.block_size, num_cpu_blocks=b.num_cpu_blocks, prefix_caching=b.prefix_caching)
    empty = to_state(b, snapshot(kv))

    def prove(inv):
        solver = _solver(60)
        solver.add(z3.Not(inv(b, empty)))
        return _verdict(solver.check())
    return [_timed(f"initiation: {name}", "initiation", b.describe(), lambda inv=inv: prove(inv))
            for name, inv in ALL.items()]


def induction(machine: Machine, case: Case, timeout_s: float = 120) -> list:
    """Inv ∧ Pre ∧ Case ∧ Trans ⇒ Inv' for each named invariant, and for the strengthening lemmas
    together; first shows the case is possible under Inv (the proof is not vacuous)."""
    b = machine.b
    started = time.perf_counter()
    t = Transition.build(machine, case.op)
    solver = _solver(timeout_s)
    solver.add(*t.assumptions, t.run.ok, case.holds(machine, t.pre, t.args))
    possible = solver.check() == z3.sat
    results = []
    goals = {name: (lambda s, inv=inv: inv(b, s)) for name, inv in NAMED.items()}
    goals["strengthening lemmas"] = lambda s: z3.And([inv(b, s) for inv in STRENGTHENING.values()])
    for goal, holds in goals.items():
        def body():
            if not possible:
                return False, "vacuous: the case cannot happen under the invariant"
            solver.push()
            solver.add(z3.Not(holds(t.run.state)))
            result = solver.check()
            passed, detail = _verdict(result)
            if result == z3.sat:
                detail = t.counterexample(solver.model(), case.name, goal).render()
            solver.pop()
            return passed, detail
        results.append(_timed(f"induction: {case.name} ⇒ {goal}", "induction", b.describe(), body))
    results[0].seconds = round(results[0].seconds + (time.perf_counter() - started) - sum(r.seconds for r in results), 2)
    return results


def find_violation(machine: Machine, case: Case, timeout_s: float = 120):
    """The first named invariant or lemma the case breaks, as a Counterexample (None if none)."""
    t = Transition.build(machine, case.op)
    solver = _solver(timeout_s)
    solver.add(*t.assumptions, t.run.ok, case.holds(machine, t.pre, t.args))
    writes = z3.Or([z3.And(active, ref != 1) for active, _, ref in t.run.writes] or [z3.BoolVal(False)])
    goals = {name: (lambda s, inv=inv: inv(machine.b, s)) for name, inv in ALL.items()}
    for goal, holds in goals.items():
        solver.push()
        solver.add(z3.Not(holds(t.run.state)))
        if solver.check() == z3.sat:
            return t.counterexample(solver.model(), case.name, goal)
        solver.pop()
    solver.add(writes)
    if solver.check() == z3.sat:
        return t.counterexample(solver.model(), case.name, "write exclusivity")
    return None


def _refute(machine: Machine, op_name: str, timeout_s: float, violation, what: str, label: str) -> tuple:
    """Search for a run of `op_name` satisfying `violation(transition)`; none found means proved."""
    t = Transition.build(machine, op_name)
    solver = _solver(timeout_s)
    solver.add(*t.assumptions, violation(t))
    result = solver.check()
    passed, detail = _verdict(result)
    if result == z3.sat:
        detail = t.counterexample(solver.model(), what, label).render()
    return passed, detail


def atomicity(machine: Machine, op_name: str, timeout_s: float = 120) -> ObligationResult:
    """A failed operation leaves the state exactly as it was."""
    def changed_on_failure(t):
        return z3.And(z3.Not(t.run.ok), z3.Not(same_state(machine.b, t.pre, t.run.state)))
    return _timed(f"atomicity: {op_name}", "atomicity", machine.b.describe(),
                  lambda: _refute(machine, op_name, timeout_s, changed_on_failure, "failed", "failure atomicity"))


WRITING_OPS = ("add", "append", "resume")   # step writes only through append (see step_composition)


def exclusivity(machine: Machine, op_name: str, timeout_s: float = 120) -> ObligationResult:
    """Every write goes to a block whose ref count is 1 at that moment."""
    def writes_shared_block(t):
        return z3.Or([z3.And(active, ref != 1) for active, _, ref in t.run.writes])
    return _timed(f"exclusivity: {op_name} writes only unshared blocks", "exclusivity", machine.b.describe(),
                  lambda: _refute(machine, op_name, timeout_s, writes_shared_block, "write", "write exclusivity"))


def cases_cover(machine: Machine, op_name: str, timeout_s: float = 120) -> ObligationResult:
    """The cases of an operation cover every successful call, so their proofs cover the operation."""
    def body():
        t = Transition.build(machine, op_name)
        solver = _solver(timeout_s)
        cases = [c.holds(machine, t.pre, t.args) for c in CASES if c.op == op_name]
        solver.add(*t.assumptions, t.run.ok, z3.Not(z3.Or(cases)))
        return _verdict(solver.check())
    names = ", ".join(c.name for c in CASES if c.op == op_name)
    return _timed(f"induction: cases cover {op_name} ({names})", "induction", machine.b.describe(), body)


def step_composition(machine: Machine, timeout_s: float = 120) -> ObligationResult:
    """Consecution of step, by composition. The encoded step is preempt_recompute calls followed by
    append calls (the very methods whose cases are proved above), each under a guard; so every
    invariant is kept if none of those calls raises once step's own validation has passed."""
    def body():
        t = Transition.build(machine, "step")
        validated = z3.And([z3.Implies(member, z3.And(machine.is_running(t.pre, q), token >= 0))
                            for q, (member, token) in enumerate(t.args[0])])
        solver = _solver(timeout_s)
        solver.add(*t.assumptions, validated, z3.Not(t.run.ok))
        result = solver.check()
        passed, detail = _verdict(result)
        if result == z3.sat:
            detail = t.counterexample(solver.model(), "step", "an inner preempt or append raises").render()
        return passed, (detail + "; with the preempt/append cases this proves step keeps every invariant "
                        "and writes only unshared blocks")
    return _timed("induction: step = preemptions then appends, none raising ⇒ every invariant",
                  "induction", machine.b.describe(), body)


def step_unrolling(machine: Machine, timeout_s: float = 120) -> ObligationResult:
    """The encoding unrolls step's preemption loop max_seqs times: that always suffices."""
    def body():
        t = Transition.build(machine, "step")
        solver = _solver(timeout_s)
        solver.add(*t.assumptions, z3.Not(z3.And(t.run.checks)))
        return _verdict(solver.check())
    return _timed("induction: step's preemption loop ends within max_seqs rounds", "induction",
                  machine.b.describe(), body)


def no_leak(machine: Machine, timeout_s: float = 120) -> ObligationResult:
    """Unbounded in the number of operations: a state satisfying the inductive invariant with no
    sequence left has both pools full. With the `free` case's consecution (every free keeps the
    invariant), freeing everything from any reachable state returns the pools to full."""
    def body():
        s = State.fresh(machine.b, "pre")
        solver = _solver(timeout_s)
        solver.add(inductive_invariant(machine.b, s), *[z3.Not(live) for live in s.live],
                   z3.Not(_full(machine.b, s)))
        return _verdict(solver.check())
    return _timed("induction: from any reachable state, freeing everything returns both pools to full",
                  "induction", machine.b.describe(), body)


def _full(b: Bounds, s: State):
    return z3.And(s.free_len + s.evict_len == b.num_blocks, s.cpu_free_len == b.num_cpu_blocks)


# ------------------------------------------------------------------ bounded model checking

def _bmc_trace(machine: Machine, k: int, token_values: int):
    """States s_0 (empty) .. s_k, each s_{i+1} the result of one symbolic operation on s_i."""
    b = machine.b
    kv = KVSpec(b.num_blocks, b.block_size, num_cpu_blocks=b.num_cpu_blocks, prefix_caching=b.prefix_caching)
    states, constraints = [to_state(b, snapshot(kv))], []
    for i in range(k):
        choice = z3.Int(f"op{i}")
        constraints += [0 <= choice, choice < len(OPS)]
        successor = None
        for index, op in enumerate(OPS.values()):
            args, domain = symbolic_args(b, op, f"s{i}")
            run = execute(machine, op, states[-1], args)
            chosen = domain + _small_tokens(op, args, token_values) + run.domain
            constraints += [z3.Implies(choice == index, c) for c in chosen]
            successor = run.state.terms() if successor is None else \
                [z3.If(choice == index, new, old) for new, old in zip(run.state.terms(), successor)]
        state = State.fresh(b, f"s{i + 1}")
        constraints += [x == y for x, y in zip(state.terms(), successor)]
        states.append(state)
    return states, constraints


def _small_tokens(op, args, token_values: int) -> list:
    """Tokens range over a few values so prefixes repeat and cache hits happen."""
    tokens = []
    for kind, arg in zip(op.params, args):
        if kind == "token":
            tokens.append(arg)
        elif kind == "prompt":
            tokens += arg[1]
        elif kind == "batch":
            tokens += [t for _, t in arg]
    return [z3.And(0 <= t, t < token_values) for t in tokens]


def _free_all(machine: Machine, state: State) -> State:
    run = Run(state)
    for sid in range(machine.b.max_seqs):
        with run.when(at(run.state.live, sid)):
            machine.free(run, sid)
    return run.state


def bmc(machine: Machine, k: int, timeout_s: float = 300, token_values: int = 2) -> list:
    """From the empty state every sequence of up to k operations keeps every invariant, and
    freeing every sequence afterwards returns both pools to full."""
    b = machine.b
    bounds = f"{b.describe()} k={k} tokens<{token_values}"

    def keeps_invariants():
        states, constraints = _bmc_trace(machine, k, token_values)
        solver = _solver(timeout_s)
        solver.add(*constraints, z3.Or([z3.Not(inv(b, s)) for s in states[1:] for inv in NAMED.values()]))
        return _verdict(solver.check())

    def no_leak():
        states, constraints = _bmc_trace(machine, k, token_values)
        drained = _free_all(machine, states[-1])
        solver = _solver(timeout_s)
        solver.add(*constraints, z3.Not(_full(b, drained)))
        return _verdict(solver.check())

    return [_timed(f"BMC: every trace of ≤{k} ops keeps the named invariants", "BMC", bounds, keeps_invariants),
            _timed(f"BMC: after ≤{k} ops, freeing everything returns both pools to full", "BMC", bounds, no_leak)]


WITNESSES = {
    # situation: (a trace from the empty state, the situation holds after it)
    "a block is shared by three tables": (
        [("add", (0, [0, 0, 1])), ("fork", (0, 1)), ("fork", (0, 2))],
        lambda snap: 3 in snap["ref"]),
    "the GPU pool runs out": (
        [("add", (0, [0, 1, 0])), ("add", (1, [1, 1])), ("add", (2, [1]))],
        lambda snap: not snap["free"] and not snap["evictable"]),
    "a cached block is evicted": (
        [("add", (0, [0, 0, 1])), ("free", (0,)), ("add", (1, [1, 1, 1])), ("add", (2, [2, 2, 2]))],
        lambda snap: not snap["evictable"] and (0, 0) not in snap["index"].values()),
}


def witnesses(machine: Machine) -> list:
    """The bounds are big enough to matter: a trace from the empty state, run through the encoded
    transitions, reaches each situation."""
    b = machine.b

    def replay(trace, holds):
        kv = KVSpec(b.num_blocks, b.block_size, num_cpu_blocks=b.num_cpu_blocks, prefix_caching=b.prefix_caching)
        snap = snapshot(kv)
        for op_name, values in trace:
            outcome = evaluate(b, op_name, snap, values)
            if not (outcome.in_bounds and outcome.unique):
                return False, f"{op_name}{values} is outside the bounds"
            snap = outcome.after
        calls = ", ".join(f"{op}{values}" for op, values in trace)
        return holds(snap), f"reached by {calls}" if holds(snap) else f"not reached by {calls}"
    return [_timed(f"BMC witness: {name}", "BMC", b.describe(), lambda t=trace, h=holds: replay(t, h))
            for name, (trace, holds) in WITNESSES.items()]
