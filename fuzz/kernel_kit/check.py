"""The `kernels` check of `pagedkv check`: the designed grids and seeded random cases against a kernel.

``run_kernel_check(profile, kernel=None)`` replays the multi-tile grid, the ports of peers' test
grids and seeded random draws (`grids`) against the kernel target (default: pagedkv's own kernels,
for which write_kv and copy_blocks are swept too), on CUDA if present, else under Triton's
interpreter. Cases outside what the kernel declares are counted as skipped; every failing case is
appended, replayable, to the target's failure corpus (`replay.failure_file`). A run in which no case
was within the kernel's declarations fails: a check that checked nothing proves nothing.

    ci    the ci tile grid + peer grids in float32, 16 random draws (~30 s on 2 CPU cores)
    dev   the full tile grid + peers in every dtype the device runs, 80 random draws
    deep  as dev, 300 random draws, longer sequences
"""

from __future__ import annotations

import random
import time
from collections import Counter

import torch

from ..kernel_corpus import DTYPES, run_case, save_failures
from .grids import designed_corpus, random_cases
from .protocol import LoadedKernel, load_kernel
from .replay import failure_file

PROFILES = {
    "ci": dict(grid="ci", random=16, long=80, seed=20240601, all_dtypes=False),
    "dev": dict(grid="dev", random=80, long=200, seed=20240602, all_dtypes=True),
    "deep": dict(grid="deep", random=300, long=600, seed=20240603, all_dtypes=True),
}


def device_dtypes(device: str) -> list[str]:
    return ["float32", "float16", "bfloat16"] if device == "cuda" else ["float32", "float16"]


def planned_runs(profile: str, device: str) -> list[tuple[dict, str]]:
    """(case, dtype name) pairs of a profile: designed cases in float32 (every device dtype in dev and
    deep), each random draw in one dtype drawn from the device's."""
    cfg = PROFILES[profile]
    dtypes = device_dtypes(device)
    designed = [(case, dtype) for case in designed_corpus(cfg["grid"])
                for dtype in (dtypes if cfg["all_dtypes"] else ["float32"])]
    rng = random.Random(cfg["seed"])
    drawn = [(case, rng.choice(dtypes)) for case in random_cases(cfg["random"], seed=cfg["seed"], long=cfg["long"])]
    return designed + drawn


def _summary(loaded: LoadedKernel, counts: Counter, kinds: Counter, reasons: Counter, device: str) -> str:
    skipped = f" ({'; '.join(f'{n} {why}' for why, n in reasons.most_common(3))})" if reasons else ""
    where = f"{device}{' (Triton interpreter)' if device == 'cpu' else ''}"
    return (f"{counts['passed']} passed, {counts['skipped']} skipped{skipped}, {counts['failed']} failed of "
            f"{sum(counts.values())} cases ({kinds['decode']} decode, {kinds['prefill']} prefill) against "
            f"{loaded.target} on {where}")


def run_kernel_check(profile: str, kernel: str | None = None) -> dict:
    """Run the sweep sized by `profile` against `kernel` ("module:factory", a built-in name, or None
    for pagedkv's own kernels)."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; choose one of {sorted(PROFILES)}")
    loaded = load_kernel(kernel or "pagedkv")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    counts, kinds, reasons, failures, saved = Counter(), Counter(), Counter(), [], []
    start = time.perf_counter()
    for i, (case, dtype) in enumerate(planned_runs(profile, device)):
        outcome = run_case(case, loaded, device, DTYPES[dtype])
        counts[outcome.status] += 1
        kinds[case["kernel"]] += 1
        if outcome.status == "skipped":
            reasons[outcome.detail] += 1
        elif outcome.status == "failed":
            failures.append(f"case {i} ({case['kernel']}, {dtype}, {case.get('source', '')}): {outcome.detail}")
            saved.append(case)
    covered = _summary(loaded, counts, kinds, reasons, device)
    if saved:
        path = failure_file(loaded.target)
        save_failures(path, saved)
        failures.append(f"{len(saved)} failing cases saved to {path}; replay: python -m "
                        f"pagedkv.fuzz.kernel_kit.replay {path} --kernel {loaded.target}")
    if loaded.target == "pagedkv":
        from pagedkv.kernels.check import run_cache_ops_sweep

        cache_cases, cache_failures = run_cache_ops_sweep(profile)
        covered += f"; {cache_cases} write_kv + copy_blocks cases"
        failures.extend(cache_failures)
    if not counts["passed"]:
        failures.append("no case was within the kernel's declarations: nothing was checked")
    elapsed = time.perf_counter() - start
    detail = (f"all within tolerance in {elapsed:.1f}s" if not failures
              else f"{len(failures)} problems in {elapsed:.1f}s; " + " | ".join(failures[:4] + failures[4:][-1:]))
    return {"name": "kernels", "covered": covered, "passed": not failures, "detail": detail}
