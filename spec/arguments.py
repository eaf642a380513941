"""Argument checks every block manager applies before touching its state (InvalidArgument)."""

from .errors import InvalidArgument

MAX_TOKEN = 2 ** 63 - 1  # token ids live in int64 tensors in every engine


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _plain(value: int) -> int:
    """An int's value as a plain int: a subclass by `int.__index__`, which reads the value itself;
    an int as it is (which keeps a symbolic int of CrossHair's symbolic)."""
    return value if type(value) is int else int.__index__(value)


def require(condition: bool, message: str) -> None:
    if not condition:
        raise InvalidArgument(message)


# The checks below run on every operation: they format their message only when they fail. Each
# returns what it checked as plain ints: an int subclass passes by its value (`int.__index__`
# reads it), never by its own `__eq__`, `__hash__` or comparisons, which may disagree with it.

def check_int(value, low, high, message: str) -> int:
    """`value` as a plain int in low..high (`high` may be math.inf), range-checked by its value;
    anything else raises InvalidArgument(message, and what it got)."""
    if is_int(value):
        plain = _plain(value)
        if low <= plain <= high:
            return plain
    raise InvalidArgument(f"{message}, got {value!r}")


def check_seq_id(seq_id) -> int:
    if not is_int(seq_id):
        raise InvalidArgument(f"sequence ids are ints, got {seq_id!r}")
    return _plain(seq_id)


def check_token(token) -> int:
    if is_int(token):
        value = _plain(token)
        if 0 <= value <= MAX_TOKEN:
            return value
    raise InvalidArgument(f"tokens are ints in 0..2**63-1, got {token!r}")


def check_block(block, num_blocks: int) -> int:
    if is_int(block):
        value = _plain(block)
        if 0 <= value < num_blocks:
            return value
    raise InvalidArgument(f"block id {block!r} outside 0..{num_blocks - 1}")


def check_prompt(tokens) -> list:
    if not (isinstance(tokens, (list, tuple)) and len(tokens) > 0):
        raise InvalidArgument(f"a prompt is a non-empty list of tokens, got {tokens!r}")
    return [check_token(token) for token in tokens]


def check_step_tokens(tokens) -> dict:
    """A decode step's batch: a dict of sequence id -> next token, each sequence named once."""
    if not isinstance(tokens, dict):
        raise InvalidArgument(f"step takes a dict of seq_id -> token, got {type(tokens).__name__}")
    batch = {check_seq_id(seq_id): check_token(token) for seq_id, token in tokens.items()}
    require(len(batch) == len(tokens), "a step names a sequence twice")
    return batch
