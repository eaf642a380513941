"""Traces: JSONL round trip and validation, the seeded synthesizer, statistics, and `pagedkv trace`."""
import json
import statistics

import pytest
from click.testing import CliRunner
from hypothesis import given, settings, strategies as st

from pagedkv.cli.trace import trace as trace_cmd
from pagedkv.impl.sim.trace import (MAX_ARRIVAL, MAX_LINE, MAX_MEAN_SPAN, LengthDist, Request, TraceConfig,
                                TraceError, parse_trace, read_trace, synthesize, synthesize_chunks, trace_stats,
                                write_trace)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 300), chunk=st.integers(1, 64), seed=st.integers(0, 2**32),
       kind=st.sampled_from(["lognormal", "uniform", "fixed"]))
def test_streaming_in_chunks_draws_the_same_trace(n, chunk, seed, kind):
    # The reference is one draw per column (one chunk), as the synthesizer did before it streamed.
    cfg = TraceConfig(n, seed=seed, prompt=LengthDist(kind, 60), output=LengthDist(kind, 20), max_seq_len=128,
                      prefix_fraction=0.5, prefix_len=8, sample_prob=0.3)
    whole = [r for c in synthesize_chunks(cfg, chunk=n) for r in c]
    chunks = list(synthesize_chunks(cfg, chunk=chunk))
    assert [len(c) for c in chunks] == [min(chunk, n - i) for i in range(0, n, chunk)]
    assert [r for c in chunks for r in c] == whole == synthesize(cfg)


def test_write_trace_streams_to_stdout(capsys):
    requests = synthesize(TraceConfig(3, seed=1))
    assert write_trace("-", iter(requests)) == 3
    assert parse_trace(capsys.readouterr().out.splitlines()) == requests


def test_same_seed_same_trace_other_seed_other_trace():
    cfg = TraceConfig(500, seed=7, prefix_fraction=0.3, prefix_len=32, sample_prob=0.2)
    assert synthesize(cfg) == synthesize(cfg)
    assert synthesize(cfg) != synthesize(TraceConfig(500, seed=8, prefix_fraction=0.3, prefix_len=32,
                                                     sample_prob=0.2))


def test_write_then_read_gives_the_same_requests(tmp_path):
    requests = synthesize(TraceConfig(300, seed=1, prefix_fraction=0.5, prefix_len=40, sample_prob=0.5))
    path = tmp_path / "t.jsonl"
    write_trace(path, requests)
    assert read_trace(path) == requests


def test_default_scenario_matches_the_seed_means():
    # Seed scenario: prompts average 450 tokens, outputs 120, max_seq_len 2048. Lognormal with
    # sigma 0.5 has sd ≈ 0.53 × mean, so over 20,000 requests the standard error is < 0.4%;
    # clipping at 2048 removes well under 0.1% of the mass. 3% is a wide margin.
    requests = synthesize(TraceConfig(20_000, seed=0))
    s = trace_stats(requests)
    assert s["prompt_len"]["mean"] == pytest.approx(450, rel=0.03)
    assert s["output_len"]["mean"] == pytest.approx(120, rel=0.03)
    assert s["total_len"]["max"] <= 2048
    assert s["rate_per_s"] == pytest.approx(4.0, rel=0.05)  # default rate, sd of the estimate ≈ 0.7%


@pytest.mark.parametrize("kind", ["lognormal", "uniform", "fixed"])
def test_each_distribution_keeps_its_mean(kind):
    requests = synthesize(TraceConfig(20_000, seed=3, prompt=LengthDist(kind, 300), output=LengthDist(kind, 50)))
    assert sum(r.prompt_len for r in requests) / len(requests) == pytest.approx(300, rel=0.03)
    assert sum(r.output_len for r in requests) / len(requests) == pytest.approx(50, rel=0.03)
    if kind == "fixed":
        assert {(r.prompt_len, r.output_len) for r in requests} == {(300, 50)}


def test_prefix_and_sample_shares():
    cfg = TraceConfig(20_000, seed=5, prefix_fraction=0.25, prefix_groups=3, prefix_len=64,
                      sample_prob=0.1, num_samples=4)
    requests = synthesize(cfg)
    s = trace_stats(requests)
    assert s["prefix_fraction"] == pytest.approx(0.25, abs=0.02)
    assert s["prefix_groups"] == 3
    assert s["multi_sample_fraction"] == pytest.approx(0.1, abs=0.01)
    assert {r.num_samples for r in requests} == {1, 4}
    assert all(r.prefix_len == min(64, r.prompt_len) for r in requests if r.prefix_group is not None)


