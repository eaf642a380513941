"""Files for `pagedkv simulate --out DIR`: summaries as JSON and CSV, per-step timelines as CSV, and
PNG plots of what allocators are compared by: KV utilization, running and waiting sequences, and
preemptions over time; TTFT and inter-token latency distributions (CDFs); and the paged block-size
sweep at fixed pool bytes."""
import csv
import json
from pathlib import Path

from .simulator import SimResult

#: summary keys shown in tables and the sweep CSV, in order
HEADLINE = ("allocator", "block_size", "pool_blocks", "utilization_mean", "tail_bound_mean", "tail_expected_mean",
            "waste_mib_mean",
            "concurrency_peak", "concurrency_mean", "admissions_delayed", "oom_events", "preempt_recompute",
            "preempt_swap", "prefix_hit_rate", "block_table_len_mean", "ttft_p50_s", "ttft_p99_s",
            "itl_p50_s", "itl_p99_s", "simulated_s")
#: one colour per allocator in every plot
COLOURS = {"contiguous": "tab:orange", "paged": "tab:blue"}


def write_outputs(out_dir, results: list, sweep: list, cost_model: str) -> list:
    """Write everything; returns the paths written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = [_write_json(out / "summary.json", {"cost_model": cost_model,
                                                   "runs": [r.summary() for r in results],
                                                   "block_size_sweep": sweep})]
    for r in results:
        written.append(_write_csv(out / f"timeline_{r.config.allocator}.csv", _rows(r.timeline)))
    written.append(plot_utilization(results, out / "utilization.png"))
    written.append(plot_latency_cdfs(results, out / "latency_cdf.png"))
    written.append(plot_concurrency(results, out / "concurrency.png"))
    written.append(plot_preemptions(results, out / "preemptions.png"))
    if sweep:
        written.append(_write_csv(out / "block_size_sweep.csv", sweep))
        written.append(plot_sweep(sweep, out / "block_size_sweep.png"))
    return written


def run_label(result: SimResult) -> str:
    """Block size only where there are blocks: the contiguous baseline reserves ranges of slots."""
    cfg = result.config
    if cfg.allocator == "contiguous":
        return "contiguous"
    return f"paged, B={cfg.block_size}" + (" +prefix cache" if cfg.prefix_caching else "")


def plot_utilization(results: list, path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    for r in results:
        t = r.timeline
        util = [u / v if v else float("nan") for u, v in zip(t["useful"], t["reserved"])]
        mean = r.summary()["utilization_mean"]
        ax.plot(t["time"], util, lw=0.8, color=COLOURS[r.config.allocator],
                label=f"{run_label(r)} (mean {mean:.1%})")
    ax.set(xlabel="simulated time (s)", ylabel="KV utilization (useful / reserved slots)", ylim=(0, 1.05),
           title="KV-cache utilization over time")
    ax.legend(loc="lower right")
    return _save(fig, path)


def plot_latency_cdfs(results: list, path) -> Path:
    """TTFT and inter-token latency as empirical CDFs: the whole distribution, tails included."""
    import numpy as np

    plt = _pyplot()
    fig, (ttft_ax, itl_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for ax, attribute, title in ((ttft_ax, "ttft", "time to first token"), (itl_ax, "itl", "inter-token latency")):
        for r in results:
            values = np.sort(np.asarray(getattr(r, attribute), dtype=float)) * 1e3
            if len(values):
                ax.step(values, np.arange(1, len(values) + 1) / len(values), where="post",
                        color=COLOURS[r.config.allocator],
                        label=f"{run_label(r)} (P50 {np.percentile(values, 50):,.0f} ms, "
                              f"P99 {np.percentile(values, 99):,.0f} ms)")
        ax.set(xscale="symlog", xlabel=f"{title} (ms, simulated)", ylabel="fraction of " + (
            "requests" if attribute == "ttft" else "token gaps"), ylim=(0, 1.02), title=f"{title}, CDF")
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize="small")
    return _save(fig, path)


def plot_concurrency(results: list, path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    for r in results:
        t, colour = r.timeline, COLOURS[r.config.allocator]
        ax.plot(t["time"], t["sequences"], lw=0.9, color=colour,
                label=f"{run_label(r)}: running (peak {max(t['sequences'], default=0)})")
        ax.plot(t["time"], t["waiting"], lw=0.9, ls="--", color=colour, label=f"{run_label(r)}: waiting")
    ax.set(xlabel="simulated time (s)", ylabel="sequences", title="Running and waiting sequences over time")
    ax.legend(loc="upper left", fontsize="small")
    return _save(fig, path)


def plot_preemptions(results: list, path) -> Path:
    import numpy as np

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    for r in results:
        t, summary = r.timeline, r.summary()
        detail = (" (never preempts: it reserves max_seq_len up front)" if r.config.allocator == "contiguous" else
                  f" ({summary['preempt_recompute']} by recompute, {summary['preempt_swap']} by swap)")
        ax.step(t["time"], np.cumsum(t["preempted"]), where="post", color=COLOURS[r.config.allocator],
                label=run_label(r) + detail)
    ax.set(xlabel="simulated time (s)", ylabel="sequences preempted so far", title="Preemptions over time")
    ax.yaxis.get_major_locator().set_params(integer=True)   # counts, not fractions
    if not any(sum(r.timeline["preempted"]) for r in results):
        ax.set_ylim(0, 1)
        ax.text(0.5, 0.5, "no sequence was preempted in this run", transform=ax.transAxes, ha="center",
                color="tab:gray")
    else:
        ax.set_ylim(bottom=0)
    ax.legend(loc="best", fontsize="small")
    return _save(fig, path)


def plot_sweep(sweep: list, path) -> Path:
    """Measured utilization next to the tail-waste expectation it usually sits on: distinct markers
    and line styles, the measured line drawn thin over the others, so neither hides the other."""
    plt = _pyplot()
    sizes = [row["block_size"] for row in sweep]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.plot(sizes, [row["tail_bound_mean"] for row in sweep], "^:", color="tab:gray", ms=7,
              label="tail-waste bound, B-1 empty slots per seq")
    left.plot(sizes, [row["tail_expected_mean"] for row in sweep], "s--", color="tab:green", ms=10, mfc="none",
              mew=1.5, label="expected, (B-1)/2 empty slots per seq")
    left.plot(sizes, [row["utilization_mean"] for row in sweep], "o-", color="tab:blue", ms=4, lw=1,
              label="measured utilization")
    left.set(xscale="log", xlabel="block size (tokens)", ylabel="mean utilization", title="Paged, fixed pool bytes")
    left.set_xticks(sizes, [str(s) for s in sizes])
    left.legend(fontsize="small")
    right.plot(sizes, [row["waste_mib_mean"] for row in sweep], "o-", color="tab:red", label="mean tail waste (MiB)")
    right.set(xscale="log", xlabel="block size (tokens)", ylabel="mean tail waste (MiB)",
              title="Waste vs block-table length")
    right.set_xticks(sizes, [str(s) for s in sizes])
    twin = right.twinx()
    twin.plot(sizes, [row["block_table_len_mean"] for row in sweep], "s:", color="tab:gray",
              label="mean block-table length (blocks)")
    twin.set_ylabel("mean block-table length (blocks)", color="tab:gray")
    lines = right.get_lines() + twin.get_lines()
    right.legend(lines, [line.get_label() for line in lines], loc="upper center", fontsize="small")
    return _save(fig, path)


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")   # files only: no display on servers and CI
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    fig.clf()
    import matplotlib.pyplot as plt
    plt.close(fig)
    return Path(path)


def _rows(columns: dict) -> list:
    names = list(columns)
    return [dict(zip(names, values)) for values in zip(*columns.values())]


def _write_csv(path, rows: list) -> Path:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else [])
        writer.writeheader()
        writer.writerows(rows)
    return Path(path)


def _write_json(path, data) -> Path:
    Path(path).write_text(json.dumps(data, indent=2))
    return Path(path)


def headline(result: SimResult) -> dict:
    summary = result.summary()
    return {k: summary[k] for k in HEADLINE}
