"""`pagedkv trace`: synthesize request traces and summarize trace files (format in pagedkv.impl.sim.trace)."""
import json

import click

from pagedkv.impl.sim import trace as tr


@click.group()
def trace():
    """Request traces as JSONL: synthesize one, or summarize a file."""


@trace.command()
@click.option("--out", type=click.Path(dir_okay=False), required=True, help="JSONL file to write.")
@click.option("--num-requests", type=int, required=True)
@click.option("--seed", type=int, required=True, help="The same seed gives the same trace.")
@click.option("--rate", type=float, default=4.0, show_default=True, help="Poisson arrivals per second.")
@click.option("--prompt-dist", type=click.Choice(tr.DISTRIBUTIONS), default="lognormal", show_default=True)
@click.option("--prompt-mean", type=float, default=450, show_default=True)
@click.option("--output-dist", type=click.Choice(tr.DISTRIBUTIONS), default="lognormal", show_default=True)
@click.option("--output-mean", type=float, default=120, show_default=True)
@click.option("--sigma", type=float, default=0.5, show_default=True, help="Log-space spread of lognormal lengths.")
@click.option("--max-seq-len", type=int, default=2048, show_default=True, help="Clip prompt + output to this.")
@click.option("--prefix-fraction", type=float, default=0.0, show_default=True,
              help="Share of requests that start with a shared prefix.")
@click.option("--prefix-groups", type=int, default=4, show_default=True, help="Distinct shared prefixes.")
@click.option("--prefix-len", type=int, default=0, show_default=True, help="Tokens in a shared prefix.")
@click.option("--sample-prob", type=float, default=0.0, show_default=True,
              help="Share of requests that ask for parallel samples.")
@click.option("--num-samples", type=int, default=4, show_default=True, help="Samples such a request asks for.")
def synth(out, num_requests, seed, rate, prompt_dist, prompt_mean, output_dist, output_mean, sigma,
          max_seq_len, prefix_fraction, prefix_groups, prefix_len, sample_prob, num_samples):
    """Write a seeded synthetic trace (defaults: the seed scenario, prompts ~450, outputs ~120, max 2048)."""
    try:
        cfg = tr.TraceConfig(
            num_requests=num_requests, seed=seed, rate=rate,
            prompt=tr.LengthDist(prompt_dist, prompt_mean, sigma),
            output=tr.LengthDist(output_dist, output_mean, sigma),
            max_seq_len=max_seq_len, prefix_fraction=prefix_fraction, prefix_groups=prefix_groups,
            prefix_len=prefix_len, sample_prob=sample_prob, num_samples=num_samples)
    except tr.TraceError as e:
        raise click.UsageError(str(e)) from e
    requests = tr.synthesize(cfg)
    tr.write_trace(out, requests)
    click.echo(f"wrote {len(requests)} requests to {out}")


@trace.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def stats(file, as_json):
    """Count, mean and percentiles of a trace's lengths."""
    try:
        summary = tr.trace_stats(tr.read_trace(file))
    except tr.TraceError as e:
        raise click.UsageError(str(e)) from e
    if as_json:
        click.echo(json.dumps(summary))
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
