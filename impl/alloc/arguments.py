"""Argument checks of the production allocator (the per-value checks are the spec's,
`pagedkv.spec.arguments`), which also *normalise*: what passes is a plain `int` or an int64 array.

An `int` subclass passes the checks, but may lie: its `__eq__`/`__hash__` could make it equal to
another prompt's token or sequence id, and numpy converts it through `__int__`, which may disagree
with its value. The spec's checks read the value itself (`int.__index__`) and return it, so
everything stored or looked up is a plain int.
"""

import marshal

import numpy as np
import torch

from pagedkv.spec import InvalidArgument
from pagedkv.spec.arguments import MAX_TOKEN, check_seq_id, check_token, is_int, require

TORCH_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
# marshal format 2 writes a list (or tuple) as its tag byte and a 4-byte count, then each item; an
# exact `int` that fits in 32 signed bits is the tag "i" and its 4 bytes, little-endian. Anything
# else (a bool, an int subclass, a float, a numpy scalar, a larger int) is written otherwise or
# refused, so a dump of exactly this layout is a list of plain ints, read in one C pass: item i's
# value is the <i4 at byte 6 + 5 * i.
MARSHAL_VALUE = np.dtype("<i4")
# The native int64 dtype, compared by identity (`==` converts its operand first, ~0.5 us): an equal
# dtype that is another object takes the general path, with the same result.
INT64 = np.dtype(np.int64)


def plain_seq_id(seq_id) -> int:
    return seq_id if type(seq_id) is int else check_seq_id(seq_id)   # the common case by its type alone


def plain_seq_ids(seq_ids) -> list:
    """A batch of sequence ids as a list of plain ints (a list, tuple or integer array)."""
    if isinstance(seq_ids, (np.ndarray, torch.Tensor)):
        require(seq_ids.ndim == 1 and _is_integer_array(seq_ids),
                f"seq_ids must be a 1-d integer array, got {seq_ids.dtype}{list(seq_ids.shape)}")
        return seq_ids.tolist()
    require(isinstance(seq_ids, (list, tuple)), f"seq_ids must be a list, got {type(seq_ids).__name__}")
    if set(map(type, seq_ids)) - {int}:
        return [plain_seq_id(seq_id) for seq_id in seq_ids]
    return seq_ids if type(seq_ids) is list else list(seq_ids)


def check_prompt(tokens) -> np.ndarray:
    """The prompt as an int64 array, once every token is known to be an int in range: a list or
    tuple of ints, or a 1-d integer numpy array or tensor (checked in a few vectorised passes; a
    list in one C pass when it can be). An int64 array comes back as itself: the manager only
    reads it during the call."""
    if not isinstance(tokens, (list, tuple)):   # (tested first: `isinstance(_, torch.Tensor)` costs ~4x)
        if not isinstance(tokens, (np.ndarray, torch.Tensor)):
            raise InvalidArgument(f"a prompt is a non-empty list of tokens, got {_short(tokens)}")
        array = check_token_batch(tokens)
        if not len(array):
            raise InvalidArgument("a prompt has at least one token")
        return array
    if not len(tokens):
        raise InvalidArgument(f"a prompt is a non-empty list of tokens, got {_short(tokens)}")
    array = _small_plain_ints(tokens)
    if array is not None:
        return array
    if set(map(type, tokens)) == {int}:
        try:
            array = np.array(tokens, dtype=np.int64)
            if array.min() >= 0:
                return array
        except OverflowError:
            pass
    return np.array([check_token(token) for token in tokens], dtype=np.int64)   # names the bad one


def marshalled(items):
    """A list's or tuple's items with their exact types, as bytes: one C pass (marshal format 2).
    None when marshal cannot write an item (an int subclass, a numpy scalar, ...)."""
    try:
        return marshal.dumps(items, 2)
    except ValueError:
        return None


def _small_plain_ints(tokens):
    """A list or tuple of plain ints in 0..2**31-1 as int64 (None when it is anything else: the
    caller then checks it item by item). One marshal dump types and reads every item in C, about
    three times faster than a type pass plus a conversion over the Python objects."""
    dump = marshalled(tokens)
    if dump is None:
        return None
    n = len(tokens)
    if len(dump) != 5 + 5 * n or dump[5::5] != b"i" * n:   # every item tagged "i"
        return None
    if not n:
        return np.zeros(0, dtype=np.int64)
    # The values as one strided view of the dump (one call: a structured frombuffer and its field
    # cost more), copied to int64.
    values = np.ndarray((n,), MARSHAL_VALUE, dump, 6, (5,)).astype(np.int64)
    # None negative: `argmin` on the copy is a plain C loop (a second strided pass over the dump's
    # sign bytes costs about twice that for a 2k prompt).
    return values if values[values.argmin()] >= 0 else None


