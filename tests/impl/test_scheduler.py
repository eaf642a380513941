"""Scheduler: watermark admission, latest-first preemption, the cost model both ways, shared blocks
not counted as freed, tables published only after the capacity check, and full runs."""

import random

import pytest

from pagedkv.impl import BlockManager
from pagedkv.impl import Scheduler, SchedulerConfig
from pagedkv.spec import InvalidArgument

RECOMPUTE_CHEAP = SchedulerConfig(watermark=0.0, prefill_tokens_per_s=1e12, swap_bytes_per_s=1.0)
SWAP_CHEAP = SchedulerConfig(watermark=0.0, prefill_tokens_per_s=1.0, swap_bytes_per_s=1e18)


def run_step(scheduler: Scheduler, token: int = 7):
    """One engine step: schedule, then sample `token` for every sequence that ran."""
    out = scheduler.schedule()
    scheduler.update({s: token for s in out.seq_ids + list(out.forked)})
    return out


def test_admission_keeps_the_watermark_free():
    bm = BlockManager(10, 4)
    scheduler = Scheduler(bm, SchedulerConfig(watermark=0.2))   # 2 blocks stay free
    with pytest.raises(InvalidArgument):                          # 9 blocks: over the watermark for good
        scheduler.add_request("a", list(range(33)), 4)
    scheduler.add_request("b", list(range(29)), 4)                # 8 blocks: fits an empty pool
    scheduler.add_request("c", [1], 4)                            # 1 more block would breach the watermark
    assert [p.seq_id for p in scheduler.schedule().prefills] == [0]
    assert bm.num_free_blocks() == 2
    bm2 = BlockManager(10, 4)
    scheduler2 = Scheduler(bm2, SchedulerConfig(watermark=0.2))
    scheduler2.add_request("a", list(range(32)), 4)               # 8 blocks: fits
    out = scheduler2.schedule()
    assert [p.seq_id for p in out.prefills] == [0] and out.prefills[0].num_computed_tokens == 32
    assert bm2.num_free_blocks() == 2


def test_max_num_seqs_limits_admission():
    scheduler = Scheduler(BlockManager(64, 4), SchedulerConfig(max_num_seqs=3))
    scheduler.add_request("a", [1, 2], 5, n=2)
    scheduler.add_request("b", [3], 5, n=2)
    out = scheduler.schedule()
    assert [p.seq_id for p in out.prefills] == [0] and out.forked == {1: 0}
    assert list(scheduler.waiting)[0].req_id == "b"


def fill_up(config: SchedulerConfig, num_cpu_blocks: int = 0):
    """Three one-block sequences admitted in order 0, 1, 2 fill 3 blocks of size 2; the next
    decode needs a new block for each, so two must go."""
    bm = BlockManager(3, 2, num_cpu_blocks=num_cpu_blocks)
    scheduler = Scheduler(bm, config)
    for name in "abc":
        scheduler.add_request(name, [1, 2], 10)
    out = run_step(scheduler)
    assert [p.seq_id for p in out.prefills] == [0, 1, 2]
    return bm, scheduler


def test_preempts_the_most_recently_admitted_first():
    bm, scheduler = fill_up(RECOMPUTE_CHEAP)
    out = run_step(scheduler)
    assert out.preempted == [2, 1] and out.decodes == [0]
    assert bm.status(1) == bm.status(2) == "waiting"
    assert list(scheduler.preempted) == [1, 2]               # earliest admitted resumes first


def test_cost_model_picks_recompute_when_prefill_is_cheap():
    bm, scheduler = fill_up(RECOMPUTE_CHEAP, num_cpu_blocks=8)
    out = run_step(scheduler)
    assert out.preempted and not out.swapped_out


def test_cost_model_picks_swap_when_the_link_is_fast():
    bm, scheduler = fill_up(SWAP_CHEAP, num_cpu_blocks=8)
    out = run_step(scheduler)
    assert out.swapped_out == [2, 1] and not out.preempted
    assert out.copies.swap_out.shape == (2, 2)
    assert bm.status(2) == "swapped"


def test_swap_needs_room_in_the_cpu_pool():
    bm, scheduler = fill_up(SWAP_CHEAP, num_cpu_blocks=1)
    out = run_step(scheduler)
    assert out.swapped_out == [2] and out.preempted == [1]   # the CPU pool filled after one


