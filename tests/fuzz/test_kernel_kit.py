"""The kernel conformance kit: targets load or are refused with a reason, the layout adapters hold
the canonical batch's data, cases outside a kernel's declarations are skipped (never failed), and a
kernel with the planted tile-offset bug fails both `pagedkv check --kernel` and the replay of a
default `gen-kernel-tests` corpus, with per-sequence reports and a saved case that replays red."""

import json
import os
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner
from hypothesis import given, settings, strategies as st

from pagedkv.cli.main import main
from pagedkv.fuzz.kernel_corpus import Heads, build_batch, read_corpus, run_case
from pagedkv.fuzz.kernel_kit import KernelTargetError, load_kernel
from pagedkv.fuzz.kernel_kit import check as kit_check
from pagedkv.fuzz.kernel_kit import layouts
from pagedkv.fuzz.kernel_kit.grids import SMALL, slots_case
from pagedkv.fuzz.kernel_kit.replay import main as replay_main
from pagedkv.fuzz.kernel_machine import run_kernel_machine
from pagedkv.kernels import gather_kv

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
MINIMAL = "pagedkv.fuzz.kernel_kit.minimal:factory"
PLANTED = "pagedkv.fuzz.kernel_kit.minimal:tile_offset_bug"


# ------------------------------------------------------------------ targets

class Declares:
    """A kernel object built from keyword attributes (decode returns zeros)."""

    def __init__(self, **attributes):
        self.__dict__.update(attributes)

    def decode(self, q, *args, **options):
        return torch.zeros_like(q)


@pytest.mark.parametrize("attributes, reason", [
    ({"capabilities": {"paged"}}, "unknown capabilities"),
    ({"capabilities": "prefill"}, "capabilities must be a set"),
    ({"capabilities": {"prefill"}}, "no callable prefill"),
    ({"block_sizes": [16, 0]}, "positive ints"),
    ({"block_sizes": 16}, "collection of ints"),
    ({"dtypes": ["float8"]}, "not one of"),
    ({"max_group": 0}, "max_group"),
    ({"tile_size": -3}, "tile_size"),
])
def test_a_kernel_breaking_the_protocol_is_refused_with_the_reason(attributes, reason, monkeypatch):
    module = type(sys)("user_kernel_under_test")
    module.factory = lambda: Declares(**attributes)
    monkeypatch.setitem(sys.modules, "user_kernel_under_test", module)
    with pytest.raises(KernelTargetError, match=reason):
        load_kernel("user_kernel_under_test:factory")


@pytest.mark.parametrize("target, reason", [
    ("no_colon", "bad kernel target"),
    ("pagedkv_no_such_module:factory", "cannot import"),
    ("pagedkv.fuzz.kernel_kit.minimal:nope", "no attribute"),
    ("pagedkv.fuzz.kernel_kit.minimal:TILE", "not a factory"),
])
def test_unloadable_targets_are_refused(target, reason):
    with pytest.raises(KernelTargetError, match=reason):
        load_kernel(target)


