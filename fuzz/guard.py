"""The call guard: every call the harness makes into a subject passes through it, and every
operation the spec, differential and scheduler machines run is timed by the same timer.

Three ways a subject can break the kit itself become findings that name the step and the method:

- `protocol`: a method returns the wrong kind of value (`append` returning None, say), which would
  otherwise surface as a TypeError deep inside the harness with no step and no method;
- `timeout`: a call does not return within `timeout` seconds, which would otherwise hang the kit;
- `crash`: a call to `sys.exit` (a `SystemExit`), which would otherwise end the campaign unreported.

How a call that never returns is stopped (the choice, and why): the subject runs inline, in the
thread that runs the harness, and a `SIGALRM` interval timer is armed around each call (about 1.5 us
per call). When it expires, its handler raises `CallTimeout` (a BaseException, so a subject's
`except Exception` cannot swallow it; the timer repeats until the call gives up) inside the stuck
call: that interrupts Python loops, `time.sleep`, lock waits and blocking socket reads alike, and the
harness reports a normal, shrinkable finding with the program so far. A watchdog thread could not
interrupt the call at all (Python threads cannot be killed), and running the subject in a worker
process would put a round trip on every one of the thousands of calls a campaign makes per second.

Two cases escape the timer: runs off the main thread (signal handlers only run there) and a call
stuck in C code that holds the GIL (the handler never gets to run). For those a backstop stays
armed: `faulthandler` dumps every thread's stack to stderr and ends the process with status 1 once
no guarded call has started or ended for `BACKSTOP_FACTOR` times the timeout plus `BACKSTOP_SLACK`
seconds. It is re-armed at most every quarter timeout, because arming it costs about 140 us.

The Hypothesis machines of `pagedkv check` (the spec's stateful machine, the differential and the
scheduler machines) time each operation with the same `Deadline` (`TimedMachine`, `run_bounded`), but a
hang there is not shrunk: it escapes Hypothesis as `Hang` (a BaseException, which Hypothesis neither
catches nor shrinks; each shrinking attempt of a hang would cost the whole timeout again) carrying the
program so far, and `run_bounded` reports it as a `HangFound` failure with that program. So a hang costs
one timeout, however many steps the program had (a mutant that deleted the preemption in
`KVSpec.step` once hung the spec check forever).
"""

import faulthandler
import functools
import numbers
import signal
import sys
import threading
import time
from collections.abc import Sequence

from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

from .strategies import bind

DEFAULT_TIMEOUT = 10.0      # seconds one subject call may take before it is a `timeout` finding
BACKSTOP_FACTOR, BACKSTOP_SLACK = 3, 5.0
#: method -> (check of its result, what the protocol wants). fork and free return nothing of use.
GUARDED = ("add", "append", "fork", "free", "block_table", "num_free_blocks", "swap_out", "swap_in", "block_tables")


def _process_stderr():
    """The process' own stderr, where the backstop writes (sys.stderr may be a capture without a file
    descriptor, under pytest or click's test runner); None leaves the backstop off."""
    try:
        sys.__stderr__.fileno()
    except (AttributeError, OSError, ValueError):
        return None
    return sys.__stderr__


_STDERR = _process_stderr()


class SubjectFault(Exception):
    """A finding of the guard. The harness reports it under `oracle` (fuzz/oracles.py)."""

    def __init__(self, oracle: str, message: str):
        super().__init__(message)
        self.oracle = oracle


class CallTimeout(BaseException):
    """Raised by the timer inside a subject call that overran its time."""


def _count(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _pairs(value) -> bool:
    return isinstance(value, (list, tuple)) and all(
        isinstance(pair, (list, tuple)) and len(pair) == 2 and all(map(_count, pair)) for pair in value)


def _table(value) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


RETURNS = {
    "add": (_count, "an int: how many prompt tokens the prefix cache served"),
    "append": (_pairs, "a list of (src, dst) block-id pairs: the copies to do before the write"),
    "swap_out": (_pairs, "a list of (gpu, cpu) block-id pairs"),
    "swap_in": (_pairs, "a list of (cpu, gpu) block-id pairs"),
    "block_table": (_table, "a list of block ids"),
    "num_free_blocks": (_count, "an int"),
}


class Deadline:
    """Times subject calls: the SIGALRM timer on the main thread, the faulthandler backstop anywhere.
    Use it as a context manager around a run; outside one, calls are not timed."""

    def __init__(self, seconds: float = DEFAULT_TIMEOUT):
        self.seconds = seconds
        self.timer = False          # the SIGALRM handler is installed (a run on the main thread)
        self.in_call = False        # a stray expiry outside a call is ignored
        self.entered = False
        self.backstop_armed_at = None
        self.previous_handler, self.previous_timer, self.entered_at = None, (0.0, 0.0), 0.0

    def __enter__(self):
        self.entered = True
        if threading.current_thread() is threading.main_thread():
            # someone else's timer (pytest-timeout's signal method, say) is paused, and resumed on exit
            self.previous_timer, self.entered_at = signal.getitimer(signal.ITIMER_REAL), time.monotonic()
            self.previous_handler = signal.signal(signal.SIGALRM, self._expired)
            self.timer = True
        return self

    def __exit__(self, *exc):
        if self.timer:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.previous_handler)
            delay, interval = self.previous_timer
            if delay:
                left = max(delay - (time.monotonic() - self.entered_at), 1e-3)  # overdue: fire at once
                signal.setitimer(signal.ITIMER_REAL, left, interval)
            self.timer = False
        if self.backstop_armed_at is not None:
            faulthandler.cancel_dump_traceback_later()
            self.backstop_armed_at = None
        self.entered = False

    def _expired(self, signum, frame):
        if self.in_call:
            raise CallTimeout()

    def _refresh_backstop(self) -> None:
        now = time.monotonic()
        if self.backstop_armed_at is None or now - self.backstop_armed_at >= self.seconds / 4:
            faulthandler.dump_traceback_later(BACKSTOP_FACTOR * self.seconds + BACKSTOP_SLACK, exit=True,
                                              file=_STDERR)
            self.backstop_armed_at = now

    def call(self, what: str, thunk):
        """`thunk()`, timed; a timeout, a sys.exit or a bad return become a `SubjectFault`."""
        try:
            result = self.timed(thunk)
        except CallTimeout:
            raise SubjectFault("timeout", f"{what} did not return within {self.seconds:g} s") from None
        except SystemExit as exit_:
            raise SubjectFault("crash", f"{what} called sys.exit({exit_.code!r})") from None
        check = RETURNS.get(what)
        if check and not check[0](result):
            raise SubjectFault("protocol", f"{what} returned {_shown(result)}; the protocol wants {check[1]}")
        return result

    def timed(self, thunk):
        """`thunk()`, raising `CallTimeout` out of it once it overruns (untimed outside a run)."""
        if not self.entered:
            return thunk()
        if _STDERR is not None:
            self._refresh_backstop()
        self.in_call = True
        if self.timer:
            signal.setitimer(signal.ITIMER_REAL, self.seconds, self.seconds)
        try:
            return thunk()
        finally:
            if self.timer:
                signal.setitimer(signal.ITIMER_REAL, 0)
            self.in_call = False
            if _STDERR is not None:
                self._refresh_backstop()


