"""Capacity planner: the seeds' worked examples, arithmetic properties, and the `plan` command."""
import json

import pytest
from click.testing import CliRunner
from hypothesis import given, strategies as st

from pagedkv.cli.plan import plan as plan_cmd
from pagedkv.impl.sim.planner import (GiB, KiB, MiB, PlanError, blocks_for, gib_to_bytes,
                                  kv_bytes_per_token, kv_heads_per_rank, plan)


# ---- worked examples from seeds/ (expected values computed by hand, arithmetic in comments) ----

def test_seed_teaching_model_128_kib_per_token():
    # L=32, Hkv=8, d=128, BF16: 2 × 32 × 8 × 128 × 2 = 131,072 B = 128 KiB.
    assert kv_bytes_per_token(32, 8, 128, "bf16") == 131_072 == 128 * KiB


def test_seed_24_gib_pool_fits_47_requests():
    # Same model, B=16: a block is 16 × 128 KiB = 2 MiB; 24 GiB / 2 MiB = 24 × 1024 / 2 = 12,288 blocks.
    # A request needing 257 blocks holds ceil(T/16) = 257, i.e. T in 4097..4112; take T = 4097.
    # floor(12,288 / 257) = 47 (47 × 257 = 12,079), leaving 12,288 − 12,079 = 209 blocks;
    # a 48th request would need 257 and is short by 257 − 209 = 48.
    p = plan(32, 8, 128, "bf16", 16, 24 * GiB, tokens_per_request=4097)
    assert p.block_bytes == 2 * MiB
    assert p.num_blocks == 12_288
    assert p.blocks_per_request == 257
    assert p.max_requests == 47
    assert p.leftover_blocks == 209
    assert p.blocks_per_request - p.leftover_blocks == 48
    assert p.leftover_bytes == 0
    assert plan(32, 8, 128, "bf16", 16, 24 * GiB, tokens_per_request=4112).max_requests == 47


def test_seed_exercise_8_gib_pool_1025_token_requests():
    # ① 2 × 24 × 4 × 128 × 2 = 49,152 B = 48 KiB per token.
    # ② block 16 × 48 KiB = 768 KiB; floor(8 × 2^20 KiB / 768 KiB) = floor(10,922.67) = 10,922 blocks.
    # ③ ceil(1,025 / 16) = 65 blocks per request.
    # ④ floor(10,922 / 65) = 168 (168 × 65 = 10,920), 2 blocks left;
    #    8,388,608 KiB − 10,922 × 768 KiB = 8,388,608 − 8,388,096 = 512 KiB not forming a block.
    p = plan(24, 4, 128, "bf16", 16, 8 * GiB, tokens_per_request=1025)
    assert p.bytes_per_token == 49_152 == 48 * KiB
    assert p.block_bytes == 768 * KiB
    assert p.num_blocks == 10_922
    assert p.blocks_per_request == 65
    assert p.max_requests == 168
    assert p.leftover_blocks == 2
    assert p.leftover_bytes == 512 * KiB


def test_seed_7b_hidden_4096_sixteen_full_requests_take_32_gib():
    # 7B: 32 layers, hidden 4096 = 32 heads × 128 (MHA, so 32 KV heads), fp16, context 4096.
    # Per token 2 × 32 × 4096 × 2 = 524,288 B = 512 KiB; 16 requests × 4096 tokens:
    # 2 × 32 × 4096 × 4096 × 2 × 16 = 2^35 B = 32 GiB (the seed's "≈ 32GB").
    # With B=16: block 16 × 512 KiB = 8 MiB, 32 GiB / 8 MiB = 4,096 blocks, 4096 / 16 = 256 blocks
    # per request (the seed's "256 blocks" for a max-length request), 4,096 / 256 = 16 requests.
    p = plan(32, 32, 128, "fp16", 16, 32 * GiB, tokens_per_request=4096)
    assert p.bytes_per_token == 524_288
    assert p.num_blocks == 4096
    assert p.blocks_per_request == 256
    assert (p.max_requests, p.leftover_blocks, p.leftover_bytes) == (16, 0, 0)


def test_seed_7b_40_layers_100_requests_of_2048():
    # 40 layers, 32 heads, d=128, fp16: 2 × 40 × 32 × 128 × 2 = 655,360 B = 640 KiB (seed: "≈ 0.64MB").
    # 100 × 2048 × 640 KiB = 131,072,000 KiB = 125 GiB exactly (seed: "≈ 131GB", mixing units).
    # B=16: block 10 MiB, 125 GiB / 10 MiB = 12,800 blocks, 2048 / 16 = 128 per request, 12,800 / 128 = 100.
    assert kv_bytes_per_token(40, 32, 128, "fp16") == 655_360 == 640 * KiB
    p = plan(40, 32, 128, "fp16", 16, 125 * GiB, tokens_per_request=2048)
    assert (p.num_blocks, p.blocks_per_request, p.max_requests) == (12_800, 128, 100)
    assert (p.leftover_blocks, p.leftover_bytes) == (0, 0)


