"""Files for `pagedkv simulate --out DIR`: summaries as JSON and CSV, per-step timelines as CSV, and
PNG plots (utilization over time per allocator; the block-size sweep at fixed pool bytes)."""
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
    if sweep:
        written.append(_write_csv(out / "block_size_sweep.csv", sweep))
        written.append(plot_sweep(sweep, out / "block_size_sweep.png"))
    return written


def plot_utilization(results: list, path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    for r in results:
        t = r.timeline
        util = [u / v if v else float("nan") for u, v in zip(t["useful"], t["reserved"])]
        mean = r.summary()["utilization_mean"]
        ax.plot(t["time"], util, lw=0.8, label=f"{r.config.allocator} (B={r.config.block_size}, mean {mean:.1%})")
    ax.set(xlabel="simulated time (s)", ylabel="KV utilization (useful / reserved slots)", ylim=(0, 1.05),
           title="KV-cache utilization over time")
    ax.legend(loc="lower right")
    return _save(fig, path)


def plot_sweep(sweep: list, path) -> Path:
    plt = _pyplot()
    sizes = [row["block_size"] for row in sweep]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(sizes, [row["utilization_mean"] for row in sweep], "o-", label="utilization")
    left.plot(sizes, [row["tail_expected_mean"] for row in sweep], ":", label="expected tail waste, (B-1)/2 per seq")
    left.plot(sizes, [row["tail_bound_mean"] for row in sweep], "--", label="tail-waste bound, B-1 per seq")
    left.set(xscale="log", xlabel="block size (tokens)", ylabel="mean utilization", title="Paged, fixed pool bytes")
    left.set_xticks(sizes, [str(s) for s in sizes])
    left.legend()
    right.plot(sizes, [row["waste_mib_mean"] for row in sweep], "o-", color="tab:red", label="tail waste (MiB)")
    right.set(xscale="log", xlabel="block size (tokens)", ylabel="mean tail waste (MiB)")
    right.set_xticks(sizes, [str(s) for s in sizes])
    twin = right.twinx()
    twin.plot(sizes, [row["block_table_len_mean"] for row in sweep], "s:", color="tab:gray")
    twin.set_ylabel("mean block-table length", color="tab:gray")
    right.legend(loc="upper center")
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
