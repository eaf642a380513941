"""The `pagedkv` command group. Each subcommand lives in its own module of this package."""
import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main():
    """pagedkv: a formally checked reference for PagedAttention KV-cache management."""


def _register():
    # Subcommand modules import heavy rooms (torch, z3) lazily inside their commands,
    # so `pagedkv --help` stays fast.
    from pagedkv.cli import check, demo, fuzz, gen_kernel_tests, lab, plan, prove, simulate, trace

    for command in (check.check, prove.prove, fuzz.fuzz, lab.lab, plan.plan, trace.trace,
                    simulate.simulate, demo.demo, gen_kernel_tests.gen_kernel_tests):
        main.add_command(command)


_register()
