"""bench/mutation.py, the standing mutation measure: its mutants are real one-point changes, they
run in an overlay the checks really import, and a check that notices the change kills the mutant."""

import ast
import difflib
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import mutation  # noqa: E402  (bench/ is scripts, not a package)

DUPLICATE_RAISE = "spec/kvspec.py::KVSpec.add: delete Raise: raise DuplicateSequence(seq_id) #1"
#: Fails (exit 1) unless adding an existing id raises DuplicateSequence: a check of our own.
DUPLICATE_CHECK = [sys.executable, "-c",
                   "import sys\nfrom pagedkv.spec import KVSpec, DuplicateSequence\nkv = KVSpec(4, 2)\n"
                   "kv.add(0, [1])\ntry:\n    kv.add(0, [2])\nexcept DuplicateSequence:\n    sys.exit(0)\nsys.exit(1)"]


def by_ident(file: str) -> dict:
    return {m.ident: m for m in mutation.mutation_points(file)}


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


def test_a_mutant_is_killed_by_the_check_that_notices_and_survives_one_that_does_not(monkeypatch):
    monkeypatch.setitem(mutation.CHECKS, "duplicate", (DUPLICATE_CHECK, ("spec",)))
    monkeypatch.setitem(mutation.CHECKS, "blind", ([sys.executable, "-c", "import pagedkv.spec"], ("spec",)))
    result = mutation.run_mutant(by_ident("spec/kvspec.py")[DUPLICATE_RAISE], ["duplicate", "blind"], 60)
    assert [(o.check, o.verdict) for o in result.outcomes] == [("duplicate", "killed"), ("blind", "survived")]
    assert result.killers == ["duplicate"]


def test_the_unmutated_overlay_passes_the_same_check(tmp_path, monkeypatch):
    monkeypatch.setitem(mutation.CHECKS, "duplicate", (DUPLICATE_CHECK, ("spec",)))
    assert mutation.run_check("duplicate", mutation.overlay(None, tmp_path), 60).verdict == "survived"


def test_a_check_that_hangs_kills_the_mutant_as_a_hang(monkeypatch, tmp_path):
    monkeypatch.setitem(mutation.CHECKS, "sleepy", ([sys.executable, "-c", "import time; time.sleep(30)"], ("spec",)))
    outcome = mutation.run_check("sleepy", mutation.overlay(None, tmp_path), 1)
    assert outcome.verdict == "hang"


def test_report_scores_files_and_unique_killers():
    m1, m2, m3 = list(by_ident("impl/alloc/block_pool.py").values())[:3]
    results = [mutation.Result(m1, [mutation.Outcome("unit", "killed", 1), mutation.Outcome("differential", "survived", 1)]),
               mutation.Result(m2, [mutation.Outcome("unit", "killed", 1), mutation.Outcome("differential", "killed", 1)]),
               mutation.Result(m3, [mutation.Outcome("unit", "survived", 1), mutation.Outcome("differential", "survived", 1)])]
    text = mutation.report(results, ["impl/alloc/block_pool.py"], 0)
    assert "impl/alloc/block_pool.py                 2      3   66.7%" in text
    assert "unit                    2        1" in text and "differential            1        0" in text
    assert "1 survivor(s)" in text and m3.ident in text


def test_listed_equivalent_mutants_exist_and_give_a_reason():
    known = {m.ident for file in mutation.TARGETS for m in mutation.mutation_points(file)}
    for ident, reason in mutation.load_equivalent().items():
        assert ident in known, f"stale equivalent-mutant entry: {ident}"
        assert len(reason) > 20, ident