@settings(max_examples=50, deadline=None)
@given(n=st.integers(1, 200), seed=st.integers(0, 2**32), max_seq_len=st.integers(2, 4096),
       kind=st.sampled_from(["lognormal", "uniform", "fixed"]), prompt_mean=st.floats(1, 5000),
       output_mean=st.floats(1, 2000), prefix_fraction=st.floats(0, 1), prefix_len=st.integers(0, 5000))
def test_synthesized_traces_are_valid_and_clipped(n, seed, max_seq_len, kind, prompt_mean, output_mean,
                                                  prefix_fraction, prefix_len):
    cfg = TraceConfig(n, seed=seed, max_seq_len=max_seq_len, prompt=LengthDist(kind, prompt_mean),
                      output=LengthDist(kind, output_mean), prefix_fraction=prefix_fraction,
                      prefix_len=prefix_len)
    requests = synthesize(cfg)
    assert len(requests) == n
    assert parse_trace(json.dumps(r.__dict__) for r in requests) == requests
    for r in requests:
        assert r.prompt_len >= 1 and r.output_len >= 1
        assert r.prompt_len + r.output_len <= max_seq_len
        assert r.prefix_len <= min(prefix_len, r.prompt_len)
    assert [r.arrival for r in requests] == sorted(r.arrival for r in requests)


def test_optional_fields_default():
    [r] = parse_trace(['{"arrival": 0, "prompt_len": 5, "output_len": 2}'])
    assert (r.prefix_group, r.prefix_len, r.num_samples) == (None, 0, 1)


def test_blank_lines_are_skipped_and_line_numbers_count_them():
    lines = ['{"arrival": 0, "prompt_len": 5, "output_len": 2}', "", '{"arrival": 1, "prompt_len": 0, "output_len": 2}']
    with pytest.raises(TraceError, match=r"^line 3: field 'prompt_len' must be an integer in 1\.\.16777216, got 0$"):
        parse_trace(lines)


@pytest.mark.parametrize("line, message", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object, got list"),
    ('{"arrival": 0, "prompt_len": 5, "output_len": 2, "prompt_length": 5}', "unknown field(s) prompt_length"),
    ('{"arrival": 0, "prompt_len": 5}', "missing field(s) output_len"),
    ('{"arrival": -1, "prompt_len": 5, "output_len": 2}', "field 'arrival' must be a number of seconds in 0..2**32"),
    ('{"arrival": NaN, "prompt_len": 5, "output_len": 2}', "field 'arrival' must be a number of seconds in 0..2**32"),
    ('{"arrival": "0", "prompt_len": 5, "output_len": 2}', "field 'arrival' must be a number of seconds in 0..2**32"),
    ('{"arrival": 0, "prompt_len": 4.5, "output_len": 2}', "field 'prompt_len' must be an integer in 1.."),
    ('{"arrival": 0, "prompt_len": true, "output_len": 2}', "field 'prompt_len' must be an integer in 1.."),
    ('{"arrival": 0, "prompt_len": 5, "output_len": 0}', "field 'output_len' must be an integer in 1.."),
    ('{"arrival": 0, "prompt_len": 5, "output_len": 2, "num_samples": 0}', "field 'num_samples' must be an integer in 1..1024"),
    ('{"arrival": 0, "prompt_len": 5, "output_len": 2, "prefix_group": -2}', "field 'prefix_group' must be null"),
    ('{"arrival": 0, "prompt_len": 5, "output_len": 2, "prefix_group": 1, "prefix_len": 6}', "field 'prefix_len' must be an integer in 0..prompt_len=5"),
    ('{"arrival": 0, "prompt_len": 5, "output_len": 2, "prefix_len": 3}', "field 'prefix_len' is 3 but 'prefix_group' is null"),
    # sizes no tool could hold, and files that are not usable JSON at all
    ('{"arrival": 0, "prompt_len": 16777217, "output_len": 2}', "field 'prompt_len' must be an integer in 1..16777216"),
    ('{"arrival": 0, "prompt_len": 5, "output_len": 2, "prefix_group": 9223372036854775808}',
     "field 'prefix_group' must be null or an integer in 0..2**63-1"),
    ('{"arrival": 1' + "0" * 400 + ', "prompt_len": 5, "output_len": 2}', "field 'arrival' must be a number of seconds in 0..2**32"),
    # past 2**32 s a float clock loses microseconds: at 1e15 every latency read 0
    ('{"arrival": 1e15, "prompt_len": 5, "output_len": 2}', "field 'arrival' must be a number of seconds in 0..2**32"),
    ('{"arrival": 0, "prompt_len": 1' + "0" * 5000 + ', "output_len": 2}', "not usable JSON (Exceeds the limit"),
    ("[" * 100_000 + "]" * 100_000, "JSON nested too deeply"),
    (b'{"arrival": 0, "prompt_len": 5, "output_len": 2, "x\xff": 1}', "not UTF-8 text (byte 52 of the line)"),
])
def test_bad_records_name_their_line(line, message):
    good = '{"arrival": 0, "prompt_len": 5, "output_len": 2}'
    with pytest.raises(TraceError, match="^line 2: ") as e:
        parse_trace([good, line])
    assert message in str(e.value)


