"""`pagedkv fuzz TARGET`: fuzz a block manager against the spec through the conformance protocol."""

import sys
import traceback

import click

from pagedkv.cli.common import JSON_HELP, OutputDir, OutputFile


def block_sizes(ctx, param, value):
    """`16,32` -> (16, 32); the ranges are checked with the other options (campaign.checked)."""
    if value is None:
        return None
    try:
        return tuple(int(part) for part in value.split(","))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of integers (e.g. 16,32)")


@click.command()
@click.argument("target")
@click.option("--profile", type=click.Choice(["ci", "dev", "deep"]), default="ci", show_default=True,
              help="Effort: examples per run and steps per example.")
@click.option("--max-examples", type=int, help="Examples per worker, 1..10^9 (default: the profile's).")
@click.option("--seconds", type=float, help="Time budget, up to 30 days: keep running until it is spent.")
@click.option("--workers", type=int, default=1, show_default=True,
              help="Processes sharing one example database, 1..256.")
@click.option("--seed", type=int,
              help="Seed of every draw, 0..2^64-1 (default: 0 under --profile ci, else a fresh one, printed).")
@click.option("--call-timeout", type=float, default=10.0, show_default=True,
              help="Seconds one subject call may take before it is a `timeout` finding (up to 3600).")
@click.option("--policy", type=click.Choice(["spec", "any"]),
              help="spec: the subject must make the spec's own choices; any: any legal choice "
                   "(default: spec for the targets spec and impl, any for every other target).")
@click.option("--block-sizes", callback=block_sizes,
              help="Comma-separated block sizes to draw from (e.g. 16,32), overriding what the subject declares.")
@click.option("--db", default=".hypothesis/pagedkv", show_default=True,
              help="Example database: a directory, or a Redis URL shared by many machines "
                   "(redis://[:PASSWORD@]HOST:PORT/N, rediss:// for TLS, unix:///PATH?db=N).")
@click.option("--save-regression", type=OutputDir(),
              help="Write a counterexample as a pytest file (and its JSON data) into this folder.")
@click.option("--json", "json_path", type=OutputFile(), metavar="FILE", help=JSON_HELP)
@click.option("--junit", "junit_path", type=OutputFile(dash=False), help="Write a JUnit XML report to FILE.")
@click.option("--traceback", "show_traceback", is_flag=True,
              help="On a usage error, also print the full traceback of its cause (an adapter's import error, say).")
def fuzz(target, show_traceback, **options):
    """Fuzz TARGET ('spec', 'impl', a built-in engine adapter such as 'vllm' or 'sglang', or
    'module:factory') against the spec.

    Exit status: 0 when no oracle fired, 1 on a counterexample, 2 on a usage error.
    """
    from pagedkv.fuzz.campaign import Options, run_campaign
    from pagedkv.fuzz.subjects import UsageError

    try:
        report_to = sys.stderr if options["json_path"] == "-" else None   # `--json -` keeps stdout clean JSON
        result = run_campaign(Options(target=target, **options), out=report_to)
    except UsageError as error:
        if show_traceback and error.__cause__ is not None:
            click.echo("".join(traceback.format_exception(error.__cause__)), err=True, nl=False)
        hint = " (--traceback shows where)" if error.__cause__ is not None and not show_traceback else ""
        raise click.UsageError(f"{error}{hint}")
    raise SystemExit(result.exit_code())