def test_seed_oom_story_54_gb_card_holds_20_max_length_requests():
    # Same 640 KiB/token, max_seq_len 4096: a request reserves 4096 × 640 KiB = 2.5 GiB (seed: "≈ 2.6GB").
    # 54 GB (decimal, 54 × 10^9 B) left for KV; B=16 gives 10 MiB = 10,485,760 B blocks:
    # floor(54,000,000,000 / 10,485,760) = 5,149 blocks, remainder 54e9 − 53,991,178,240 = 8,821,760 B.
    # 4096 / 16 = 256 blocks per request; floor(5,149 / 256) = 20, so the 21st request fails as in the
    # seed; 5,149 − 5,120 = 29 blocks left.
    p = plan(40, 32, 128, "fp16", 16, 54_000_000_000, tokens_per_request=4096)
    assert p.num_blocks == 5_149
    assert p.leftover_bytes == 8_821_760
    assert (p.blocks_per_request, p.max_requests, p.leftover_blocks) == (256, 20, 29)


def test_seed_20_gib_pool_of_64_kib_blocks():
    # Seed: "20GB / 64KB ≈ 320,000 blocks". In binary units 20 × 2^30 / 2^16 = 20 × 2^14 = 327,680.
    # A shape with 64 KiB blocks: 8 layers, 1 KV head, d=128, fp16 → 2 × 8 × 1 × 128 × 2 = 4 KiB/token,
    # × 16 tokens = 64 KiB.
    p = plan(8, 1, 128, "fp16", 16, 20 * GiB)
    assert p.block_bytes == 64 * KiB
    assert p.num_blocks == 327_680
    assert p.blocks_per_request is None and p.max_requests is None and p.leftover_blocks is None


@pytest.mark.parametrize("block_size, lengths, blocks, waste_mib", [
    # Seed table, lengths 17 / 32 / 63 (112 tokens), 128 KiB per token slot:
    # B=4:  5 + 8 + 16 = 29 blocks, 116 slots, 4 empty  → 4 × 128 KiB = 0.5 MiB
    # B=16: 2 + 2 + 4  = 8 blocks, 128 slots, 16 empty  → 2 MiB
    # B=64: 1 + 1 + 1  = 3 blocks, 192 slots, 80 empty  → 10 MiB
    (4, (17, 32, 63), 29, 0.5),
    (16, (17, 32, 63), 8, 2),
    (64, (17, 32, 63), 3, 10),
    # Seed: length 50 with B=16 → 3 full blocks + a 2-token tail = 4 blocks (64 slots, 14 empty).
    (16, (50,), 4, 14 * 128 / 1024),
    # Seed: length 150 with B=16 → 9 full + a 6-token tail = 10 blocks, 160 slots, 10 empty (6.25%).
    (16, (150,), 10, 10 * 128 / 1024),
    # Seed: length 10 with B=4 → 3 blocks, 12 slots, 2 empty.
    (4, (10,), 3, 2 * 128 / 1024),
])
def test_seed_tail_waste_tables(block_size, lengths, blocks, waste_mib):
    per_token = kv_bytes_per_token(32, 8, 128, "bf16")
    total = sum(blocks_for(n, block_size) for n in lengths)
    assert total == blocks
    assert (total * block_size - sum(lengths)) * per_token == waste_mib * MiB


# ---- properties ----

shapes = st.fixed_dictionaries({
    "layers": st.integers(1, 128),
    "kv_heads": st.integers(1, 64),
    "head_dim": st.sampled_from([32, 64, 80, 96, 128, 256]),
    "dtype": st.sampled_from(["fp32", "bf16", "fp16", "fp8"]),
    "block_size": st.sampled_from([1, 4, 8, 16, 32, 64, 128]),
})
pools = st.integers(1, 512 * GiB)
lengths = st.integers(1, 1 << 20)


@given(shapes, pools, lengths)
def test_every_pool_byte_and_block_is_accounted_for(shape, pool, tokens):
    p = plan(**shape, pool_bytes=pool, tokens_per_request=tokens)
    assert p.block_bytes == shape["block_size"] * p.bytes_per_token
    assert p.num_blocks * p.block_bytes + p.leftover_bytes == pool
    assert 0 <= p.leftover_bytes < p.block_bytes
    assert p.max_requests * p.blocks_per_request + p.leftover_blocks == p.num_blocks
    assert 0 <= p.leftover_blocks < p.blocks_per_request
    assert (p.blocks_per_request - 1) * shape["block_size"] < tokens <= p.blocks_per_request * shape["block_size"]


@given(shapes, pools, pools, lengths)
def test_a_bigger_pool_never_fits_fewer(shape, a, b, tokens):
    small, big = sorted((a, b))
    ps = plan(**shape, pool_bytes=small, tokens_per_request=tokens)
    pb = plan(**shape, pool_bytes=big, tokens_per_request=tokens)
    assert ps.num_blocks <= pb.num_blocks
    assert ps.max_requests <= pb.max_requests


