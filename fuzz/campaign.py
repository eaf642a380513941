"""Fuzz campaigns: run the conformance harness against a target, on one or many workers.

A campaign first replays the examples saved in its database (a shared directory, or a Redis server
that many machines point at), then generates new programs in runs of at most `RUN_EXAMPLES` examples,
once through the example budget or, with `seconds`, until the time is up. The first counterexample
stops every worker; it is shrunk, printed as readable steps with the oracle that fired and the state
around it, and optionally saved as a standalone pytest regression file.
"""

import hashlib
import json
import multiprocessing
import os
import pprint
import queue
import re
import sys
import threading
import time
import unittest
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import asdict, dataclass

from hypothesis import Phase, Verbosity
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.stateful import run_state_machine_as_test

from .harness import PATHS, machine_for
from .oracles import ORACLES, OracleFailure
from .profiles import EFFORT, settings_for
from .subjects import UsageError, resolve

DEFAULT_DB = os.path.join(".hypothesis", "pagedkv")
RUN_EXAMPLES = 100   # examples per Hypothesis run: workers notice a stop or the deadline between runs
REPLAY = (Phase.explicit, Phase.reuse, Phase.shrink)
GENERATE = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink)


@dataclass
class Options:
    target: str
    profile: str = "ci"
    max_examples: int = None     # per worker; default: the profile's
    seconds: float = None        # time budget: keep running until it is spent
    workers: int = 1
    db: str = DEFAULT_DB         # a directory or redis://HOST:PORT/N
    save_regression: str = None
    json_path: str = None
    junit_path: str = None


@dataclass
class Result:
    target: str
    profile: str
    passed: bool
    seconds: float
    tally: dict
    database: str
    database_note: str = ""
    failure: dict = None         # oracle, message, found_in, worker, config, program, trace, state
    regression: str = None

    def exit_code(self) -> int:
        return 0 if self.passed else 1


# ---------------------------------------------------------------------- databases

def open_database(spec: str):
    """(database, note): a directory database, or Redis when `spec` is a reachable redis:// URL.
    An unreachable Redis falls back to the local default directory, and the note says so."""
    if not spec.startswith("redis://"):
        return DirectoryBasedExampleDatabase(spec), ""
    import redis
    from hypothesis.extra.redis import RedisExampleDatabase

    client = redis.Redis.from_url(spec, socket_connect_timeout=2, socket_timeout=5)
    try:
        client.ping()
    except redis.RedisError as error:
        return (DirectoryBasedExampleDatabase(DEFAULT_DB),
                f"Redis at {spec} is unreachable ({error}); fuzzing on with the local database {DEFAULT_DB}")
    return RedisExampleDatabase(client), ""


def harness_settings(profile: str, phases=GENERATE, **overrides):
    """The profile's settings for the conformance machine: quiet, one bug per run, no explain phase."""
    return settings_for(profile, verbosity=Verbosity.quiet, report_multiple_bugs=False, phases=phases, **overrides)


# ---------------------------------------------------------------------- one run

def run_once(subject, settings, tally: Counter) -> dict:
    """One Hypothesis run of the harness; the (shrunk) counterexample as a dict, or None."""
    try:
        run_state_machine_as_test(machine_for(subject.factory, subject.capabilities, tally, subject.target),
                                  settings=settings)
    except OracleFailure as failure:
        return {"oracle": failure.oracle, "message": failure.message, **failure.report}
    except unittest.SkipTest:  # a replay-only run over an empty database: nothing to replay
        return None
    except Exception as error:  # not an oracle: Hypothesis itself (flaky subject) or a harness bug
        return {"oracle": type(error).__name__, "message": str(error), "config": {}, "program": [],
                "trace": [], "state": {}}
    return None


def check(subject, profile: str, **overrides) -> tuple:
    """(tally, failure or None) of one derandomized run under `profile`: the CI form of the check."""
    tally = Counter()
    return tally, run_once(subject, harness_settings(profile, **overrides), tally)


def fuzz_worker(options: Options, tally: Counter, stop, worker: int = 0) -> tuple:
    """Replay the database, then generate until the budget is spent. Returns (failure, db note)."""
    subject = resolve(options.target)
    database, note = open_database(options.db)
    base = {"database": database, "derandomize": False}
    failure = run_once(subject, harness_settings(options.profile, REPLAY, **base), tally)
    found_in = "replay"
    budget = options.max_examples or EFFORT[options.profile].max_examples
    deadline = time.monotonic() + options.seconds if options.seconds else None
    while failure is None and not stop.is_set() and (budget > 0 or deadline):
        if deadline and time.monotonic() >= deadline:
            break
        size = min(RUN_EXAMPLES, budget) if not deadline else RUN_EXAMPLES
        failure = run_once(subject, harness_settings(options.profile, max_examples=size, **base), tally)
        found_in, budget = "generate", budget - size
        tally["runs"] += 1
    if failure:
        failure.update(found_in=found_in, worker=worker)
        stop.set()
    return failure, note


