"""`pagedkv fuzz TARGET`: fuzz a block manager against the spec through the conformance protocol."""

import click


@click.command()
@click.argument("target")
@click.option("--profile", type=click.Choice(["ci", "dev", "deep"]), default="ci", show_default=True,
              help="Effort: examples per run and steps per example.")
@click.option("--max-examples", type=click.IntRange(min=1), help="Examples per worker (default: the profile's).")
@click.option("--seconds", type=click.FloatRange(min=0, min_open=True),
              help="Time budget: keep running until it is spent.")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True,
              help="Processes sharing one example database.")
@click.option("--db", default=".hypothesis/pagedkv", show_default=True,
              help="Example database: a directory, or redis://HOST:PORT/N shared by many machines.")
@click.option("--save-regression", type=click.Path(file_okay=False),
              help="Write a counterexample as a standalone pytest file into this directory.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write the result as JSON.")
@click.option("--junit", "junit_path", type=click.Path(dir_okay=False), help="Write a JUnit XML report.")
def fuzz(target, **options):
    """Fuzz TARGET ('spec', 'impl' or 'module:factory') against the spec.

    Exit status: 0 when no oracle fired, 1 on a counterexample, 2 on a usage error.
    """
    from pagedkv.fuzz.campaign import Options, run_campaign
    from pagedkv.fuzz.subjects import UsageError

    try:
        result = run_campaign(Options(target=target, **options))
    except UsageError as error:
        raise click.UsageError(str(error))
    raise SystemExit(result.exit_code())
