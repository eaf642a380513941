"""Fuzz campaigns: run the conformance harness against a target, on one or many workers.

A campaign first replays the examples saved in its database (a shared directory, or a Redis server
that many machines point at), then generates new programs in runs of at most `RUN_EXAMPLES` examples,
once through the example budget or, with `seconds`, until the time is up. The first counterexample
stops every worker; it is shrunk (by Hypothesis, then step by step: `drop_needless_steps`), printed
as readable steps with the oracle that fired and the state around it, and optionally saved as a
regression: a JSON file of data and a fixed pytest file that replays it.

Every run is seeded: run `r` of worker `w` draws from `run_seed(seed, w, r)`, so a campaign with the
same seed, target, database contents and budget draws the same programs (under `ci` the seed is 0
unless `--seed` says otherwise; other profiles draw a fresh seed and print it).
"""

import hashlib
import json
import math
import multiprocessing
import os
import queue
import re
import secrets
import stat
import sys
import threading
import time
import unittest
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from urllib.parse import unquote, urlsplit

from hypothesis import Phase, Verbosity, seed as hypothesis_seed
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.errors import Flaky
from hypothesis.stateful import run_state_machine_as_test

from .guard import DEFAULT_TIMEOUT, Deadline, GuardedFactory
from .harness import (ARG_NAMES, PATHS, POLICIES, ConfigSpaceError, check_config_space, declared_config_space,
                      machine_for, replay)
from .oracles import ORACLES, OracleFailure
from .profiles import EFFORT, settings_for
from .subjects import UsageError, resolve

DEFAULT_DB = os.path.join(".hypothesis", "pagedkv")
RUN_EXAMPLES = 100   # examples per Hypothesis run: workers notice a stop or the deadline between runs
REPLAY = (Phase.explicit, Phase.reuse, Phase.shrink)
GENERATE = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink)
#: option -> (lowest, highest, lowest excluded): every number a campaign takes is bounded.
LIMITS = {
    "max_examples": (1, 10**9, False),
    "seconds": (0, 30 * 86400, True),
    "workers": (1, 256, False),
    "seed": (0, 2**64 - 1, False),
    "call_timeout": (0, 3600, True),
}
MAX_BLOCK_SIZE = 1 << 16
#: Targets judged by the spec's own choices unless --policy says otherwise; every other target is
#: judged policy-free (`any`): a real engine makes its own legal choices.
SPEC_POLICY_TARGETS = ("spec", "impl")


@dataclass
class Options:
    target: str
    profile: str = "ci"
    max_examples: int = None     # per worker; default: the profile's
    seconds: float = None        # time budget: keep running until it is spent
    workers: int = 1
    db: str = DEFAULT_DB         # a directory, or a Redis URL (redis://, rediss://, unix://)
    save_regression: str = None
    json_path: str = None        # "-": stdout (pass `out=sys.stderr` for the report)
    junit_path: str = None
    seed: int = None             # None: 0 under ci, a fresh random seed otherwise
    call_timeout: float = DEFAULT_TIMEOUT
    policy: str = None           # "spec" or "any"; None: spec for SPEC_POLICY_TARGETS, any otherwise
    block_sizes: tuple = None    # overrides the block sizes the subject declares (or the kit's 1..16)


@dataclass
class Result:
    target: str
    profile: str
    passed: bool
    seconds: float
    tally: dict
    database: str                # as shown: a Redis password is masked
    seed: int
    policy: str
    database_note: str = ""
    failure: dict = None         # oracle, message, found_in, worker, config, program, trace, state
    regression: str = None

    def exit_code(self) -> int:
        return 0 if self.passed else 1


def checked(options: Options) -> Options:
    """`options` with its seed, policy and block sizes settled, or UsageError naming the option that
    is out of range."""
    if options.profile not in EFFORT:
        raise UsageError(f"unknown profile {options.profile!r}; choose one of {', '.join(EFFORT)}")
    for name in LIMITS:
        _check_number(name, getattr(options, name))
    if options.policy is not None and options.policy not in POLICIES:
        raise UsageError(f"--policy must be one of {', '.join(POLICIES)}, got {options.policy!r}")
    sizes = options.block_sizes
    if sizes is not None and (not sizes or not all(type(b) is int and 1 <= b <= MAX_BLOCK_SIZE for b in sizes)):
        raise UsageError(f"--block-sizes must be integers in [1, {MAX_BLOCK_SIZE}], got {sizes!r}")
    seed = options.seed if options.seed is not None else 0 if options.profile == "ci" else secrets.randbelow(2**32)
    policy = options.policy or ("spec" if options.target in SPEC_POLICY_TARGETS else "any")
    return replace(options, seed=seed, policy=policy, block_sizes=tuple(sorted(set(sizes))) if sizes else None)