def _process_main(options: Options, worker: int, messages, stop) -> None:
    """Body of a worker process: streams its tally, then its result, to the parent."""
    tally, done = Counter(), threading.Event()

    def stream():
        while not done.wait(0.5):
            messages.put(("tally", worker, dict(tally)))
    pusher = threading.Thread(target=stream, daemon=True)
    pusher.start()
    try:
        failure, note = fuzz_worker(options, tally, stop, worker)
        outcome = ("done", worker, dict(tally), failure, note, None)
    except Exception as error:  # reported by the parent, never swallowed
        outcome = ("done", worker, dict(tally), None, "", f"{type(error).__name__}: {error}")
    done.set()
    messages.put(outcome)


# ---------------------------------------------------------------------- the campaign

def run_campaign(options: Options, out=None) -> Result:
    """Run `options` and report. Raises UsageError (exit 2) for a target that cannot be fuzzed."""
    out = out or sys.stdout
    resolve(options.target)  # usage errors surface here, before any worker starts
    if options.profile not in EFFORT:
        raise UsageError(f"unknown profile {options.profile!r}; choose one of {', '.join(EFFORT)}")
    if options.workers < 1:
        raise UsageError(f"--workers must be >= 1, got {options.workers}")
    started = time.monotonic()
    display = Display(options, out, started)
    failure, note, tally = (_run_in_thread if options.workers == 1 else _run_in_processes)(options, display)
    result = Result(options.target, options.profile, failure is None, round(time.monotonic() - started, 2),
                    {key: tally.get(key, 0) for key in ("examples", "steps", "runs", *PATHS)},
                    options.db if not note else DEFAULT_DB, note, failure)
    if failure and failure["program"] and options.save_regression:
        result.regression = write_regression(options.save_regression, options.target, failure)
    report(result, out)
    if options.json_path:
        with open(options.json_path, "w") as handle:
            json.dump(asdict(result), handle, indent=2, default=str)
    if options.junit_path:
        write_junit(options.junit_path, result)
    return result


def _run_in_thread(options: Options, display) -> tuple:
    tally, stop, outcome = Counter(), threading.Event(), {}

    def body():
        try:
            outcome["result"] = fuzz_worker(options, tally, stop)
        except Exception as error:  # re-raised in the caller's thread below
            outcome["error"] = error
    worker = threading.Thread(target=body, daemon=True)
    worker.start()
    while worker.is_alive():
        display.update(tally)
        worker.join(0.25)
    display.close()
    if "error" in outcome:
        raise outcome["error"]
    failure, note = outcome["result"]
    return failure, note, tally


def _run_in_processes(options: Options, display) -> tuple:
    context = multiprocessing.get_context("spawn")
    messages, stop = context.Queue(), context.Event()
    processes = [context.Process(target=_process_main, args=(options, i, messages, stop), daemon=True)
                 for i in range(options.workers)]
    for process in processes:
        process.start()
    tallies, results = {}, {}
    while len(results) < len(processes):
        try:
            kind, worker, tally, *rest = messages.get(timeout=0.25)
            tallies[worker] = tally
            if kind == "done":
                results[worker] = rest
        except queue.Empty:
            if not any(p.is_alive() for p in processes) and messages.empty():
                break  # a worker died without reporting: its error shows below
        display.update(sum((Counter(t) for t in tallies.values()), Counter()))
    for process in processes:
        process.join(5)
    total = sum((Counter(t) for t in tallies.values()), Counter())
    display.close()
    errors = [error for _, _, error in results.values() if error]
    if errors or len(results) < len(processes):
        raise RuntimeError(f"worker failed: {errors[0] if errors else 'exited without a result'}")
    failures = [failure for failure, _, _ in results.values() if failure]
    note = next((note for _, note, _ in results.values() if note), "")
    return (failures[0] if failures else None), note, total


# ---------------------------------------------------------------------- progress

class Display:
    """A rich live panel on a terminal; a plain line every few seconds otherwise."""

    def __init__(self, options: Options, out, started: float):
        self.options, self.out, self.started = options, out, started
        self.live, self.last_line = None, started
        if getattr(out, "isatty", lambda: False)():
            from rich.console import Console
            from rich.live import Live
            self.live = Live(console=Console(file=out), refresh_per_second=4, transient=True)
            self.live.start()

    def line(self, tally) -> str:
        elapsed = time.monotonic() - self.started
        if self.options.seconds:
            left = f"time left {max(0.0, self.options.seconds - elapsed):.0f}s"
        else:
            budget = (self.options.max_examples or EFFORT[self.options.profile].max_examples) * self.options.workers
            left = f"~{max(0, budget - tally.get('examples', 0))} examples left"
        paths = " ".join(f"{p}={tally.get(p, 0)}" for p in PATHS)
        return (f"{self.options.target}: {tally.get('examples', 0)} examples, {tally.get('steps', 0)} steps | "
                f"paths {paths} | {elapsed:.0f}s, {left}")

    def update(self, tally) -> None:
        if self.live:
            self.live.update(self.line(tally))
        elif time.monotonic() - self.last_line >= 5:
            self.last_line = time.monotonic()
            print(self.line(tally), file=self.out, flush=True)

    def close(self) -> None:
        if self.live:
            self.live.stop()


