"""Live progress for long commands: a rich display on a terminal, plain lines when stderr is piped
or redirected (CI logs), so a run of several minutes never looks like a hung one.

Progress goes to stderr; stdout keeps the command's results. Expected durations are those of the
last run on this machine (remembered under $XDG_CACHE_HOME/pagedkv, else ~/.cache/pagedkv), or the
figures measured on the project's 2-core machine before any run here.
"""
import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from pagedkv.cli.common import format_duration


@dataclass
class Step:
    label: str
    total: int = 1
    expected_s: float | None = None     # measured duration of this step, None when unknown
    done: int = 0
    failed: int = 0
    started: float | None = None
    task_id: int | None = None
    seconds: float = field(default=0.0)

    @property
    def expected(self) -> str:
        return f"expected ~{format_duration(self.expected_s)}" if self.expected_s is not None else ""


class StepProgress:
    """Named steps, each with a count of parts; `begin`, then `advance` once per finished part.

    announce: on a non-terminal, print a line when each step begins (sequential steps such as the
    checks of `pagedkv check`); steps that all run at once (proof groups) print only when done.
    verdicts: a finished step shows PASS or FAIL (checks) rather than just done (a file written).
    plain: print the plain lines at all off a terminal (False for work that is quick as a rule)."""

    #: Off a terminal, a line this often for each step still running (CI logs must not fall silent).
    HEARTBEAT_S = 60.0

    def __init__(self, title: str, steps: dict, announce: bool = True, verdicts: bool = True, plain: bool = True,
                 stream=None):
        self.title, self.steps, self.announce, self.verdicts, self.plain = title, steps, announce, verdicts, plain
        self.stream = stream or sys.stderr
        self.live = None
        self.stopped = threading.Event()

    def __enter__(self):
        if self.stream.isatty():
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                                       TimeElapsedColumn)

            self.live = Progress(SpinnerColumn(finished_text="•"), TextColumn("{task.description}"),
                                 BarColumn(bar_width=20), MofNCompleteColumn(), TextColumn("{task.fields[state]}"),
                                 TimeElapsedColumn(), TextColumn("[dim]{task.fields[expected]}"),
                                 console=Console(file=self.stream), transient=False)
            self.live.__enter__()
            for step in self.steps.values():
                step.task_id = self.live.add_task(step.label, total=step.total, start=False, state="waiting",
                                                  expected=step.expected)
        elif self.plain:
            threading.Thread(target=self._heartbeat, daemon=True).start()
        return self

    def _heartbeat(self) -> None:
        """One line per beat: the running step, or all running steps (with their counts) in one line."""
        while not self.stopped.wait(self.HEARTBEAT_S):
            now = time.perf_counter()
            running = [step for step in self.steps.values() if step.started is not None and step.done < step.total]
            if len(running) == 1:
                step = running[0]
                self._line(f"{step.label}: still running, {format_duration(now - step.started)} so far"
                           + (f" ({step.expected})" if step.expected else ""))
            elif running:
                since = min(step.started for step in running)
                self._line("still running: " + ", ".join(f"{step.label} {step.done}/{step.total}" for step in running)
                           + f" ({format_duration(now - since)} so far)")

    def __exit__(self, *exc):
        self.stopped.set()
        if self.live is not None:
            for step in self.steps.values():
                if step.started is not None and step.done < step.total:
                    self.live.update(step.task_id, state="[yellow]interrupted")
                    self.live.stop_task(step.task_id)
            self.live.__exit__(*exc)
        return False

    def begin(self, key) -> None:
        step = self.steps[key]
        step.started = time.perf_counter()
        if self.live is not None:
            self.live.start_task(step.task_id)
            self.live.update(step.task_id, state="running")
        elif self.announce:
            self._line(f"{step.label}: running" + (f" ({step.expected})" if step.expected else ""))

    def advance(self, key, failed: int = 0, count: int = 1) -> None:
        step = self.steps[key]
        step.done += count
        step.failed += failed
        finished = step.done >= step.total
        if finished:
            step.seconds = time.perf_counter() - step.started
        verdict = ("[red]FAIL" if step.failed else "[green]PASS") if self.verdicts else "[green]done"
        if self.live is not None:
            state = (f"{verdict} ({step.failed} failed)" if step.failed else verdict) if finished else (
                f"[red]{step.failed} failed" if step.failed else "running")
            self.live.update(step.task_id, completed=step.done, state=state)
            if finished:
                self.live.stop_task(step.task_id)
        elif finished:
            failed_text = f" ({step.failed} of {step.total} failed)" if step.failed and step.total > 1 else ""
            outcome = ("FAIL" if step.failed else "PASS") if self.verdicts else "done"
            self._line(f"{step.label}: {outcome}{failed_text} in "
                       f"{format_duration(step.seconds)}")

    def _line(self, text: str) -> None:
        if self.plain:
            print(f"{self.title}: {text}", file=self.stream, flush=True)


def _durations_file() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pagedkv" / "durations.json"


def expected_seconds(kind: str, shipped: dict) -> dict:
    """Seconds per step of `kind` (e.g. "check ci"): the last run's here, else the shipped figures."""
    try:
        remembered = json.loads(_durations_file().read_text()).get(kind, {})
    except (OSError, ValueError, AttributeError):   # no run here yet, or a cache someone else wrote
        remembered = {}
    return {**shipped, **{key: value for key, value in remembered.items() if isinstance(value, (int, float))}}


def remember_seconds(kind: str, steps: dict) -> None:
    """Keep the durations of the steps that finished, for the next run's expectations."""
    finished = {key: round(step.seconds, 1) for key, step in steps.items() if step.done >= step.total > 0}
    if not finished:
        return
    path = _durations_file()
    try:
        data = json.loads(path.read_text()) if path.exists() else {}
        data = data if isinstance(data, dict) else {}
        data[kind] = {**(data.get(kind) if isinstance(data.get(kind), dict) else {}), **finished}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=1, sort_keys=True))
    except (OSError, ValueError):   # a read-only home must not fail a finished run over a convenience
        pass
