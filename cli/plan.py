"""`pagedkv plan`: how many KV blocks and requests a pool holds, for a given model shape.

Option names follow vLLM where vLLM has one (`--kv-cache-dtype`, `--max-model-len`,
`--tensor-parallel-size`/`-tp`, `--block-size`), and `--model-config` reads the shape from a Hugging
Face `config.json`.
"""
import click

from pagedkv.cli.common import Finite, InputFile, console, json_option, write_json

#: KV storage types as the planner names them (pagedkv.impl.sim.planner.DTYPE_BYTES; a test keeps
#: the two in step), and the spellings vLLM and Hugging Face configs use for the same types.
DTYPES = ("bf16", "fp16", "fp32", "fp8")
DTYPE_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32",
                 "fp8_e4m3": "fp8", "fp8_e5m2": "fp8"}
#: `auto` (vLLM's default): store KV in the model's own dtype, as read from --model-config.
KV_DTYPE_CHOICES = ("auto", *DTYPES, *DTYPE_ALIASES)

MAX_POOL_GIB = 2**20          # 1 PiB per device: far above any accelerator, far below float overflow
MAX_POOL_BYTES = MAX_POOL_GIB * 2**30
MAX_TOKENS = 2**31            # the longest context any engine indexes with int32 positions
MAX_LAYERS, MAX_WIDTH = 10_000, 65_536   # --layers; --kv-heads and --head-dim (a config's fields too)


