"""The operations as data: their parameters, symbolic or concrete arguments, and how to run each on
the encoding (`execute`) and on the executable spec (`call_spec`)."""
from dataclasses import dataclass

import z3

from .encoding import Bounds, Machine, Run, State


@dataclass(frozen=True)
class Op:
    name: str
    params: tuple   # kinds: "seq", "token", "prompt", "batch"


OPS = {op.name: op for op in [
    Op("add", ("seq", "prompt")),
    Op("append", ("seq", "token")),
    Op("fork", ("seq", "seq")),
    Op("free", ("seq",)),
    Op("preempt_recompute", ("seq",)),
    Op("preempt_swap", ("seq",)),
    Op("resume", ("seq",)),
    Op("step", ("batch",)),
]}


def symbolic_args(b: Bounds, op: Op, name: str):
    """(args, domain): fresh constants for the op's parameters and the range they may take."""
    args, domain = [], []
    for i, kind in enumerate(op.params):
        tag = f"{name}.{op.name}.{i}"
        if kind == "seq":
            sid = z3.Int(tag)
            args.append(sid)
            domain += [0 <= sid, sid < b.max_seqs]
        elif kind == "token":
            args.append(z3.Int(tag))
        elif kind == "prompt":
            n = z3.Int(f"{tag}.n")
            args.append((n, [z3.Int(f"{tag}.t{k}") for k in range(b.max_tokens)]))
            domain += [0 <= n, n <= b.max_tokens]
        else:
            args.append([(z3.Bool(f"{tag}.in{q}"), z3.Int(f"{tag}.t{q}")) for q in range(b.max_seqs)])
    return args, domain


def concrete_args(b: Bounds, op: Op, values):
    """Encoded arguments for Python values as the spec takes them."""
    args = []
    for kind, value in zip(op.params, values):
        if kind in ("seq", "token"):
            args.append(z3.IntVal(value))
        elif kind == "prompt":
            if len(value) > b.max_tokens:
                raise ValueError("prompt longer than the bounds allow")
            args.append((z3.IntVal(len(value)), [z3.IntVal(t) for t in value] + [z3.IntVal(0)] * (b.max_tokens - len(value))))
        else:
            args.append([(z3.BoolVal(q in value), z3.IntVal(value.get(q, 0))) for q in range(b.max_seqs)])
    return args


def execute(machine: Machine, op: Op, state: State, args) -> Run:
    run = Run(state)
    if op.name == "add":
        sid, (n, tokens) = args
        machine.add(run, sid, n, tokens)
    else:
        getattr(machine, op.name)(run, *args)
    return run


def call_spec(kv, op: Op, values):
    """Run the op on a KVSpec with Python argument values."""
    if op.name.startswith("preempt_"):
        return kv.preempt(values[0], op.name[len("preempt_"):])
    return getattr(kv, op.name)(*values)


def model_args(model: z3.ModelRef, op: Op, args) -> list:
    """The Python values of symbolic arguments under a model (for counterexamples)."""
    def num(term):
        return model.eval(term, model_completion=True).as_long()

    values = []
    for kind, arg in zip(op.params, args):
        if kind == "prompt":
            n, tokens = arg
            values.append([num(t) for t in tokens[:num(n)]])
        elif kind == "batch":
            values.append({q: num(t) for q, (m, t) in enumerate(arg) if z3.is_true(model.eval(m, model_completion=True))})
        else:
            values.append(num(arg))
    return values


def render_call(op: Op, values) -> str:
    return f"{op.name}({', '.join(map(repr, values))})"