def test_arrivals_must_not_go_back_in_time():
    lines = ['{"arrival": 2, "prompt_len": 5, "output_len": 2}', '{"arrival": 1, "prompt_len": 5, "output_len": 2}']
    with pytest.raises(TraceError, match="line 2: field 'arrival' is 1, earlier than the line before"):
        parse_trace(lines)


def test_read_errors_name_the_file(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"arrival": 0, "prompt_len": 5, "output_len": 2}\n{"arrival": 0}\n')
    with pytest.raises(TraceError, match=r"bad\.jsonl: line 2: missing field\(s\) prompt_len, output_len"):
        read_trace(path)


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_requests=0), "num_requests must be an integer >= 1"),
    (dict(rate=0.0), "rate must be positive"),
    (dict(max_seq_len=1), "max_seq_len must be an integer >= 2"),
    (dict(prefix_fraction=1.5), "prefix_fraction must lie in [0, 1]"),
    (dict(sample_prob=-0.1), "sample_prob must lie in [0, 1]"),
    (dict(prefix_len=-1), "prefix_len must be an integer >= 0"),
    (dict(num_samples=0), "num_samples must be an integer >= 1"),
])
def test_bad_configs_raise(kwargs, message):
    with pytest.raises(TraceError) as e:
        TraceConfig(**(dict(num_requests=10) | kwargs))
    assert message in str(e.value)


@pytest.mark.parametrize("kwargs, message", [
    (dict(kind="normal"), "unknown distribution 'normal'"),
    (dict(mean=0.5), "mean length must be >= 1"),
    (dict(sigma=-1.0), "sigma must be >= 0"),
])
def test_bad_distributions_raise(kwargs, message):
    with pytest.raises(TraceError, match=message):
        LengthDist(**kwargs)


def test_stats_of_a_small_trace():
    # Prompts 10, 20, 30, 40: mean 25, linear-interpolated median (20 + 30) / 2 = 25.
    # Arrivals 0..3 s: 3 gaps in 3 s, so 1 request per second.
    requests = [Request(float(i), 10 * (i + 1), 5, prefix_group=i % 2 or None, num_samples=1 + i % 2)
                for i in range(4)]
    s = trace_stats(requests)
    assert s["count"] == 4 and s["duration_s"] == 3.0 and s["rate_per_s"] == 1.0
    assert s["prompt_len"]["mean"] == 25 and s["prompt_len"]["p50"] == 25 and s["prompt_len"]["max"] == 40
    assert s["total_len"]["mean"] == 30
    assert s["prefix_fraction"] == 0.5 and s["prefix_groups"] == 1
    assert s["multi_sample_fraction"] == 0.5 and s["total_samples"] == 6
    with pytest.raises(TraceError, match="no requests"):
        trace_stats([])


# ---- the command ----

