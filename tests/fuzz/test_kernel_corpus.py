"""`pagedkv gen-kernel-tests`: the corpus it writes replays green through its own pytest module, is
reproducible from its seed, is versioned, and a corrupted case fails the replay."""

import json
import pathlib
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner
from hypothesis import given, settings, strategies as st

from pagedkv.cli.main import main
from pagedkv.fuzz.kernel_corpus import (FORMAT, REPLAY_MODULE, CorpusFormatError, read_corpus, replay_case,
                                        save_failures)
from pagedkv.fuzz.kernel_machine import generate_cases

#: Committed cases, replayed forever: six pinned from real allocation histories, plus every failure
#: found once (on a GPU runner or here), appended with `--save-failures`.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
COMMITTED_CASES = pathlib.Path(__file__).parent / "kernel_regressions.jsonl"


def generate(out, *args):
    result = CliRunner().invoke(main, ["gen-kernel-tests", "--out", str(out), "--count", "4", "--seed", "5",
                                       "--grid", "none", *args])
    assert result.exit_code == 0, result.output
    return read_corpus(out / "corpus.jsonl")


def replay(folder):
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(folder / REPLAY_MODULE)],
                          capture_output=True, text=True, cwd=folder)


def test_generated_corpus_replays_green_and_a_corrupted_case_fails(tmp_path):
    header, cases = generate(tmp_path, "--dtype", "float32", "--dtype", "bfloat16")
    assert header["format"] == FORMAT and header["dtypes"] == ["float32", "bfloat16"] and len(cases) == 4
    green = replay(tmp_path)
    runs = 2 if DEVICE == "cuda" else 1   # bfloat16 is skipped where pagedkv's kernels cannot run it
    summary = f"{4 * runs} passed" + ("" if runs == 2 else ", 4 skipped")
    assert green.returncode == 0 and summary in green.stdout, green.stdout + green.stderr

    lines = (tmp_path / "corpus.jsonl").read_text().splitlines()
    bad = json.loads(lines[1])
    first_block = bad["seqs"][0]["table"][0]
    slot_keys = dict(bad["blocks"])[first_block]
    slot_keys[0] ^= 1    # the first slot now holds another position's content
    bad["blocks"] = [[b, slot_keys if b == first_block else keys] for b, keys in bad["blocks"]]
    (tmp_path / "corpus.jsonl").write_text("\n".join([lines[0], json.dumps(bad), *lines[2:]]) + "\n")
    red = replay(tmp_path)
    assert red.returncode == 1 and f"{runs} failed, {3 * runs} passed" in red.stdout, red.stdout + red.stderr
    assert "wrong K/V at positions [0" in red.stdout


def test_same_seed_same_cases():
    assert generate_cases(3, seed=11) == generate_cases(3, seed=11)


def test_unknown_format_is_refused_with_a_clear_error(tmp_path):
    path = tmp_path / "future.jsonl"
    path.write_text(json.dumps({"format": FORMAT + 1, "dtypes": ["float32"]}) + "\n")
    with pytest.raises(CorpusFormatError, match=f"format {FORMAT + 1} is not supported.*gen-kernel-tests"):
        read_corpus(path)
    path.write_text('{"kernel": "decode"}\n')
    with pytest.raises(CorpusFormatError, match="not a pagedkv kernel corpus"):
        read_corpus(path)


def test_saved_failures_are_kept_once_and_replayed_with_the_corpus(tmp_path):
    case = generate_cases(1, seed=2)[0]
    failures = tmp_path / "failures-store.jsonl"
    save_failures(failures, [case])
    save_failures(failures, [case])
    _, saved = read_corpus(failures)
    assert len(saved) == 1 and replay_case(saved[0], DEVICE, torch.float32)[0]

    out = tmp_path / "out"
    generate(out, "--save-failures", str(failures))
    _, replayed = read_corpus(out / "failures.jsonl")
    assert [c["id"] for c in replayed] == [saved[0]["id"]]


@pytest.mark.parametrize("case", read_corpus(COMMITTED_CASES)[1], ids=lambda case: case["id"])
def test_committed_cases_replay_green(case):
    ok, detail = replay_case(case, DEVICE, torch.float32)
    assert ok, detail


# ------------------------------------------------------------------ malformed corpora

VALID = {"kernel": "decode", "block_size": 4, "num_blocks": 3, "heads": {"num_kv_heads": 1, "group": 2, "head_dim": 8},
         "kv_seed": 1, "query_seed": 2, "seqs": [{"length": 5, "table": [2, 0], "queries": 1}]}


