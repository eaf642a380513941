"""`pagedkv plan`: how many KV blocks and requests a pool holds, for a given model shape."""
import json

import click

from pagedkv.impl.sim import planner


@click.command()
@click.option("--layers", type=int, required=True, help="Transformer layers.")
@click.option("--kv-heads", type=int, required=True, help="KV heads of the whole model (GQA groups).")
@click.option("--head-dim", type=int, required=True, help="Width of one head.")
@click.option("--dtype", type=click.Choice(sorted(planner.DTYPE_BYTES)), required=True,
              help="Storage type of the KV cache.")
@click.option("--block-size", type=int, required=True, help="Tokens per block.")
@click.option("--pool-gib", type=float, help="KV pool per device in GiB (2^30 bytes).")
@click.option("--pool-bytes", type=int, help="KV pool per device in bytes.")
@click.option("--tokens-per-request", type=int, help="Tokens each request holds (prompt + output).")
@click.option("--tp", type=int, default=1, show_default=True,
              help="Tensor-parallel ranks; each stores kv_heads/tp heads, or one replicated head when tp > kv_heads.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
def plan(layers, kv_heads, head_dim, dtype, block_size, pool_gib, pool_bytes,
         tokens_per_request, tp, as_json):
    """Size a paged KV pool: bytes per token and block, blocks in the pool, requests that fit."""
    if (pool_gib is None) == (pool_bytes is None):
        raise click.UsageError("give exactly one of --pool-gib and --pool-bytes")
    try:
        if pool_bytes is None:
            pool_bytes = planner.gib_to_bytes(pool_gib)
        result = planner.plan(layers, kv_heads, head_dim, dtype, block_size, pool_bytes,
                              tokens_per_request, tp)
    except planner.PlanError as e:
        raise click.UsageError(str(e)) from e
    if as_json:
        click.echo(json.dumps(result.to_dict()))
        return
    _print_table(result, pool_bytes, planner.kv_heads_per_rank(kv_heads, tp))


def _print_table(result, pool_bytes, heads_per_rank):
    from rich.console import Console
    from rich.table import Table

    fb = planner.format_bytes
    table = Table(show_header=False, box=None)
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
    Console(width=100).print(table)
