"""`pagedkv gen-kernel-tests`: kernel cases from real allocation histories and the designed grids, and a
pytest module that replays them on the device at hand against a kernel target."""

import pathlib

import click

from pagedkv.cli.common import OutputDir, OutputFile

DTYPE_NAMES = ("float32", "float16", "bfloat16")
GRIDS = ("ci", "dev", "deep", "none")
# The kernels' own limit (pagedkv.kernels.validation.MAX_HEAD_DIM), restated so that a bad value is
# refused while the command line is parsed, before torch loads; tests/cli keeps the two in step.
MAX_HEAD_DIM = 256
# Bounds that keep the caches the state machine draws (blocks x block size x heads x head dim, K
# and V) within a few GiB: the defaults are far below them.
MAX_KV_HEADS, MAX_GROUP = 16, 16
MAX_BLOCKS, MAX_BLOCK_SIZE, MAX_PROMPT, MAX_COUNT = 1024, 256, 4096, 100_000


def _heads(_ctx, _param, text: str) -> tuple:
    """num_kv_heads,group,head_dim, checked while the command line is parsed (before torch loads)."""
    try:
        num_kv_heads, group, head_dim = (int(part) for part in text.split(","))
    except ValueError:
        raise click.BadParameter("give num_kv_heads,group,head_dim, e.g. 1,3,16") from None
    if not (1 <= num_kv_heads <= MAX_KV_HEADS and 1 <= group <= MAX_GROUP and 1 <= head_dim <= MAX_HEAD_DIM):
        raise click.BadParameter(f"num_kv_heads must lie in 1..{MAX_KV_HEADS}, group in 1..{MAX_GROUP} "
                                 f"and head_dim in 1..{MAX_HEAD_DIM}")
    return num_kv_heads, group, head_dim


def _target(kernel):
    from pagedkv.fuzz.kernel_kit import KernelTargetError, load_kernel

    if kernel is None:
        return None
    try:
        return load_kernel(kernel)
    except KernelTargetError as error:
        raise click.BadParameter(str(error), param_hint="--kernel") from None


@click.command("gen-kernel-tests")
@click.option("--out", "out_dir", required=True, type=OutputDir(), help="Folder to write into.")
@click.option("--count", default=50, show_default=True, type=click.IntRange(1, MAX_COUNT), help="Cases to keep.")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(0, 2**63 - 1),
              help="Seeds the state machine run and the sampling.")
@click.option("--max-blocks", default=24, show_default=True, type=click.IntRange(4, MAX_BLOCKS),
              help="Largest GPU pool drawn.")
@click.option("--max-block-size", default=8, show_default=True, type=click.IntRange(1, MAX_BLOCK_SIZE),
              help="Largest block size drawn.")
@click.option("--max-prompt", default=6, show_default=True, type=click.IntRange(0, MAX_PROMPT),
              help="Most prompt tokens after the shared prefix.")
@click.option("--heads", default="1,3,16", show_default=True, callback=_heads, help="num_kv_heads,group,head_dim.")
@click.option("--dtype", "dtypes", multiple=True, default=("float32",), show_default=True,
              type=click.Choice(DTYPE_NAMES), help="Replay in this dtype (repeatable); a kernel that does not "
                                                   "declare a dtype (bfloat16 off CUDA) skips it.")
@click.option("--grid", default="ci", show_default=True, type=click.Choice(GRIDS),
              help="Also write grid.jsonl: the multi-tile grid at this size and the ports of peers' test grids.")
@click.option("--kernel", metavar="MODULE:FACTORY",
              help="The kernel the replay module tests unless PAGEDKV_KERNEL names another (recorded in "
                   "replay.json); with --check-kernels, also the kernel the state machine runs.")
@click.option("--check-kernels/--no-check-kernels", default=False, show_default=True,
              help="Also run the kernels while generating (slow under the interpreter).")
@click.option("--save-failures", type=OutputFile(dash=False), envvar="PAGEDKV_KERNEL_FAILURES",
              help="Failure corpus: shrunk failures are appended to it, and its cases are replayed too "
                   "[env: PAGEDKV_KERNEL_FAILURES].")
def gen_kernel_tests(out_dir, count, seed, max_blocks, max_block_size, max_prompt, heads, dtypes, grid, kernel,
                     check_kernels, save_failures):
    """Run the kernel state machine, keep COUNT of the batches it checked as cases (corpus.jsonl), add
    the designed grid (grid.jsonl), and write test_kernel_replay.py, which replays every *.jsonl case
    file in OUT against $PAGEDKV_KERNEL, else --kernel, else pagedkv's own kernels."""
    from pagedkv.fuzz.kernel_corpus import Heads, read_corpus, write_corpus, write_replay_module
    from pagedkv.fuzz.kernel_kit.grids import designed_corpus
    from pagedkv.fuzz.kernel_kit.replay import write_folder_target
    from pagedkv.fuzz.kernel_machine import Limits, generate_cases

    target = _target(kernel)
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    limits = Limits(max_blocks=max_blocks, max_block_size=max_block_size, max_prompt=max_prompt)
    failure = None
    try:
        cases = generate_cases(count, seed=seed, limits=limits, heads=Heads(*heads), run_kernels=check_kernels,
                               failures_path=save_failures, target=target)
    except AssertionError as error:
        cases, failure = [], error
    if cases:
        write_corpus(out / "corpus.jsonl", cases, dtypes=dtypes, seed=seed, limits=vars(limits))
    grid_cases = designed_corpus(grid) if grid != "none" else []
    if grid_cases:
        write_corpus(out / "grid.jsonl", grid_cases, dtypes=dtypes, source=f"kernel_kit.grids, {grid}")
    if save_failures and pathlib.Path(save_failures).exists():
        _, failures = read_corpus(save_failures)
        write_corpus(out / "failures.jsonl", failures, dtypes=dtypes, source=str(save_failures))
    if target is not None:
        write_folder_target(out, target.target)
    module = write_replay_module(out)
    click.echo(f"{len(cases)} cases -> {out / 'corpus.jsonl'}, {len(grid_cases)} -> {out / 'grid.jsonl'}; "
               f"replay: python -m pytest {module}")
    if failure is not None:
        where = f"; saved to {save_failures}" if save_failures else " (pass --save-failures to keep it)"
        raise click.ClickException(f"the kernel state machine failed{where}:\n{failure}")
