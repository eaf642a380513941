"""`pagedkv check` and `pagedkv prove` report what they found and what they were doing: counterexamples
as programs, partial results on Ctrl-C, progress while they run."""
import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

from click.testing import CliRunner
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test

from pagedkv.cli import check as check_module
from pagedkv.cli.main import main


class Counter(RuleBasedStateMachine):
    """Two planted bugs, so Hypothesis reports two distinct failures, each with its own program."""

    def __init__(self):
        super().__init__()
        self.total = 0

    @rule(k=st.integers(0, 10))
    def add(self, k):
        self.total += k
        if self.total >= 15:
            raise AssertionError("total reached 15")   # not `assert`: pytest would rewrite its message
        if k == 7:
            raise ValueError("seven is planted")


def two_bug_check(profile):
    run_state_machine_as_test(Counter, settings=settings(max_examples=300, database=None, derandomize=True,
                                                          deadline=None))
    return {"covered": "-", "passed": True}


def passing_check(profile):
    return {"covered": f"ran with {profile}", "passed": True}


def interrupted_check(profile):
    raise KeyboardInterrupt


def here(function) -> str:
    return f"{__name__}:{function.__name__}"


def test_failing_check_prints_each_counterexample_and_reports_them(monkeypatch, tmp_path):
    monkeypatch.setattr(check_module, "CHECKS", [("planted", here(two_bug_check), "two planted bugs")])
    report, junit = tmp_path / "check.json", tmp_path / "check.xml"
    result = CliRunner().invoke(main, ["check", "--json", str(report), "--junit", str(junit)])
    assert result.exit_code == 1, result.output
    [row] = json.loads(report.read_text())["checks"]
    examples = {example["error"]: example["program"] for example in row["counterexamples"]}
    assert set(examples) == {"AssertionError: total reached 15", "ValueError: seven is planted"}
    # Each program is the shrunk, readable one: it replays the failure step by step.
    assert examples["ValueError: seven is planted"].splitlines()[1:] == ["state = Counter()", "state.add(k=7)",
                                                                         "state.teardown()"]
    assert "state.add(k=" in examples["AssertionError: total reached 15"]
    for text in (result.output, ET.parse(junit).getroot().find("testcase/failure").text):
        assert "counterexample 1/2" in text and "counterexample 2/2" in text and "state.add(k=7)" in text


def test_ctrl_c_prints_the_finished_rows_and_exits_130(monkeypatch, tmp_path):
    monkeypatch.setattr(check_module, "CHECKS", [("first", here(passing_check), "passes"),
                                                 ("second", here(interrupted_check), "Ctrl-C"),
                                                 ("third", here(passing_check), "never reached")])
    report = tmp_path / "check.json"
    result = CliRunner().invoke(main, ["check", "--json", str(report)])
    assert result.exit_code == 130, result.output
    assert "ran with ci" in result.output and "not run" in result.output and "interrupted after" in result.output
    assert [line.split("│")[3].strip() for line in result.output.splitlines() if "│ second" in line] == ["interrupted"]
    data = json.loads(report.read_text())
    assert data["interrupted"] and not data["passed"]
    assert [row["check"] for row in data["checks"]] == ["first"] and data["not_run"] == ["second", "third"]


def test_progress_is_plain_lines_on_stderr_when_not_a_terminal(monkeypatch):
    monkeypatch.setattr(check_module, "CHECKS", [("first", here(passing_check), "-"),
                                                 ("second", here(passing_check), "-")])
    monkeypatch.setattr(check_module, "EXPECTED_CI_S", {"first": 70})
    result = CliRunner().invoke(main, ["check"])
    assert result.exit_code == 0
    lines = result.stderr.splitlines()
    assert lines[0] == "check --profile ci: 1/2 first: running (expected ~70 s)"
    assert lines[1].startswith("check --profile ci: 1/2 first: PASS in ")
    assert lines[2] == "check --profile ci: 2/2 second: running"   # nothing measured yet
    assert "first" in result.stdout and "first" not in result.stdout.split("┃")[0]   # the table is on stdout


def test_the_next_run_expects_what_the_last_run_took(monkeypatch):
    monkeypatch.setattr(check_module, "CHECKS", [("slow", here(passing_check), "-")])
    monkeypatch.setattr(check_module, "EXPECTED_CI_S", {"slow": 500})
    runner = CliRunner()
    assert "(expected ~8 min 20 s)" in runner.invoke(main, ["check"]).stderr
    assert "(expected ~0 s)" in runner.invoke(main, ["check"]).stderr


def test_check_help_lists_every_check_and_only_takes_each():
    help_text = CliRunner().invoke(main, ["check", "--help"]).output
    for name in check_module.CHECK_NAMES:
        assert f"  {name} " in help_text
    assert check_module.CHECK_NAMES == ["spec-stateful", "proofs", "differential", "conformance", "kernels",
                                        "kernel-state", "engine"]


def test_json_dash_writes_clean_json_to_stdout(monkeypatch):
    monkeypatch.setattr(check_module, "CHECKS", [("first", here(passing_check), "-")])
    result = CliRunner().invoke(main, ["check", "--json", "-"])
    assert json.loads(result.stdout)["checks"][0]["covered"] == "ran with ci"
    assert "pagedkv check --profile ci" in result.stderr   # the table moved to stderr


def test_prove_ctrl_c_exits_130_without_worker_tracebacks(tmp_path):
    """A real SIGINT to the whole process group, as a terminal's Ctrl-C sends it, once the first
    obligation group has finished: the workers leave quietly and the finished results are printed."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    process = subprocess.Popen([sys.executable, "-m", "pagedkv", "prove", "--workers", "2"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True, env=env)
    first = process.stderr.readline()   # plain progress: a line per finished group
    time.sleep(0.5)
    os.killpg(process.pid, signal.SIGINT)
    stdout, stderr = process.communicate(timeout=60)
    assert first.startswith("prove --profile ci: ") and " PASS " in first
    assert process.returncode == 130
    assert "Traceback" not in stderr and "ForkPoolWorker" not in stderr, stderr
    assert "interrupted" in stdout and "obligation" in stdout


def slow_check(profile):
    time.sleep(0.35)
    return {"covered": "-", "passed": True}


def test_a_long_check_keeps_printing_off_a_terminal(monkeypatch):
    from pagedkv.cli.progress import StepProgress

    monkeypatch.setattr(StepProgress, "HEARTBEAT_S", 0.1)
    monkeypatch.setattr(check_module, "CHECKS", [("slow", here(slow_check), "-")])
    lines = CliRunner().invoke(main, ["check"]).stderr.splitlines()
    still = [line for line in lines if "slow: still running" in line]
    assert len(still) >= 2 and any(line.startswith("check --profile ci: 1/1 slow: PASS in ") for line in lines)


def test_groups_running_side_by_side_share_one_heartbeat_line():
    import io

    from pagedkv.cli.progress import Step, StepProgress

    stream = io.StringIO()
    progress = StepProgress("prove", {"a": Step("induction", total=3), "b": Step("atomicity", total=2)},
                            announce=False, stream=stream)
    progress.HEARTBEAT_S = 0.05
    with progress:
        progress.begin("a")
        progress.begin("b")
        progress.advance("a")
        time.sleep(0.2)
    beats = [line for line in stream.getvalue().splitlines() if "still running" in line]
    assert beats and all(line.startswith("prove: still running: induction 1/3, atomicity 0/2 (") for line in beats)
