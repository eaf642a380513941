"""Argument checks of whole batches (the per-value checks are the spec's, `pagedkv.spec.arguments`)."""

import numpy as np
import torch

from pagedkv.spec import InvalidArgument
from pagedkv.spec.arguments import check_token, require


def check_prompt(tokens) -> np.ndarray:
    """The prompt as int64, once every token is known to be a plain int in range."""
    if not (isinstance(tokens, (list, tuple)) and len(tokens) > 0):
        raise InvalidArgument(f"a prompt is a non-empty list of tokens, got {tokens!r}")
    if set(map(type, tokens)) == {int}:
        try:
            array = np.array(tokens, dtype=np.int64)
            if array.min() >= 0:
                return array
        except OverflowError:
            pass
    for token in tokens:   # the slow path finds and names the bad token
        check_token(token)
    return np.array(tokens, dtype=np.int64)


def check_token_batch(tokens) -> np.ndarray:
    """A batch of tokens as int64: a list of ints, or an integer numpy array or tensor."""
    if isinstance(tokens, torch.Tensor):
        tokens = tokens.cpu().numpy()
    if isinstance(tokens, np.ndarray):
        if not (tokens.ndim == 1 and (tokens.dtype.kind in "iu" or tokens.size == 0)):
            raise InvalidArgument(f"a token batch is a 1-d integer array, got {tokens.dtype}{list(tokens.shape)}")
        array = tokens.astype(np.int64)   # uint64 beyond int64 wraps negative and is refused
        require(not (array < 0).any(), "tokens are ints in 0..2**63-1")
        return array
    require(isinstance(tokens, (list, tuple)), f"tokens must be a list, got {type(tokens).__name__}")
    if set(map(type, tokens)) - {int}:
        for token in tokens:
            check_token(token)
    try:
        array = np.array(tokens, dtype=np.int64)
    except OverflowError:
        raise InvalidArgument("tokens are ints in 0..2**63-1") from None
    require(not (array < 0).any(), "tokens are ints >= 0")
    return array
