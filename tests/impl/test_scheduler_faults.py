"""Scheduler steps are transactions in every state a run reaches: random workloads (prefix hits,
forks, preemption by swap or by recompute, swap-in, aborts), a fault planted at a random line of
one `schedule()` or `update()` call, the state checked unchanged, then the run goes on to the end
with no block leaked. Runs are deterministic, so an unfaulted twin run counts the call's lines."""

from hypothesis import given, settings, strategies as st

from pagedkv.impl import BlockManager, Scheduler, SchedulerConfig

from test_fault_injection import FaultInjector, Planted, scheduler_state

REQUESTS = st.lists(st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=7), st.integers(1, 6),
                              st.integers(1, 2)), min_size=1, max_size=6)


def build(requests, swap_cheap: bool) -> Scheduler:
    bm = BlockManager(8, 2, num_cpu_blocks=6, prefix_caching=True)
    config = SchedulerConfig(watermark=0.0, max_num_seqs=4, prefill_tokens_per_s=1.0 if swap_cheap else 1e12,
                             swap_bytes_per_s=1e18 if swap_cheap else 1.0)
    scheduler = Scheduler(bm, config)
    for i, (prompt, new_tokens, n) in enumerate(requests):
        scheduler.add_request(i, [1, 2] + prompt, new_tokens, n=n)   # at most 5 of the 8 blocks
    return scheduler


def samples(out) -> dict:
    return {seq_id: 3 for seq_id in out.seq_ids + list(out.forked)}


def advance(scheduler: Scheduler, steps: int) -> bool:
    """Run whole steps; False if the run finished first."""
    for _ in range(steps):
        if not scheduler.has_unfinished():
            return False
        scheduler.update(samples(scheduler.schedule()))
    return scheduler.has_unfinished()


@settings(max_examples=40, deadline=None)
@given(requests=REQUESTS, swap_cheap=st.booleans(), fault_step=st.integers(0, 20),
       fraction=st.floats(0.0, 1.0), in_update=st.booleans())
def test_a_fault_in_any_step_of_any_run_changes_nothing(requests, swap_cheap, fault_step, fraction, in_update):
    probe = build(requests, swap_cheap)
    steps = next(step for step in range(200) if not advance(probe, 1))   # the steps before the last
    fault_step %= steps + 1     # a step the run reaches: every example plants its fault
    scheduler, twin = build(requests, swap_cheap), build(requests, swap_cheap)
    assert advance(scheduler, fault_step) and advance(twin, fault_step)
    if in_update:
        out, twin_out = scheduler.schedule(), twin.schedule()
        call, twin_call = (lambda: scheduler.update(samples(out))), (lambda: twin.update(samples(twin_out)))
    else:
        call, twin_call = scheduler.schedule, twin.schedule
    with FaultInjector() as counter:
        twin_call()
    before = scheduler_state(scheduler)
    try:
        with FaultInjector(max(1, round(fraction * counter.lines)), Planted):
            call()
    except Planted:
        pass
    else:
        raise AssertionError("the planted fault did not fire")
    assert scheduler_state(scheduler) == before
    scheduler.bm.check()
    result = call()                              # the same call, undisturbed, goes through
    if not in_update:
        scheduler.update(samples(result))
    advance(scheduler, 200)
    assert not scheduler.has_unfinished()
    assert scheduler.bm.num_free_blocks() == 8 and scheduler.bm.num_free_cpu_blocks() == 6
    scheduler.bm.check()
