"""Concrete `KVSpec` states <-> encoded states, through one canonical snapshot.

`snapshot(kv)` and `model_snapshot(model, state)` give the same plain-Python description of a spec
state (queues in order, ref counts, ghost slots as token tuples, the prefix index as block -> key
tokens, every sequence), so "the Z3 successor equals the spec's" is a dict comparison, and the same
snapshot renders counterexamples in domain terms (`describe`).
"""
import z3

from pagedkv.spec import KVSpec

from .encoding import NIL, STATUS_NAMES, Bounds, State, Toks


class OutsideBounds(ValueError):
    """The concrete state does not fit the encoding's bounds."""


def _slot(kv_slot):
    return None if kv_slot is None else kv_slot.prefix + (kv_slot.token,)


def _index(kv: KVSpec) -> dict:
    """block -> key tokens; each key must be the tokens its block's last slot completes."""
    index = kv.cached_blocks()
    for block, key in index.items():
        if len(key) % kv.block_size or (_slot(kv.slots[block][-1]) or ()) != key:
            raise OutsideBounds(f"block {block}'s key does not name its tokens")
    return index


def snapshot(kv: KVSpec) -> dict:
    return {
        "ref": list(kv.ref_count),
        "slots": [[_slot(x) for x in row] for row in kv.slots],
        "free": list(kv.free_queue),
        "evictable": list(kv.evictable),
        "index": _index(kv),
        "cpu_slots": [[_slot(x) for x in row] for row in kv.cpu_slots],
        "cpu_free": list(kv.cpu_free_queue),
        "clock": kv.admissions,
        "seqs": {sid: {"status": seq.status, "tokens": list(seq.tokens), "table": list(seq.block_table),
                       "cpu_table": list(seq.cpu_block_table), "admitted": seq.admitted,
                       "cached": seq.cached_tokens}
                 for sid, seq in sorted(kv.seqs.items())},
    }


def toks_term(tokens) -> z3.DatatypeRef:
    term = NIL
    for token in tokens:
        term = Toks.cons(z3.IntVal(token), term)
    return term


def _pad(items, size, fill):
    if len(items) > size:
        raise OutsideBounds(f"{len(items)} entries exceed the bound {size}")
    return list(items) + [fill] * (size - len(items))


def to_state(b: Bounds, snap: dict) -> State:
    """The encoded state of a snapshot (constants only)."""
    N, S, T, L = b.num_blocks, b.max_seqs, b.max_blocks_per_seq, b.max_tokens
    if len(snap["ref"]) != N or len(snap["cpu_slots"]) != b.num_cpu_blocks or \
            any(len(row) != b.block_size for row in snap["slots"]):
        raise OutsideBounds("pool sizes differ from the bounds")
    if any(not (isinstance(sid, int) and 0 <= sid < S) for sid in snap["seqs"]):
        raise OutsideBounds(f"sequence ids must lie in 0..{S - 1}")
    I, seqs = z3.IntVal, snap["seqs"]

    def per_seq(field, default):
        return [seqs[q][field] if q in seqs else default for q in range(S)]

    def slot(value):
        return NIL if value is None else toks_term(value)

    status = per_seq("status", "waiting")
    return State(
        ref=[I(r) for r in snap["ref"]], slots=[[slot(x) for x in row] for row in snap["slots"]],
        free=[I(x) for x in _pad(snap["free"], N, 0)], free_len=I(len(snap["free"])),
        evict=[I(x) for x in _pad(snap["evictable"], N, 0)], evict_len=I(len(snap["evictable"])),
        hashed=[z3.BoolVal(blk in snap["index"]) for blk in range(N)],
        key=[toks_term(snap["index"].get(blk, ())) for blk in range(N)],
        cpu_slots=[[slot(x) for x in row] for row in snap["cpu_slots"]],
        cpu_free=[I(x) for x in _pad(snap["cpu_free"], b.num_cpu_blocks, 0)],
        cpu_free_len=I(len(snap["cpu_free"])),
        live=[z3.BoolVal(q in seqs) for q in range(S)],
        status=[I(STATUS_NAMES.index(x)) for x in status],
        ntok=[I(len(t)) for t in per_seq("tokens", [])],
        toks=[[I(x) for x in _pad(t, L, 0)] for t in per_seq("tokens", [])],
        table=[[I(x) for x in _pad(t, T, 0)] for t in per_seq("table", [])],
        tlen=[I(len(t)) for t in per_seq("table", [])],
        cpu_table=[[I(x) for x in _pad(t, T, 0)] for t in per_seq("cpu_table", [])],
        cpu_tlen=[I(len(t)) for t in per_seq("cpu_table", [])],
        admitted=[I(x) for x in per_seq("admitted", 0)], cached=[I(x) for x in per_seq("cached", 0)],
        clock=I(snap["clock"]))


def _is_cons(term) -> bool:
    return term.decl().eq(Toks.cons)


def _toks(term) -> tuple:
    out = []
    while _is_cons(term):
        out.append(term.arg(0).as_long())
        term = term.arg(1)
    return tuple(reversed(out))


def model_snapshot(model: z3.ModelRef, s: State) -> dict:
    """The snapshot of the state `s` denotes under `model`."""
    def val(term):
        return model.eval(term, model_completion=True)

    def num(term):
        return val(term).as_long()

    def queue(items, length):
        return [num(x) for x in items[:num(length)]]

    def slot(term):
        value = _toks(val(term))
        return value or None

    seqs = {}
    for q in range(len(s.live)):
        if z3.is_true(val(s.live[q])):
            ntok = num(s.ntok[q])
            seqs[q] = {"status": STATUS_NAMES[num(s.status[q])], "tokens": [num(t) for t in s.toks[q][:ntok]],
                       "table": queue(s.table[q], s.tlen[q]), "cpu_table": queue(s.cpu_table[q], s.cpu_tlen[q]),
                       "admitted": num(s.admitted[q]), "cached": num(s.cached[q])}
    return {
        "ref": [num(r) for r in s.ref],
        "slots": [[slot(x) for x in row] for row in s.slots],
        "free": queue(s.free, s.free_len),
        "evictable": queue(s.evict, s.evict_len),
        "index": {blk: _toks(val(k)) for blk, (h, k) in enumerate(zip(s.hashed, s.key)) if z3.is_true(val(h))},
        "cpu_slots": [[slot(x) for x in row] for row in s.cpu_slots],
        "cpu_free": queue(s.cpu_free, s.cpu_free_len),
        "clock": num(s.clock),
        "seqs": seqs,
    }


def describe(snap: dict) -> str:
    """A snapshot in domain terms: tables, ref counts, queues, the prefix index."""
    lines = [f"  ref counts {snap['ref']}  free queue {snap['free']}  evictable {snap['evictable']}  "
             f"cpu free {snap['cpu_free']}"]
    if snap["index"]:
        lines.append("  prefix index " + ", ".join(f"block {b} <- {list(k)}" for b, k in sorted(snap["index"].items())))
    for sid, seq in snap["seqs"].items():
        cpu = f" cpu table {seq['cpu_table']}" if seq["cpu_table"] else ""
        lines.append(f"  seq {sid} {seq['status']:<8} tokens {seq['tokens']} table {seq['table']}{cpu}")
    filled = [f"{b}:{['.' if x is None else x[-1] for x in row]}" for b, row in enumerate(snap["slots"])]
    lines.append("  slots (last token per slot) " + " ".join(filled))
    return "\n".join(lines)