def check_token_batch(tokens) -> np.ndarray:
    """A batch of tokens as int64: a list of ints, or a 1-d integer numpy array or tensor."""
    if type(tokens) is np.ndarray and tokens.dtype is INT64 and tokens.ndim == 1:
        # The common case, one pass: `argmin` is a plain C loop, some 6 times cheaper here than
        # `min()` (a ufunc reduction with its fixed setup cost) for a 2k prompt.
        if len(tokens) and tokens[tokens.argmin()] < 0:
            raise InvalidArgument("tokens are ints in 0..2**63-1")
        return tokens
    if isinstance(tokens, torch.Tensor):
        require(_is_integer_array(tokens), f"a token batch is a dense integer tensor on the CPU or a CUDA "
                                           f"device, got {tokens.dtype} ({tokens.layout}) on {tokens.device}")
        tokens = tokens.detach().cpu().numpy()
    if isinstance(tokens, np.ndarray):
        if not (tokens.ndim == 1 and (_is_integer_array(tokens) or tokens.size == 0)):
            raise InvalidArgument(f"a token batch is a 1-d integer array, got {tokens.dtype}{list(tokens.shape)}")
        if len(tokens):   # unsigned ids are never negative; only a uint64 may pass int64's top
            negative = tokens.dtype.kind == "i" and tokens.min() < 0
            if negative or (tokens.dtype == np.uint64 and tokens.max() > MAX_TOKEN):
                raise InvalidArgument("tokens are ints in 0..2**63-1")
        return tokens.astype(np.int64, copy=False)
    if not isinstance(tokens, (list, tuple)):   # (a require() would format its message every step)
        raise InvalidArgument(f"tokens must be a list, got {type(tokens).__name__}")
    array = _small_plain_ints(tokens)
    if array is not None:
        return array
    if set(map(type, tokens)) - {int}:
        tokens = [check_token(token) for token in tokens]
    try:
        array = np.array(tokens, dtype=np.int64)
    except OverflowError:
        raise InvalidArgument("tokens are ints in 0..2**63-1") from None
    require(not np.count_nonzero(array < 0), "tokens are ints in 0..2**63-1")
    return array


def check_token_counts(num_tokens, lengths: np.ndarray) -> np.ndarray:
    """`slot_mapping`'s `num_tokens`: one int for every sequence, or one int per sequence, each in
    0..that sequence's length."""
    if isinstance(num_tokens, (np.ndarray, torch.Tensor)):
        require(num_tokens.ndim == 1 and _is_integer_array(num_tokens),
                f"num_tokens must be a 1-d integer array, got {num_tokens.dtype}{list(num_tokens.shape)}")
        num_tokens = num_tokens.tolist()
    if isinstance(num_tokens, (list, tuple)):
        require(len(num_tokens) == len(lengths),
                f"num_tokens has {len(num_tokens)} counts for {len(lengths)} sequences")
        require(all(is_int(n) and 0 <= n <= MAX_TOKEN for n in num_tokens),
                f"num_tokens are ints in 0..length, got {_short(num_tokens)}")
        counts = np.array([int.__index__(n) for n in num_tokens], dtype=np.int64) if num_tokens else \
            np.zeros(0, dtype=np.int64)
    else:
        require(is_int(num_tokens) and 0 <= num_tokens <= MAX_TOKEN,
                f"num_tokens is an int in 0..length or a list of them, got {num_tokens!r}")
        counts = np.full(len(lengths), int.__index__(num_tokens), dtype=np.int64)
    require(bool(((counts >= 0) & (counts <= lengths)).all()), "num_tokens must be in 0..length")
    return counts


def check_device(device) -> torch.device:
    """The device tensors are handed out on: the CPU, or a CUDA device that exists."""
    require(isinstance(device, (str, torch.device)), f"device must be a str or torch.device, got {device!r}")
    try:
        device = torch.device(device)
    except RuntimeError:
        raise InvalidArgument(f"unknown device {device!r}") from None
    if device.type == "cuda":
        require(torch.cuda.is_available(), "device 'cuda' asked for, but CUDA is not available")
        require(device.index is None or device.index < torch.cuda.device_count(),
                f"no CUDA device {device.index}: {torch.cuda.device_count()} present")
        return device
    require(device.type == "cpu", f"device must be 'cpu' or 'cuda', got {device}")
    return device


def _is_integer_array(array) -> bool:
    """An integer numpy array, or a dense integer tensor whose values can be read (on the CPU or a
    CUDA device: a "meta" tensor has none, and a sparse one no numpy view)."""
    if isinstance(array, torch.Tensor):
        return (array.dtype in TORCH_INT_DTYPES and array.layout == torch.strided
                and array.device.type in ("cpu", "cuda"))
    return array.dtype.kind in "iu"


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