def test_cost_model_compares_recompute_time_with_twice_the_transfer():
    def admitted(swap_bytes_per_s):
        scheduler = Scheduler(BlockManager(8, 4, num_cpu_blocks=8), SchedulerConfig(
            prefill_tokens_per_s=8.0, kv_bytes_per_token=1, swap_bytes_per_s=swap_bytes_per_s))
        scheduler.add_request("r", list(range(8)), 4)          # 8 tokens, 2 blocks
        assert scheduler.schedule().seq_ids == [0]
        return scheduler

    assert admitted(16.0).preempt_mode(0) == "recompute"      # 1 s recompute vs 2*8/16 = 1 s swap
    assert admitted(17.0).preempt_mode(0) == "swap"


def test_blocks_shared_with_others_are_not_counted_as_freed():
    """Parent 0 and children 1, 2 share both prompt blocks (the tail partly filled). The decode
    needs 2 copy-on-writes with 1 block free. Preempting child 2 frees nothing, as its blocks stay
    for the others; then 0 copies and 1, the last sharer, writes in place: 1 block, which fits."""
    bm = BlockManager(3, 2)
    scheduler = Scheduler(bm, RECOMPUTE_CHEAP)
    scheduler.add_request("a", [1, 2, 3], 10, n=3)
    out = run_step(scheduler)
    assert out.forked == {1: 0, 2: 0} and bm.num_free_blocks() == 1
    free_after_preempt = []
    preempt = bm.preempt
    bm.preempt = lambda *a: (preempt(*a), free_after_preempt.append(bm.num_free_blocks()))[0]
    out = scheduler.schedule()
    assert out.preempted == [2] and free_after_preempt == [1]
    assert out.decodes == [0, 1] and out.copies.cow.shape == (1, 2)
    assert bm.refcount(bm.block_table(1)[0]) == 2
    bm.check()


def test_tables_published_only_after_the_capacity_check():
    """Spy on the block manager: within a step, every preemption comes before the batch append,
    and the tables are read after it."""
    bm, scheduler = fill_up(RECOMPUTE_CHEAP)
    calls = []   # (the block manager's own batch append is all or nothing as well)
    for name in ("preempt", "append_batch", "append", "block_tables", "slot_mapping"):
        method = getattr(bm, name)
        setattr(bm, name, lambda *a, _m=method, _n=name, **k: (calls.append(_n), _m(*a, **k))[1])
    out = scheduler.schedule()
    assert calls == ["preempt", "preempt", "append_batch", "block_tables", "slot_mapping"]
    assert out.block_tables.tolist() == [bm.block_table(0)]


def test_preempted_sequences_come_back_and_finish():
    for config, cpu in ((RECOMPUTE_CHEAP, 0), (SWAP_CHEAP, 16)):
        bm = BlockManager(6, 2, num_cpu_blocks=cpu, prefix_caching=True)
        scheduler = Scheduler(bm, config)
        for name in "abc":
            scheduler.add_request(name, [1, 2, 3], 6)
        finished, seen, samples = [], set(), {0: 0, 1: 0, 2: 0}
        for _ in range(60):
            out = scheduler.schedule()
            seen |= {"preempted"} if out.preempted else set()
            seen |= {"swapped"} if out.swapped_in else set()
            ran = out.seq_ids + list(out.forked)
            for seq_id in ran:
                samples[seq_id] += 1
            finished += scheduler.update({s: 5 for s in ran})
            bm.check()
            if not scheduler.has_unfinished():
                break
        assert sorted(finished) == [0, 1, 2] and samples == {0: 6, 1: 6, 2: 6}   # 6 new tokens each
        assert seen == ({"preempted"} if cpu == 0 else {"swapped"})
        assert bm.seq_ids() == [] and bm.num_free_blocks() == 6


def test_random_workload_runs_to_completion_without_leaks():
    rng = random.Random(1)
    bm = BlockManager(40, 4, num_cpu_blocks=12, prefix_caching=True)
    scheduler = Scheduler(bm, SchedulerConfig(watermark=0.05, max_num_seqs=8, prefill_tokens_per_s=50.0,
                                              kv_bytes_per_token=64, swap_bytes_per_s=1e5))
    lengths, wanted = {}, {}
    for i in range(12):
        max_new_tokens = rng.randrange(1, 20)
        ids = scheduler.add_request(i, [1, 2, 3, 4] + [rng.randrange(9) for _ in range(rng.randrange(1, 12))],
                                    max_new_tokens=max_new_tokens, n=rng.choice([1, 1, 2]))
        lengths.update({s: 0 for s in ids})
        wanted.update({s: max_new_tokens for s in ids})
    for _ in range(500):
        if not scheduler.has_unfinished():
            break
        out = scheduler.schedule()
        sampled = {s: rng.randrange(9) for s in out.seq_ids + list(out.forked)}
        for s in sampled:
            lengths[s] += 1
        for s in scheduler.update(sampled):
            lengths[s] = -lengths[s]   # mark finished
        bm.check()
    assert not scheduler.has_unfinished()
    # No eos and no sequence outgrows the pool: each finished on exactly its max_new_tokens-th sample.
    assert {s: -n for s, n in lengths.items()} == wanted
    assert bm.num_free_blocks() == 40 and bm.num_free_cpu_blocks() == 12


