"""The encoding is the spec: on concrete states reached by the spec itself, the Z3 transition of
every operation has exactly one outcome, and it is the spec's (same successor, same error)."""
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pagedkv.proofs.convert import snapshot
from pagedkv.proofs.encoding import Bounds
from pagedkv.proofs.ops import OPS, call_spec
from pagedkv.proofs.tie import evaluate
from pagedkv.spec import KVSpec, PagedKVError

BOUNDS = {caching: Bounds(4, 2, 3, 3, 2, prefix_caching=caching) for caching in (True, False)}
B = BOUNDS[True]

seq_ids = st.integers(0, B.max_seqs - 1)
tokens = st.integers(0, 2)                      # few values, so prefixes repeat and the cache hits
any_token = st.one_of(tokens, st.just(-1))      # -1: InvalidArgument

ARGS = {
    "add": st.tuples(seq_ids, st.lists(any_token, max_size=B.max_tokens)),
    "append": st.tuples(seq_ids, any_token),
    "fork": st.tuples(seq_ids, seq_ids),
    "free": st.tuples(seq_ids),
    "preempt_recompute": st.tuples(seq_ids),
    "preempt_swap": st.tuples(seq_ids),
    "resume": st.tuples(seq_ids),
    "step": st.dictionaries(seq_ids, any_token).map(lambda d: (dict(sorted(d.items())),)),
}
calls = st.one_of([st.tuples(st.just(name), args) for name, args in ARGS.items()])


def fits(kv: KVSpec, name: str, values) -> bool:
    """The call keeps every sequence within the bounds' max_tokens."""
    grows = [values[0]] if name == "append" else list(values[0]) if name == "step" else []
    return all(s not in kv.seqs or kv.length(s) < B.max_tokens for s in grows)


@st.composite
def spec_states(draw, caching: bool) -> KVSpec:
    kv = KVSpec(B.num_blocks, B.block_size, num_cpu_blocks=B.num_cpu_blocks, prefix_caching=caching)
    for name, values in draw(st.lists(calls, max_size=14)):
        if fits(kv, name, values):
            try:
                call_spec(kv, OPS[name], values)
            except PagedKVError:
                pass
    return kv


@pytest.mark.parametrize("op_name", list(OPS))
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), caching=st.booleans())
def test_encoded_transition_is_the_spec(op_name, data, caching):
    kv = data.draw(spec_states(caching))
    values = data.draw(ARGS[op_name])
    before = snapshot(kv)
    encoded = evaluate(BOUNDS[caching], op_name, before, values)
    assume(encoded.in_bounds)
    try:
        call_spec(kv, OPS[op_name], values)
        spec_error = "ok"
    except PagedKVError as error:
        spec_error = type(error).__name__
    assert encoded.unique, "the encoded transition allows more than one outcome"
    assert encoded.error == spec_error
    assert encoded.after == snapshot(kv)
    if spec_error != "ok":
        assert encoded.after == before


def test_out_of_bounds_is_reported_not_compared():
    kv = KVSpec(B.num_blocks, B.block_size, num_cpu_blocks=B.num_cpu_blocks)
    kv.add(0, [1] * B.max_tokens)
    assert not evaluate(B, "append", snapshot(kv), (0, 1)).in_bounds


def test_a_step_that_preempts_nothing_appends_to_the_latest_admitted_sequence():
    """The encoded step once dropped the latest admitted running sequence from every batch, as if
    each unrolled round had preempted it (found replaying a stored Hypothesis example)."""
    kv = KVSpec(B.num_blocks, B.block_size, num_cpu_blocks=B.num_cpu_blocks, prefix_caching=True)
    kv.add(1, [2])
    kv.fork(1, 2)                  # 2 is admitted last and shares 1's partial tail
    encoded = evaluate(B, "step", snapshot(kv), ({2: 0},))
    kv.step({2: 0})                # copy-on-write of the tail, then the write
    assert encoded.unique and encoded.error == "ok" and encoded.after == snapshot(kv)
    assert kv.tokens(2) == [2, 0]