def test_a_module_in_the_working_directory_loads_but_never_shadows_an_installed_one(tmp_path, monkeypatch):
    (tmp_path / "my_cwd_kernel.py").write_text("from pagedkv.fuzz.kernel_kit.minimal import factory\n")
    (tmp_path / "json.py").write_text("raise RuntimeError('shadowed the standard library')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert load_kernel("my_cwd_kernel:factory").declared.tile_size == 16
    assert sys.path[-1] == str(tmp_path)
    import importlib

    assert importlib.import_module("json").loads("1") == 1


def test_the_environment_names_the_default_target(monkeypatch):
    monkeypatch.setenv("PAGEDKV_KERNEL", MINIMAL)
    assert load_kernel().target == MINIMAL


# ------------------------------------------------------------------ layouts

batches = st.builds(
    lambda block_size, lengths, seed: slots_case("decode", block_size=block_size, heads=Heads(2, 2, 8),
                                                 lengths=lengths, seed=seed, share=1, repeat_in_row=True),
    st.integers(1, 9), st.lists(st.integers(0, 40), min_size=1, max_size=4), st.integers(0, 1000))


@settings(max_examples=25, deadline=None)
@given(batches)
def test_token_and_flashinfer_layouts_name_exactly_each_sequences_tokens(case):
    batch, _ = build_batch(case, "cpu", torch.float32)
    b = batch.block_size
    indptr, indices = layouts.token_slots(batch.block_tables, batch.seq_lens, b)
    tokens = layouts.token_cache(batch.k_cache)
    pages_ptr, pages, last = layouts.flashinfer_pages(batch.block_tables, batch.seq_lens, b)
    for i, n in enumerate(batch.seq_lens.tolist()):
        k, _ = gather_kv(batch.k_cache, batch.v_cache, batch.block_tables[i], n)
        assert torch.equal(tokens[indices[indptr[i]:indptr[i + 1]]], k)
        mine = pages[pages_ptr[i]:pages_ptr[i + 1]]
        assert len(mine) == -(-n // b) and (n == 0 or 1 <= last[i] <= b)
        flat = batch.k_cache[mine.long()].flatten(0, 1)          # whole pages, then the last one cut
        assert torch.equal(flat[: len(flat) - b + int(last[i])] if n else flat, k)


@settings(max_examples=10, deadline=None)
@given(batches)
def test_hnd_and_combined_caches_hold_the_same_data_and_poison(case):
    batch, _ = build_batch(case, "cpu", torch.float32)
    hnd = layouts.to_hnd(batch.k_cache)
    assert hnd.is_contiguous() and torch.equal(hnd.permute(0, 2, 1, 3).isnan(), batch.k_cache.isnan())
    assert torch.allclose(hnd.permute(0, 2, 1, 3), batch.k_cache, equal_nan=True)
    kv, k_view, v_view = layouts.combined_cache(batch.k_cache, batch.v_cache)
    assert kv.shape[1] == 2 and k_view.stride(0) == 2 * batch.k_cache[0].numel()
    assert torch.allclose(k_view, batch.k_cache, equal_nan=True) and torch.allclose(v_view, batch.v_cache,
                                                                                    equal_nan=True)


def test_a_strided_kernel_gives_the_same_answer_on_the_vllm_and_fused_qkv_layouts():
    """The adapters' strided views are what engines pass: the minimal kernel, which honours strides,
    must give bit-identical output on them, and the fused q's neighbours are NaN."""
    case = slots_case("decode", block_size=5, heads=Heads(2, 3, 16), lengths=[9, 40, 3], seed=4)
    batch, _ = build_batch(case, DEVICE, torch.float32)
    kernel = load_kernel(MINIMAL).kernel
    options = dict(scale=batch.scale, sliding_window=None, softcap=None)
    expected = kernel.decode(batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, **options)
    _, k_view, v_view = layouts.combined_cache(batch.k_cache, batch.v_cache)
    q_view = layouts.fused_qkv(batch.q, num_kv_heads=2)
    assert q_view.stride(0) == (6 + 2 * 2) * 16 and torch.equal(q_view, batch.q)
    assert q_view.as_strided((len(batch.q), 4 * 16), (q_view.stride(0), 1), 6 * 16).isnan().all()
    got = kernel.decode(q_view, k_view, v_view, batch.block_tables, batch.seq_lens, **options)
    assert torch.equal(got, expected) and torch.isfinite(got).all()


# ------------------------------------------------------------------ declarations

def test_a_kernel_without_empty_rows_is_skipped_not_failed_on_length_zero_rows():
    minimal = load_kernel(MINIMAL)
    with_empty = slots_case("decode", block_size=4, heads=SMALL, lengths=[0, 9], seed=3)
    batch, _ = build_batch(with_empty, DEVICE, torch.float32)
    raw = minimal.kernel.decode(batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens,
                                scale=batch.scale, sliding_window=None, softcap=None)
    assert raw[0].isnan().all(), "the minimal kernel should be NaN on an empty row (it declares no empty_rows)"
    outcome = run_case(with_empty, minimal, DEVICE, torch.float32)
    assert outcome.status == "skipped" and "empty_rows" in outcome.detail
    assert run_case(with_empty, load_kernel("pagedkv"), DEVICE, torch.float32).status == "passed"
    without = slots_case("decode", block_size=4, heads=SMALL, lengths=[5, 9], seed=3)
    assert run_case(without, minimal, DEVICE, torch.float32).status == "passed"


def test_undeclared_block_size_dtype_group_and_features_are_skipped(monkeypatch):
    module = type(sys)("narrow_kernel")
    module.factory = lambda: Declares(block_sizes={16}, head_dims={16}, dtypes={"float16"}, max_group=2)
    monkeypatch.setitem(sys.modules, "narrow_kernel", module)
    narrow = load_kernel("narrow_kernel:factory")
    base = dict(block_size=16, heads=Heads(1, 2, 16), lengths=[5], seed=1)
    reasons = {
        "block size 8": dict(base, block_size=8), "head dim 32": dict(base, heads=Heads(1, 2, 32)),
        "group 3": dict(base, heads=Heads(1, 3, 16)), "softcap": dict(base, options={"softcap": 5.0}),
    }
    for reason, spec in reasons.items():
        outcome = run_case(slots_case("decode", **spec), narrow, DEVICE, torch.float16)
        assert outcome.status == "skipped" and reason in outcome.detail, (reason, outcome.detail)
    assert "dtype float32" in run_case(slots_case("decode", **base), narrow, DEVICE, torch.float32).detail
    # within every declaration it runs, and its zeros are wrong: declared means tested
    assert run_case(slots_case("decode", **base), narrow, DEVICE, torch.float16).status == "failed"


def test_a_check_that_runs_nothing_fails(monkeypatch):
    module = type(sys)("block7_kernel")
    module.factory = lambda: Declares(block_sizes={7})
    monkeypatch.setitem(sys.modules, "block7_kernel", module)
    monkeypatch.setitem(kit_check.PROFILES, "tiny", dict(grid="ci", random=0, long=8, seed=1, all_dtypes=False))
    result = kit_check.run_kernel_check("tiny", kernel="block7_kernel:factory")
    assert not result["passed"] and "nothing was checked" in result["detail"]
    assert result["covered"].startswith("0 passed, ")


# ------------------------------------------------------------------ the planted tile-offset bug

def test_check_with_the_planted_kernel_fails_with_per_sequence_reports_and_a_replayable_case(tmp_path,
                                                                                               monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PAGEDKV_KERNEL_FAILURES", raising=False)
    result = CliRunner().invoke(main, ["check", "--only", "kernels", "--kernel", PLANTED, "--json", "r.json"])
    assert result.exit_code == 1, result.output
    row = json.loads((tmp_path / "r.json").read_text())["checks"][0]
    assert not row["passed"] and " 0 failed" not in row["covered"]
    assert "key tile 16" in row["detail"] and "of 3 slots" in row["detail"] and "blocks [" in row["detail"]
    assert "max err" in row["detail"] and "NaN/inf at query positions" in row["detail"]
    saved = tmp_path / "kernel-failures" / "pagedkv.fuzz.kernel_kit.minimal_tile_offset_bug.jsonl"
    _, cases = read_corpus(saved)
    assert cases and all(c["kernel"] == "decode" for c in cases)
    assert replay_main([str(saved), "--kernel", PLANTED, "--failures", str(tmp_path / "again.jsonl")]) == 1
    assert replay_main([str(saved), "--kernel", MINIMAL]) == 0     # the same cases, the bug fixed


def test_the_default_corpus_replay_fails_the_planted_kernel(tmp_path):
    result = CliRunner().invoke(main, ["gen-kernel-tests", "--out", str(tmp_path), "--count", "2", "--seed", "3",
                                       "--kernel", PLANTED])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "replay.json").read_text()) == {"kernel": PLANTED}
    env = {key: value for key, value in os.environ.items() if key not in ("PAGEDKV_KERNEL", "PAGEDKV_KERNEL_FAILURES")}
    red = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_kernel_replay.py"],
                         capture_output=True, text=True, cwd=tmp_path, env=env)
    assert red.returncode == 1 and " failed" in red.stdout and "grid:" in red.stdout, red.stdout[-3000:]
    assert "key tile 16" in red.stdout and "skipped" in red.stdout
    assert list((tmp_path / "kernel-failures").glob("*.jsonl")), "the failing cases were not saved"