def model_shape(path: str) -> dict:
    """layers, kv_heads, head_dim and (when the config says) dtype of a Hugging Face config.json.
    Multimodal configs keep the language model's shape under `text_config`."""
    def fail(message):
        raise click.BadParameter(f"{path}: {message}", param_hint="'--model-config'")

    config = _read_json(path, fail)

    if not isinstance(config, dict):
        fail("expected a JSON object (a Hugging Face config.json)")
    if "num_hidden_layers" not in config and isinstance(config.get("text_config"), dict):
        config = config["text_config"]
    if "kv_lora_rank" in config:
        fail("field 'kv_lora_rank': this model caches a compressed latent (MLA), not per-head K and V; "
             "plan sizes per-head KV caches only")

    def positive(field, most=MAX_WIDTH):
        """A field within the bounds the matching option has (a config is no more trusted)."""
        value = config.get(field)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
            fail(f"field '{field}' must be an integer in 1..{most}, got {value!r}")
        return value

    layers = positive("num_hidden_layers", MAX_LAYERS)
    if config.get("head_dim") is not None:
        head_dim = positive("head_dim")
    else:
        hidden, heads = positive("hidden_size", 2**31), positive("num_attention_heads")
        if hidden % heads:
            fail(f"no field 'head_dim', and hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
        head_dim = hidden // heads
    # Hugging Face: without num_key_value_heads every attention head has its own K and V (no GQA).
    kv_heads = positive("num_key_value_heads" if "num_key_value_heads" in config else "num_attention_heads")
    if "num_attention_heads" in config:
        heads = positive("num_attention_heads")
        if heads % kv_heads:   # every attention implementation groups query heads over the KV heads
            fail(f"field 'num_key_value_heads' is {kv_heads}, which does not divide num_attention_heads {heads}")
    shape = {"layers": layers, "kv_heads": kv_heads, "head_dim": head_dim, "dtype": None}
    # transformers >= 4.56 writes `dtype`; older configs `torch_dtype`.
    dtype_field = "dtype" if "dtype" in config else "torch_dtype"
    if config.get(dtype_field) is not None:
        name = config[dtype_field]
        shape["dtype"] = DTYPE_ALIASES.get(name, name) if isinstance(name, str) else name
        if shape["dtype"] not in DTYPES:
            fail(f"field '{dtype_field}' is {name!r}; a KV cache dtype is one of {', '.join(DTYPE_ALIASES)}")
    return shape


def _read_json(path: str, fail):
    """Every way a file can fail to be JSON, as one message naming the file (and line, where known)."""
    import json

    raw = open(path, "rb").read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        fail(f"line {line}: not UTF-8 text (byte {e.start + 1} of the file)")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        fail(f"line {e.lineno} column {e.colno}: not valid JSON ({e.msg})")
    except RecursionError:
        fail("JSON nested too deeply")
    except ValueError as e:   # e.g. an integer longer than Python's 4300-digit conversion limit
        fail(f"not usable JSON ({e})")


def resolve_shape(model_config, layers, kv_heads, head_dim, dtype) -> dict:
    """The shape from --model-config, with any explicit option taking precedence."""
    shape = model_shape(model_config) if model_config else {"layers": None, "kv_heads": None, "head_dim": None,
                                                            "dtype": None}
    for key, value in (("layers", layers), ("kv_heads", kv_heads), ("head_dim", head_dim)):
        if value is not None:
            shape[key] = value
    if dtype not in (None, "auto"):
        shape["dtype"] = DTYPE_ALIASES.get(dtype, dtype)
    missing = [f"--{key.replace('_', '-')}" for key in ("layers", "kv_heads", "head_dim") if shape[key] is None]
    if missing:
        raise click.UsageError(f"give --model-config or {', '.join(missing)}")
    if shape["dtype"] is None:
        raise click.UsageError("give --kv-cache-dtype (the model config names no dtype)" if model_config else
                               "give --kv-cache-dtype, or --model-config to store KV in the model's dtype")
    return shape


def shape_options(function):
    """The model-shape options `plan` and `simulate` share."""
    for decorator in reversed((
        click.option("--model-config", type=InputFile(), metavar="CONFIG_JSON",
                     help="Take layers, KV heads, head_dim and dtype from a Hugging Face config.json "
                          "(options given explicitly take precedence)."),
        click.option("--layers", type=click.IntRange(1, MAX_LAYERS), help="Transformer layers."),
        click.option("--kv-heads", type=click.IntRange(1, MAX_WIDTH), help="KV heads of the whole model (GQA groups)."),
        click.option("--head-dim", type=click.IntRange(1, MAX_WIDTH), help="Width of one head."),
        click.option("--kv-cache-dtype", "--dtype", "dtype", type=click.Choice(KV_DTYPE_CHOICES),
                     help="Storage type of the KV cache; auto (vLLM's default): the model config's dtype."),
    )):
        function = decorator(function)
    return function


def tp_option(function):
    return click.option("--tensor-parallel-size", "-tp", "--tp", "tp", type=click.IntRange(1, 4096), default=1,
                        show_default=True,
                        help="Tensor-parallel ranks; each stores kv_heads/tp heads, or one replicated head when "
                             "tp > kv_heads.")(function)


@click.command()
@shape_options
@click.option("--block-size", type=click.IntRange(1, 65_536), required=True, help="Tokens per block.")
@click.option("--pool-gib", type=Finite(0, MAX_POOL_GIB, min_open=True),
              help="KV pool per device in GiB (2^30 bytes).")
@click.option("--pool-bytes", type=click.IntRange(1, MAX_POOL_BYTES), help="KV pool per device in bytes.")
@click.option("--max-model-len", "--tokens-per-request", "tokens_per_request", type=click.IntRange(1, MAX_TOKENS),
              help="Tokens each request holds (prompt + output): how many such requests fit.")
@tp_option
@json_option
def plan(model_config, layers, kv_heads, head_dim, dtype, block_size, pool_gib, pool_bytes, tokens_per_request, tp,
         json_path):
    """Size a paged KV pool: bytes per token and block, blocks in the pool, requests that fit.

    Example (Llama-3-8B's shape): pagedkv plan --model-config config.json --block-size 16 --pool-gib 24
    """
    if (pool_gib is None) == (pool_bytes is None):
        raise click.UsageError("give exactly one of --pool-gib and --pool-bytes")
    shape = resolve_shape(model_config, layers, kv_heads, head_dim, dtype)
    from pagedkv.impl.sim import planner

    try:
        if pool_bytes is None:
            pool_bytes = planner.gib_to_bytes(pool_gib)
        result = planner.plan(shape["layers"], shape["kv_heads"], shape["head_dim"], shape["dtype"], block_size,
                              pool_bytes, tokens_per_request, tp)
    except planner.PlanError as e:
        raise click.UsageError(str(e)) from e
    if json_path:
        write_json(json_path, {**result.to_dict(), "shape": shape, "tp": tp, "pool_bytes": pool_bytes})
    if json_path != "-":
        _print_table(result, shape, pool_bytes, planner.kv_heads_per_rank(shape["kv_heads"], tp),
                     console())


def _print_table(result, shape, pool_bytes, heads_per_rank, out):
    from rich.table import Table

    from pagedkv.impl.sim import planner

    fb = planner.format_bytes
    table = Table(show_header=False, box=None)
    table.add_row("model shape", f"{shape['layers']} layers, {shape['kv_heads']} KV heads, head_dim "
                                 f"{shape['head_dim']}, {shape['dtype']}")
    table.add_row("KV heads per rank", str(heads_per_rank))
    table.add_row("KV bytes per token", fb(result.bytes_per_token))
    table.add_row("bytes per block", fb(result.block_bytes))
    table.add_row("pool", fb(pool_bytes))
    table.add_row("blocks in pool", f"{result.num_blocks:,}")
    if result.max_requests is not None:
        table.add_row("blocks per request", f"{result.blocks_per_request:,}")
        table.add_row("requests that fit", f"{result.max_requests:,}")
        table.add_row("leftover blocks", f"{result.leftover_blocks:,}")
    table.add_row("leftover bytes (under one block)", fb(result.leftover_bytes))
    out.print(table)

