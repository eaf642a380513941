"""Every bad value a new user reported (issue 16) is a usage error: exit status 2, one `Error:` line,
no traceback, and no heavy room loaded before the refusal."""
import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from pagedkv.cli.main import main

GOOD_TRACE = '{"arrival": 0, "prompt_len": 20, "output_len": 4}\n'


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("usage")
    paths = {
        "trace": GOOD_TRACE,
        "digits": '{"arrival": 0, "prompt_len": 1' + "0" * 5000 + ', "output_len": 4}\n',
        "deep": "[" * 30_000 + "]" * 30_000 + "\n",   # under the 64 KiB line bound
        "config": '{"num_hidden_layers": 0, "num_attention_heads": 32, "hidden_size": 4096}',
        "far": '{"arrival": 1e15, "prompt_len": 20, "output_len": 4}\n',
        "empty": "\n  \n",
        "long": '{"arrival": 0, "prompt_len": 20, "output_len": 4' + " " * 70_000 + "}\n",
    }
    out = {}
    for name, text in paths.items():
        out[name] = folder / f"{name}.json"
        out[name].write_text(text)
    out["utf8"] = folder / "utf8.jsonl"
    out["utf8"].write_bytes(GOOD_TRACE.encode() + b'{"arrival": 1, "prompt_len": 5, "output_len": 2, "\xff": 1}\n')
    out["missing"] = folder / "no-such-folder" / "out.json"
    return out


def sim(files, *args):
    return ["simulate", str(files["trace"]), "--pool-blocks", "64", *args]


SYNTH = ["trace", "synth", "--num-requests", "10", "--seed", "1"]

