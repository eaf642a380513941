"""Trace simulator: hand-computable replays, utilization bounds as properties, fragmentation, CLI smoke."""
import json

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv.cli.main import main
from pagedkv.impl.sim import simulator as sim
from pagedkv.impl.sim.contiguous import ContiguousAllocator
from pagedkv.impl.sim.trace import Request, TraceConfig, synthesize, write_trace


def config(allocator, *, block_size=4, num_blocks=64, max_seq_len=32, **kw):
    return sim.SimConfig(allocator, block_size, num_blocks, bytes_per_token=1024, max_seq_len=max_seq_len, **kw)


# ------------------------------------------------------------------ contiguous allocator

def test_first_fit_takes_the_lowest_hole_that_fits():
    a = ContiguousAllocator(100)
    for owner, size in (("a", 30), ("b", 20), ("c", 30)):
        assert a.admit(owner, size, used=1)
    a.free("a")
    a.free("c")
    assert a.holes() == [30, 50]
    assert a.admit("d", 40, used=0) and a.ranges["d"].start == 50   # skips the 30-slot hole
    assert a.admit("e", 25, used=0) and a.ranges["e"].start == 0


def test_fragmentation_refuses_although_the_free_total_suffices():
    a = ContiguousAllocator(100)
    for owner in "abcd":
        assert a.admit(owner, 25, used=0)
    a.free("a")
    a.free("c")
    assert a.free_slots == 50 and a.largest_hole == 25
    assert not a.admit("e", 40, used=0)
    assert (a.refusals, a.fragmented_refusals) == (1, 1)
    assert "e" not in a.ranges and a.free_slots == 50


def test_a_reservation_never_grows():
    a = ContiguousAllocator(10)
    assert a.admit("a", 4, used=3)
    a.grow("a")
    with pytest.raises(ValueError):
        a.grow("a")


# ------------------------------------------------------------------ token ids

def test_prefix_groups_share_exactly_their_prefix():
    r1 = Request(0.0, 10, 2, prefix_group=1, prefix_len=6)
    r2 = Request(0.0, 8, 2, prefix_group=1, prefix_len=6)
    r3 = Request(0.0, 8, 2)
    t1, t2, t3 = sim.prompt_tokens(0, r1), sim.prompt_tokens(1, r2), sim.prompt_tokens(2, r3)
    assert (len(t1), len(t2)) == (10, 8)
    assert t1[:6] == t2[:6] and not set(t1[6:]) & set(t2[6:])
    assert not set(t3) & (set(t1) | set(t2))


@pytest.mark.parametrize("group", [0, 2**38, 2**63 - 1])
def test_any_int64_group_id_shares_its_prefix(group):
    # Group ids are renumbered densely before they become token ids, so the largest ids a trace may
    # hold hit the prefix cache exactly like group 0 (they used to overflow the int64 token range).
    reqs = [Request(0.0, 40, 4, prefix_group=group, prefix_len=32), Request(0.5, 40, 4, prefix_group=group,
                                                                         prefix_len=32)]
    s = sim.simulate(reqs, config("paged", block_size=16, num_blocks=64, max_seq_len=64,
                                  prefix_caching=True)).summary()
    assert s["requests"] == 2 and s["rejected"] == 0
    assert s["prefix_hit_rate"] == pytest.approx(32 / 80)   # the second prompt's two full shared blocks


def test_rejections_are_counted_by_reason():
    reqs = [Request(0.0, 30, 10), Request(0.0, 8, 4), Request(0.0, 20, 4)]
    s = sim.simulate(reqs, config("paged", block_size=4, num_blocks=5, max_seq_len=32)).summary()
    # 40 tokens exceed max_seq_len; 24 tokens need 6 blocks of a 5-block pool; 12 tokens fit.
    assert (s["rejected_too_long"], s["rejected_too_large"], s["rejected"], s["requests"]) == (1, 1, 2, 1)


@pytest.mark.parametrize("allocator", ["paged", "contiguous"])
def test_a_request_of_more_samples_than_sequence_slots_is_rejected(allocator):
    # Its samples are admitted together, one slot each: 3 samples never fit max_num_seqs = 2.
    reqs = [Request(0.0, 4, 2, num_samples=3), Request(0.0, 4, 2, num_samples=2)]
    s = sim.simulate(reqs, config(allocator, block_size=4, num_blocks=16, max_seq_len=8, max_num_seqs=2)).summary()
    assert (s["rejected_too_large"], s["requests"]) == (1, 1)


# ------------------------------------------------------------------ hand-computed replays

TWO = [Request(0.0, prompt_len=5, output_len=3), Request(0.0, prompt_len=9, output_len=2)]


