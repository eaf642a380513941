"""Pure helpers of paged KV bookkeeping, with contracts in their docstrings that CrossHair checks.
The production allocator calls `blocks_needed` itself, so the proved function is the one it runs."""

from typing import NamedTuple, Sequence


class KV(NamedTuple):
    """Ghost content of one cache slot: the token written there and the prefix it follows.

    A token's key and value depend on every token before it, so two slots hold the same KV only if
    they hold the same token after the same prefix. Comparing ghosts therefore catches a cached
    block reused after a different prefix, exactly as wrong attention output would.
    """

    prefix: tuple
    token: int


def blocks_needed(num_tokens: int, block_size: int) -> int:
    """Blocks that hold `num_tokens` tokens: ceil(num_tokens / block_size).

    pre: num_tokens >= 0
    pre: block_size >= 1
    post: __return__ * block_size >= num_tokens
    post: (__return__ - 1) * block_size < num_tokens or __return__ == 0
    """
    return -(-num_tokens // block_size)


def slot_of(block_table: Sequence[int], position: int, block_size: int) -> int:
    """Flat cache slot of token `position`: its block's id times B plus its offset in the block.

    pre: block_size >= 1
    pre: 0 <= position < len(block_table) * block_size
    post: __return__ // block_size == block_table[position // block_size]
    post: __return__ % block_size == position % block_size
    """
    return block_table[position // block_size] * block_size + position % block_size


def expected_slots(tokens: Sequence[int], start: int, stop: int) -> list:
    """What positions start..stop-1 of a sequence with these tokens must hold.

    pre: 0 <= start <= stop <= len(tokens)
    post: len(__return__) == stop - start
    post: all(kv.prefix == tuple(tokens[:start + i]) for i, kv in enumerate(__return__))
    """
    return [KV(tuple(tokens[:i]), tokens[i]) for i in range(start, stop)]
