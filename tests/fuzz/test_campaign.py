"""`pagedkv fuzz`: exit codes, option ranges, seeds, reports, regression files, module search paths
and workers sharing a directory database."""

import json
import os
import subprocess
import sys
import threading
import xml.etree.ElementTree as ET

import pytest
from click.testing import CliRunner
from hypothesis.errors import FlakyFailure

import bug_zoo
from pagedkv.cli.fuzz import fuzz as fuzz_command
from pagedkv.fuzz import campaign as campaign_module
from pagedkv.fuzz.campaign import (REGRESSION_TEST, Options, RegularFilesDatabase, UsageError, check, checked,
                                   drop_needless_steps, open_database, replay_guarded, replay_regression, run_campaign)
from pagedkv.fuzz.oracles import OracleFailure
from pagedkv.fuzz.subjects import Subject, resolve

ZOO_DIR = os.path.dirname(os.path.abspath(__file__))
BUG = "bug_zoo:BlockIdsFromOne"   # fires on the first add: campaigns against it take seconds


def fuzz(tmp_path, *args):
    """Run `pagedkv fuzz` in tmp_path with the zoo importable; returns the CompletedProcess."""
    search = [ZOO_DIR] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]  # "" would be the cwd
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(search)}
    env.pop("CI", None)
    # -P: like the `pagedkv` script, do not put the working directory first on sys.path
    return subprocess.run([sys.executable, "-P", "-W", "ignore", "-c", "from pagedkv.cli.main import main; main()",
                           "fuzz", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def invoke(*args):
    """`pagedkv fuzz` in this process (usage errors only: they stop before any fuzzing)."""
    return CliRunner().invoke(fuzz_command, list(args))


def test_spec_passes_with_exit_0(tmp_path):
    run = fuzz(tmp_path, "spec", "--max-examples", "20", "--db", "db")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "PASS" in run.stdout and "(seed 0, policy spec)" in run.stdout


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
    assert "oracle 'block_range' fired" in run.stdout
    assert "add(seq=" in run.stdout and "<-- block_range" in run.stdout
    assert "num_free_blocks() =" in run.stdout


@pytest.mark.parametrize("target, reason", [
    ("no-colon", "use 'spec', 'impl' or 'module:factory'"),
    ("no_such_module_xyz:factory", "cannot import 'no_such_module_xyz'"),
    ("bad_subjects:BOOM", "not a callable factory"),
    ("bad_subjects:raising", "raised RuntimeError: boom"),
    ("bad_subjects:exiting", "factory called sys.exit(4)"),
    ("bad_subjects:missing", "has no attribute 'missing'"),
    ("bad_subjects:incomplete", "lacks protocol method(s) append"),
    ("./bad_subjects.py:raising", "is a file path; give a module name: 'bad_subjects:raising'"),
])
def test_usage_errors_exit_2_with_the_reason(tmp_path, target, reason):
    (tmp_path / "bad_subjects.py").write_text(
        "import sys\nBOOM = 3\n"
        "def raising(**config):\n    raise RuntimeError('boom')\n"
        "def exiting(**config):\n    sys.exit(4)\n"
        "class incomplete:\n    def __init__(self, **config): pass\n"
        "    def add(self, s, t): return 0\n    def fork(self, p, c): pass\n    def free(self, s): pass\n"
        "    def block_table(self, s): return []\n    def num_free_blocks(self): return 0\n")
    run = fuzz(tmp_path, target, "--max-examples", "5")
    assert run.returncode == 2, run.stdout + run.stderr
    assert reason in run.stderr


@pytest.mark.parametrize("args, says", [
    (["--seconds", "nan"], "--seconds must be a number in (0, 2592000], got nan"),
    (["--seconds", "inf"], "--seconds must be a number in (0, 2592000], got inf"),
    (["--seconds", "0"], "--seconds must be a number"),
    (["--max-examples", "0"], "--max-examples must be an integer in [1, 1000000000], got 0"),
    (["--workers", "0"], "--workers must be an integer in [1, 256], got 0"),
    (["--workers", "100000"], "--workers must be an integer in [1, 256]"),
    (["--seed", "-1"], "--seed must be an integer in [0, 18446744073709551615], got -1"),
    (["--seed", str(2**64)], "--seed must be an integer"),
    (["--call-timeout", "-inf"], "--call-timeout must be a number in (0, 3600]"),
    (["--call-timeout", "nan"], "--call-timeout must be a number in (0, 3600]"),
])
def test_every_numeric_option_has_a_range(args, says):
    run = invoke("spec", *args)
    assert run.exit_code == 2, run.output
    assert says in run.output


@pytest.mark.parametrize("field, value", [("max_examples", True), ("max_examples", 2.0), ("workers", 10**400),
                                          ("seconds", float("nan")), ("seed", "1")])
def test_the_api_checks_the_same_ranges(field, value):
    with pytest.raises(UsageError, match=field.replace("_", "-")):
        checked(Options("spec", **{field: value}))


def test_an_adapters_import_error_shows_its_traceback_on_request(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "adapter_with_a_bad_import.py").write_text("import os\nfrom os import no_such_name_xyz\n")
    short = invoke("adapter_with_a_bad_import:make")
    assert short.exit_code == 2 and "cannot import 'adapter_with_a_bad_import'" in short.output
    assert "--traceback shows where" in short.output and "Traceback" not in short.output
    full = invoke("adapter_with_a_bad_import:make", "--traceback")
    assert full.exit_code == 2
    assert "Traceback" in full.output and 'adapter_with_a_bad_import.py", line 2' in full.output


def test_regression_file_fails_against_the_bug_and_passes_once_fixed(bug_run):
    where, _ = bug_run
    [name] = [name for name in os.listdir(where / "regressions") if name.endswith(".py")]
    path = where / "regressions" / name
    replay = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(path)]
    failing = subprocess.run(replay, cwd=where, capture_output=True, text=True, timeout=120)
    assert failing.returncode == 1 and "block_range" in failing.stdout, failing.stdout
    data_path = path.with_suffix(".json")
    data = json.loads(data_path.read_text())
    assert data["target"] == BUG
    data_path.write_text(json.dumps({**data, "target": "bug_zoo:Reference"}))
    fixed = subprocess.run(replay, cwd=where, capture_output=True, text=True, timeout=120)
    assert fixed.returncode == 0, fixed.stdout


def test_json_to_stdout_and_output_paths_checked_before_any_work(tmp_path):
    run = invoke("spec", "--max-examples", "3", "--db", str(tmp_path / "db"), "--json", "-")
    assert run.exit_code == 0, run.output
    assert json.loads(run.stdout)["passed"] is True and "PASS" in run.stderr
    for option, path in (("--json", tmp_path / "missing" / "out.json"), ("--junit", tmp_path),
                         ("--save-regression", tmp_path / "missing" / "deeper")):
        run = invoke("spec", option, str(path), "--db", str(tmp_path / "db"))
        assert run.exit_code == 2 and "examples" not in run.output, run.output


def test_json_and_junit_reports(bug_run):
    where, _ = bug_run
    result = json.loads((where / "out.json").read_text())
    assert result["passed"] is False and result["failure"]["oracle"] == "block_range"
    assert result["failure"]["program"] and result["tally"]["examples"] > 0 and result["seed"] == 0
    suite = ET.parse(where / "out.xml").getroot()
    assert suite.get("failures") == "1"
    assert "block_range" in suite.find("testcase/failure").get("message")


# ---------------------------------------------------------------------- seeds

def campaign(tmp_path, **options) -> dict:
    """An in-process campaign's result as its JSON report says it."""
    out = tmp_path / f"out{len(os.listdir(tmp_path))}.json"
    with open(os.devnull, "w") as quiet:
        run_campaign(Options(db=str(tmp_path / "db"), json_path=str(out), **options), out=quiet)
    return json.loads(out.read_text())


def test_the_ci_profile_draws_the_same_programs_on_every_run(tmp_path):
    first, second = (fuzz(tmp_path, "spec", "--max-examples", "15", "--db", f"db{i}") for i in (1, 2))
    assert first.returncode == second.returncode == 0
    assert first.stdout.splitlines()[0].split(" in ")[0] == second.stdout.splitlines()[0].split(" in ")[0]


def test_a_seed_fixes_a_campaign_and_different_seeds_draw_differently(tmp_path):
    drawn = campaign(tmp_path, target="spec", profile="dev", max_examples=15)
    assert 0 <= drawn["seed"] < 2**32
    again = campaign(tmp_path, target="spec", profile="dev", max_examples=15, seed=drawn["seed"])
    other = campaign(tmp_path, target="spec", profile="dev", max_examples=15, seed=drawn["seed"] + 1)
    assert again["tally"] == drawn["tally"]
    assert other["tally"] != drawn["tally"]


# ---------------------------------------------------------------------- policies and block sizes

SUBJECTS = '''
import bug_zoo

class Forgetful(bug_zoo.Reference):
    """Legal for a cache that does not claim completeness: a released block leaves the index at once,
    so no hit ever crosses requests (the spec keeps it and serves it)."""
    capabilities = frozenset({"fork", "prefix_caching"})
    def _drop(self, block):
        if self.refs[block] == 1 and block in self.block_hash:
            self._unregister(block)
        super()._drop(block)

class Sixteens(bug_zoo.Reference):
    """Supports block sizes that are multiples of 16 only, and does not say so; records what it was built with."""
    built = set()
    def __init__(self, num_blocks, block_size, **options):
        if block_size % 16:
            raise ValueError(f"block size {block_size} is not a multiple of 16")
        self.built.add(block_size)
        super().__init__(num_blocks, block_size, **options)

class DeclaredSixteens(Sixteens):
    config_space = {"block_sizes": (16, 48)}
'''


@pytest.fixture
def subjects(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "policy_subjects.py").write_text(SUBJECTS)
    yield tmp_path
    sys.modules.pop("policy_subjects", None)


def test_policy_defaults_to_spec_for_our_targets_and_any_for_others(subjects):
    assert checked(Options("spec")).policy == checked(Options("impl")).policy == "spec"
    assert checked(Options("policy_subjects:Forgetful")).policy == "any"
    assert checked(Options("impl", policy="any")).policy == "any"
    run = invoke("spec", "--policy", "sometimes")
    assert run.exit_code == 2 and "'sometimes' is not one of 'spec', 'any'" in run.output


def test_a_legal_choice_the_spec_does_not_make_fails_only_under_policy_spec(subjects):
    passed = campaign(subjects, target="policy_subjects:Forgetful", max_examples=40)
    assert passed["passed"] and passed["policy"] == "any", passed["failure"]
    failed = campaign(subjects, target="policy_subjects:Forgetful", policy="spec", save_regression="regressions")
    assert not failed["passed"] and failed["policy"] == "spec"
    assert failed["failure"]["oracle"] in ("cache_hit", "oom_exact")
    data = subjects / failed["regression"].replace(".py", ".json")
    with pytest.raises(OracleFailure):
        replay_regression(data)                       # the regression replays under the policy it was found in
    data.write_text(json.dumps({**json.loads(data.read_text()), "policy": "any"}))
    replay_regression(data)


def test_block_sizes_override_what_is_drawn(subjects):
    refused = invoke("policy_subjects:Sixteens", "--max-examples", "5")
    assert refused.exit_code == 2 and "block size 2 is not a multiple of 16" in refused.output
    result = campaign(subjects, target="policy_subjects:Sixteens", block_sizes=(32, 16, 16), max_examples=20)
    assert result["passed"], result["failure"]
    assert sys.modules["policy_subjects"].Sixteens.built == {16, 32}
    for sizes, says in ((("16",), "must be integers"), ((0, 16), r"must be integers in \[1, 65536\]"),
                        ((), "must be integers")):
        with pytest.raises(UsageError, match=says):
            checked(Options("spec", block_sizes=sizes))
    declared = sys.modules["policy_subjects"].DeclaredSixteens    # a Subject built by hand, not by resolve
    _, failure = check(Subject("declared", declared, declared.capabilities), "ci", "any", max_examples=10)
    assert failure is None, failure
    run = invoke("spec", "--block-sizes", "16,x")
    assert run.exit_code == 2 and "not a comma-separated list of integers" in run.output


# ---------------------------------------------------------------------- shrinking and findings

NOISE = [("append", [1_000_007, 0]), ("free", [1_000_008]), ("add", [7, [3]]), ("free", [7]), ("free", [7]),
         ("block_table", [1_000_009])]
ESSENCE = [("add", [1, [0, 0]]), ("add", [2, [0, 0]]), ("free", [1])]   # FreeStillShared at block size 1


def test_steps_that_change_nothing_are_shrunk_away():
    config = {"num_blocks": 3, "block_size": 1, "prefix_caching": True, "num_cpu_blocks": 0}
    padded = [NOISE[0], ESSENCE[0], NOISE[1], NOISE[2], NOISE[3], ESSENCE[1], NOISE[4], NOISE[5], ESSENCE[2]]
    subject = Subject("bug_zoo:FreeStillShared", bug_zoo.FreeStillShared, bug_zoo.FreeStillShared.capabilities)
    with pytest.raises(OracleFailure) as caught:
        replay_guarded(subject, config, padded)
    failure = {"oracle": caught.value.oracle, "message": caught.value.message, **caught.value.report}
    assert failure["oracle"] == "free_count" and len(failure["program"]) == len(padded)
    shrunk = drop_needless_steps(subject, failure)
    assert shrunk["oracle"] == "free_count"
    assert [tuple(step) for step in shrunk["program"]] == [tuple(step) for step in ESSENCE]
    assert len(shrunk["trace"]) == len(ESSENCE)


CRASHES = """
import sys
import bug_zoo

class KeyErrorAtFirstAdd(bug_zoo.Reference):
    def add(self, seq_id, tokens):
        raise KeyError(seq_id)

class ForkTypeError(bug_zoo.Reference):
    def fork(self, parent_id, child_id):
        raise TypeError("fork() got confused")

class ExitsOnFree(bug_zoo.Reference):
    def free(self, seq_id):
        sys.exit(0)

class SpinsOnAppend(bug_zoo.Reference):
    def append(self, seq_id, token):
        while True:
            pass
"""


@pytest.fixture
def crashes(tmp_path, monkeypatch):
    """A module of crashing subjects in a fresh working directory (the adapter beside its user)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "crashing_subjects.py").write_text(CRASHES)
    yield tmp_path
    sys.modules.pop("crashing_subjects", None)


@pytest.mark.parametrize("bug, method", [("KeyErrorAtFirstAdd", "add"), ("ForkTypeError", "fork")])
def test_a_crash_keeps_its_step_and_its_regression_fails_until_fixed(crashes, bug, method):
    result = campaign(crashes, target=f"crashing_subjects:{bug}", save_regression="regressions")
    failure = result["failure"]
    assert failure["oracle"] == "crash" and failure["program"][-1][0] == method
    regression = crashes / result["regression"]
    data = json.loads(regression.with_suffix(".json").read_text())
    assert data["program"] == failure["program"] and data["program"]       # never PROGRAM = []
    assert data["trace"][-1].startswith(f"{method}(") and data["trace"][-1].endswith("-> did not complete")
    assert regression.read_text() == REGRESSION_TEST   # what pytest runs: test_regression_file_fails_... runs one
    with pytest.raises(OracleFailure, match=r"\[crash\]"):
        replay_regression(regression.with_suffix(".json"))
    regression.with_suffix(".json").write_text(json.dumps({**data, "target": "bug_zoo:Reference"}))
    replay_regression(regression.with_suffix(".json"))


def test_a_subject_calling_sys_exit_is_a_finding(crashes):
    failure = campaign(crashes, target="crashing_subjects:ExitsOnFree")["failure"]
    assert failure["oracle"] == "crash" and failure["message"] == "free called sys.exit(0)"


def test_a_call_that_never_returns_is_reported_not_waited_for(crashes):
    failure = campaign(crashes, target="crashing_subjects:SpinsOnAppend", call_timeout=0.1)["failure"]
    assert failure["oracle"] == "timeout" and failure["message"] == "append did not return within 0.1 s"
    assert failure["program"][-1][0] == "append"


class MiscountsOnce(bug_zoo.Reference):
    """The free count is one short on the first call of all (of any instance), right afterwards: an
    oracle fires once and never on replay, as from a subject whose behaviour depends on outside state."""

    calls = 0

    def num_free_blocks(self):
        MiscountsOnce.calls += 1
        return super().num_free_blocks() - (MiscountsOnce.calls == 1)


def test_a_flaky_subject_is_reported_as_flaky_not_as_the_oracle_it_fired_once(monkeypatch):
    monkeypatch.setattr(MiscountsOnce, "calls", 0)
    subject = Subject("test:MiscountsOnce", MiscountsOnce, MiscountsOnce.capabilities)
    _, failure = check(subject, "ci")
    assert failure["oracle"] == "FlakyFailure" and "OracleFailure[free_count]" in failure["message"]


ONE_SHORT = OracleFailure("free_count", "one short", {})


@pytest.mark.parametrize("besides, reported", [
    (KeyError("harness bug"), ("KeyError", "'harness bug'")),
    (FlakyFailure("Falsified on the first call but did not on a subsequent one", [ONE_SHORT]),
     ("FlakyFailure", "Falsified on the first call but did not on a subsequent one (1 sub-exception)")),
], ids=["harness error", "flaky oracle"])
def test_a_run_that_fails_besides_its_oracles_reports_the_run_failing(monkeypatch, besides, reported):
    """Hypothesis groups every distinct failure: an error of the harness, or an oracle that fired once
    and not on replay, among the oracle findings is named by its type and message (not hidden behind
    the findings, nor behind the group's own message)."""
    def failing(machine, settings):
        raise ExceptionGroup("Hypothesis found 2 distinct failures.", [ONE_SHORT, besides])
    monkeypatch.setattr(campaign_module, "run_state_machine_as_test", failing)
    _, failure = check(resolve("spec"), "ci")
    assert (failure["oracle"], failure["message"]) == reported


# ---------------------------------------------------------------------- where modules come from

PLANTED = "open('PLANTED_MODULE_RAN', 'w').close()\n"


def test_builtin_targets_never_import_from_the_working_directory(tmp_path):
    (tmp_path / "redis.py").write_text(PLANTED)
    (tmp_path / "pagedkv_probe.py").write_text(PLANTED)
    unreachable = "redis://127.0.0.1:9/0"   # nothing listens on the discard port: falls back, imports redis
    run = fuzz(tmp_path, "spec", "--max-examples", "3", "--db", unreachable)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "unreachable" in run.stdout
    assert not (tmp_path / "PLANTED_MODULE_RAN").exists()


def test_resolving_a_builtin_target_leaves_sys_path_alone(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = list(sys.path)
    resolve("spec")
    assert sys.path == before


def test_a_module_target_imports_from_the_working_directory_without_shadowing(tmp_path, monkeypatch):
    import importlib.util

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    (tmp_path / "redis.py").write_text(PLANTED)
    (tmp_path / "local_adapter_xyz.py").write_text("from bug_zoo import Reference as make\n")
    assert resolve("local_adapter_xyz:make").factory is bug_zoo.Reference
    assert sys.path[-1] == str(tmp_path)
    assert importlib.util.find_spec("redis").origin != str(tmp_path / "redis.py")
    sys.modules.pop("local_adapter_xyz", None)


# ---------------------------------------------------------------------- directory databases

def test_a_regular_file_as_db_is_a_usage_error(tmp_path):
    (tmp_path / "not_a_dir").write_text("")
    run = invoke("spec", "--db", str(tmp_path / "not_a_dir"))
    assert run.exit_code == 2 and "exists and is not a directory" in run.output
    run = invoke("spec", "--db", str(tmp_path / "not_a_dir" / "below"))
    assert run.exit_code == 2 and "cannot create the directory" in run.output


def test_non_regular_entries_in_a_directory_database_are_never_opened(tmp_path):
    database = RegularFilesDatabase(tmp_path / "db")
    database.save(b"key", b"saved example")
    [entry] = [path for path in (tmp_path / "db").glob("*/*") if path.read_bytes() == b"saved example"]
    folder = entry.parent
    os.mkfifo(folder / "fifo")
    os.symlink(folder / "fifo", folder / "link_to_fifo")
    os.symlink(entry, folder / "link_to_file")
    (folder / "a_directory").mkdir()
    fetched = []
    reader = threading.Thread(target=lambda: fetched.extend(database.fetch(b"key")), daemon=True)
    reader.start()
    reader.join(10)
    assert not reader.is_alive(), "fetch blocked on a FIFO"
    assert fetched == [b"saved example"]


def test_open_database_directory_and_default(tmp_path):
    database, label, note = open_database(str(tmp_path / "fresh"))
    assert isinstance(database, RegularFilesDatabase) and label == str(tmp_path / "fresh") and note == ""
    assert (tmp_path / "fresh").is_dir()


def test_two_workers_share_a_directory_database_that_holds_a_fifo(tmp_path):
    first = fuzz(tmp_path, BUG, "--workers", "2", "--db", "shared", "--json", "first.json")
    assert first.returncode == 1, first.stdout + first.stderr
    folders = [entry for entry in (tmp_path / "shared").iterdir() if entry.is_dir()]
    assert folders, "the counterexample was not saved"
    for folder in folders:
        os.mkfifo(folder / "planted_fifo")   # would block every campaign's replay phase on open()
    second = fuzz(tmp_path, BUG, "--max-examples", "1", "--db", "shared", "--json", "second.json")
    assert second.returncode == 1, second.stdout + second.stderr
    assert json.loads((tmp_path / "second.json").read_text())["failure"]["found_in"] == "replay"


def test_seconds_budget_runs_until_time_is_up(tmp_path):
    run = fuzz(tmp_path, "spec", "--seconds", "2", "--db", "db", "--json", "out.json")
    assert run.returncode == 0
    result = json.loads((tmp_path / "out.json").read_text())
    assert result["seconds"] >= 2 and result["tally"]["runs"] >= 1


class ChecksItself(bug_zoo.Reference):
    """An adapter whose own consistency check raises the kit's OracleFailure (the sequence of 5 tokens
    is its planted bug): the harness's oracles never fire on it."""

    def append(self, seq_id, token):
        copies = super().append(seq_id, token)
        if len(self.seqs[seq_id].tokens) >= 5:
            raise OracleFailure("protocol", f"seq {seq_id} grew to 5 tokens", {})
        return copies


def test_a_failure_the_subject_raises_itself_is_reported_as_found():
    _, failure = check(Subject("test:ChecksItself", ChecksItself, ChecksItself.capabilities), "ci", "any")
    assert failure["oracle"] == "protocol" and failure["message"].endswith("grew to 5 tokens")
    first = failure["first"]   # as found, before shrinking: when, in which example, after which steps
    assert isinstance(first["seconds"], float) and first["seconds"] >= 0 and first["examples"] >= 1
    assert first["program"] and first["program"][-1][0] == "append" and first["steps"] == len(first["program"])
    assert failure["program"][-1][0] == "append" and len(failure["program"]) <= first["steps"]
