"""The encoded transition evaluated on a concrete spec state, for comparing with the spec itself.

`evaluate` encodes the snapshot, runs the operation's transition relation on it, asks Z3 for the
successor and the raised error, and then asks whether any *other* successor or error is possible:
the relation must be functional (unique) for the comparison to mean anything.
"""
from dataclasses import dataclass

import z3

from .convert import model_snapshot, to_state
from .encoding import ERRORS, Bounds, Machine, State, same_state
from .ops import OPS, concrete_args, execute


@dataclass
class Outcome:
    in_bounds: bool     # the operation's result is representable within the bounds
    error: str          # "ok" or the spec's error class name
    after: dict         # the successor's snapshot
    unique: bool        # no other successor or error satisfies the relation


def evaluate(b: Bounds, op_name: str, snap: dict, values) -> Outcome:
    op = OPS[op_name]
    run = execute(Machine(b), op, to_state(b, snap), concrete_args(b, op, values))
    post, err = State.fresh(b, "post"), z3.Int("post.error")
    solver = z3.Solver()
    solver.add(same_state(b, post, run.state), err == run.err)
    solver.push()
    solver.add(*run.domain)
    if solver.check() != z3.sat:
        return Outcome(False, "", {}, True)
    model = solver.model()
    after, error = model_snapshot(model, post), model.eval(err).as_long()
    solver.pop()
    solver.add(z3.Not(z3.And(same_state(b, post, to_state(b, after)), err == error)))
    return Outcome(True, ERRORS[error], after, solver.check() == z3.unsat)
