"""What every `pagedkv` command shares: bounded numeric options, output paths checked before any work
starts, one meaning for `--json FILE` (`-` is stdout), and consoles that follow the terminal.

Only click is imported here: a usage error must be reported before any heavy room (torch, z3) loads.
"""
import json
import math
import os
import sys
from pathlib import Path

import click

#: `--json FILE`: one meaning in every command.
JSON_HELP = "Write the results as JSON to FILE ('-' for stdout; the table then goes to stderr)."


class Finite(click.FloatRange):
    """A float range that also refuses nan and infinities. A bare FloatRange lets nan through,
    because every comparison with nan is false."""

    name = "number"

    def convert(self, value, param, ctx):
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return super().convert(number, param, ctx)


class InputFile(click.Path):
    """A file the command reads: it exists and is a regular file (a device such as /dev/zero never
    ends, and a FIFO with no writer blocks forever)."""

    def __init__(self):
        super().__init__(exists=True, dir_okay=False)

    def convert(self, value, param, ctx):
        path = super().convert(value, param, ctx)
        if not os.path.isfile(path):
            self.fail(f"{value!r} is not a regular file.", param, ctx)
        return path


class OutputFile(click.ParamType):
    """A file the command will write: checked when the command line is parsed, before any work,
    so a typo in a path cannot throw away minutes of results. `-` (when allowed) means stdout."""

    name = "file"

    def __init__(self, dash: bool = True):
        self.dash = dash

    def convert(self, value, param, ctx):
        if self.dash and value == "-":
            return value
        path = Path(value)
        if path.is_dir():
            self.fail(f"{value!r} is a folder, not a file.", param, ctx)
        folder = path.parent
        if not folder.is_dir():
            self.fail(f"folder {str(folder)!r} does not exist.", param, ctx)
        if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
            self.fail(f"{value!r} is not writable.", param, ctx)
        return str(path)


class OutputDir(click.ParamType):
    """A folder the command writes into: it may not exist yet (it is created), but its parent must."""

    name = "folder"

    def convert(self, value, param, ctx):
        path = Path(value)
        if path.exists() and not path.is_dir():
            self.fail(f"{value!r} exists and is not a folder.", param, ctx)
        existing = path if path.exists() else path.parent
        if not existing.is_dir():
            self.fail(f"folder {str(existing)!r} does not exist.", param, ctx)
        if not os.access(existing, os.W_OK):
            self.fail(f"{str(existing)!r} is not writable.", param, ctx)
        return str(path)


def json_option(function):
    return click.option("--json", "json_path", type=OutputFile(), metavar="FILE", help=JSON_HELP)(function)


def write_json(target: str, data) -> None:
    """Write `data` to the file `target`, or to stdout when it is '-'."""
    text = json.dumps(data, indent=2) + "\n"
    if target == "-":
        click.echo(text, nl=False)
    else:
        Path(target).write_text(text, encoding="utf-8")


def console(stderr: bool = False):
    """A rich console for human output. On a terminal it follows the terminal's width; piped or
    redirected there is no width to fit, so lines keep their natural length instead of being folded
    at 80 columns (COLUMNS, when set, still wins)."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty() or "COLUMNS" in os.environ:
        return Console(file=stream)
    return Console(file=stream, width=1000, soft_wrap=True)


def human_console(json_path):
    """Human output goes to stderr when the JSON goes to stdout, so `--json -` pipes clean JSON."""
    return console(stderr=json_path == "-")


def format_duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds // 60:.0f} min {seconds % 60:02.0f} s"
