"""`pagedkv gen-kernel-tests`: the corpus it writes replays green through its own pytest module, is
reproducible from its seed, is versioned, and a corrupted case fails the replay."""

import json
import pathlib
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner

from pagedkv.cli.main import main
from pagedkv.fuzz.kernel_corpus import (FORMAT, REPLAY_MODULE, CorpusFormatError, read_corpus, replay_case,
                                        save_failures)
from pagedkv.fuzz.kernel_machine import generate_cases

#: Committed cases, replayed forever: six pinned from real allocation histories, plus every failure
#: found once (on a GPU runner or here), appended with `--save-failures`.
COMMITTED_CASES = pathlib.Path(__file__).parent / "kernel_regressions.jsonl"


def generate(out, *args):
    result = CliRunner().invoke(main, ["gen-kernel-tests", "--out", str(out), "--count", "4", "--seed", "5", *args])
    assert result.exit_code == 0, result.output
    return read_corpus(out / "corpus.jsonl")


def replay(folder):
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(folder / REPLAY_MODULE)],
                          capture_output=True, text=True, cwd=folder)


def test_generated_corpus_replays_green_and_a_corrupted_case_fails(tmp_path):
    header, cases = generate(tmp_path, "--dtype", "float32", "--dtype", "bfloat16")
    assert header["format"] == FORMAT and header["dtypes"] == ["float32", "bfloat16"] and len(cases) == 4
    green = replay(tmp_path)
    assert green.returncode == 0 and "4 passed" in green.stdout, green.stdout + green.stderr

    lines = (tmp_path / "corpus.jsonl").read_text().splitlines()
    bad = json.loads(lines[1])
    first_block = bad["seqs"][0]["table"][0]
    slot_keys = dict(bad["blocks"])[first_block]
    slot_keys[0] ^= 1    # the first slot now holds another position's content
    bad["blocks"] = [[b, slot_keys if b == first_block else keys] for b, keys in bad["blocks"]]
    (tmp_path / "corpus.jsonl").write_text("\n".join([lines[0], json.dumps(bad), *lines[2:]]) + "\n")
    red = replay(tmp_path)
    assert red.returncode == 1 and "1 failed, 3 passed" in red.stdout, red.stdout + red.stderr
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
    assert len(saved) == 1 and replay_case(saved[0], "cpu", torch.float32)[0]

    out = tmp_path / "out"
    generate(out, "--save-failures", str(failures))
    _, replayed = read_corpus(out / "failures.jsonl")
    assert [c["id"] for c in replayed] == [saved[0]["id"]]


@pytest.mark.parametrize("case", read_corpus(COMMITTED_CASES)[1], ids=lambda case: case["id"])
def test_committed_cases_replay_green(case):
    ok, detail = replay_case(case, "cpu", torch.float32)
    assert ok, detail