def corpus_with(tmp_path, *lines):
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join([json.dumps({"format": FORMAT, "dtypes": ["float32"]}), *lines]) + "\n")
    return path


def changed(**fields):
    return json.dumps({**VALID, **fields})


@pytest.mark.parametrize("line, reason", [
    ("{not json", "line 3: not JSON"),
    ("[1, 2]", "a case is a JSON object"),
    (json.dumps({k: v for k, v in VALID.items() if k != "seqs"}), r"missing field\(s\) \['seqs'\]"),
    (changed(kernel="attention"), "kernel must be one of"),
    (changed(kernel=None), "kernel must be one of"),
    (changed(block_size=0), "block_size must be an int"),
    (changed(block_size=True), "block_size must be an int"),
    (changed(block_size="4"), "block_size must be an int"),
    (changed(num_blocks=1 << 40), "num_blocks must be an int"),
    (changed(heads={"num_kv_heads": 1, "group": 2}), "heads must be"),
    (changed(heads={"num_kv_heads": 64, "group": 2, "head_dim": 4096}, num_blocks=1000), "more than"),
    (changed(kv_seed=1.5), "kv_seed"),
    (changed(seqs=[]), "seqs is empty"),
    (changed(seqs=[[5]]), "must be an object"),
    (changed(seqs=[{"length": 9, "table": [2, 0], "queries": 1}]), "exceeds its table"),
    (changed(seqs=[{"length": 5, "table": [2, 3], "queries": 1}]), "outside"),
    (changed(seqs=[{"length": 5, "table": [2, 0], "queries": 2}]), "queries must be an int"),
    (changed(seqs=[{"length": 5, "table": [2, 0]}]), "exactly the keys"),
    (changed(seqs=[{"tokens": [1, 2], "table": [2], "queries": 1}]), "'blocks' is given exactly"),
    (changed(seqs=[{"tokens": [1, -2], "table": [2], "queries": 1}], blocks=[]), "each token"),
    (changed(seqs=[{"tokens": [1], "table": [2], "queries": 1}], blocks=[[2, [None]]]), "not block_size"),
    (changed(seqs=[{"tokens": [1], "table": [2], "queries": 1}], blocks=[[9, [None] * 4]]), "block id"),
    (changed(options={"window": 3}), "unknown option"),
    (changed(options={"causal": False}), "decode case is causal"),
    (changed(options={"sliding_window": 2 ** 64}), "sliding_window"),
    (changed(options={"softcap": float("inf")}), "softcap"),
    (changed(options={"num_splits": 0}), "num_splits"),
    (changed(kernel="prefill", options={"num_splits": 2}), "decode cases only"),
    (changed(extra=1), "unknown field"),
])
def test_a_malformed_case_raises_corpus_format_error_naming_line_and_field(tmp_path, line, reason):
    with pytest.raises(CorpusFormatError, match=reason) as caught:
        read_corpus(corpus_with(tmp_path, json.dumps(VALID), line))
    assert "line 3" in str(caught.value)


json_values = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=4),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                        max_size=3), max_leaves=8)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_any_mutation_of_a_case_is_read_or_refused_with_corpus_format_error(tmp_path_factory, data):
    """Replace one field, or one sequence's field, by arbitrary JSON: the reader accepts it or raises
    CorpusFormatError, never JSONDecodeError, TypeError, KeyError or anything else."""
    case = json.loads(json.dumps(VALID))
    target = data.draw(st.sampled_from([case, case["seqs"][0], case["heads"]]))
    target[data.draw(st.sampled_from([*target, "options", "blocks"]))] = data.draw(json_values)
    path = corpus_with(tmp_path_factory.mktemp("m"), json.dumps(case, allow_nan=True))
    try:
        read_corpus(path)
    except CorpusFormatError:
        pass


def test_the_header_is_checked_too(tmp_path):
    path = tmp_path / "h.jsonl"
    for header, reason in [('{"format": 2, "dtypes": "float32"}', "list of names"),
                           ('{"format": 2, "dtypes": ["float8"]}', "unknown dtype"), ("", "not a pagedkv kernel corpus")]:
        path.write_text(header + "\n")
        with pytest.raises(CorpusFormatError, match=reason):
            read_corpus(path)
    with pytest.raises(CorpusFormatError, match="not a regular file"):
        read_corpus(tmp_path)
