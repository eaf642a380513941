"""Regression files never turn what a subject said into Python source: the test file is the same
fixed text for every finding, and the subject's messages and reprs are data in the JSON beside it."""

import builtins
import json
import os
import runpy
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

import bug_zoo
from pagedkv.fuzz.campaign import REGRESSION_TEST, load_regression, replay_guarded, write_regression
from pagedkv.fuzz.oracles import OracleFailure
from pagedkv.fuzz.subjects import Subject

ZOO_DIR = os.path.dirname(os.path.abspath(__file__))
CONFIG = {"num_blocks": 3, "block_size": 2, "prefix_caching": False, "num_cpu_blocks": 0}
#: Texts that broke out of the old generated source: a docstring end, a Windows path (a bad
#: escape), a multi-line repr under a comment, and code that marks itself if it ever runs.
RUNS = "import builtins; builtins.PAGEDKV_SUBJECT_TEXT_RAN = True"
HOSTILE = ['"""\n' + RUNS + '\n"""', "C:\\Users\\x\\N{oops}\\u12", "array([[1, 2],\n" + RUNS + "\n  [3, 4]])",
           "'''" + RUNS + "'''", "\\", "{config}", "\x00\r\n", "#" + "\n" + RUNS]
texts = st.one_of(st.text(), st.sampled_from(HOSTILE),
                  st.tuples(st.text(), st.sampled_from(HOSTILE), st.text()).map("".join))


class Says(bug_zoo.Reference):
    """Raises a foreign error carrying `text` at its first add, and returns `text` from fork (a
    protocol breach whose repr lands in the trace)."""

    text = ""

    def add(self, seq_id, tokens):
        if seq_id == 2:
            raise RuntimeError(self.text)
        return super().add(seq_id, tokens)


def finding(text: str) -> dict:
    says = type("Says", (Says,), {"text": text})
    try:
        replay_guarded(Subject("hostile_subjects:Says", says, says.capabilities), CONFIG,
                       [["add", [1, [0, 1, 2]]], ["add", [2, [0]]]])
    except OracleFailure as failure:
        return {"oracle": failure.oracle, "message": failure.message, **failure.report}
    raise AssertionError("the subject did not crash")


@settings(max_examples=60, deadline=None)
@given(text=texts, extra=st.lists(texts, max_size=3))
def test_subject_text_is_data_never_source(tmp_path_factory, text, extra):
    failure = finding(text)
    failure["trace"] = failure["trace"] + extra     # reprs of results the subject returned
    directory = tmp_path_factory.mktemp("regressions")
    subject = Subject("hostile_subjects:Says", Says, Says.capabilities, search_path=ZOO_DIR)
    path = write_regression(str(directory), subject, failure)
    with open(path, encoding="utf-8") as handle:
        assert handle.read() == REGRESSION_TEST
    data = load_regression(path[:-3] + ".json")
    assert data["message"] == failure["message"] == f"add raised RuntimeError: {text}"
    assert data["trace"][:len(failure["trace"])] == failure["trace"]
    runpy.run_path(path)    # what collection does: import the module
    assert not hasattr(builtins, "PAGEDKV_SUBJECT_TEXT_RAN")


def test_pytest_collects_and_runs_a_hostile_regression_without_running_its_text(tmp_path):
    text = '"""\nopen("TEXT_RAN", "w").close()\n"""' + HOSTILE[1]
    (tmp_path / "hostile_subjects.py").write_text(
        "import bug_zoo\n\n\nclass Says(bug_zoo.Reference):\n    def add(self, seq_id, tokens):\n"
        f"        raise RuntimeError({text!r})\n")
    subject = Subject("hostile_subjects:Says", Says, Says.capabilities, search_path=str(tmp_path))
    path = write_regression(str(tmp_path / "regressions"), subject, finding(text))
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore", path],
                         cwd=tmp_path / "regressions", capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": ZOO_DIR})
    assert run.returncode == 1, run.stdout + run.stderr     # collected fine, and the bug is still there
    assert "[crash] add raised RuntimeError" in run.stdout and "SyntaxError" not in run.stdout
    assert not (tmp_path / "TEXT_RAN").exists() and not (tmp_path / "regressions" / "TEXT_RAN").exists()


@pytest.mark.parametrize("broken, says", [
    ("[]", "a JSON object expected"), ('{"format": 1}', "'target' missing"),
    (json.dumps({"format": 9, "target": "spec", "search_path": "", "oracle": "crash", "message": "", "config": {},
                 "program": [], "trace": [], "call_timeout": 1, "policy": "spec", "block_sizes": None}),
     "regression format 9")])
def test_a_malformed_regression_file_says_what_is_wrong(tmp_path, broken, says):
    (tmp_path / "r.json").write_text(broken)
    with pytest.raises(ValueError, match=says):
        load_regression(tmp_path / "r.json")