def _check_number(name: str, value) -> None:
    """None (the default) or a finite number of the option's kind inside its `LIMITS`."""
    if value is None:
        return
    low, high, low_open = LIMITS[name]
    integral = name not in ("seconds", "call_timeout")
    kinds = (int,) if integral else (int, float)
    # min() keeps math.isfinite from converting an integer too large for a float
    if not isinstance(value, kinds) or isinstance(value, bool) or not math.isfinite(min(value, high + 1)) \
            or value < low or (low_open and value == low) or value > high:
        raise UsageError(f"--{name.replace('_', '-')} must be {'an integer' if integral else 'a number'} in "
                         f"{'(' if low_open else '['}{low}, {high}], got {value!r}")


def config_space(subject, block_sizes=None) -> dict:
    """What the kit draws configurations from: the subject's declaration (for a `Subject` built by
    hand, not by `resolve`, its factory's), `block_sizes` overriding."""
    declared = declared_config_space(subject.factory) if subject.config_space is None else subject.config_space
    return {**declared, **({"block_sizes": block_sizes} if block_sizes else {})}


def run_seed(seed: int, worker: int, run: int) -> int:
    """The seed of one Hypothesis run: runs of one campaign, and workers, never repeat each other."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{worker}/{run}".encode()).digest()[:8], "big")


# ---------------------------------------------------------------------- databases

SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
REDIS_SCHEMES = ("redis", "rediss", "unix")


class RegularFilesDatabase(DirectoryBasedExampleDatabase):
    """Hypothesis' directory database that reads regular files only. A FIFO (or a device, or a
    symlink to one) planted in a shared directory would block the replay phase of every campaign on
    `open()`; entries are opened non-blocking and without following links, and skipped unless fstat
    says they are regular files."""

    def fetch(self, key: bytes):
        directory = self._key_path(key)
        try:
            names = os.listdir(directory)
        except OSError:  # no entries for this key yet (or not a directory at all)
            return
        for name in names:
            value = _read_regular(os.path.join(directory, name))
            if value is not None:
                yield value


def _read_regular(path: str):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(os.dup(fd), "rb") as handle:
            return handle.read()
    except OSError:
        return None
    finally:
        os.close(fd)


def open_database(spec: str) -> tuple:
    """(database, label, note). `spec` is a directory or a Redis URL; `label` is how to show it (any
    password masked). An unreachable Redis falls back to the local default directory and `note` says
    so; anything else wrong with `spec` is a UsageError."""
    if SCHEME.match(spec):
        return _open_redis(spec)
    return _open_directory(spec), spec, ""


def _open_directory(path: str):
    if os.path.lexists(path) and not os.path.isdir(path):
        raise UsageError(f"--db {path!r} exists and is not a directory")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as error:
        raise UsageError(f"--db {path!r}: cannot create the directory ({error.strerror})") from error
    if not os.access(path, os.R_OK | os.W_OK | os.X_OK):
        raise UsageError(f"--db {path!r}: the directory is not writable")
    return RegularFilesDatabase(path)


def _secrets(url: str) -> list:
    """The passwords in a Redis URL (user info, or a password= query argument), as written and decoded."""
    found = re.findall(r"(?i)[?&]password=([^&#]*)", url)
    try:
        password = urlsplit(url).password
    except ValueError:
        password = None
    if password:
        found.append(password)
    return sorted({form for text in found if text for form in (text, unquote(text))}, key=len, reverse=True)


def masked(url: str, text: str = None) -> str:
    """`text` (default: the URL itself) with every password of `url` replaced by ***."""
    text = url if text is None else text
    for secret in _secrets(url):
        text = text.replace(secret, "***")
    return text


def _open_redis(spec: str) -> tuple:
    label = masked(spec)
    scheme = SCHEME.match(spec).group(1).lower()
    if scheme not in REDIS_SCHEMES:
        raise UsageError(f"--db {label}: unknown scheme {scheme}://; give a directory or a Redis URL: "
                         f"redis://[:PASSWORD@]HOST:PORT/N, rediss://... (TLS), unix:///PATH/TO/SOCKET?db=N")
    url = scheme + spec[len(scheme):]  # the client's parser wants the scheme in lower case
    import redis
    from hypothesis.extra.redis import RedisExampleDatabase

    if scheme != "unix" and not re.fullmatch(r"/?\d*", urlsplit(url).path):
        raise UsageError(f"--db {label}: the path must be a database number (/0, /1, ...)")
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=5)
    except ValueError as error:
        raise UsageError(f"--db {label} is not a valid Redis URL: {masked(spec, str(error))}") from None
    try:
        client.ping()
    except redis.AuthenticationError as error:  # a ConnectionError too: must come first
        raise UsageError(f"--db {label}: Redis refused the credentials ({masked(spec, str(error))})") from None
    except (redis.ConnectionError, redis.TimeoutError) as error:
        return (_open_directory(DEFAULT_DB), DEFAULT_DB,
                f"Redis at {label} is unreachable ({masked(spec, str(error))}); "
                f"fuzzing on with the local database {DEFAULT_DB}")
    except redis.RedisError as error:  # e.g. a database number the server does not have, no permission
        raise UsageError(f"--db {label}: Redis refused the connection ({masked(spec, str(error))})") from None
    return RedisExampleDatabase(client), label, ""


def harness_settings(profile: str, phases=GENERATE, **overrides):
    """The profile's settings for the conformance machine: quiet, every distinct bug (one OracleFailure
    class per oracle: Hypothesis shrinks each on its own, so the first oracle that fired is never
    replaced by another one that shrinking ran into), no explain phase."""
    return settings_for(profile, verbosity=Verbosity.quiet, report_multiple_bugs=True, phases=phases, **overrides)


# ---------------------------------------------------------------------- one run

def _failure(error: OracleFailure) -> dict:
    return {"oracle": error.oracle, "message": error.message, **error.report}


def run_once(subject, settings, tally: Counter, seed: int = None, call_timeout: float = DEFAULT_TIMEOUT,
             policy: str = "spec", space: dict = None, started: float = None) -> dict:
    """One Hypothesis run of the harness under `policy`, drawing from `space` (default: what the
    subject declares), every subject call guarded (fuzz/guard.py); the counterexample as a dict
    (see `_reported`), or None. `seed` fixes what the run draws; `started` (a `time.monotonic()`,
    default: now) is what the first failure's seconds count from."""
    deadline, found = Deadline(call_timeout), []
    started = time.monotonic() if started is None else started
    machine = machine_for(GuardedFactory(subject.factory, deadline), subject.capabilities, tally, subject.target,
                          policy=policy, config_space=config_space(subject) if space is None else space, found=found)
    if seed is not None:
        machine = hypothesis_seed(seed)(machine)
    try:
        with deadline:
            run_state_machine_as_test(machine, settings=settings)
    except OracleFailure as failure:
        return _reported([_failure(failure)], found, started)
    except BaseExceptionGroup as group:   # several distinct failures; a FlakyFailure is a group too
        flaky, (failures, others) = _flaky(group), group.split(OracleFailure)
        if flaky or others is not None:   # the run itself failed: that comes first
            return _run_failed(flaky or _leaves(others)[0])
        return _reported([_failure(leaf) for leaf in _leaves(failures)], found, started)
    except unittest.SkipTest:  # a replay-only run over an empty database: nothing to replay
        return None
    except Exception as error:
        return _run_failed(error)
    return None