@pytest.mark.parametrize("kwargs", [{"max_new_tokens": 0}, {"n": 0}, {"prompt": []}])
def test_bad_requests_are_refused(kwargs):
    scheduler = Scheduler(BlockManager(4, 2))
    with pytest.raises(InvalidArgument):
        scheduler.add_request("a", **{"prompt": [1], "max_new_tokens": 2, **kwargs})
    assert not scheduler.waiting and scheduler.next_seq_id == 0 and not scheduler.request_of


def test_prompt_that_can_never_fit_is_refused_up_front():
    scheduler = Scheduler(BlockManager(4, 2), SchedulerConfig(watermark=0.0))
    with pytest.raises(InvalidArgument, match="prompt needs 5 blocks"):
        scheduler.add_request("big", [1] * 9, max_new_tokens=1)   # 9 tokens -> 5 blocks of 2
    assert not scheduler.has_unfinished()


def test_sequence_that_outgrows_the_whole_pool_is_aborted_not_livelocked():
    bm = BlockManager(2, 2)
    scheduler = Scheduler(bm, SchedulerConfig(watermark=0.0))
    [seq] = scheduler.add_request("long", [1, 2, 3], max_new_tokens=10)   # outgrows the pool at token 5
    aborted = []
    for _ in range(10):
        out = scheduler.schedule()
        aborted += out.aborted
        scheduler.update({s: 7 for s in out.seq_ids})
        if not scheduler.has_unfinished():
            break
    assert aborted == [seq] and not scheduler.has_unfinished()
    assert bm.num_free_blocks() == 2


def test_admission_heads_name_each_queue_head_and_whether_it_waits_for_blocks():
    # After fill_up's second step, 0 runs with 3 tokens (2 of the 3 blocks), 1 block is free, and
    # the victims 1 and 2 (2 tokens each) wait in the queue their preemption mode chose.
    bm, scheduler = fill_up(RECOMPUTE_CHEAP)
    run_step(scheduler)
    # A recompute victim re-prefills its 2 tokens plus its pending one: 2 blocks, 1 is free.
    assert scheduler.admission_heads() == [(1, 2)] and scheduler.waits_for_blocks()
    bm, scheduler = fill_up(SWAP_CHEAP, num_cpu_blocks=8)
    run_step(scheduler)
    # A swapped victim comes back on its 1 CPU block's worth plus a block for its pending token.
    assert scheduler.admission_heads() == [(1, 2)] and scheduler.waits_for_blocks()
    # New requests: 2 samples of a 5-token prompt need 3 blocks of 2 (the fork shares them); 2 are
    # free beside the admitted 4-token request.
    scheduler = Scheduler(BlockManager(4, 2), SchedulerConfig(watermark=0.0))
    scheduler.add_request("fits", [1, 2, 3, 4], 5)
    scheduler.add_request("big", [1, 2, 3, 4, 5], 5, n=2)
    run_step(scheduler)
    assert scheduler.admission_heads() == [(2, 3)] and scheduler.waits_for_blocks()
    # With no sequence slot left the head waits for a slot, not for blocks.
    scheduler = Scheduler(BlockManager(4, 2), SchedulerConfig(watermark=0.0, max_num_seqs=2))
    scheduler.add_request("fits", [1, 2, 3, 4], 5)
    scheduler.add_request("big", [1, 2, 3, 4, 5], 5, n=2)
    run_step(scheduler)
    assert scheduler.admission_heads() == [(2, 3)] and not scheduler.waits_for_blocks()
    # Once the running request is gone, the head fits: nothing waits.
    scheduler = Scheduler(BlockManager(4, 2), SchedulerConfig(watermark=0.0))
    scheduler.add_request("big", [1, 2, 3, 4, 5], 5, n=2)
    assert scheduler.admission_heads() == [(2, 3)] and not scheduler.waits_for_blocks()


def test_a_swapped_sequence_comes_back_once_its_blocks_and_its_pending_tokens_are_free():
    bm = BlockManager(4, 2, num_cpu_blocks=8)
    scheduler = Scheduler(bm, SWAP_CHEAP)
    scheduler.add_request("a", [1, 2, 3], 2)   # 2 blocks; finishes with its second token
    scheduler.add_request("b", [1, 2], 10)
    scheduler.add_request("c", [5, 6], 10)
    run_step(scheduler)                         # all three admitted: the 4 blocks are taken
    out = run_step(scheduler)                   # b and c need a block each: c (latest) swaps out
    assert out.swapped_out == [2] and out.decodes == [0, 1] and bm.num_free_blocks() == 2   # a finished
    # c comes back on 1 block for its 1 CPU block plus 1 for its pending token: exactly the 2 free.
    out = run_step(scheduler)
    assert out.swapped_in == [2] and out.decodes == [1, 2] and bm.num_free_blocks() == 0


