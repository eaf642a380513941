"""The call guard: a wrong return type, a call that never returns and a sys.exit are findings that
name the step and the method, never a harness failure or a hung kit."""

import subprocess
import sys
import textwrap
import threading
import time

import pytest
from hypothesis import Phase

import bug_zoo
from pagedkv.fuzz.campaign import check, replay_guarded
from pagedkv.fuzz.guard import Deadline, SubjectFault
from pagedkv.fuzz.oracles import ORACLES, OracleFailure
from pagedkv.fuzz.subjects import Subject

CONFIG = {"num_blocks": 4, "block_size": 2, "prefix_caching": False, "num_cpu_blocks": 0}
NO_SHRINK = [Phase.explicit, Phase.reuse, Phase.generate]
PROGRAM = [("add", (1, [0, 1, 2])), ("append", (1, 3)), ("fork", (1, 2)), ("free", (1,))]


def subject(cls) -> Subject:
    return Subject(f"test:{cls.__name__}", cls, cls.capabilities)


def fired(cls, program=PROGRAM, timeout=10.0) -> OracleFailure:
    with pytest.raises(OracleFailure) as caught:
        replay_guarded(subject(cls), CONFIG, program, timeout)
    return caught.value


class AppendReturnsNone(bug_zoo.Reference):
    def append(self, seq_id, token):
        super().append(seq_id, token)


class AddReturnsText(bug_zoo.Reference):
    def add(self, seq_id, tokens):
        return str(super().add(seq_id, tokens))


class TableIsNone(bug_zoo.Reference):
    def block_table(self, seq_id):
        super().block_table(seq_id)


@pytest.mark.parametrize("cls, method, step", [
    (AppendReturnsNone, "append", 2), (AddReturnsText, "add", 1), (TableIsNone, "block_table", 1)])
def test_a_wrong_return_type_is_a_protocol_finding_at_its_step(cls, method, step):
    failure = fired(cls)
    assert failure.oracle == "protocol" and failure.oracle in ORACLES
    assert failure.message.startswith(f"{method} returned ") and "the protocol wants" in failure.message
    assert len(failure.report["program"]) == step  # the program stops at the step that returned it


def test_the_campaign_reports_a_wrong_return_type_as_protocol_not_a_harness_error():
    _, failure = check(subject(AppendReturnsNone), "ci", max_examples=20, phases=NO_SHRINK)
    assert failure["oracle"] == "protocol" and "append returned None" in failure["message"]
    assert failure["program"][-1][0] == "append"


class Exits(bug_zoo.Reference):
    def fork(self, parent_id, child_id):
        sys.exit(3)


def test_sys_exit_is_a_crash_finding():
    failure = fired(Exits)
    assert failure.oracle == "crash" and failure.message == "fork called sys.exit(3)"
    assert failure.report["program"][-1] == ["fork", [1, 2]]


class SpinsOnFork(bug_zoo.Reference):
    def fork(self, parent_id, child_id):
        while True:
            try:
                time.sleep(0.01)
            except Exception:  # a subject that swallows what it can must still be stopped
                pass


class SleepsOnAppend(bug_zoo.Reference):
    def append(self, seq_id, token):
        time.sleep(3600)


class WaitsOnALock(bug_zoo.Reference):
    def free(self, seq_id):
        lock = threading.Lock()
        lock.acquire()
        lock.acquire()


@pytest.mark.parametrize("cls, method", [(SpinsOnFork, "fork"), (SleepsOnAppend, "append"), (WaitsOnALock, "free")])
def test_a_call_that_never_returns_is_a_timeout_finding(cls, method):
    started = time.monotonic()
    failure = fired(cls, timeout=0.2)
    assert time.monotonic() - started < 5
    assert failure.oracle == "timeout" and failure.message == f"{method} did not return within 0.2 s"
    assert failure.report["program"][-1][0] == method


def test_a_fast_subject_is_never_timed_out_and_the_timer_is_disarmed_after():
    replay_guarded(subject(bug_zoo.Reference), CONFIG, PROGRAM, 0.05)
    import signal
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_a_timer_set_before_the_run_is_resumed_after_it():
    import signal
    fired = []
    previous = signal.signal(signal.SIGALRM, lambda *_: fired.append(True))
    try:
        signal.setitimer(signal.ITIMER_REAL, 30)
        replay_guarded(subject(bug_zoo.Reference), CONFIG, PROGRAM, 5.0)
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 20 < left <= 30 and not fired
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_off_the_main_thread_calls_run_untimed_but_guarded():
    outcome = {}

    def body():
        with Deadline(0.01) as deadline:
            outcome["slow"] = deadline.call("num_free_blocks", lambda: time.sleep(0.05) or 7)
            try:
                deadline.call("add", lambda: None)
            except SubjectFault as fault:
                outcome["fault"] = fault.oracle
    worker = threading.Thread(target=body)
    worker.start()
    worker.join(10)
    assert outcome == {"slow": 7, "fault": "protocol"}


def test_the_backstop_ends_a_call_stuck_in_c_with_every_stack(tmp_path):
    """sum() over a huge range holds the GIL in C: the timer's handler never runs, faulthandler does."""
    script = tmp_path / "stuck.py"
    script.write_text(textwrap.dedent("""
        from pagedkv.fuzz import guard
        guard.BACKSTOP_FACTOR, guard.BACKSTOP_SLACK = 1, 0.5
        with guard.Deadline(0.2) as deadline:
            deadline.call("add", lambda: sum(range(10**15)))
        print("returned")
    """))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and "returned" not in run.stdout
    assert "Timeout" in run.stderr and "stuck.py" in run.stderr