def _run_failed(error: BaseException) -> dict:
    """Not an oracle: Hypothesis itself (a flaky subject) or a harness bug, named by its type."""
    return {"oracle": type(error).__name__, "message": str(error), "config": {}, "program": [], "trace": [],
            "state": {}}


def _flaky(error):
    """The first Hypothesis `Flaky` in `error`'s tree, or None: a subject that failed once and not on
    replay (its counterexample cannot be trusted to reproduce), whichever oracle it fired."""
    if isinstance(error, Flaky):
        return error
    nested = error.exceptions if isinstance(error, BaseExceptionGroup) else ()
    return next(filter(None, map(_flaky, nested)), None)


def _leaves(group) -> list:
    return [leaf for error in group.exceptions
            for leaf in (_leaves(error) if isinstance(error, BaseExceptionGroup) else [error])]


def _reported(failures: list, found: list, started: float) -> dict:
    """The counterexample of one run: the shrunk one of the oracle that fired first, with `first` (that
    failure as found, before shrinking: oracle, message, program, steps, example number, seconds since
    `started`) and `distinct` (every other distinct failure's shrunk counterexample, each a failure dict)."""
    first = found[0] if found else failures[0]
    same = [failure for failure in failures if failure["oracle"] == first["oracle"]] or failures
    # several of one oracle (crashes of different errors): the one whose message opens alike
    main = next((failure for failure in same
                 if failure["message"].partition(":")[0] == first["message"].partition(":")[0]), same[0])
    summary = {"oracle": first["oracle"], "message": first["message"], "program": first["program"],
               "steps": len(first["program"]), "examples": first.get("examples"),
               "seconds": round(first["at"] - started, 2) if "at" in first else None}
    return {**main, "first": summary, "distinct": [failure for failure in failures if failure is not main]}


