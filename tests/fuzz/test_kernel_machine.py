"""The kernel state machine passes on the production allocator and kernels, reaches every path, and
catches planted bugs in the allocator (wrong table, dropped copy) and in a kernel; a shrunk failure
is saved as a case that fails on replay."""

import pytest
import torch
from hypothesis import HealthCheck, Phase, settings

from pagedkv.fuzz.kernel_kit import pagedkv_target
from pagedkv.fuzz.kernel_corpus import read_corpus, replay_case
from pagedkv.fuzz.kernel_machine import PATHS, Limits, run_kernel_machine, run_kernel_state_check
from pagedkv.impl import BlockManager
from pagedkv.kernels import paged_decode

QUICK = settings(max_examples=30, stateful_step_count=15, deadline=None, database=None, derandomize=True,
                 phases=[Phase.generate, Phase.shrink], report_multiple_bugs=False,
                 suppress_health_check=list(HealthCheck))
SMALL = Limits(max_blocks=8, max_block_size=4, max_prompt=3)   # shrinks fast


class SwappedTable(BlockManager):
    """Planted: the tables handed to the kernels have their first two blocks swapped."""

    def block_tables(self, seq_ids):
        tables = super().block_tables(seq_ids).clone()
        if tables.shape[1] >= 2:
            tables[:, [0, 1]] = tables[:, [1, 0]]
        return tables


class DroppedCopy(BlockManager):
    """Planted: copy-on-write copies are never handed to the engine."""

    def take_copies(self):
        copies = super().take_copies()
        return copies.without("cow")


def test_ci_profile_passes_and_reaches_every_path():
    result = run_kernel_state_check("ci")
    assert result["passed"], result["detail"]
    assert all(f"{path}=0" not in result["covered"] for path in PATHS), result["covered"]


@pytest.mark.parametrize("planted, symptom", [(SwappedTable, "wrong K/V"), (DroppedCopy, "wrong K/V")])
def test_planted_allocator_bug_is_caught_and_saved(planted, symptom, tmp_path):
    failures = tmp_path / "failures.jsonl"
    with pytest.raises(AssertionError, match=symptom):
        run_kernel_machine("ci", settings=QUICK, limits=SMALL, failures_path=failures, manager_factory=planted,
                           run_kernels=False)
    _, cases = read_corpus(failures)
    assert cases, "the shrunk failure was not saved"
    ok, detail = replay_case(cases[-1], "cuda" if torch.cuda.is_available() else "cpu", torch.float32)
    assert not ok, f"the saved failure replays green: {detail}"


def test_planted_kernel_bug_is_caught(monkeypatch):
    def forgets_last_key(q, k_cache, v_cache, block_tables, seq_lens, **options):
        return paged_decode(q, k_cache, v_cache, block_tables, (seq_lens - 1).clamp(min=1), **options)

    monkeypatch.setattr(pagedkv_target, "paged_decode", forgets_last_key)
    with pytest.raises(AssertionError, match="decode batch .* err"):
        run_kernel_machine("ci", settings=QUICK, limits=SMALL, failures_path=None)