#: (command line, text the one error line must contain). Where the user's bad value was in the report,
#: it is here verbatim.
CASES = [
    # simulate: ZeroDivisionError, OverflowError, MemoryError and silent nonsense before
    (lambda f: sim(f, "--block-size", "0"), "'--block-size': 0 is not in the range 1<=x<=65536"),
    (lambda f: sim(f, "--step-ms", "0"), "'--step-ms': 0.0 is not in the range 0<x"),
    (lambda f: sim(f, "--prefill-us", "0"), "'--prefill-us': 0.0 is not in the range 0<x"),
    (lambda f: sim(f, "--swap-gibps", "0"), "'--swap-gibps': 0.0 is not in the range 0<x"),
    (lambda f: sim(f, "--step-ms", "-5"), "'--step-ms': -5.0 is not in the range 0<x"),
    (lambda f: sim(f, "--decode-ms", "nan"), "'--decode-ms': 'nan' is not a finite number"),
    (lambda f: sim(f, "--step-ms", "inf"), "'--step-ms': 'inf' is not a finite number"),
    (lambda f: ["simulate", str(f["trace"]), "--pool-gib", "1e300"], "'--pool-gib': 1e+300 is not in the range"),
    (lambda f: ["simulate", str(f["trace"]), "--pool-blocks", "1e12"], "'--pool-blocks': '1e12' is not a valid integer"),
    (lambda f: ["simulate", str(f["trace"]), "--pool-blocks", "1000000000000"],
     "'--pool-blocks': 1000000000000 is not in the range 1<=x<=4194304"),
    (lambda f: ["simulate", str(f["trace"]), "--pool-blocks", "300000000"], "is not in the range 1<=x<=4194304"),
    (lambda f: ["simulate", str(f["trace"]), "--pool-gib", "1000", "--block-size", "1"],
     "--pool-gib: 8,192,000 blocks of 1 tokens; the simulator holds at most 4,194,304 blocks"),
    (lambda f: sim(f, "--max-model-len", "0"), "'--max-model-len' / '--max-seq-len': 0 is not in the range"),
    (lambda f: sim(f, "--out", str(f["missing"])), "does not exist"),
    (lambda f: sim(f, "--json", str(f["missing"])), "does not exist"),
    (lambda f: ["simulate", str(f["digits"]), "--pool-blocks", "64"], "not usable JSON (Exceeds the limit (4300 digits)"),
    (lambda f: ["simulate", str(f["utf8"]), "--pool-blocks", "64"], "utf8.jsonl: line 2: not UTF-8 text (byte 51 of"),
    # simulate: latencies silently 0 (a float clock at 1e15 s absorbs every step), "all 0 rejected"
    (lambda f: ["simulate", str(f["far"]), "--pool-blocks", "64"],
     "line 1: field 'arrival' must be a number of seconds in 0..2**32, got 1000000000000000.0"),
    (lambda f: ["simulate", str(f["empty"]), "--pool-blocks", "64"], "empty.json holds no requests: nothing to simulate"),
    (lambda f: ["simulate", str(f["long"]), "--pool-blocks", "64"], "line 1: longer than 65536 bytes"),
    (lambda f: ["simulate", "/dev/zero", "--pool-blocks", "64"], "'/dev/zero' is not a regular file"),
    # plan
    (lambda f: ["plan", "--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--dtype", "bf16",
                "--block-size", "16", "--pool-gib", "1e300"], "'--pool-gib': 1e+300 is not in the range 0<x<=1048576"),
    (lambda f: ["plan", "--model-config", str(f["config"]), "--block-size", "16", "--pool-gib", "8"],
     "field 'num_hidden_layers' must be an integer in 1..10000, got 0"),
    (lambda f: ["plan", "--model-config", str(f["deep"]), "--block-size", "16", "--pool-gib", "8"],
     "JSON nested too deeply"),
    (lambda f: ["plan", "--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--block-size", "16",
                "--pool-gib", "8"], "give --kv-cache-dtype"),
    # trace synth and stats
    (lambda f: [*SYNTH[:-2], "--seed", "-1", "--out", "t.jsonl"], "'--seed': -1 is not in the range 0<=x"),
    (lambda f: [*SYNTH, "--rate", "1e-320", "--out", "t.jsonl"], "'--rate': 1e-320 is not in the range 1e-06<=x"),
    (lambda f: [*SYNTH, "--prompt-mean", "1e300", "--out", "t.jsonl"], "'--prompt-mean': 1e+300 is not in the range"),
    (lambda f: [*SYNTH, "--out", str(f["missing"])], "no-such-folder' does not exist"),
    (lambda f: ["trace", "stats", str(f["digits"])], "digits.json: line 1: not usable JSON"),
    (lambda f: ["trace", "stats", str(f["utf8"])], "line 2: not UTF-8 text"),
    (lambda f: ["trace", "stats", str(f["deep"])], "deep.json: line 1: JSON nested too deeply"),
    (lambda f: ["trace", "stats", "/dev/zero"], "'/dev/zero' is not a regular file"),
    (lambda f: ["trace", "synth", "--num-requests", "1000", "--seed", "1", "--rate", "1e-6", "--out", "t.jsonl"],
     "1000 requests at 1e-06/s would span some 1e+09 s; arrivals stop at 2**32 s"),
    # prove, check, demo
    (lambda f: ["prove", "--workers", "-1"], "'--workers': -1 is not in the range 0<=x<=1024"),
    (lambda f: ["prove", "--json", str(f["missing"])], "does not exist"),
    (lambda f: ["check", "--json", str(f["missing"])], "'--json': folder"),
    (lambda f: ["check", "--junit", str(f["missing"])], "no-such-folder' does not exist"),
    (lambda f: ["check", "--json", str(f["trace"].parent)], "is a folder, not a file"),
    (lambda f: ["check", "--only", "kernel_state"], "'kernel_state' is not one of 'spec-stateful'"),
    (lambda f: ["demo", "--new-tokens", "100000"], "'--new-tokens': 100000 is not in the range 1<=x<=64"),
    (lambda f: ["demo", "--only", "nope"], "'nope' is not one of 'mixed'"),
    (lambda f: ["lab", "--lengths", "1,10000000"], "every length must lie in 1..1000000"),
    # gen-kernel-tests and fuzz
    (lambda f: ["gen-kernel-tests", "--out", "gen", "--heads", "0,0,0"], "head_dim in 1..256"),
    (lambda f: ["gen-kernel-tests", "--out", "gen", "--heads", "1,1,257"], "head_dim in 1..256"),
    (lambda f: ["gen-kernel-tests", "--out", "gen", "--heads", "17,1,16"], "num_kv_heads must lie in 1..16"),
    (lambda f: ["gen-kernel-tests", "--out", "gen", "--max-blocks", "100000000000"],
     "'--max-blocks': 100000000000 is not in the range 4<=x<=1024"),
    (lambda f: ["gen-kernel-tests", "--out", "gen", "--max-block-size", "100000"],
     "'--max-block-size': 100000 is not in the range 1<=x<=256"),
    (lambda f: ["fuzz", "spec", "--seconds", "nan"], "--seconds must be a number in (0, 2592000], got nan"),
    (lambda f: ["fuzz", "spec", "--seconds", "inf"], "--seconds must be a number in (0, 2592000], got inf"),
    (lambda f: ["fuzz", "exiting_subject:factory"], "factory called sys.exit(3)"),
]