def replay_guarded(subject, config: dict, program: list, call_timeout: float = DEFAULT_TIMEOUT,
                   policy: str = "spec") -> None:
    """`harness.replay` with every subject call guarded, as in a campaign; raises OracleFailure."""
    deadline = Deadline(call_timeout)
    with deadline:
        replay(GuardedFactory(subject.factory, deadline), config, program, policy=policy,
               capabilities=subject.capabilities)


def _replayed(subject, config: dict, program: list, call_timeout: float, policy: str) -> dict:
    try:
        replay_guarded(subject, config, program, call_timeout, policy)
    except OracleFailure as failure:
        return _failure(failure)
    return None


def drop_needless_steps(subject, failure: dict, call_timeout: float = DEFAULT_TIMEOUT, policy: str = "spec") -> dict:
    """`failure` with every step deleted whose deletion still fires the same oracle.

    Hypothesis shrinks rule by rule, so steps that change nothing (an append to an unknown id, a
    repeated free) survive inside rules it cannot delete. Replaying the flat program without one
    step at a time, from the last to the first, until a whole pass deletes nothing, drops them.
    A program that does not fire its oracle when replayed alone is kept as Hypothesis left it; a
    `timeout` is never replayed here (each attempt could take the whole call timeout)."""
    oracle = failure["oracle"]
    if oracle not in ORACLES or oracle == "timeout" or not failure["program"]:
        return failure
    best = _replayed(subject, failure["config"], failure["program"], call_timeout, policy)
    if best is None or best["oracle"] != oracle:
        return failure
    shortened = True
    while shortened:
        shortened, i = False, len(best["program"]) - 1
        while i >= 0:
            program = best["program"][:i] + best["program"][i + 1:]
            found = _replayed(subject, failure["config"], program, call_timeout, policy)
            # the replay's program can outgrow the candidate: the closing frees of `finish` join it
            if found is not None and found["oracle"] == oracle and len(found["program"]) < len(best["program"]):
                best, shortened = found, True
            i = min(i, len(best["program"])) - 1
    return {**failure, **best}


def check(subject, profile: str, policy: str = "spec", **overrides) -> tuple:
    """(tally, failure or None) of one derandomized run under `profile` and `policy`: the CI form of the check."""
    tally = Counter()
    return tally, run_once(subject, harness_settings(profile, **overrides), tally, policy=policy)


