"""Argument checks every block manager applies before touching its state (InvalidArgument)."""

from .errors import InvalidArgument

MAX_TOKEN = 2 ** 63 - 1  # token ids live in int64 tensors in every engine


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def require(condition: bool, message: str) -> None:
    if not condition:
        raise InvalidArgument(message)


# The checks below run on every operation: they format their message only when they fail.

def check_seq_id(seq_id) -> None:
    if not is_int(seq_id):
        raise InvalidArgument(f"sequence ids are ints, got {seq_id!r}")


def check_token(token) -> None:
    if not (is_int(token) and 0 <= token <= MAX_TOKEN):
        raise InvalidArgument(f"tokens are ints in 0..2**63-1, got {token!r}")


def check_prompt(tokens) -> list:
    if not (isinstance(tokens, (list, tuple)) and len(tokens) > 0):
        raise InvalidArgument(f"a prompt is a non-empty list of tokens, got {tokens!r}")
    for token in tokens:
        check_token(token)
    return list(tokens)


def check_step_tokens(tokens) -> None:
    """A decode step's batch: a dict of sequence id -> next token."""
    if not isinstance(tokens, dict):
        raise InvalidArgument(f"step takes a dict of seq_id -> token, got {type(tokens).__name__}")
    for seq_id, token in tokens.items():
        check_seq_id(seq_id)
        check_token(token)
