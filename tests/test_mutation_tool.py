"""bench/mutation.py, the standing mutation measure: its mutants are real one-point changes, they
run in an overlay the checks really import (from the measured checkout), the check that notices
the change kills the mutant, the gate's kill stops the rest, a hang kills only when the unmutated
check finishes, shrinking is capped, and a results file resumes an interrupted run."""

import ast
import difflib
import json
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import mutation  # noqa: E402  (bench/ is scripts, not a package)

SPEC = "spec/kvspec.py"
DUPLICATE_RAISE = "spec/kvspec.py::KVSpec.add: delete Raise: raise DuplicateSequence(seq_id) #1"
#: Exit 0 if adding an existing id raises DuplicateSequence; else exit 1, or sleep (a hang) with HANG.
DUPLICATE = ("import sys, time\nfrom pagedkv.spec import KVSpec, DuplicateSequence\nkv = KVSpec(4, 2)\n"
             "kv.add(0, [1])\ntry:\n    kv.add(0, [2])\nexcept DuplicateSequence:\n    sys.exit(0)\n"
             "if len(sys.argv) > 1:\n    time.sleep(60)\nsys.exit(1)")


def code_check(code: str, *args: str) -> mutation.Check:
    return mutation.Check((sys.executable, "-c", code, *args), ("spec",))


def by_ident(file: str, root: Path = mutation.ROOT) -> dict:
    return {m.ident: m for m in mutation.mutation_points(file, root)}


@pytest.fixture(autouse=True)
def fixed_commit(monkeypatch):
    """The shared tree's commit moves while tests run; a results file belongs to one commit."""
    monkeypatch.setattr(mutation, "commit_of", lambda root: "c0ffee")


@pytest.fixture
def checks(monkeypatch):
    """Replace the project's checks with `name -> Check` (in run order; the first is the gate)."""
    def use(**named):
        monkeypatch.setattr(mutation, "CHECKS", dict(named))
        monkeypatch.setattr(mutation, "GATE", next(iter(named)))
    return use