def test_the_kernel_state_machine_runs_a_target_and_skips_what_it_does_not_declare():
    from hypothesis import HealthCheck, Phase

    quick = settings(max_examples=3, stateful_step_count=8, deadline=None, database=None, derandomize=True,
                     phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    tally = run_kernel_machine("ci", settings=quick, target=load_kernel(MINIMAL))
    assert tally["decode_checks"] > 0 and tally["skipped_checks"] > 0 and tally["prefill_checks"] == 0


AOT = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from pagedkv.fuzz.kernel_kit import minimal
fn = minimal._minimal_decode_kernel
for bug in (False, True):
    consts = dict(HEAD_DIM=80, BLOCK_D=128, TILE_N=minimal.TILE, TILE_OFFSET_BUG=bug)
    sig = {name: "constexpr" if name in consts else "*bf16" if name in ("q_ptr", "k_ptr", "v_ptr", "out_ptr")
           else "*i32" if name.endswith("_ptr") else "fp32" if name == "scale" else "i32" for name in fn.arg_names}
    triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts), target=GPUTarget("cuda", 90, 32))
print("compiled")
"""


def test_the_minimal_kernel_compiles_for_the_gpu():
    """The interpreter runs the kernel's Python semantics only; the GPU compiler (sm_90, bf16, Triton's
    own lowering) must accept it too, or the GPU runner's replay of it would crash."""
    env = dict(os.environ, TRITON_INTERPRET="0")
    proc = subprocess.run([sys.executable, "-c", AOT], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0 and "compiled" in proc.stdout, proc.stderr[-2000:]


def test_kernel_state_with_a_kernel_that_declares_none_of_its_batches_fails(monkeypatch):
    from hypothesis import HealthCheck, Phase

    from pagedkv.fuzz import kernel_machine

    quick = settings(max_examples=2, stateful_step_count=6, deadline=None, database=None, derandomize=True,
                     phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    monkeypatch.setattr(kernel_machine, "kernel_settings_for", lambda profile: quick)
    module = type(sys)("block16_kernel")
    module.factory = lambda: Declares(block_sizes={16})
    monkeypatch.setitem(sys.modules, "block16_kernel", module)
    result = kernel_machine.run_kernel_state_check("ci", kernel="block16_kernel:factory")
    assert not result["passed"] and "nothing was run" in result["detail"], result
    assert "0 decode + 0 prefill kernel checks of block16_kernel:factory" in result["covered"]


# ------------------------------------------------------------------ the grid and the reports

def test_the_default_grid_reaches_what_multi_tile_bugs_need():
    from pagedkv.fuzz.kernel_kit.grids import TILES, designed_corpus

    cases = designed_corpus("ci")
    reach = {(t, kind) for t in TILES for case in cases for kind in ("B does not divide T", "T does not divide B")
             if any(s["length"] > 2 * t for s in case["seqs"])
             and (case["block_size"] % t if kind == "T does not divide B" else t % case["block_size"])}
    assert reach == {(t, kind) for t in TILES for kind in ("B does not divide T", "T does not divide B")}
    used = [[s["table"][:-(-s["length"] // c["block_size"])] for s in c["seqs"]] for c in cases]
    assert any(len(set(row)) < len(row) for rows in used for row in rows), "no table names a block twice"
    assert any(len({b for row in rows for b in row}) < sum(map(len, rows)) for rows in used), "no shared block"
    lengths = {s["length"] % t for c in cases for s in c["seqs"] for t in TILES}
    assert lengths - {0}, "every length is a multiple of a tile"


class Perturbed:
    """The dense reference itself, with sequence `row`'s output shifted (or NaN): a kernel whose every
    error is known, to check that the report names exactly the wrong sequence."""

    capabilities = frozenset({"empty_rows"})
    tile_size = 32

    def __init__(self, row: int, nan: bool):
        self.row, self.nan = row, nan

    def decode(self, q, k_cache, v_cache, block_tables, seq_lens, *, scale, sliding_window, softcap):
        from pagedkv.kernels import reference_decode

        out = reference_decode(q, k_cache, v_cache, block_tables, seq_lens, scale=scale).to(q.dtype)
        out[self.row, 1] = float("nan") if self.nan else out[self.row, 1] + 0.5
        return out


@settings(max_examples=20, deadline=None)
@given(st.lists(st.integers(1, 70), min_size=1, max_size=4), st.integers(1, 9), st.data())
def test_a_failure_report_names_exactly_the_wrong_sequence(lengths, block_size, data):
    from pagedkv.fuzz.kernel_kit.conformance import run_batch
    from pagedkv.fuzz.kernel_kit.protocol import LoadedKernel, declaration_of

    row, nan = data.draw(st.integers(0, len(lengths) - 1)), data.draw(st.booleans())
    case = slots_case("decode", block_size=block_size, heads=Heads(1, 3, 8), lengths=lengths, seed=len(lengths))
    batch, _ = build_batch(case, "cpu", torch.float32)
    kernel = Perturbed(row, nan)
    outcome = run_batch(LoadedKernel("perturbed", kernel, declaration_of(kernel)), batch)
    blocks = case["seqs"][row]["table"][:-(-lengths[row] // block_size)]
    assert outcome.status == "failed" and len(outcome.rows) == 1, outcome.detail
    prefix = f"sequence {row} (length {lengths[row]}, 1 query, blocks {str(blocks[:12])[:-1]}"   # long lists cut
    assert outcome.rows[0].startswith(prefix), outcome.rows[0]
    assert f"of {block_size} slots, key tile 32)" in outcome.rows[0]
    if nan:
        assert f"NaN/inf at query positions [{lengths[row] - 1}], heads [1]" in outcome.rows[0]
    else:
        assert "max err 0.5 > bound" in outcome.rows[0]


class Scribbler:
    """Right answers, but it zeroes the first block of the K cache as it goes."""

    def decode(self, q, k_cache, v_cache, block_tables, seq_lens, *, scale, sliding_window, softcap):
        from pagedkv.kernels import reference_decode

        out = reference_decode(q, k_cache, v_cache, block_tables, seq_lens, scale=scale).to(q.dtype)
        k_cache[int(block_tables[0, 0])].zero_()
        return out


def test_a_kernel_that_writes_into_its_inputs_fails():
    from pagedkv.fuzz.kernel_kit.conformance import run_batch
    from pagedkv.fuzz.kernel_kit.protocol import LoadedKernel, declaration_of

    batch, _ = build_batch(slots_case("decode", block_size=4, heads=SMALL, lengths=[6, 9], seed=2), "cpu",
                           torch.float32)
    outcome = run_batch(LoadedKernel("scribbler", Scribbler(), declaration_of(Scribbler())), batch)
    assert outcome.status == "failed" and outcome.detail == "decode wrote into its input(s) k_cache"


def test_the_planted_bug_is_caught_within_vllm_like_declarations_too(monkeypatch):
    """A kernel that only takes blocks that are multiples of 16 and head dims >= 32 (as vLLM's unified
    attention declares) still meets multi-tile cases it cannot pass with the tile-offset bug."""
    from pagedkv.fuzz.kernel_kit.minimal import MinimalDecode

    class Restricted(MinimalDecode):
        block_sizes = frozenset(range(16, 1025, 16))
        head_dims = frozenset(range(32, 513))

    module = type(sys)("restricted_planted")
    module.factory = lambda: Restricted(tile_offset_bug=True)
    monkeypatch.setitem(sys.modules, "restricted_planted", module)
    monkeypatch.setattr(kit_check, "save_failures", lambda path, cases: None)   # keep the tree clean
    result = kit_check.run_kernel_check("ci", kernel="restricted_planted:factory")
    assert not result["passed"] and "B=48" in result["detail"] and "B=128" in result["detail"], result
