"""`pagedkv check` and `pagedkv lab` through the command line."""

import json
import xml.etree.ElementTree as ET

from click.testing import CliRunner

from pagedkv.cli import check as check_module
from pagedkv.cli.main import main


def test_check_writes_table_json_and_junit(tmp_path):
    report, junit = tmp_path / "check.json", tmp_path / "check.xml"
    result = CliRunner().invoke(main, ["check", "--profile", "ci", "--only", "spec-stateful",
                                       "--json", str(report), "--junit", str(junit)])
    assert result.exit_code == 0, result.output
    assert "spec-stateful" in result.output and "PASS" in result.output
    data = json.loads(report.read_text())
    assert data["passed"] and data["checks"][0]["check"] == "spec-stateful"
    assert "examples" in data["checks"][0]["covered"]
    suite = ET.parse(junit).getroot()
    assert suite.get("tests") == "1" and suite.get("failures") == "0"


def test_check_fails_when_a_check_fails(monkeypatch, tmp_path):
    monkeypatch.setattr(check_module, "CHECKS", [("broken", "pagedkv.cli.check:no_such_function", "planted")])
    junit = tmp_path / "check.xml"
    result = CliRunner().invoke(main, ["check", "--junit", str(junit)])
    assert result.exit_code == 1 and "FAIL" in result.output
    assert ET.parse(junit).getroot().get("failures") == "1"


def test_check_rejects_unknown_check_name():
    result = CliRunner().invoke(main, ["check", "--only", "nonsense"])
    assert result.exit_code == 2
    assert "'nonsense' is not one of 'spec-stateful', 'proofs', 'differential', 'conformance', 'kernels', " \
           "'kernel-state', 'engine'" in result.output


def test_lab_reproduces_the_worked_example_totals():
    for block_size, totals in [(16, "blocks=8 slots=128 useful=112 tail_waste=16"),
                               (4, "blocks=29 slots=116 useful=112 tail_waste=4")]:
        result = CliRunner().invoke(main, ["lab", "--block-size", str(block_size)])
        assert result.exit_code == 0, result.output
        assert totals in result.output.splitlines()
        assert result.output.count("PASS") == 5 and "FAIL" not in result.output


def test_lab_fails_loudly_when_a_scenario_fails(monkeypatch):
    monkeypatch.setattr("pagedkv.spec.lab.SCENARIOS", (lambda b: ("planted failure", False, "seen"),))
    result = CliRunner().invoke(main, ["lab", "--block-size", "4", "--lengths", "1,2"])
    assert result.exit_code == 1 and "FAIL  planted failure" in result.output


def test_lab_rejects_bad_lengths():
    result = CliRunner().invoke(main, ["lab", "--lengths", "3,x"])
    assert result.exit_code == 2
