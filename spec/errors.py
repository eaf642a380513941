"""The errors every pagedkv block manager raises. A failed operation leaves the state unchanged."""


class PagedKVError(Exception):
    """Base class of every error a block manager raises on purpose."""


class OutOfBlocks(PagedKVError):
    """The pool cannot supply the blocks an operation needs."""

    def __init__(self, needed: int, available: int, pool: str = "gpu"):
        super().__init__(f"need {needed} {pool} block(s), {available} available")
        self.needed = needed
        self.available = available
        self.pool = pool


class UnknownSequence(PagedKVError, KeyError):
    """No sequence with this id exists."""

    def __init__(self, seq_id):
        super().__init__(seq_id)
        self.seq_id = seq_id

    def __str__(self):
        return f"unknown sequence {self.seq_id!r}"


class DuplicateSequence(PagedKVError):
    """A sequence with this id already exists."""

    def __init__(self, seq_id):
        super().__init__(f"sequence {seq_id!r} already exists")
        self.seq_id = seq_id


class InvalidState(PagedKVError):
    """The sequence exists but its status does not allow the operation."""


class InvalidArgument(PagedKVError, ValueError):
    """An argument is malformed: wrong type, negative token, empty prompt, bad mode."""


class InvariantViolation(PagedKVError, AssertionError):
    """`check()` found a broken named invariant."""

    def __init__(self, invariant: str, detail: str):
        super().__init__(f"invariant {invariant!r} broken: {detail}")
        self.invariant = invariant
        self.detail = detail
