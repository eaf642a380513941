"""The `pagedkv` command group. Each subcommand lives in its own module of this package."""
import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main():
    """pagedkv: a formally checked reference for PagedAttention KV-cache management."""


def _register():
    # Subcommand modules import heavy rooms (torch, z3) lazily inside their commands,
    # so `pagedkv --help` stays fast.
    from pagedkv.cli import check, lab

    main.add_command(check.check)
    main.add_command(lab.lab)
    from pagedkv.cli import plan, trace
    main.add_command(plan.plan)
    main.add_command(trace.trace)
    from pagedkv.cli import gen_kernel_tests
    main.add_command(gen_kernel_tests.gen_kernel_tests)
    from pagedkv.cli import demo, simulate
    main.add_command(simulate.simulate)
    main.add_command(demo.demo)
    from pagedkv.cli import prove
    main.add_command(prove.prove)

    from pagedkv.cli import fuzz
    main.add_command(fuzz.fuzz)


_register()
