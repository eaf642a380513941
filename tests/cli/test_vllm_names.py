"""`plan` and `simulate` speak vLLM's option names and read a Hugging Face config.json.

The configs are written here with the published shapes of well-known models; each expected figure
is worked out by hand in the comment next to it (2 for K and V x layers x KV heads x head_dim x bytes).
"""
import json

import pytest
from click.testing import CliRunner

from pagedkv.cli.main import main

MODELS = {
    # Llama-3-8B: 32 layers, 8 KV heads, 4096 / 32 = 128 per head, bf16: 2*32*8*128*2 = 131072 (128 KiB)
    "llama-3-8b": ({"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "num_attention_heads": 32,
                    "num_hidden_layers": 32, "num_key_value_heads": 8, "torch_dtype": "bfloat16"}, 131_072),
    # Llama-2-7B: no num_key_value_heads, so all 32 heads keep K and V: 2*32*32*128*2 = 524288 (0.5 MiB)
    "llama-2-7b": ({"hidden_size": 4096, "num_attention_heads": 32, "num_hidden_layers": 32,
                    "torch_dtype": "float16"}, 524_288),
    # Qwen2-7B: 28 layers, 4 KV heads, 3584 / 28 = 128: 2*28*4*128*2 = 57344
    "qwen2-7b": ({"hidden_size": 3584, "num_attention_heads": 28, "num_hidden_layers": 28,
                  "num_key_value_heads": 4, "torch_dtype": "bfloat16"}, 57_344),
    # Gemma-7B: head_dim 256 is given and differs from 3072 / 16 = 192: 2*28*16*256*2 = 458752
    "gemma-7b": ({"hidden_size": 3072, "num_attention_heads": 16, "num_hidden_layers": 28, "head_dim": 256,
                  "num_key_value_heads": 16, "torch_dtype": "bfloat16"}, 458_752),
    # Llama-4-Scout keeps the language model under text_config, and newer transformers write `dtype`:
    # 48 layers, 8 KV heads, head_dim 128: 2*48*8*128*2 = 196608
    "llama-4-scout": ({"architectures": ["Llama4ForConditionalGeneration"], "vision_config": {"num_hidden_layers": 34},
                       "text_config": {"hidden_size": 5120, "num_attention_heads": 40, "num_hidden_layers": 48,
                                       "num_key_value_heads": 8, "head_dim": 128, "dtype": "bfloat16"}}, 196_608),
}


def write_config(tmp_path, name, config) -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(config))
    return str(path)