@pytest.mark.parametrize("file", mutation.TARGETS)
def test_every_mutant_is_one_change_that_still_parses(file):
    points = mutation.mutation_points(file)
    assert len({m.ident for m in points}) == len(points), "idents name one mutant each"
    original = ast.unparse(ast.parse((mutation.ROOT / file).read_text()))
    for mutant in points[:: max(1, len(points) // 8)]:
        mutated = mutation.mutated_source(mutant)
        ast.parse(mutated)
        assert mutated != original, mutant.ident
        diff = difflib.unified_diff(original.splitlines(), mutated.splitlines(), n=0, lineterm="")
        changed = [line for line in diff if line[:1] in "+-" and line[:3] not in ("+++", "---")]
        assert 0 < len(changed) <= 4, (mutant.ident, changed)


def test_every_operator_kind_is_drawn():
    kinds = {m.kind.split()[0] for file in mutation.TARGETS for m in mutation.mutation_points(file)}
    assert kinds == {"compare", "arith", "bool", "drop", "constant", "swap", "delete"}


def test_the_draw_is_fixed_by_the_seed_and_a_shorter_sample_is_its_prefix():
    first, again = mutation.sample(mutation.TARGETS, 40, 0), mutation.sample(mutation.TARGETS, 40, 0)
    assert first == again and mutation.sample(mutation.TARGETS, 200, 0)[:40] == first
    assert mutation.sample(mutation.TARGETS, 40, 1) != first


def test_the_noticing_check_kills_and_the_blind_one_survives(checks):
    checks(blind=code_check("import pagedkv.spec"), duplicate=code_check(DUPLICATE), after=code_check("pass"))
    result = mutation.run_mutant(by_ident(SPEC)[DUPLICATE_RAISE], ["blind", "duplicate", "after"], mutation.Bench())
    assert [(o.check, o.verdict) for o in result.outcomes] == [("blind", "survived"), ("duplicate", "killed"),
                                                                ("after", "survived")]
    assert result.killers == ["duplicate"] and "-            raise DuplicateSequence(seq_id)\n+            pass" in result.diff


def test_a_kill_by_the_gate_stops_the_other_checks(checks):
    checks(duplicate=code_check(DUPLICATE), blind=code_check("import pagedkv.spec"))
    result = mutation.run_mutant(by_ident(SPEC)[DUPLICATE_RAISE], ["duplicate", "blind"], mutation.Bench())
    assert [o.check for o in result.outcomes] == ["duplicate"] and result.gated


def test_a_pytest_check_kills_the_planted_mutant_and_names_the_test_that_noticed(checks):
    """The project's pytest checks as the measure runs them (launcher, -x, fixed seed), on one suite."""
    checks(errors=mutation.Check(mutation.capped(*mutation.PYTEST, "tests/spec/test_error_paths.py"), ("spec",)),
           blind=code_check("import pagedkv.spec"))
    result = mutation.run_mutant(by_ident(SPEC)[DUPLICATE_RAISE], ["errors", "blind"], mutation.Bench())
    assert [(o.check, o.verdict) for o in result.outcomes] == [("errors", "killed")]
    assert result.outcomes[0].tail.startswith("FAILED tests/spec/test_error_paths.py::")


def test_a_hang_kills_only_when_the_unmutated_check_finishes(checks):
    checks(duplicate=code_check(DUPLICATE, "hang"))
    bench = mutation.Bench(fixed_timeout=3)
    result = mutation.run_mutant(by_ident(SPEC)[DUPLICATE_RAISE], ["duplicate"], bench)
    assert [(o.check, o.verdict) for o in result.outcomes] == [("duplicate", "hang")] and result.killers
    assert bench.baseline["duplicate"].verdict == "survived"
    checks(sleepy=code_check("import time; time.sleep(60)"))
    with pytest.raises(mutation.BaselineFails, match="sleepy hang on the unmutated code"):
        mutation.run_mutant(by_ident(SPEC)[DUPLICATE_RAISE], ["sleepy"], mutation.Bench(baseline_limit=2))


def test_a_check_that_fails_on_the_unmutated_code_judges_nothing(checks):
    checks(broken=code_check("raise SystemExit(3)"))
    with pytest.raises(mutation.BaselineFails, match="broken killed on the unmutated code"):
        mutation.run_mutant(by_ident(SPEC)[DUPLICATE_RAISE], ["broken"], mutation.Bench())


def test_timeouts_follow_the_unmutated_time(checks):
    checks(quick=code_check("pass"))
    bench = mutation.Bench(timeout_factor=5, min_timeout=7)
    assert bench.timeout("quick") == 7
    bench.baseline["quick"] = mutation.Outcome("quick", "survived", 4.0)
    assert bench.timeout("quick") == 20


PROBE = ("import os, sys\nfrom hypothesis.internal.conjecture import engine\n"
         "scratch = os.path.dirname(os.environ['HYPOTHESIS_STORAGE_DIRECTORY'])\n"
         "ok = engine.MAX_SHRINKING_SECONDS == 3.0 and sys.argv[-2:] == ['--db', os.path.join(scratch, 'db')]\n"
         "sys.exit(0 if ok else 1)\n")


def test_a_check_runs_with_shrinking_capped_and_its_own_example_database(checks, tmp_path):
    path = mutation.overlay(None, tmp_path / "overlay")
    (path / "shrink_probe.py").write_text(PROBE)
    checks(probe=mutation.Check(mutation.capped("shrink_probe"), ("spec",), "--db"))
    assert mutation.run_check("probe", path, mutation.Bench(shrink_s=3), tmp_path / "a", 60).verdict == "survived"
    assert mutation.run_check("probe", path, mutation.Bench(shrink_s=4), tmp_path / "b", 60).verdict == "killed"


def test_the_overlay_imports_the_measured_checkout_not_this_one(checks, tmp_path):
    """--root: a frozen snapshot is measured while this tree changes."""
    root = tmp_path / "snapshot"
    shutil.copytree(mutation.ROOT / "spec", root / "spec", ignore=shutil.ignore_patterns("__pycache__"))
    with (root / SPEC).open("a") as out:
        out.write("\nSNAPSHOT = True\n")
    for name in mutation.ROOMS[1:]:
        (root / name).symlink_to(mutation.ROOT / name, target_is_directory=True)
    checks(marker=code_check("import sys, pagedkv.spec.kvspec as k\nsys.exit(0 if hasattr(k, 'SNAPSHOT') else 1)"))
    assert mutation.run_check("marker", mutation.overlay(None, tmp_path / "a", root), mutation.Bench(root),
                              tmp_path / "s1", 60).verdict == "survived"
    assert mutation.run_check("marker", mutation.overlay(None, tmp_path / "b"), mutation.Bench(),
                              tmp_path / "s2", 60).verdict == "killed"
    mutant = by_ident(SPEC, root)[DUPLICATE_RAISE]
    assert "SNAPSHOT = True" in mutation.mutated_source(mutant, root)
    assert mutation.run_check("marker", mutation.overlay(mutant, tmp_path / "c", root), mutation.Bench(root),
                              tmp_path / "s3", 60).verdict == "survived"


SURVIVOR = "spec/kvspec.py::KVSpec.add: delete Expr: self._allocate_prompt(seq) #1"


def test_results_resume_and_survivors_are_judged_again_by_ident(checks, tmp_path, capsys):
    checks(duplicate=code_check(DUPLICATE))
    assert SURVIVOR in by_ident(SPEC), "the survivor used here must be a mutation point"
    results = tmp_path / "results.jsonl"
    argv = ["--files", SPEC, "--checks", "duplicate", "--results", str(results), "--only", DUPLICATE_RAISE,
            "--only", SURVIVOR]
    assert mutation.main(argv) == 0
    first = capsys.readouterr().out
    records = [json.loads(line) for line in results.read_text().splitlines()]
    assert sorted(r["ident"] for r in records) == sorted([DUPLICATE_RAISE, SURVIVOR])
    assert "1 survivor(s)" in first and SURVIVOR in first and "-        self._allocate_prompt(seq)" in first
    assert "spec/kvspec.py                           1       2   50.0%" in first

    kept = next(line for line in results.read_text().splitlines() if DUPLICATE_RAISE in line)
    results.write_text(kept + "\n" + '{"ident": "cut off by an interrupt')
    assert mutation.main(argv) == 0
    resumed = capsys.readouterr().out
    assert "1 to judge, 1 already judged" in resumed and "[1/1] " + SURVIVOR in resumed
    assert mutation.survivors_of(results) == [SURVIVOR]

    again = tmp_path / "again.jsonl"
    assert mutation.main(["--checks", "duplicate", "--survivors-of", str(results), "--results", str(again)]) == 0
    assert [json.loads(line)["ident"] for line in again.read_text().splitlines()] == [SURVIVOR]
    capsys.readouterr()
    assert mutation.main(argv + ["--fail-under", "50"]) == 0 and mutation.main(argv + ["--fail-under", "51"]) == 2
    assert "score 50.0% is under --fail-under 51%" in capsys.readouterr().err


def test_a_results_file_of_another_commit_is_refused(checks, tmp_path):
    results = tmp_path / "results.jsonl"
    results.write_text(json.dumps({"ident": DUPLICATE_RAISE, "commit": "0000000", "setup": "abc"}) + "\n")
    with pytest.raises(SystemExit, match="measured on 0000000"):
        mutation.main(["--files", SPEC, "--results", str(results), "--only", DUPLICATE_RAISE])


def test_report_scores_files_and_counts_kills_made_by_one_check_alone():
    m1, m2, m3, m4 = list(by_ident("impl/alloc/block_pool.py").values())[:4]
    killed, survived = (lambda name: mutation.Outcome(name, "killed", 1)), (lambda n: mutation.Outcome(n, "survived", 1))
    results = [mutation.Result(m1, [killed("unit")]),
               mutation.Result(m2, [survived("unit"), killed("differential"), survived("conformance")]),
               mutation.Result(m3, [survived("unit"), killed("differential"), killed("conformance")]),
               mutation.Result(m4, [survived("unit"), survived("differential"), survived("conformance")], "DIFF")]
    text = mutation.report(results, ["impl/alloc/block_pool.py"], {})
    assert "impl/alloc/block_pool.py                 3       4   75.0%" in text
    assert "unit                     4      1        -" in text
    assert "differential             3      2        1" in text and "conformance              3      1        0" in text
    assert "1 survivor(s)" in text and m4.ident + "\nDIFF" in text
    equivalent = mutation.report(results, ["impl/alloc/block_pool.py"], {m4.ident: "reason"})
    assert "3       3  100.0%" in equivalent and "+1 drawn that are listed as equivalent" in equivalent


def test_listed_equivalent_mutants_exist_where_they_were_judged_and_give_a_reason():
    """Each entry names a real mutation point of the commit it was judged on (today's code may have
    moved on: then it is simply never drawn)."""
    entries = json.loads(mutation.EQUIVALENT_FILE.read_text())
    for ident, entry in entries.items():
        file = ident.split("::")[0]
        assert file in mutation.TARGETS, ident
        assert ident in {m.ident for m in mutation.points_at(file, entry["commit"])}, f"no such mutant: {ident}"
        assert len(entry["reason"]) > 40, ident
    assert mutation.load_equivalent() == {ident: entry["reason"] for ident, entry in entries.items()}
    with pytest.raises(ValueError, match="no-such-file.py"):
        mutation.points_at("spec/no-such-file.py", "HEAD")