def assert_one_line_usage_error(result, expected: str) -> None:
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit), result.exception   # no traceback escaped
    lines = [line for line in result.output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("Error:")]
    assert len(errors) == 1 and expected in errors[0], result.output
    assert all(line.startswith(("Usage:", "Try ", "Error:")) for line in lines), result.output


@pytest.mark.parametrize("case, expected", CASES, ids=[expected[:40] for _, expected in CASES])
def test_bad_value_is_a_one_line_usage_error(files, case, expected, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # A fuzz target whose factory exits the interpreter (found in the working directory).
    (tmp_path / "exiting_subject.py").write_text("import sys\n\n\ndef factory(**config):\n    sys.exit(3)\n")
    monkeypatch.delitem(sys.modules, "exiting_subject", raising=False)
    assert_one_line_usage_error(CliRunner().invoke(main, case(files)), expected)
    assert not (tmp_path / "t.jsonl").exists() and not (tmp_path / "gen").exists()   # refused before any work


FAST = [["simulate", "x.jsonl", "--block-size", "0"], ["simulate", "x.jsonl", "--pool-gib", "1e300"],
        ["plan", "--block-size", "16", "--pool-gib", "1e300"], ["demo", "--new-tokens", "100000"],
        ["trace", "synth", "--out", "t.jsonl", "--num-requests", "1", "--seed", "-1"], ["prove", "--workers", "-1"],
        ["check", "--only", "nope"], ["lab", "--block-size", "0"],
        ["gen-kernel-tests", "--out", "gen", "--heads", "0,0,0"], ["gen-kernel-tests", "--out", "gen", "--seed", "-1"]]


def test_usage_errors_come_before_heavy_imports():
    """Usage errors are decided by the option types, before torch, numpy or z3 load (each costs
    seconds): one process runs every case and reports what had been imported."""
    script = f"""
import json, sys, time
from pagedkv.cli.main import main
codes, seconds = [], []
for args in {FAST!r}:
    started = time.perf_counter()
    try:
        main(args, prog_name="pagedkv")
    except SystemExit as exit:
        codes.append(exit.code)
    seconds.append(time.perf_counter() - started)
print(json.dumps({{"codes": codes, "seconds": seconds,
                  "heavy": sorted(m for m in ("torch", "numpy", "z3", "triton", "matplotlib") if m in sys.modules)}}))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["codes"] == [2] * len(FAST), done.stderr
    assert report["heavy"] == []
    assert max(report["seconds"]) < 0.3


def test_simulate_exits_1_and_says_so_when_every_request_was_rejected(files):
    result = CliRunner().invoke(main, sim(files, "--max-model-len", "10"))
    assert result.exit_code == 1
    assert "requests simulated / rejected" in result.output and "0 / 1" in result.output
    assert "every one of the 1 requests was rejected" in result.output


def test_simulate_names_why_some_requests_were_rejected(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"arrival": 0, "prompt_len": 20, "output_len": 4}\n'
                     '{"arrival": 0, "prompt_len": 300, "output_len": 4}\n'
                     '{"arrival": 0, "prompt_len": 100, "output_len": 4}\n')
    # 4 blocks of 16 hold 64 tokens: the 104-token request never fits; 304 tokens exceed max-model-len 256
    result = CliRunner().invoke(main, ["simulate", str(trace), "--allocator", "paged", "--pool-blocks", "4",
                                       "--max-model-len", "256"])
    assert result.exit_code == 0
    assert "note: paged rejected 2 of 3 requests: 1 longer than --max-model-len 256, 1 larger than the whole pool" \
        in result.output