def plan_json(*args):
    result = CliRunner().invoke(main, ["plan", *args, "--json", "-"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.parametrize("name", MODELS)
def test_model_config_gives_the_published_kv_bytes_per_token(name, tmp_path):
    config, per_token = MODELS[name]
    out = plan_json("--model-config", write_config(tmp_path, name, config), "--block-size", "16", "--pool-gib", "24")
    assert out["bytes_per_token"] == per_token
    assert out["num_blocks"] == 24 * 2**30 // (16 * per_token)


def test_llama_3_8b_on_24_gib_holds_24_requests_of_8k(tmp_path):
    # 24 GiB / (16 tokens * 128 KiB) = 12288 blocks; an 8192-token request takes 512 of them.
    config, _ = MODELS["llama-3-8b"]
    out = plan_json("--model-config", write_config(tmp_path, "l3", config), "--block-size", "16",
                    "--pool-gib", "24", "--max-model-len", "8192")
    assert (out["num_blocks"], out["blocks_per_request"], out["max_requests"]) == (12_288, 512, 24)


def test_explicit_options_override_the_config(tmp_path):
    config, _ = MODELS["llama-3-8b"]
    path = write_config(tmp_path, "l3", config)
    fp8 = plan_json("--model-config", path, "--kv-cache-dtype", "fp8_e4m3", "--block-size", "16", "--pool-gib", "1")
    tp2 = plan_json("--model-config", path, "-tp", "2", "--block-size", "16", "--pool-gib", "1")
    layers = plan_json("--model-config", path, "--layers", "16", "--block-size", "16", "--pool-gib", "1")
    assert fp8["bytes_per_token"] == tp2["bytes_per_token"] == layers["bytes_per_token"] == 131_072 // 2
    assert fp8["shape"]["dtype"] == "fp8" and layers["shape"]["layers"] == 16


@pytest.mark.parametrize("config, message", [
    ({"num_attention_heads": 32, "hidden_size": 4096}, "field 'num_hidden_layers' must be an integer in 1..10000, got None"),
    ({"num_hidden_layers": 10**22, "num_attention_heads": 32, "hidden_size": 4096},
     "field 'num_hidden_layers' must be an integer in 1..10000"),
    ({"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 64, "hidden_size": 4096},
     "field 'num_key_value_heads' is 64, which does not divide num_attention_heads 32"),
    ({"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 5, "hidden_size": 4096},
     "field 'num_key_value_heads' is 5, which does not divide num_attention_heads 32"),
    ({"num_hidden_layers": 32, "num_attention_heads": 24, "hidden_size": 4000}, "not a multiple of num_attention_heads"),
    ({"num_hidden_layers": 32, "num_attention_heads": 32, "hidden_size": 4096, "torch_dtype": "int8"},
     "field 'torch_dtype' is 'int8'"),
    ({"num_hidden_layers": 61, "num_attention_heads": 128, "hidden_size": 7168, "kv_lora_rank": 512},
     "field 'kv_lora_rank': this model caches a compressed latent (MLA)"),
    ([1, 2], "expected a JSON object"),
])
def test_unusable_configs_name_the_file_and_field(config, message, tmp_path):
    path = write_config(tmp_path, "bad", config)
    result = CliRunner().invoke(main, ["plan", "--model-config", path, "--block-size", "16", "--pool-gib", "1"])
    assert result.exit_code == 2 and message in result.output and "bad.json" in result.output


def test_a_config_without_dtype_needs_kv_cache_dtype(tmp_path):
    path = write_config(tmp_path, "nodtype", {"num_hidden_layers": 2, "num_attention_heads": 2, "hidden_size": 16})
    runner = CliRunner()
    refused = runner.invoke(main, ["plan", "--model-config", path, "--block-size", "4", "--pool-gib", "1"])
    assert refused.exit_code == 2 and "the model config names no dtype" in refused.output
    # kv-cache-dtype auto means "the model's dtype", which this config does not name either
    auto = runner.invoke(main, ["plan", "--model-config", path, "--kv-cache-dtype", "auto", "--block-size", "4",
                                "--pool-gib", "1"])
    assert auto.exit_code == 2


@pytest.fixture
def trace_file(tmp_path):
    from pagedkv.impl.sim.trace import TraceConfig, synthesize, write_trace

    path = tmp_path / "t.jsonl"
    write_trace(path, synthesize(TraceConfig(40, seed=3, rate=20, max_seq_len=256, prefix_fraction=0.5,
                                             prefix_len=32)))
    return str(path)


def simulate_json(trace_file, *args):
    result = CliRunner().invoke(main, ["simulate", trace_file, "--allocator", "paged", *args, "--json", "-"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout), result.stderr


def test_vllm_names_mean_the_same_as_ours(trace_file):
    ours, _ = simulate_json(trace_file, "--pool-blocks", "64", "--max-seq-len", "256", "--prefix-caching",
                            "--swap-gib", "0.5", "--dtype", "fp16", "--tp", "2")
    vllm, _ = simulate_json(trace_file, "--pool-blocks", "64", "--max-model-len", "256", "--enable-prefix-caching",
                            "--swap-space", "0.5", "--kv-cache-dtype", "float16", "--tensor-parallel-size", "2")
    assert ours == vllm
    [run] = vllm["runs"]
    assert run["prefix_caching"] and run["prefix_hit_rate"] > 0


def test_tensor_parallel_and_fp8_grow_the_pool_in_blocks(trace_file):
    # At a fixed pool in GiB, each rank of -tp 2 stores half the heads; fp8 stores half the bytes.
    base, _ = simulate_json(trace_file, "--pool-gib", "0.5", "--max-model-len", "256")
    tp2, _ = simulate_json(trace_file, "--pool-gib", "0.5", "--max-model-len", "256", "-tp", "2")
    fp8, _ = simulate_json(trace_file, "--pool-gib", "0.5", "--max-model-len", "256", "--kv-cache-dtype", "fp8")
    # 0.5 GiB / (16 tokens * 128 KiB) = 256 blocks of Llama-3-8B's shape
    assert base["runs"][0]["pool_blocks"] == 256
    assert tp2["runs"][0]["pool_blocks"] == fp8["runs"][0]["pool_blocks"] == 512


def test_settings_without_effect_are_named(trace_file, tmp_path):
    _, notes = simulate_json(trace_file, "--pool-blocks", "64", "--max-model-len", "256")
    assert "requests share prefixes, but prefix caching is off" in notes
    plain = tmp_path / "plain.jsonl"
    plain.write_text('{"arrival": 0, "prompt_len": 20, "output_len": 4}\n')
    _, notes = simulate_json(str(plain), "--pool-blocks", "64", "--enable-prefix-caching", "--swap-space", "1")
    assert "--enable-prefix-caching had no effect: no request in the trace has a shared prefix" in notes
    assert "--swap-space had no effect: no sequence was swapped out" in notes
    short = tmp_path / "short.jsonl"
    short.write_text('{"arrival": 0, "prompt_len": 20, "output_len": 4, "prefix_group": 1, "prefix_len": 8}\n')
    _, notes = simulate_json(str(short), "--pool-blocks", "64", "--enable-prefix-caching")
    assert "every shared prefix is shorter than one block (16 tokens)" in notes


def test_trace_synth_names_settings_without_effect(tmp_path):
    result = CliRunner().invoke(main, ["trace", "synth", "--out", str(tmp_path / "t.jsonl"), "--num-requests", "5",
                                       "--seed", "1", "--prefix-len", "32", "--num-samples", "8"])
    assert result.exit_code == 0
    assert "--prefix-len had no effect: --prefix-fraction is 0" in result.stderr
    assert "--num-samples had no effect: --sample-prob is 0" in result.stderr


def test_trace_synth_streams_to_stdout_with_progress_on_stderr():
    from pagedkv.impl.sim.trace import TraceConfig, parse_trace, synthesize

    result = CliRunner().invoke(main, ["trace", "synth", "--out", "-", "--num-requests", "7", "--seed", "4"])
    assert result.exit_code == 0
    assert parse_trace(result.stdout.splitlines()) == synthesize(TraceConfig(7, seed=4))
    assert result.stderr.startswith("trace synth: 7 requests to -: done in ")
    assert result.stderr.endswith("wrote 7 requests to -\n")


def test_kv_cache_dtype_auto_is_the_models_own(trace_file, tmp_path):
    assert simulate_json(trace_file, "--pool-blocks", "64", "--kv-cache-dtype", "auto") == \
        simulate_json(trace_file, "--pool-blocks", "64")            # the default shape's bf16
    config, _ = MODELS["llama-2-7b"]                                 # float16
    path = write_config(tmp_path, "l2", config)
    assert simulate_json(trace_file, "--pool-blocks", "64", "--model-config", path, "--kv-cache-dtype", "auto") == \
        simulate_json(trace_file, "--pool-blocks", "64", "--model-config", path, "--kv-cache-dtype", "fp16")


def test_a_swap_space_past_the_simulator_bounds_is_clipped_like_the_pool(tmp_path):
    """1 TiB of swap in blocks of 65536 one-byte tokens would be 2 TiB of bookkeeping (a [blocks,
    block size] int64 array): the CPU pool is clipped to the token slots the GPU pool may hold."""
    plain = tmp_path / "plain.jsonl"
    plain.write_text('{"arrival": 0, "prompt_len": 20, "output_len": 4}\n')
    result, _ = simulate_json(str(plain), "--pool-blocks", "4", "--block-size", "65536", "--swap-space", "1048576",
                              "--layers", "1", "--kv-heads", "1", "--head-dim", "1", "--kv-cache-dtype", "fp8")
    assert result["runs"][0]["requests"] == 1 and result["runs"][0]["rejected"] == 0