def fuzz_worker(options: Options, tally: Counter, stop, worker: int = 0) -> tuple:
    """Replay the database, then generate until the budget is spent. Returns (failure, db note)."""
    subject = resolve(options.target, options.block_sizes)
    database, _, note = open_database(options.db)
    base = {"database": database, "derandomize": False}
    space, run, started = config_space(subject, options.block_sizes), 0, time.monotonic()

    def once(settings):
        nonlocal run
        run += 1
        return run_once(subject, settings, tally, run_seed(options.seed, worker, run), options.call_timeout,
                        options.policy, space, started)

    failure = once(harness_settings(options.profile, REPLAY, **base))
    found_in = "replay"
    budget = options.max_examples or EFFORT[options.profile].max_examples
    deadline = time.monotonic() + options.seconds if options.seconds else None
    while failure is None and not stop.is_set() and (budget > 0 or deadline):
        if deadline and time.monotonic() >= deadline:
            break
        size = min(RUN_EXAMPLES, budget) if not deadline else RUN_EXAMPLES
        failure = once(harness_settings(options.profile, max_examples=size, **base))
        found_in, budget = "generate", budget - size
        tally["runs"] += 1
    if failure:
        failure = drop_needless_steps(subject, failure, options.call_timeout, options.policy)
        failure["distinct"] = [{**drop_needless_steps(subject, other, options.call_timeout, options.policy),
                                "found_in": found_in, "worker": worker} for other in failure.get("distinct", ())]
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
    """Run `options` and report. Raises UsageError (exit 2) for a target that cannot be fuzzed, an
    option out of range or a database that cannot be used."""
    out = out or sys.stdout
    options = checked(options)
    subject = resolve(options.target, options.block_sizes)  # usage errors surface here, before any worker starts
    try:
        check_config_space(config_space(subject, options.block_sizes), subject.capabilities)
    except ConfigSpaceError as error:
        raise UsageError(f"target {options.target!r}: {error}") from error
    _, label, note = open_database(options.db)
    started = time.monotonic()
    display = Display(options, out, started)
    failure, worker_note, tally = (_run_here if options.workers == 1 else _run_in_processes)(options, display)
    result = Result(options.target, options.profile, failure is None, round(time.monotonic() - started, 2),
                    {key: tally.get(key, 0) for key in ("examples", "steps", "runs", *PATHS)},
                    label, options.seed, options.policy, note or worker_note, failure)
    if failure and options.save_regression:
        result.regression = write_regression(options.save_regression, subject, failure, options.call_timeout,
                                             options.policy, options.block_sizes)
    report(result, out)
    if options.json_path:
        text = json.dumps(asdict(result), indent=2, default=str) + "\n"
        if options.json_path == "-":   # the report went to `out` (the CLI passes stderr)
            sys.stdout.write(text)
        else:
            Path(options.json_path).write_text(text, encoding="utf-8")
    if options.junit_path:
        write_junit(options.junit_path, result)
    return result


def _run_here(options: Options, display) -> tuple:
    """One worker, in this thread (the call guard's timer works on the main thread only); the
    display refreshes from a side thread."""
    tally, stop, done = Counter(), threading.Event(), threading.Event()

    def refresh():
        while not done.wait(0.25):
            display.update(tally)
    painter = threading.Thread(target=refresh, daemon=True)
    painter.start()
    try:
        failure, note = fuzz_worker(options, tally, stop)
    finally:
        done.set()
        painter.join()
        display.close()
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
    failures = [results[w][0] for w in sorted(results) if results[w][0]]
    note = next((note for _, note, _ in results.values() if note), "")
    if not failures:
        return None, note, total
    main, seen = failures[0], {failures[0]["oracle"]} | {other["oracle"] for other in failures[0].get("distinct", ())}
    for other in (found for failure in failures[1:] for found in [failure, *failure.get("distinct", ())]):
        if other["oracle"] not in seen:   # another worker's oracle: distinct too
            seen.add(other["oracle"])
            main.setdefault("distinct", []).append({key: value for key, value in other.items() if key != "distinct"})
    return main, note, total


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

def program_lines(failure: dict) -> list:
    """One line per step of the program. The trace holds the steps that completed; a step during
    which the oracle fired (a crash, a timeout, a bad return) is in the program only."""
    lines = list(failure["trace"])
    for op, args in failure["program"][len(lines):]:
        call = ", ".join(f"{name}={value!r}" for name, value in zip(ARG_NAMES.get(op, ()), args))
        lines.append(f"{op}({call}) -> did not complete")
    return lines