def test_a_swapped_sequence_with_room_in_its_tail_needs_no_block_for_its_pending_token():
    """Swapped out at 35 tokens (9 blocks of 4, 1 slot free), B comes back on its own 9 blocks: it
    is neither aborted as outgrown (9 <= 10 - 1 above the watermark) nor kept waiting for a 10th."""
    bm = BlockManager(10, 4, num_cpu_blocks=20)
    scheduler = Scheduler(bm, SchedulerConfig(watermark=0.1, prefill_tokens_per_s=1.0, swap_bytes_per_s=1e18))
    a, = scheduler.add_request("A", [1], 10)            # 1 block
    b, = scheduler.add_request("B", list(range(32)), 5)  # 8 full blocks; at most 36 tokens = 9 blocks
    outs = [run_step(scheduler) for _ in range(5)]     # both admitted, B writes 3 tokens, A's 4th decode swaps B out
    assert [out.swapped_out for out in outs] == [[], [], [], [], [b]] and not any(out.aborted for out in outs)
    assert bm.length(b) == 35 and len(bm.cpu_block_table(b)) == 9
    assert scheduler.admission_heads() == [(1, 9)]
    outs = [run_step(scheduler) for _ in range(12)]
    assert b in [seq for out in outs for seq in out.swapped_in]
    assert not any(out.aborted for out in outs) and not scheduler.has_unfinished()


class Lying(int):
    """An int subclass whose operators disagree with its value."""

    def __int__(self):
        return 0

    def __radd__(self, other):
        return -5

    def __le__(self, other):
        return True

    def __ge__(self, other):
        return True


def test_request_counts_are_read_by_value_not_through_an_int_subclass_operators():
    scheduler = Scheduler(BlockManager(8, 2), SchedulerConfig(watermark=0.0, max_num_seqs=4))
    assert scheduler.add_request("x", [1, 2], Lying(3), n=Lying(2)) == [0, 1]
    assert scheduler.next_seq_id == 2 and scheduler.waiting[0].max_new_tokens == 3
    for bad in (Lying(0), Lying(-1), Lying(5)):   # out of range by value, whatever they compare as
        with pytest.raises(InvalidArgument, match="n must be an int"):
            scheduler.add_request("y", [1], 1, n=bad)
    with pytest.raises(InvalidArgument, match="max_new_tokens"):
        scheduler.add_request("y", [1], Lying(0))
    with pytest.raises(InvalidArgument, match="token"):
        scheduler.add_request("y", [Lying(-1)], 1)
    with pytest.raises(InvalidArgument, match="max_num_seqs"):
        SchedulerConfig(max_num_seqs=Lying(0))
    assert type(SchedulerConfig(max_num_seqs=Lying(4)).max_num_seqs) is int
    assert scheduler.next_seq_id == 2 and len(scheduler.waiting) == 1   # nothing queued by a refusal


def test_the_default_kv_bytes_per_token_is_llama_3_8b_in_bf16():
    """The swap-vs-recompute cost model's default token size: K and V, 32 layers, 8 KV heads of 128
    dimensions, 2 bytes each (Llama-3-8B's config.json, bf16)."""
    k_and_v, layers, kv_heads, head_dim, bf16 = 2, 32, 8, 128, 2
    assert SchedulerConfig().kv_bytes_per_token == k_and_v * layers * kv_heads * head_dim * bf16


class RehashedId(int):
    """An int subclass that hashes apart from its value: a dict holds it beside the plain id it equals."""

    def __hash__(self):
        return hash(("rehashed", int(self)))


def test_update_refuses_a_sequence_named_twice_and_changes_nothing():
    scheduler = Scheduler(BlockManager(8, 4), SchedulerConfig(watermark=0.0))
    scheduler.add_request("a", [1, 2, 3], 1)                    # one token to generate: its sample finishes it
    [seq_id] = scheduler.schedule().seq_ids
    twice = {seq_id: 5, RehashedId(seq_id): 6}
    assert len(twice) == 2                                      # two keys, both naming the same sequence
    with pytest.raises(InvalidArgument, match="twice"):
        scheduler.update(twice)
    # Nothing was recorded: the sequence still awaits its one sample, which then finishes it.
    assert scheduler.update({seq_id: 5}) == [seq_id]
