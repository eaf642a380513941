"""`pagedkv lab`: the seed's teaching lab on the spec."""

import click


def parse_lengths(_ctx, _param, value: str) -> tuple:
    try:
        lengths = tuple(int(part) for part in value.split(","))
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}")
    if any(length < 1 for length in lengths):
        raise click.BadParameter("every length must be >= 1")
    return lengths


@click.command()
@click.option("--block-size", type=click.IntRange(min=1), default=16, show_default=True)
@click.option("--lengths", default="17,32,63", show_default=True, callback=parse_lengths,
              help="Comma-separated sequence lengths.")
def lab(block_size, lengths):
    """Block arithmetic for some lengths, then copy-on-write, release and OOM scenarios."""
    from pagedkv.spec.lab import block_arithmetic, run_scenarios

    rows, totals = block_arithmetic(lengths, block_size)
    for row in rows:
        click.echo(f"length={row['length']} blocks={row['blocks']} slots={row['slots']} "
                   f"useful={row['useful']} tail_waste={row['tail_waste']}")
    click.echo(" ".join(f"{key}={value}" for key, value in totals.items()))
    failed = 0
    for name, passed, seen in run_scenarios(block_size):
        failed += not passed
        click.echo(f"{'PASS' if passed else 'FAIL'}  {name}  ({seen})")
    raise SystemExit(1 if failed else 0)
