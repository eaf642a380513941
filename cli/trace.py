"""`pagedkv trace`: synthesize request traces and summarize trace files (format in pagedkv.impl.sim.trace)."""
import click

from pagedkv.cli.common import Finite, InputFile, OutputFile, json_option, write_json

#: pagedkv.impl.sim.trace.DISTRIBUTIONS, restated so that a usage error never waits for the impl
#: room to load (a test keeps the two in step).
DISTRIBUTIONS = ("lognormal", "uniform", "fixed")
#: Longest sequence a trace may describe: the simulator numbers token positions below 2**24.
MAX_SEQ_LEN = 2**24
MAX_REQUESTS = 10**9


@click.group()
def trace():
    """Request traces as JSONL: synthesize one, or summarize a file."""


@trace.command()
@click.option("--out", type=OutputFile(), required=True, help="JSONL file to write ('-' for stdout).")
@click.option("--num-requests", type=click.IntRange(1, MAX_REQUESTS), required=True)
@click.option("--seed", type=click.IntRange(0, 2**63 - 1), required=True, help="The same seed gives the same trace.")
@click.option("--rate", type=Finite(1e-6, 1e9), default=4.0, show_default=True, help="Poisson arrivals per second.")
@click.option("--prompt-dist", type=click.Choice(DISTRIBUTIONS), default="lognormal", show_default=True)
@click.option("--prompt-mean", type=Finite(1, MAX_SEQ_LEN), default=450, show_default=True, help="Mean prompt tokens.")
@click.option("--output-dist", type=click.Choice(DISTRIBUTIONS), default="lognormal", show_default=True)
@click.option("--output-mean", type=Finite(1, MAX_SEQ_LEN), default=120, show_default=True, help="Mean output tokens.")
@click.option("--sigma", type=Finite(0, 4), default=0.5, show_default=True, help="Log-space spread of lognormal lengths.")
@click.option("--max-seq-len", "--max-model-len", "max_seq_len", type=click.IntRange(2, MAX_SEQ_LEN), default=2048,
              show_default=True, help="Clip prompt + output to this.")
@click.option("--prefix-fraction", type=Finite(0, 1), default=0.0, show_default=True,
              help="Share of requests that start with a shared prefix.")
@click.option("--prefix-groups", type=click.IntRange(1, 2**20), default=4, show_default=True,
              help="Distinct shared prefixes.")
@click.option("--prefix-len", type=click.IntRange(0, MAX_SEQ_LEN), default=0, show_default=True,
              help="Tokens in a shared prefix.")
@click.option("--sample-prob", type=Finite(0, 1), default=0.0, show_default=True,
              help="Share of requests that ask for parallel samples.")
@click.option("--num-samples", type=click.IntRange(1, 1024), default=4, show_default=True,
              help="Samples such a request asks for.")
def synth(out, num_requests, seed, rate, prompt_dist, prompt_mean, output_dist, output_mean, sigma,
          max_seq_len, prefix_fraction, prefix_groups, prefix_len, sample_prob, num_samples):
    """Write a seeded synthetic trace (JSONL, streamed: any size in constant memory). Defaults: Poisson
    arrivals at 4/s, lognormal prompts of mean 450 tokens and outputs of mean 120, prompt + output
    clipped to 2048 (the workload of the README's utilization figures)."""
    from pagedkv.impl.sim import trace as tr

    try:
        cfg = tr.TraceConfig(
            num_requests=num_requests, seed=seed, rate=rate,
            prompt=tr.LengthDist(prompt_dist, prompt_mean, sigma),
            output=tr.LengthDist(output_dist, output_mean, sigma),
            max_seq_len=max_seq_len, prefix_fraction=prefix_fraction, prefix_groups=prefix_groups,
            prefix_len=prefix_len, sample_prob=sample_prob, num_samples=num_samples)
    except tr.TraceError as e:
        raise click.UsageError(str(e)) from e
    from pagedkv.cli.progress import Step, StepProgress

    written = Step(f"{num_requests:,} requests to {out}", total=num_requests)
    with StepProgress("trace synth", {"write": written}, announce=False, verdicts=False) as progress:
        progress.begin("write")

        def counted(chunks):
            for chunk in chunks:
                yield from chunk
                progress.advance("write", count=len(chunk))

        count = tr.write_trace(out, counted(tr.synthesize_chunks(cfg)))
    for note in synth_no_effect(prompt_dist, output_dist, sigma, prefix_fraction, prefix_len, sample_prob):
        click.echo(f"note: {note}", err=True)
    click.echo(f"wrote {count} requests to {out}", err=out == "-")


def synth_no_effect(prompt_dist, output_dist, sigma, prefix_fraction, prefix_len, sample_prob) -> list:
    """Settings that cannot have changed the trace (each names the setting that would make it count)."""
    notes = []
    if prefix_fraction > 0 and prefix_len == 0:
        notes.append("--prefix-fraction had no effect: --prefix-len is 0, so no request shares a token")
    if prefix_len > 0 and prefix_fraction == 0:
        notes.append("--prefix-len had no effect: --prefix-fraction is 0, so no request joins a group")
    if sample_prob == 0 and click.get_current_context().get_parameter_source("num_samples").name != "DEFAULT":
        notes.append("--num-samples had no effect: --sample-prob is 0")
    if sigma != 0.5 and "lognormal" not in (prompt_dist, output_dist):
        notes.append("--sigma had no effect: it spreads lognormal lengths only")
    return notes


@trace.command()
@click.argument("file", type=InputFile())
@json_option
def stats(file, json_path):
    """Count, mean and percentiles of a trace's lengths."""
    from pagedkv.impl.sim import trace as tr

    try:
        summary = tr.trace_stats(tr.stream_trace(file))
    except tr.TraceError as e:
        raise click.UsageError(str(e)) from e
    if json_path:
        write_json(json_path, summary)
    if json_path == "-":
        return
    rate = summary["rate_per_s"]
    click.echo(f"requests     {summary['count']}  over {summary['duration_s']:.1f} s"
               + (f"  ({rate:.2f}/s)" if rate is not None else ""))
    click.echo(f"{'':12} {'mean':>9} {'p50':>8} {'p90':>8} {'p99':>8} {'max':>8}")
    for key in ("prompt_len", "output_len", "total_len"):
        s = summary[key]
        click.echo(f"{key:12} {s['mean']:9.1f} {s['p50']:8.0f} {s['p90']:8.0f} {s['p99']:8.0f} {s['max']:8.0f}")
    click.echo(f"with prefix  {summary['prefix_fraction']:.1%} in {summary['prefix_groups']} group(s)")
    click.echo(f"multi-sample {summary['multi_sample_fraction']:.1%}  ({summary['total_samples']} samples in all)")