def test_cli_synth_is_deterministic_and_stats_reads_it(tmp_path):
    runner = CliRunner()
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    for path in (a, b):
        r = runner.invoke(trace_cmd, ["synth", "--out", str(path), "--num-requests", "200", "--seed", "9",
                                      "--prefix-fraction", "0.5", "--prefix-len", "16", "--sample-prob", "0.3"])
        assert r.exit_code == 0, r.output
        assert "wrote 200 requests" in r.output
    assert a.read_bytes() == b.read_bytes()

    r = runner.invoke(trace_cmd, ["stats", str(a), "--json", "-"])
    assert r.exit_code == 0, r.output
    stats = json.loads(r.output)
    # Each figure recomputed from the file's own lines with the standard library, not trace_stats.
    lines = [json.loads(line) for line in a.read_text().splitlines()]
    prompts = [line["prompt_len"] for line in lines]
    assert stats["count"] == len(lines) == 200
    assert stats["duration_s"] == pytest.approx(lines[-1]["arrival"])
    assert stats["prompt_len"]["mean"] == pytest.approx(statistics.fmean(prompts))
    assert stats["prompt_len"]["p50"] == pytest.approx(statistics.median(prompts))
    assert stats["prompt_len"]["max"] == max(prompts)
    assert stats["prefix_fraction"] == sum(line.get("prefix_group") is not None for line in lines) / 200
    assert stats["total_samples"] == sum(line.get("num_samples", 1) for line in lines)
    assert 0.3 < stats["prefix_fraction"] < 0.7   # --prefix-fraction 0.5 reached the synthesizer

    r = runner.invoke(trace_cmd, ["stats", str(a)])
    assert r.exit_code == 0, r.output
    assert "requests     200" in r.output and "prompt_len" in r.output and "p99" in r.output


def test_cli_synth_options_reach_the_synthesizer(tmp_path):
    path = tmp_path / "t.jsonl"
    r = CliRunner().invoke(trace_cmd, ["synth", "--out", str(path), "--num-requests", "50", "--seed", "1",
                                       "--prompt-dist", "fixed", "--prompt-mean", "100", "--output-dist", "fixed",
                                       "--output-mean", "2000", "--max-seq-len", "512", "--sample-prob", "1",
                                       "--num-samples", "3"])
    assert r.exit_code == 0, r.output
    assert {(q.prompt_len, q.output_len, q.num_samples) for q in read_trace(path)} == {(100, 412, 3)}


@pytest.mark.parametrize("args, message", [
    (["synth", "--out", "x.jsonl", "--num-requests", "10", "--seed", "1", "--rate", "0"], "'--rate': 0.0 is not in the range 1e-06<=x"),
    (["synth", "--out", "x.jsonl", "--num-requests", "10", "--seed", "1", "--prompt-mean", "0"], "'--prompt-mean': 0.0 is not in the range 1<=x"),
    (["synth", "--out", "x.jsonl", "--num-requests", "10", "--seed", "1", "--prompt-dist", "zipf"], "zipf"),
])
def test_cli_synth_usage_errors(args, message, tmp_path):
    r = CliRunner().invoke(trace_cmd, args)
    assert r.exit_code == 2
    assert message in r.output


def test_cli_stats_reports_the_bad_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"arrival": 0, "prompt_len": 5, "output_len": 2}\n{"arrival": 0, "prompt_len": 5}\n')
    r = CliRunner().invoke(trace_cmd, ["stats", str(path)])
    assert r.exit_code == 2
    assert "line 2: missing field(s) output_len" in r.output


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 200), st.integers(0, 2**32))
def test_a_trace_the_synthesizer_accepts_stays_within_the_arrival_bound(n, seed):
    """At the longest mean span it accepts (num_requests / rate = MAX_ARRIVAL / 64) every arrival
    is one a trace may hold; a longer span is refused before anything is drawn."""
    rate = n / MAX_MEAN_SPAN
    assert synthesize(TraceConfig(n, seed=seed, rate=rate))[-1].arrival <= MAX_ARRIVAL
    with pytest.raises(TraceError, match="arrivals stop at 2"):
        TraceConfig(n, seed=seed, rate=rate * 0.99)


def test_a_line_past_the_bound_is_refused_without_reading_the_rest(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"arrival": 0, "prompt_len": 5, "output_len": 2}\n' + b" " * (MAX_LINE + 1) + b"\n")
    with pytest.raises(TraceError, match=f"t.jsonl: line 2: longer than {MAX_LINE} bytes"):
        read_trace(path)
    path.write_bytes(b'{"arrival": 0, "prompt_len": 5, "output_len": 2' + b" " * (MAX_LINE - 60) + b"}\n")
    assert len(read_trace(path)) == 1   # a long line within the bound is read
