"""The undo log that makes every BlockManager operation a transaction.

An operation first checks everything the spec lets it refuse (typed errors, nothing changed). What
can still fail after that is not the caller's fault: a MemoryError while a table grows, a bug. So
every mutation of allocator state goes through a `Journal`, which records the inverse step *before*
mutating; `atomic` replays the inverses, newest first, when the operation raises anything, and the
state is exactly what it was before the call. Recording first means that an exception between the
record and the mutation undoes a step that did not happen, which restores the value it already has:
harmless.

Records are coarse where that is cheaper: one per batch of a kind (a ring take or release, the
blocks a prompt writes, a table push), one per row an operation changes (`RowTables.save_row`,
after which the row's fields are written directly) and one for the manager's counters when a
transaction begins (`BlockManager._save_counters`). Cost: O(what the operation touches), never
O(state), some 11 records for an add + free (6 + 5, without prefix caching).
"""

import functools
from itertools import islice

import numpy as np

_ABSENT = object()


class Journal:
    __slots__ = ("undo", "depth")

    def __init__(self):
        self.undo = []    # (function, args) inverse steps, oldest first
        self.depth = 0    # > 0 while an operation runs (operations nest: `step` preempts)

    # ---------------------------------------------------------------- recorded mutations

    def save(self, array, index) -> None:
        """Remember `array[index]` (numpy or list; fancy indices with repeats too) before the
        caller overwrites it in place."""
        old = array[index]
        if type(old) is np.ndarray and old.base is not None:
            old = old.copy()   # a slice is a view: keep the values, not the memory
        self.undo.append((array.__setitem__, (index, old)))

    def assign(self, array, index, values, old=None) -> None:
        """`array[index] = values`; `old`: the values there now, when the caller has read them
        already (its own copy, not a view), to save reading them twice."""
        if old is None:
            self.save(array, index)
        else:
            self.undo.append((array.__setitem__, (index, old)))
        array[index] = values

    def set(self, obj, name: str, value) -> None:
        self.undo.append((setattr, (obj, name, getattr(obj, name))))
        setattr(obj, name, value)

    def put(self, mapping: dict, key, value) -> None:
        self.undo.append((_restore_key, (mapping, key, mapping.get(key, _ABSENT))))
        mapping[key] = value

    def pop(self, mapping: dict, key):
        """`del mapping[key]` of a plain dict (insertion order is not restored: use `pop_ordered`
        where order is state)."""
        self.undo.append((_restore_key, (mapping, key, mapping.get(key, _ABSENT))))
        return mapping.pop(key)

    def will_append(self, container) -> None:
        """The caller is about to append to (or extend) a list or deque at its right end."""
        self.undo.append((_truncate, (container, len(container))))

    def will_popleft(self, queue, n: int) -> None:
        """The caller is about to pop up to `n` items from the left of a deque."""
        self.undo.append((_restore_front, (queue, list(islice(queue, n)), len(queue))))

    def will_pop(self, items: list) -> None:
        """The caller is about to pop one item from the right end of a list."""
        self.undo.append((_restore_back, (items, items[-1], len(items))))

    def add_to_set(self, items: set, new) -> None:
        added = [x for x in new if x not in items]
        self.undo.append((items.difference_update, (added,)))
        items.update(added)

    def pop_ordered(self, ordered: dict, key, rank) -> None:
        """Remove `key` from a dict whose insertion order is state and follows `rank(key)`
        (sequences by creation); undone at its old place."""
        self.undo.append((_reinsert_ordered, (ordered, key, ordered[key], rank(key), rank)))
        del ordered[key]

    # ---------------------------------------------------------------- transactions

    def rollback(self, mark: int = 0) -> None:
        """Undo every step recorded since the log held `mark` records, newest first."""
        undo = self.undo[mark:]
        del self.undo[mark:]
        for function, args in reversed(undo):
            function(*args)


def atomic(method):
    """Run a BlockManager method under its lock as one transaction: if it raises anything, every
    change it made is undone before the exception leaves. A nested call (inside `transaction`, or
    `step`'s preemptions) joins the outer log from a savepoint: if it raises, its own changes are
    undone there, so a caller that catches the error goes on from the state before the call.
    The fault-injection test raises at every line an operation reaches, except in this wrapper:
    its last statement is the commit point (clearing the log), after which the call has happened."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        journal = self.journal
        with self._lock:
            if journal.depth:
                mark = len(journal.undo)
                try:
                    self._save_counters()
                    return method(self, *args, **kwargs)
                except BaseException:
                    journal.rollback(mark)
                    self._forget_memo()
                    raise
            journal.depth = 1
            try:
                self._save_counters()
                result = method(self, *args, **kwargs)
            except BaseException:
                journal.rollback()
                self._forget_memo()
                raise
            finally:
                journal.depth = 0
            journal.undo.clear()
            return result
    return wrapper


def _restore_key(mapping, key, old) -> None:
    if old is _ABSENT:
        mapping.pop(key, None)
    else:
        mapping[key] = old


def _truncate(container, length: int) -> None:
    while len(container) > length:
        container.pop()


def _restore_front(queue, front: list, length: int) -> None:
    missing = length - len(queue)   # later steps are already undone: only this step's pops remain
    queue.extendleft(reversed(front[:missing]))


def _restore_back(items: list, last, length: int) -> None:
    if len(items) < length:
        items.append(last)


def _reinsert_ordered(ordered: dict, key, value, key_rank, rank) -> None:
    later = [k for k in ordered if rank(k) > key_rank]
    ordered[key] = value
    for k in later:
        ordered[k] = ordered.pop(k)
