"""Replay kernel corpora against one or several kernel targets.

    python -m pagedkv.fuzz.kernel_kit.replay CORPUS_OR_DIR... [--kernel TARGET]... [--dtype NAME]...
                                            [--failures FILE]

replays every case (of every *.jsonl in a directory) in every dtype its header names, against each
``--kernel`` (default: $PAGEDKV_KERNEL, else pagedkv's own kernels), on CUDA if present, else under
the Triton interpreter, and prints passed / skipped / failed per target with a report per failure.
Failing cases are appended to FILE (default $PAGEDKV_KERNEL_FAILURES, else
./kernel-failures/<target>.jsonl), a corpus that this same command replays. Exit 1 if any case
failed, 2 on a usage error (an unloadable target, an unreadable corpus).

The pytest module `pagedkv gen-kernel-tests` writes uses `folder_target` and `replay_one` from here.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import sys
from collections import Counter

import torch

from ..kernel_corpus import DTYPES, FAILURES_ENV, CorpusFormatError, case_id, read_corpus, run_case, save_failures
from .conformance import Outcome
from .protocol import KERNEL_ENV, KernelTargetError, LoadedKernel, load_kernel

CONFIG = "replay.json"


def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def target_slug(target: str) -> str:
    """A file-name-safe form of a target name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", target).strip("_") or "kernel"


def failure_file(target: str, folder=None) -> pathlib.Path:
    """Where failing cases of `target` are appended: $PAGEDKV_KERNEL_FAILURES, else
    <folder or cwd>/kernel-failures/<target>.jsonl (a subfolder: a replay of the folder does not
    count them twice)."""
    if os.environ.get(FAILURES_ENV):
        return pathlib.Path(os.environ[FAILURES_ENV])
    return pathlib.Path(folder or ".") / "kernel-failures" / f"{target_slug(target)}.jsonl"


def folder_target(folder) -> LoadedKernel:
    """The target of a generated replay folder: $PAGEDKV_KERNEL, else replay.json's "kernel", else pagedkv."""
    target = os.environ.get(KERNEL_ENV)
    config = pathlib.Path(folder) / CONFIG
    if not target and config.is_file():
        try:
            target = json.loads(config.read_text()).get("kernel")
        except (json.JSONDecodeError, AttributeError) as error:
            raise KernelTargetError(f"{config}: not a replay configuration ({error})") from None
    return load_kernel(target or "pagedkv")


def write_folder_target(folder, target: str) -> pathlib.Path:
    path = pathlib.Path(folder) / CONFIG
    path.write_text(json.dumps({"kernel": target}) + "\n")
    return path


def replay_one(loaded: LoadedKernel, case: dict, dtype: str, folder=None, failures=None) -> Outcome:
    """Run one case; a failure is saved as a replayable case and the outcome says where."""
    outcome = run_case(case, loaded, device(), DTYPES[dtype])
    if outcome.status == "failed":
        path = pathlib.Path(failures) if failures else failure_file(loaded.target, folder)
        save_failures(path, [{key: value for key, value in case.items() if key != "id"}])
        outcome.detail += (f" [case {case_id(case)} ({dtype}) saved to {path}; replay: python -m "
                           f"pagedkv.fuzz.kernel_kit.replay {path} --kernel {loaded.target}]")
    return outcome


def corpus_files(paths) -> list[pathlib.Path]:
    files = []
    for path in map(pathlib.Path, paths):
        files.extend(sorted(path.glob("*.jsonl")) if path.is_dir() else [path])
    return files


def replay(paths, targets, *, dtypes=None, failures=None, echo=print) -> dict[str, Counter]:
    """Replay every case of `paths` against every target; returns {target: Counter(status)}."""
    corpora = [(path, *read_corpus(path)) for path in corpus_files(paths)]
    totals = {}
    for target in targets:
        loaded = load_kernel(target)
        counts = totals.setdefault(loaded.target, Counter())
        for path, header, cases in corpora:
            for case in cases:
                for dtype in dtypes or header.get("dtypes", ["float32"]):
                    outcome = replay_one(loaded, case, dtype, failures=failures)
                    counts[outcome.status] += 1
                    if outcome.status == "failed":
                        echo(f"FAIL {loaded.target} {path.name}:{case_id(case)}:{dtype}: {outcome.detail}")
        echo(f"{loaded.target}: {counts['passed']} passed, {counts['skipped']} skipped, {counts['failed']} failed "
             f"on {device()}")
    return totals


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pagedkv.fuzz.kernel_kit.replay",
                                     description="Replay kernel corpora against kernel targets.")
    parser.add_argument("paths", nargs="+", help="corpus files or folders of *.jsonl")
    parser.add_argument("--kernel", action="append", dest="targets",
                        help=f"module:factory or a built-in name (repeatable; default ${KERNEL_ENV} or pagedkv)")
    parser.add_argument("--dtype", action="append", dest="dtypes", choices=sorted(DTYPES),
                        help="replay in these dtypes instead of the headers' (repeatable)")
    parser.add_argument("--failures", help=f"append failing cases here (default ${FAILURES_ENV} or "
                                           "./kernel-failures/<target>.jsonl)")
    args = parser.parse_args(argv)
    try:
        totals = replay(args.paths, args.targets or [None], dtypes=args.dtypes, failures=args.failures)
    except (KernelTargetError, CorpusFormatError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 1 if any(counts["failed"] for counts in totals.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
