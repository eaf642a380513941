"""`pagedkv lab`: a worked example of PagedAttention block bookkeeping, run on the executable spec."""

import click

from pagedkv.spec.lab import DEFAULT_LENGTHS   # stdlib only: cheap to import before parsing

#: The spec keeps every token it stores; a lab length is for reading the arithmetic, not for load.
MAX_LENGTH = 1_000_000


def parse_lengths(_ctx, _param, value: str) -> tuple:
    try:
        lengths = tuple(int(part) for part in value.split(","))
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from None
    if not all(1 <= length <= MAX_LENGTH for length in lengths):
        raise click.BadParameter(f"every length must lie in 1..{MAX_LENGTH}")
    return lengths


@click.command(short_help="A worked example of PagedAttention bookkeeping, run on the spec.")
@click.option("--block-size", type=click.IntRange(1, 65_536), default=16, show_default=True, help="Tokens per block.")
@click.option("--lengths", default=",".join(map(str, DEFAULT_LENGTHS)), show_default=True, callback=parse_lengths,
              help="Comma-separated sequence lengths.")
def lab(block_size, lengths):
    """Block arithmetic for some sequence lengths (blocks, slots, useful tokens, tail waste), then five
    scenarios on a small pool: copy-on-write isolates writers, the last reference returns a block, a
    copy-on-write that cannot allocate keeps the old mapping, cancelling returns everything, and a
    full pool refuses cleanly. A worked example of PagedAttention bookkeeping; each line says PASS or
    FAIL."""
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