@given(st.integers(1, 64), st.integers(1, 64))
def test_tp_divides_heads_or_replicates_whole_heads(kv_heads, tp):
    if kv_heads % tp == 0:
        assert kv_heads_per_rank(kv_heads, tp) * tp == kv_heads
    elif tp % kv_heads == 0:
        assert kv_heads_per_rank(kv_heads, tp) == 1  # replicated, not split further
    else:
        with pytest.raises(PlanError, match="neither divides"):
            kv_heads_per_rank(kv_heads, tp)


def test_tp_examples():
    # 8 KV heads over 4 ranks: 2 each, so a quarter of the single-rank 128 KiB → 32 KiB per token.
    assert kv_bytes_per_token(32, 8, 128, "bf16", tp=4) == 32 * KiB
    # 8 KV heads over 16 ranks: each rank keeps one replicated head, 2 × 32 × 1 × 128 × 2 = 16 KiB,
    # not 8/16 of a head.
    assert kv_bytes_per_token(32, 8, 128, "bf16", tp=16) == 16 * KiB


@pytest.mark.parametrize("kwargs, message", [
    (dict(layers=0), "layers must be positive"),
    (dict(layers=2.5), "layers must be an integer"),
    (dict(kv_heads=-1), "kv_heads must be positive"),
    (dict(head_dim=0), "head_dim must be positive"),
    (dict(block_size=0), "block_size must be positive"),
    (dict(pool_bytes=0), "pool_bytes must be positive"),
    (dict(tokens_per_request=0), "tokens_per_request must be positive"),
    (dict(tp=0), "tp must be positive"),
    (dict(tp=3), "neither divides"),
    (dict(dtype="int4"), "unknown dtype"),
])
def test_invalid_configurations_raise(kwargs, message):
    args = dict(layers=32, kv_heads=8, head_dim=128, dtype="bf16", block_size=16,
                pool_bytes=GiB, tokens_per_request=100, tp=1) | kwargs
    with pytest.raises(PlanError, match=message):
        plan(**args)


def test_gib_to_bytes():
    assert gib_to_bytes(24) == 24 * GiB
    assert gib_to_bytes(0.5) == 512 * MiB
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(PlanError):
            gib_to_bytes(bad)


# ---- the command ----

BASE = ["--layers", "24", "--kv-heads", "4", "--head-dim", "128", "--dtype", "bf16", "--block-size", "16"]


def run(*args):
    return CliRunner().invoke(plan_cmd, [*BASE, *args])


def test_cli_json_matches_seed_exercise():
    r = run("--pool-gib", "8", "--tokens-per-request", "1025", "--json", "-")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["shape"] == {"layers": 24, "kv_heads": 4, "head_dim": 128, "dtype": "bf16"}
    assert {key: out[key] for key in out if key not in ("shape", "tp", "pool_bytes")} == {
        "bytes_per_token": 49_152, "block_bytes": 786_432, "num_blocks": 10_922,
        "blocks_per_request": 65, "max_requests": 168, "leftover_blocks": 2, "leftover_bytes": 524_288,
    }


def test_cli_json_without_request_length_has_null_request_fields():
    r = run("--pool-bytes", str(8 * GiB), "--json", "-")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["num_blocks"] == 10_922 and out["leftover_bytes"] == 524_288
    assert out["blocks_per_request"] is out["max_requests"] is out["leftover_blocks"] is None


def test_cli_table_shows_binary_units():
    r = run("--pool-gib", "8", "--tokens-per-request", "1025")
    assert r.exit_code == 0, r.output
    for text in ("49,152 B (48.00 KiB)", "786,432 B (768.00 KiB)", "10,922", "168", "524,288 B (512.00 KiB)"):
        assert text in r.output


def test_cli_tp_uses_heads_per_rank():
    r = run("--pool-gib", "8", "--tp", "2", "--json", "-")
    assert json.loads(r.output)["bytes_per_token"] == 49_152 // 2
    r = run("--pool-gib", "8", "--tp", "8", "--json", "-")  # 4 heads on 8 ranks: one replicated head each
    assert json.loads(r.output)["bytes_per_token"] == 49_152 // 4


@pytest.mark.parametrize("args, message", [
    (["--pool-gib", "8", "--pool-bytes", "100"], "exactly one of"),
    ([], "exactly one of"),
    (["--pool-gib", "0"], "'--pool-gib': 0.0 is not in the range 0<x"),
    (["--pool-gib", "-2"], "'--pool-gib': -2.0 is not in the range 0<x"),
    (["--pool-bytes", "-5"], "'--pool-bytes': -5 is not in the range 1<=x"),
    (["--pool-gib", "8", "--tokens-per-request", "0"], "'--tokens-per-request': 0 is not in the range 1<=x"),
    (["--pool-gib", "8", "--tp", "3"], "neither divides"),
    (["--pool-gib", "8", "--block-size", "0"], "'--block-size': 0 is not in the range 1<=x"),
])
def test_cli_usage_errors_exit_2(args, message):
    r = run(*args)
    assert r.exit_code == 2
    assert message in r.output


def test_cli_rejects_unknown_dtype():
    r = CliRunner().invoke(plan_cmd, [*BASE[:6], "--dtype", "int4", "--block-size", "16", "--pool-gib", "1"])
    assert r.exit_code == 2
