"""`pagedkv fuzz`: exit codes, regression files, reports, and workers sharing a directory database."""

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

ZOO_DIR = os.path.dirname(os.path.abspath(__file__))
BUG = "bug_zoo:FreeStillShared"


def fuzz(tmp_path, *args):
    """Run `pagedkv fuzz` in tmp_path with the zoo importable; returns the CompletedProcess."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ZOO_DIR, os.environ.get("PYTHONPATH", "")])}
    env.pop("CI", None)
    return subprocess.run([sys.executable, "-c", "from pagedkv.cli.main import main; main()", "fuzz", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)


def test_spec_passes_with_exit_0(tmp_path):
    run = fuzz(tmp_path, "spec", "--max-examples", "20", "--db", "db")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "PASS" in run.stdout


@pytest.fixture(scope="module")
def bug_run(tmp_path_factory):
    """One campaign against a planted bug, with every report asked for; several tests read it."""
    where = tmp_path_factory.mktemp("bug_run")
    run = fuzz(where, BUG, "--db", "db", "--save-regression", "regressions", "--json", "out.json",
               "--junit", "out.xml")
    return where, run


def test_bug_exits_1_with_shrunk_program_oracle_and_state(bug_run):
    _, run = bug_run
    assert run.returncode == 1, run.stdout + run.stderr
    assert "oracle 'free_count' fired" in run.stdout
    assert "free(seq=" in run.stdout and "<-- free_count" in run.stdout
    assert "num_free_blocks() =" in run.stdout


@pytest.mark.parametrize("target, reason", [
    ("no-colon", "use 'spec', 'impl' or 'module:factory'"),
    ("no_such_module_xyz:factory", "cannot import 'no_such_module_xyz'"),
    ("bad_subjects:BOOM", "not a callable factory"),
    ("bad_subjects:raising", "raised RuntimeError: boom"),
    ("bad_subjects:missing", "has no attribute 'missing'"),
    ("bad_subjects:incomplete", "lacks protocol method(s) append"),
])
def test_usage_errors_exit_2_with_the_reason(tmp_path, target, reason):
    (tmp_path / "bad_subjects.py").write_text(
        "BOOM = 3\n"
        "def raising(**config):\n    raise RuntimeError('boom')\n"
        "class incomplete:\n    def __init__(self, **config): pass\n"
        "    def add(self, s, t): return 0\n    def fork(self, p, c): pass\n    def free(self, s): pass\n"
        "    def block_table(self, s): return []\n    def num_free_blocks(self): return 0\n")
    run = fuzz(tmp_path, target, "--max-examples", "5")
    assert run.returncode == 2, run.stdout + run.stderr
    assert reason in run.stderr


def test_regression_file_fails_against_the_bug_and_passes_once_fixed(bug_run):
    where, _ = bug_run
    [name] = os.listdir(where / "regressions")
    path = where / "regressions" / name
    replay = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(path)]
    failing = subprocess.run(replay, cwd=where, capture_output=True, text=True, timeout=120)
    assert failing.returncode == 1 and "free_count" in failing.stdout, failing.stdout
    path.write_text(path.read_text().replace(f"TARGET = {BUG!r}", "TARGET = 'bug_zoo:Reference'"))
    fixed = subprocess.run(replay, cwd=where, capture_output=True, text=True, timeout=120)
    assert fixed.returncode == 0, fixed.stdout


def test_json_and_junit_reports(bug_run):
    where, _ = bug_run
    result = json.loads((where / "out.json").read_text())
    assert result["passed"] is False and result["failure"]["oracle"] == "free_count"
    assert result["failure"]["program"] and result["tally"]["examples"] > 0
    suite = ET.parse(where / "out.xml").getroot()
    assert suite.get("failures") == "1"
    assert "free_count" in suite.find("testcase/failure").get("message")


def test_two_workers_share_a_directory_database(tmp_path):
    first = fuzz(tmp_path, BUG, "--workers", "2", "--db", "shared", "--json", "first.json")
    assert first.returncode == 1, first.stdout + first.stderr
    assert os.listdir(tmp_path / "shared"), "the counterexample was not saved"
    second = fuzz(tmp_path, BUG, "--workers", "2", "--max-examples", "1", "--db", "shared", "--json", "second.json")
    assert second.returncode == 1
    assert json.loads((tmp_path / "second.json").read_text())["failure"]["found_in"] == "replay"


def test_seconds_budget_runs_until_time_is_up(tmp_path):
    run = fuzz(tmp_path, "spec", "--seconds", "3", "--db", "db", "--json", "out.json")
    assert run.returncode == 0
    result = json.loads((tmp_path / "out.json").read_text())
    assert result["seconds"] >= 3 and result["tally"]["runs"] >= 1