def _shown(value) -> str:
    text = repr(value)
    return f"{text[:80]}... ({type(value).__name__})" if len(text) > 80 else f"{text} ({type(value).__name__})"


class GuardedSubject:
    """A subject whose protocol methods run through a `Deadline`; other attributes pass through."""

    def __init__(self, subject, deadline: Deadline):
        self._subject, self._deadline = subject, deadline

    def __getattr__(self, name):
        attr = getattr(self._subject, name)
        if name not in GUARDED or not callable(attr):
            return attr
        return lambda *args: self._deadline.call(name, lambda: attr(*args))


class GuardedFactory:
    """Builds guarded subjects; the factory's own attributes (a declared `config_space`, say) pass through."""

    def __init__(self, factory, deadline: Deadline):
        self._factory, self._deadline = factory, deadline

    def __call__(self, **config):
        return GuardedSubject(self._deadline.call("factory", lambda: self._factory(**config)), self._deadline)

    def __getattr__(self, name):
        return getattr(self._factory, name)


class Hang(BaseException):
    """A machine operation that overran its time, with the program that led to it. A BaseException,
    so that Hypothesis lets it through at once instead of shrinking it (see the module docstring)."""

    def __init__(self, message: str, program: list):
        super().__init__(message)
        self.message, self.program = message, program


class HangFound(AssertionError):
    """`run_bounded`'s report of a `Hang`: an ordinary test failure whose notes are the program, as
    Hypothesis' own failures carry theirs (`fuzz/findings.py` reads them)."""


class TimedMachine(RuleBasedStateMachine):
    """A state machine whose operations run through `timed`: each is recorded in `program` and, in a
    `run_bounded` run, interrupted once it overruns the run's `Deadline` (unbound, calls are untimed)."""

    deadline = None

    def __init__(self) -> None:
        super().__init__()
        self.program = []   # this example's operations so far, as readable calls
        self.hung = False   # teardown must not run operations on a state whose operation hung

    def timed(self, step, thunk, record: bool = True):
        """Run `thunk()` as the operation `step` (a readable call); `record=False` for checks that
        are not steps of the program (invariants, observations)."""
        if record:
            self.program.append(step)
        try:
            return self.deadline.timed(thunk) if self.deadline is not None else thunk()
        except CallTimeout:
            self.hung = True
            raise Hang(f"{step} did not return within {self.deadline.seconds:g} s", list(self.program)) from None


def timed_check(method):
    """A `TimedMachine` method that observes or checks (an invariant, say), timed like an operation
    but not recorded as a step of the program."""
    @functools.wraps(method)
    def timed(self, *args):
        return self.timed(f"{method.__name__}()", lambda: method(self, *args), record=False)
    return timed


def call_text(operation: str, *args) -> str:
    """One operation as a readable call: `add(3, [1, 2])`."""
    return f"{operation}({', '.join(map(repr, args))})"


def run_bounded(machine: type, settings, seconds: float = None) -> None:
    """`run_state_machine_as_test(machine)` with every timed operation bounded by `seconds` (default
    `DEFAULT_TIMEOUT`); a hang raises `HangFound` naming the operation, with the program so far."""
    deadline = Deadline(DEFAULT_TIMEOUT if seconds is None else seconds)
    try:
        with deadline:
            run_state_machine_as_test(bind(machine, deadline=deadline), settings=settings)
    except Hang as hang:
        found = HangFound(f"timeout: {hang.message}")
        found.add_note("program so far (unshrunk: a hang is not shrunk):")
        for step in hang.program:
            found.add_note(f"    {step}")
        raise found from None
