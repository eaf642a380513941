"""Conventions every command shares: --version, `python -m pagedkv`, shell completion, one meaning
for --json FILE, output that follows the terminal rather than a fixed width."""
import json
import subprocess
import sys
from importlib.metadata import version

import pytest
from click.testing import CliRunner

from pagedkv.cli import common, demo, gen_kernel_tests, plan, trace
from pagedkv.cli.main import main


def test_version_names_the_installed_distribution():
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0 and result.output == f"pagedkv {version('pagedkv')}\n"


def test_python_dash_m_pagedkv_is_the_same_command():
    done = subprocess.run([sys.executable, "-m", "pagedkv", "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == f"pagedkv {version('pagedkv')}\n"
    done = subprocess.run([sys.executable, "-m", "pagedkv", "lab", "--block-size", "0"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "Usage: pagedkv lab" in done.stderr


def test_shell_completion_completes_check_names():
    """What `eval "$(_PAGEDKV_COMPLETE=bash_source pagedkv)"` installs asks the command itself."""
    runner = CliRunner()
    source = runner.invoke(main, [], prog_name="pagedkv", env={"_PAGEDKV_COMPLETE": "bash_source"})
    assert "_pagedkv_completion()" in source.output and "complete -o nosort -F _pagedkv_completion pagedkv" in \
        source.output
    answer = runner.invoke(main, [], prog_name="pagedkv", env={
        "_PAGEDKV_COMPLETE": "bash_complete", "COMP_WORDS": "pagedkv check --only kern", "COMP_CWORD": "3"})
    assert answer.output.split() == ["plain,kernels", "plain,kernel-state"]
    assert "_PAGEDKV_COMPLETE=bash_source pagedkv" in runner.invoke(main, ["--help"]).output


def test_restated_choices_match_the_rooms():
    """The CLI restates a few choice lists so that usage errors never wait for torch; they must not drift."""
    from pagedkv.impl.engine import SCENARIOS
    from pagedkv.impl.sim.planner import DTYPE_BYTES
    from pagedkv.impl.sim.trace import DISTRIBUTIONS
    from pagedkv.kernels.validation import MAX_HEAD_DIM

    assert demo.SCENARIOS == SCENARIOS
    assert gen_kernel_tests.MAX_HEAD_DIM == MAX_HEAD_DIM
    assert set(plan.DTYPES) == set(DTYPE_BYTES)
    assert set(plan.DTYPE_ALIASES.values()) <= set(DTYPE_BYTES)
    assert trace.DISTRIBUTIONS == DISTRIBUTIONS


@pytest.mark.parametrize("command, human", [
    (["plan", "--layers", "2", "--kv-heads", "2", "--head-dim", "8", "--dtype", "fp16", "--block-size", "4",
      "--pool-bytes", "4096"], "KV bytes per token"),
    (["trace", "stats", "TRACE"], "requests     2"),
])
def test_json_option_takes_a_file_or_dash(command, human, tmp_path):
    trace_file = tmp_path / "t.jsonl"
    trace_file.write_text('{"arrival": 0, "prompt_len": 5, "output_len": 2}\n'
                          '{"arrival": 1, "prompt_len": 7, "output_len": 3}\n')
    command = [str(trace_file) if part == "TRACE" else part for part in command]
    runner = CliRunner()
    to_stdout = runner.invoke(main, [*command, "--json", "-"])
    path = tmp_path / "out.json"
    to_file = runner.invoke(main, [*command, "--json", str(path)])
    assert to_stdout.exit_code == to_file.exit_code == 0, to_stdout.output
    assert json.loads(to_stdout.stdout) == json.loads(path.read_text())
    assert human in to_file.stdout and human not in to_stdout.stdout   # with a file, the human form prints too


def test_every_json_option_means_a_file():
    """One meaning for --json in every command that has it: a FILE, '-' for stdout."""
    from pagedkv.cli.main import main as group

    def commands(command, prefix=()):
        if hasattr(command, "commands"):
            for name, sub in command.commands.items():
                yield from commands(sub, (*prefix, name))
        else:
            yield prefix, command

    found = 0
    for path, command in commands(group):
        for param in command.params:
            if "--json" in getattr(param, "opts", ()):
                found += 1
                assert not param.is_flag and param.metavar == "FILE", path
    assert found >= 6


def test_piped_tables_keep_their_lines_whole(monkeypatch):
    """No terminal: a long row stays on one line (not folded at 80 columns, mid-word)."""
    monkeypatch.delenv("COLUMNS", raising=False)
    from rich.table import Table

    console = common.console()
    table = Table()
    table.add_column("covered")
    long_text = "word " * 60
    table.add_row(long_text.strip())
    with console.capture() as captured:
        console.print(table)
    assert long_text.strip() in captured.get()


def test_a_terminal_width_is_followed(monkeypatch):
    monkeypatch.setenv("COLUMNS", "70")
    assert common.console().width == 70