# ---------------------------------------------------------------------- reports

def format_failure(failure: dict) -> str:
    oracle = failure["oracle"]
    lines = [f"COUNTEREXAMPLE — oracle {oracle!r} fired (found in {failure.get('found_in', '?')} phase)",
             f"  {ORACLES.get(oracle, 'not an oracle: the run itself failed')}",
             f"  {failure['message']}"]
    if failure["config"]:
        lines.append("config: " + ", ".join(f"{k}={v}" for k, v in failure["config"].items()))
    lines.append(f"program ({len(failure['trace'])} steps):")
    for number, step in enumerate(failure["trace"], 1):
        marker = f"    <-- {oracle}" if number == len(failure["trace"]) else ""
        lines.append(f"  {number:3d}. {step}{marker}")
    state = failure["state"]
    if state:
        lines.append("state:")
        for seq, info in state["sequences"].items():
            pool = "cpu" if info["swapped"] else "gpu"
            lines.append(f"  seq {seq}: tokens={info['tokens']} {pool} table={info['table']}")
        lines.append(f"  num_free_blocks() = {state['num_free_blocks']} (spec: {state['spec_num_free_blocks']})")
    return "\n".join(lines)


def report(result: Result, out) -> None:
    if result.database_note:
        print(f"note: {result.database_note}", file=out)
    tally = result.tally
    print(f"{result.target}: {tally['examples']} examples, {tally['steps']} steps in {result.seconds:.1f}s; "
          f"paths " + ", ".join(f"{p}={tally[p]}" for p in PATHS), file=out)
    if result.passed:
        print(f"PASS: no oracle fired ({', '.join(ORACLES)})", file=out)
        return
    print(format_failure(result.failure), file=out)
    if result.regression:
        print(f"regression test written to {result.regression}", file=out)


def write_junit(path: str, result: Result) -> None:
    suite = ET.Element("testsuite", name=f"pagedkv-fuzz-{result.profile}", tests="1",
                       failures=str(int(not result.passed)), time=str(result.seconds))
    case = ET.SubElement(suite, "testcase", classname="pagedkv.fuzz", name=f"conformance[{result.target}]",
                         time=str(result.seconds))
    ET.SubElement(case, "system-out").text = json.dumps(result.tally)
    if not result.passed:
        ET.SubElement(case, "failure", message=f"oracle {result.failure['oracle']}: {result.failure['message']}"
                      ).text = format_failure(result.failure)
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)


REGRESSION = '''"""Regression found by `pagedkv fuzz {target}`: oracle {oracle!r} fired.

{message}

Replays exactly the shrunk program below through the conformance oracles; fails until the bug is fixed.
"""
import sys

SEARCH_PATH = {search_path!r}
if SEARCH_PATH and SEARCH_PATH not in sys.path:
    sys.path.insert(0, SEARCH_PATH)

from pagedkv.fuzz.harness import replay  # noqa: E402
from pagedkv.fuzz.subjects import resolve  # noqa: E402

TARGET = {target!r}
CONFIG = {config}
PROGRAM = [
{program}]


def test_{name}():
    replay(resolve(TARGET).factory, CONFIG, PROGRAM)
'''


def write_regression(directory: str, target: str, failure: dict) -> str:
    """A standalone pytest file replaying the counterexample against the same target."""
    os.makedirs(directory, exist_ok=True)
    digest = hashlib.sha1(json.dumps(failure["program"]).encode()).hexdigest()[:8]
    name = re.sub(r"\W+", "_", f"{target}_{failure['oracle']}_{digest}").strip("_").lower()
    steps = "".join(f"    ({op!r}, {tuple(args)!r}),  # {line}\n"
                    for (op, args), line in zip(failure["program"], failure["trace"]))
    path = os.path.join(directory, f"test_regression_{name}.py")
    with open(path, "w") as handle:
        handle.write(REGRESSION.format(target=target, oracle=failure["oracle"], message=failure["message"],
                                       search_path=resolve(target).search_path,
                                       config=pprint.pformat(failure["config"]), program=steps, name=name))
    return path


# ---------------------------------------------------------------------- pagedkv check

CHECK_TARGETS = ("spec", "impl")


def run_conformance_check(profile: str) -> dict:
    """The `pagedkv check` entry: the conformance harness against `spec` and `impl` under `profile`."""
    covered, problems = [], []
    for target in CHECK_TARGETS:
        try:
            tally, failure = check(resolve(target), profile)
        except UsageError as error:
            problems.append(str(error))
            continue
        covered.append(f"{target}: {tally['examples']} examples, {tally['steps']} steps ("
                       + ", ".join(f"{p}={tally[p]}" for p in PATHS) + ")")
        if failure:
            problems.append(f"{target}: " + format_failure(failure))
    return {"name": "conformance", "covered": "; ".join(covered) or "-", "passed": not problems,
            "detail": "\n".join(problems)}
