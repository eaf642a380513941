"""The `pagedkv` command group. Each subcommand lives in its own module of this package."""
import click

COMPLETION = """\b
Shell completion (add the line to your shell's start-up file):
  bash: eval "$(_PAGEDKV_COMPLETE=bash_source pagedkv)"
  zsh:  eval "$(_PAGEDKV_COMPLETE=zsh_source pagedkv)"
  fish: _PAGEDKV_COMPLETE=fish_source pagedkv | source"""


# Help follows the terminal's width (click's default stops at 80 columns).
@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 200}, epilog=COMPLETION)
@click.version_option(package_name="pagedkv", prog_name="pagedkv", message="%(prog)s %(version)s")
def main():
    """pagedkv: a formally checked reference for PagedAttention KV-cache management.

    Every command validates its options before it starts any work; a usage error exits with status 2.
    """


def _register():
    # Subcommand modules import only click at load time and the heavy rooms (torch, z3) inside their
    # commands, after the options are validated, so `pagedkv --help` and usage errors stay fast.
    from pagedkv.cli import check, demo, fuzz, gen_kernel_tests, lab, plan, prove, simulate, trace

    for command in (check.check, prove.prove, fuzz.fuzz, lab.lab, plan.plan, trace.trace,
                    simulate.simulate, demo.demo, gen_kernel_tests.gen_kernel_tests):
        main.add_command(command)


_register()
