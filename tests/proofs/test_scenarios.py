"""proofs/scenarios.py under CrossHair: the scenarios hold and are exercised (not vacuous), and a
planted wrong postcondition is reported with its counterexample."""
import textwrap

from pagedkv.proofs import contracts, scenarios

SCENARIOS = ("fork_scenario", "free_scenario", "preempt_scenario")


def test_scenarios_hold_and_are_not_vacuous():
    skip = tuple(n for n in contracts._functions(contracts.SCENARIOS) if n not in SCENARIOS)
    assert skip == ("add_scenario", "append_scenario", "resume_scenario", "step_scenario")  # the module's others
    outcome = contracts.check_scenarios(contracts.SCENARIO_PER_CONDITION_S, 600, skip=skip)
    assert outcome.passed, outcome.detail
    assert "none vacuous" in outcome.detail


def test_scenarios_run_concretely():
    # The same functions, executed plainly (pagedkv.spec imports): their posts hold on a few inputs.
    kv, ok, cached = scenarios.add_scenario([0, 1, 2], [0, 1, 0])
    assert ok and cached == 2 and not scenarios.violations(kv)
    kv, ok, free_before, copies = scenarios.append_scenario([0, 1, 2], 1, True, False)
    assert ok and len(copies) == 1


def _mutant(tmp_path, body: str):
    package = tmp_path / "proofs"   # same layout as the checkout: spec importable as `spec`
    package.mkdir()
    (package / "__init__.py").write_text("")
    (tmp_path / "spec").symlink_to(contracts.SPEC_DIR)
    path = package / "scenarios.py"
    path.write_text(textwrap.dedent(body))
    return path


def test_planted_bug_is_reported_with_counterexample(tmp_path):
    path = _mutant(tmp_path, '''\
        from typing import List
        from spec.kvspec import KVSpec

        def preempt_never_frees(prompt: List[int], fork: bool) -> int:
            """Wrong: claims preempting never returns blocks to the pool.

            pre: 1 <= len(prompt) <= 5 and all(0 <= t < 3 for t in prompt)
            post: __return__ == 4 - -(-len(prompt) // 2)
            """
            kv = KVSpec(4, 2, num_cpu_blocks=2, prefix_caching=True)
            kv.add(1, prompt)
            if fork:
                kv.fork(1, 2)
            kv.preempt(1, "recompute")
            return kv.num_free_blocks()
        ''')
    outcome = contracts.check_scenarios(contracts.SCENARIO_PER_CONDITION_S, 600, path=path)
    assert not outcome.passed
    assert "preempt_never_frees" in outcome.detail and "when calling preempt_never_frees(" in outcome.detail
    assert "False)" in outcome.detail   # the counterexample: no fork, so the blocks come back


def test_vacuous_scenario_fails(tmp_path):
    path = _mutant(tmp_path, '''\
        def impossible(x: int) -> int:
            """
            pre: x > 0 and x < 0
            post: __return__ == x
            """
            return x
        ''')
    outcome = contracts.check_scenarios(1, 120, path=path)
    assert not outcome.passed and "vacuous" in outcome.detail, outcome.detail


def test_append_and_step_scenarios_are_checked_not_vacuous():
    skip = tuple(n for n in contracts._functions(contracts.SCENARIOS) if n not in ("append_scenario", "step_scenario"))
    outcome = contracts.check_scenarios(contracts.SCENARIO_PER_CONDITION_S, 600, skip=skip)
    assert outcome.passed, outcome.detail
