"""`pagedkv prove`: one row per obligation, JSON output, non-zero exit on any failure."""
import json

from click.testing import CliRunner

from pagedkv.cli.main import main
from pagedkv.proofs import report
from pagedkv.proofs.report import ObligationResult

PASSING = [ObligationResult("initiation: refcount", "initiation", "N=4 B=2", True, 0.01, "proved"),
           ObligationResult("BMC: no leak", "BMC", "k=6", True, 1.5, "proved")]


def invoke(monkeypatch, results, *args):
    monkeypatch.setattr(report, "run_proofs", lambda profile, workers=0, on_done=None: results)
    return CliRunner().invoke(main, ["prove", *args])


def test_prints_rows_and_writes_json(monkeypatch, tmp_path):
    out = tmp_path / "proofs.json"
    result = invoke(monkeypatch, PASSING, "--profile", "ci", "--json", str(out))
    assert result.exit_code == 0, result.output
    assert "initiation: refcount" in result.output and "BMC: no leak" in result.output
    assert "2/2 obligations hold" in result.output
    data = json.loads(out.read_text())
    assert data["passed"] and [o["kind"] for o in data["obligations"]] == ["initiation", "BMC"]


def test_fails_when_an_obligation_fails(monkeypatch):
    failing = PASSING + [ObligationResult("induction: fork ⇒ refcount", "induction", "N=4", False, 0.3,
                                          "refcount broken by fork(0, 1)")]
    result = invoke(monkeypatch, failing)
    assert result.exit_code == 1
    assert "refcount broken by fork(0, 1)" in result.output


def test_rejects_unknown_profile():
    assert CliRunner().invoke(main, ["prove", "--profile", "nope"]).exit_code == 2