def test_contiguous_two_requests_by_hand():
    # Both are admitted in step 1 (14 prompt tokens), each reserving max_seq_len = 32 slots.
    r = sim.simulate(TWO, config("contiguous"))
    t = r.timeline
    assert t["reserved"] == [64, 64, 32]          # the second request finishes after step 2
    assert t["useful"] == [5 + 9, 6 + 10, 7]      # prompt, then one token fed per step
    assert t["sequences"] == [2, 2, 1]
    cost = sim.CostModel()
    assert t["dt"][0] == pytest.approx(cost.step_seconds(14, 0, 0))
    assert t["dt"][1] == pytest.approx(cost.step_seconds(0, 2, 0))
    assert r.ttft == pytest.approx([t["dt"][0]] * 2)
    assert r.summary()["utilization_mean"] == pytest.approx(
        sum(u * d for u, d in zip(t["useful"], t["dt"])) / sum(v * d for v, d in zip(t["reserved"], t["dt"])))


def test_paged_two_requests_by_hand():
    # Block size 4: lengths 5 and 9 take 2 + 3 blocks; the same steps as above.
    r = sim.simulate(TWO, config("paged"))
    t = r.timeline
    assert t["useful"] == [14, 16, 7]
    assert t["reserved"] == [4 * (2 + 3), 4 * (2 + 3), 4 * 2]
    assert t["table_blocks"] == [5, 5, 2] and t["table_max"] == [3, 3, 2]
    s = r.summary()
    assert s["block_table_len_mean"] == pytest.approx(12 / 5)
    assert (s["oom_events"], s["preempt_recompute"], s["preempt_swap"]) == (0, 0, 0)


def test_contiguous_request_waits_for_a_range():
    # Pool of 64 slots = two reservations of 32: the third request waits for the first to finish.
    reqs = [Request(0.0, 4, 3), Request(0.0, 4, 5), Request(0.0, 4, 1)]
    r = sim.simulate(reqs, config("contiguous", num_blocks=16))
    s = r.summary()
    assert s["concurrency_peak"] == 2 and s["admissions_delayed"] == 1 and s["oom_events"] >= 1
    # The first ends in step 3; the third is admitted in step 4 and, with one output token, ends there.
    assert r.timeline["sequences"] == [2, 2, 2, 2, 1]


# ------------------------------------------------------------------ properties

requests = st.lists(st.builds(Request, arrival=st.floats(0, 2), prompt_len=st.integers(1, 40),
                              output_len=st.integers(1, 20)), min_size=1, max_size=12
                    ).map(lambda rs: sorted(rs, key=lambda r: r.arrival))


