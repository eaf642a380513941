"""The proof obligations hold (on the quick profile's smaller bounds, so pytest stays fast), and
the report/check entry points have the agreed shapes."""
from pagedkv.proofs import report
from pagedkv.proofs.report import ObligationResult, run_proof_check, run_proofs

KINDS = {"initiation", "induction", "atomicity", "exclusivity", "BMC", "contract"}


def test_quick_obligations_hold():
    results = run_proofs("quick")
    failed = [f"{r.name} [{r.bounds}]: {r.detail}" for r in results if not r.passed]
    assert not failed, "\n".join(failed)
    assert {r.kind for r in results} == KINDS
    assert all(isinstance(r, ObligationResult) and r.bounds for r in results)


def test_ci_profile_covers_every_case_and_kind():
    tasks = report.obligations("ci")
    names = [name for name, _ in tasks]
    assert names.count("induction") == len(report.CASES)
    assert {"initiation", "step_composition", "step_unrolling", "atomicity", "exclusivity", "bmc", "witnesses",
            "crosshair_check", "crosshair_scenarios", "explicit_bmc"} <= set(names)
    assert report.PROFILES["ci"].bmc_depth >= 2


def test_run_proof_check_shape(monkeypatch):
    fake = [ObligationResult("a", "induction", "N=1", True, 0.1, "proved"),
            ObligationResult("b", "BMC", "N=1", False, 0.2, "counterexample\nmore")]
    monkeypatch.setattr(report, "run_proofs", lambda profile: fake)
    check = run_proof_check("ci")
    assert check == {"name": "proofs", "covered": "2 obligations", "passed": False, "detail": "b: counterexample"}