def format_failure(failure: dict) -> str:
    oracle = failure["oracle"]
    lines = [f"COUNTEREXAMPLE — oracle {oracle!r} fired (found in {failure.get('found_in', '?')} phase)",
             f"  {ORACLES.get(oracle, 'not an oracle: the run itself failed')}",
             f"  {failure['message']}"]
    if failure["config"]:
        lines.append("config: " + ", ".join(f"{k}={v}" for k, v in failure["config"].items()))
    steps = program_lines(failure)
    lines.append(f"program ({len(steps)} steps):")
    for number, step in enumerate(steps, 1):
        marker = f"    <-- {oracle}" if number == len(steps) else ""
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
    print(f"{result.target}: {tally['examples']} examples, {tally['steps']} steps in {result.seconds:.1f}s "
          f"(seed {result.seed}, policy {result.policy}); paths " + ", ".join(f"{p}={tally[p]}" for p in PATHS), file=out)
    if result.passed:
        print(f"PASS: no oracle fired ({', '.join(ORACLES)})", file=out)
        return
    print(format_failure(result.failure), file=out)
    first, others = result.failure.get("first"), result.failure.get("distinct", ())
    if first:
        print(f"first failure: oracle {first['oracle']!r}, {first['seconds']} s into the run, in example "
              f"{first['examples']}, {first['steps']} steps before shrinking: {first['message']}", file=out)
    if others:
        print(f"{len(others)} more distinct failure(s): {', '.join(other['oracle'] for other in others)}", file=out)
        for other in others:
            print(format_failure(other), file=out)
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


# ---------------------------------------------------------------------- regressions

REGRESSION_FORMAT = 1
#: Every regression's test file, byte for byte: it holds no data, so nothing a subject said (an
#: error message, a repr) is ever Python source. The data lives in the JSON file of the same name.
REGRESSION_TEST = '''"""A regression found by `pagedkv fuzz`: replays the shrunk program stored beside this file (same
name, .json: target, configuration, program, the oracle that fired) through the conformance oracles.
It fails until the bug is fixed. This file holds no data; edit the JSON to retarget it."""
from pathlib import Path

from pagedkv.fuzz.campaign import replay_regression


def test_regression():
    replay_regression(Path(__file__).with_suffix(".json"))
'''
REGRESSION_KEYS = {"format": int, "target": str, "search_path": str, "oracle": str, "message": str,
                   "config": dict, "program": list, "trace": list, "call_timeout": (int, float), "policy": str,
                   "block_sizes": (list, type(None))}


def write_regression(directory: str, subject, failure: dict, call_timeout: float = DEFAULT_TIMEOUT,
                     policy: str = "spec", block_sizes: tuple = None) -> str:
    """A pytest file replaying the counterexample against the same target, and its JSON data."""
    os.makedirs(directory, exist_ok=True)
    digest = hashlib.sha1(json.dumps(failure["program"]).encode()).hexdigest()[:8]
    name = re.sub(r"\W+", "_", f"{subject.target}_{failure['oracle']}_{digest}", flags=re.ASCII).strip("_").lower()
    data = {"format": REGRESSION_FORMAT, "target": subject.target, "search_path": subject.search_path,
            "oracle": failure["oracle"], "message": failure["message"], "config": failure["config"],
            "program": failure["program"], "trace": program_lines(failure), "call_timeout": call_timeout,
            "policy": policy, "block_sizes": list(block_sizes) if block_sizes else None}
    stem = os.path.join(directory, f"test_regression_{name}")
    with open(stem + ".json", "w", encoding="utf-8") as handle:
        handle.write(_regression_json(data))
    with open(stem + ".py", "w", encoding="utf-8") as handle:
        handle.write(REGRESSION_TEST)
    return stem + ".py"


def _regression_json(data: dict) -> str:
    """`data` as indented JSON, the program one step per line (readable in a diff)."""
    head = json.dumps({key: value for key, value in data.items() if key != "program"}, indent=1)
    steps = ",\n  ".join(json.dumps(step) for step in data["program"])
    return f'{head[:-2]},\n "program": [\n  {steps}\n ]\n}}\n'


def load_regression(path) -> dict:
    """The data of a regression file, checked key by key (ValueError says what is wrong)."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a pagedkv regression (a JSON object expected)")
    for key, kind in REGRESSION_KEYS.items():
        if not isinstance(data.get(key), kind):
            raise ValueError(f"{path}: not a pagedkv regression: {key!r} missing or not {kind}")
    if data["format"] != REGRESSION_FORMAT:
        raise ValueError(f"{path}: regression format {data['format']}, this pagedkv reads {REGRESSION_FORMAT}")
    return data


def replay_regression(path) -> None:
    """Replay a saved regression; raises OracleFailure while the bug is present."""
    data = load_regression(path)
    if data["search_path"] and data["search_path"] not in sys.path:
        sys.path.append(data["search_path"])  # where the adapter was found; shadows nothing installed
    replay_guarded(resolve(data["target"], data["block_sizes"]), data["config"], data["program"],
                   data["call_timeout"], data["policy"])


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