@settings(max_examples=25, deadline=None)
@given(requests, st.sampled_from([1, 4, 16]))
def test_paged_utilization_is_within_the_tail_bound(reqs, block_size):
    r = sim.simulate(reqs, config("paged", block_size=block_size, num_blocks=40 * 16 // block_size, max_seq_len=64))
    t = r.timeline
    for useful, reserved, seqs in zip(t["useful"], t["reserved"], t["sequences"]):
        assert useful <= reserved
        assert reserved - useful <= (block_size - 1) * seqs   # only tail blocks are partly filled
    assert len(r.ttft) == len(reqs)


@settings(max_examples=25, deadline=None)
@given(requests)
def test_contiguous_never_beats_paged_utilization(reqs):
    paged = sim.simulate(reqs, config("paged", num_blocks=256, max_seq_len=64)).summary()
    contiguous = sim.simulate(reqs, config("contiguous", num_blocks=256, max_seq_len=64)).summary()
    assert contiguous["utilization_mean"] <= paged["utilization_mean"] + 1e-9
    assert paged["requests"] == contiguous["requests"] == len(reqs)


# ------------------------------------------------------------------ the seed scenario, small

def test_seed_scenario_paged_far_above_contiguous():
    reqs = synthesize(TraceConfig(num_requests=150, seed=3, rate=20))
    # 1024 blocks of 16 = 16,384 slots: room for 8 contiguous reservations of max_seq_len 2048.
    runs = {kind: sim.simulate(reqs, sim.SimConfig(kind, 16, 1024, 131072)).summary() for kind in sim.ALLOCATORS}
    paged, contiguous = runs["paged"], runs["contiguous"]
    assert contiguous["utilization_mean"] < 0.35 and contiguous["concurrency_peak"] == 8
    assert paged["utilization_mean"] > 0.95
    assert paged["utilization_mean"] >= paged["tail_bound_mean"]
    assert paged["utilization_mean"] == pytest.approx(paged["tail_expected_mean"], abs=0.01)
    assert paged["concurrency_peak"] > 2 * contiguous["concurrency_peak"]
    assert paged["ttft_p50_s"] < contiguous["ttft_p50_s"]


def test_prefix_caching_hits_on_shared_prefixes():
    reqs = synthesize(TraceConfig(num_requests=40, seed=2, rate=50, prefix_fraction=1.0, prefix_groups=2,
                                  prefix_len=64))
    s = sim.simulate(reqs, config("paged", block_size=16, num_blocks=1024, max_seq_len=2048,
                                  prefix_caching=True)).summary()
    assert s["prefix_hit_rate"] > 0.05


def test_parallel_samples_fork_and_copy_on_write_by_hand():
    # 4 samples of a 42-token prompt, B = 4: the prefill fills 11 blocks (the tail holds 2), which the
    # forks share. Step 2: each sample writes into the shared tail, so three copy it first (the last
    # holder writes in place): 11 + 3 blocks. Step 3: every tail takes its 4th token.
    r = sim.simulate([Request(0.0, 42, 3, num_samples=4)], config("paged", num_blocks=64, max_seq_len=64))
    t = r.timeline
    assert t["sequences"] == [4, 4, 4]
    assert t["useful"] == [42, 40 + 4 * 3, 40 + 4 * 4]
    assert t["reserved"] == [44, 56, 56]
    assert r.counters["cow_copies"] == 3
    assert len(r.itl) == 4 * 2


@pytest.mark.parametrize("swap_blocks, mode", [(0, "recompute"), (16, "swap")])
def test_paged_preempts_and_resumes_under_pressure(swap_blocks, mode):
    # Three sequences grow to 11 tokens = 3 blocks each in an 8-block pool: someone must give way.
    # With host room, swapping 3 blocks at this bandwidth is cheaper than re-prefilling 8+ tokens.
    reqs = [Request(0.0, 4, 8) for _ in range(3)]
    cfg = config("paged", num_blocks=8, num_cpu_blocks=swap_blocks, cost=sim.CostModel(swap_bytes_per_s=1e15))
    r = sim.simulate(reqs, cfg)
    s = r.summary()
    assert s[f"preempt_{mode}"] >= 1 and s["oom_events"] >= 1
    assert s["preempt_recompute" if mode == "swap" else "preempt_swap"] == 0
    assert len(r.ttft) == 3 and len(r.itl) == 3 * 7   # everyone finished all 8 tokens
    assert max(r.timeline["reserved"]) <= 8 * 4


# ------------------------------------------------------------------ CLI

def test_cli_smoke_writes_files(tmp_path):
    trace = tmp_path / "t.jsonl"
    write_trace(trace, synthesize(TraceConfig(num_requests=30, seed=0, rate=10, prompt=_len(60), output=_len(20),
                                              max_seq_len=256)))
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["simulate", str(trace), "--allocator", "both", "--block-size", "16",
                                       "--pool-blocks", "64", "--max-seq-len", "256", "--out", str(out),
                                       "--sweep", "8,16,32"])
    assert result.exit_code == 0, result.output
    assert "KV utilization" in result.output and "cost model" in result.output
    for name in ("summary.json", "timeline_paged.csv", "timeline_contiguous.csv", "utilization.png",
                 "latency_cdf.png", "concurrency.png", "preemptions.png", "block_size_sweep.csv",
                 "block_size_sweep.png"):
        assert (out / name).stat().st_size > 0, name
    summary = json.loads((out / "summary.json").read_text())
    assert [run["allocator"] for run in summary["runs"]] == ["contiguous", "paged"]
    assert [row["block_size"] for row in summary["block_size_sweep"]] == [8, 16, 32]


def test_cli_needs_one_pool_size(tmp_path):
    trace = tmp_path / "t.jsonl"
    write_trace(trace, TWO)
    result = CliRunner().invoke(main, ["simulate", str(trace)])
    assert result.exit_code != 0 and "exactly one of" in result.output


def _len(mean):
    from pagedkv.impl.sim.trace import LengthDist
    return LengthDist("lognormal", mean, 0.5)


# ------------------------------------------------------------------ plots

def _figures(monkeypatch):
    from pagedkv.impl.sim import report
    figures = []
    monkeypatch.setattr(report, "_save", lambda fig, path: figures.append(fig) or path)
    return report, figures


def _legend(ax) -> list:
    return [text.get_text() for text in ax.get_legend().get_texts()]


def test_plots_label_every_series_and_give_contiguous_no_block_size(monkeypatch, tmp_path):
    report, figures = _figures(monkeypatch)
    results = [sim.simulate(TWO, config(kind, prefix_caching=kind == "paged")) for kind in sim.ALLOCATORS]
    sweep = [report.headline(sim.simulate(TWO, config("paged", block_size=b))) for b in (2, 4)]
    report.write_outputs(tmp_path, results, sweep, "cost")
    utilization, latency, concurrency, preemptions, swept = figures
    assert [label.split(" (")[0] for label in _legend(utilization.axes[0])] == ["contiguous",
                                                                               "paged, B=4 +prefix cache"]
    assert all(len(_legend(ax)) == 2 for ax in latency.axes)               # TTFT and ITL, one CDF per run
    assert len(_legend(concurrency.axes[0])) == 4                          # running and waiting, per run
    assert "0 by recompute, 0 by swap" in _legend(preemptions.axes[0])[1]
    left, right = swept.axes[:2]
    assert len(_legend(left)) == 3
    assert _legend(right) == ["mean tail waste (MiB)", "mean block-table length (blocks)"]   # both axes' series
