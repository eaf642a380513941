"""Request traces: a JSONL file format, validation, a seeded synthesizer and summary statistics.

One JSON object per line, sorted by arrival:

    {"arrival": 0.42, "prompt_len": 450, "output_len": 120, "prefix_group": 3, "prefix_len": 64, "num_samples": 1}

- `arrival`: seconds since the trace starts (>= 0, non-decreasing down the file);
- `prompt_len`, `output_len`: tokens (>= 1); `num_samples`: parallel samples sharing the prompt (>= 1);
- `prefix_group`: requests with the same group id (an int >= 0) begin with the same tokens, or null;
- `prefix_len`: how many leading prompt tokens come from the group (0..prompt_len); optional,
  0 when absent, and must be 0 without a group.
The default synthesizer follows the seed scenario: prompts averaging 450 tokens, outputs averaging
120, prompt + output <= max_seq_len 2048.
"""
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

FIELDS = ("arrival", "prompt_len", "output_len", "prefix_group", "prefix_len", "num_samples")
DISTRIBUTIONS = ("lognormal", "uniform", "fixed")


class TraceError(ValueError):
    """A trace record or synthesizer setting is malformed."""


@dataclass(frozen=True)
class Request:
    arrival: float
    prompt_len: int
    output_len: int
    prefix_group: int | None = None
    prefix_len: int = 0
    num_samples: int = 1

    def __post_init__(self):
        _check_request(self)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_request(r: Request):
    if isinstance(r.arrival, bool) or not isinstance(r.arrival, (int, float)) \
            or not math.isfinite(r.arrival) or r.arrival < 0:
        raise TraceError(f"arrival must be a finite number of seconds >= 0, got {r.arrival!r}")
    for name in ("prompt_len", "output_len", "num_samples"):
        value = getattr(r, name)
        if not _is_int(value) or value < 1:
            raise TraceError(f"{name} must be an integer >= 1, got {value!r}")
    if r.prefix_group is not None and (not _is_int(r.prefix_group) or r.prefix_group < 0):
        raise TraceError(f"prefix_group must be null or an integer >= 0, got {r.prefix_group!r}")
    if not _is_int(r.prefix_len) or not 0 <= r.prefix_len <= r.prompt_len:
        raise TraceError(f"prefix_len must be an integer in 0..prompt_len={r.prompt_len}, got {r.prefix_len!r}")
    if r.prefix_group is None and r.prefix_len:
        raise TraceError(f"prefix_len={r.prefix_len} needs a prefix_group")


def _parse_line(text: str) -> Request:
    try:
        record = json.loads(text)
    except json.JSONDecodeError as e:
        raise TraceError(f"not valid JSON ({e.msg})") from None
    if not isinstance(record, dict):
        raise TraceError(f"expected a JSON object, got {type(record).__name__}")
    unknown = sorted(set(record) - set(FIELDS))
    if unknown:
        raise TraceError(f"unknown field(s) {', '.join(unknown)}")
    missing = [f for f in ("arrival", "prompt_len", "output_len") if f not in record]
    if missing:
        raise TraceError(f"missing field(s) {', '.join(missing)}")
    return Request(**record)


def parse_trace(lines) -> list[Request]:
    """Blank lines are skipped; an error names the 1-based line it comes from."""
    requests = []
    for lineno, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            request = _parse_line(text)
        except TraceError as e:
            raise TraceError(f"line {lineno}: {e}") from None
        if requests and request.arrival < requests[-1].arrival:
            raise TraceError(f"line {lineno}: arrival {request.arrival} is earlier than the line "
                             f"before ({requests[-1].arrival}); sort the trace by arrival")
        requests.append(request)
    return requests


def read_trace(path) -> list[Request]:
    with open(path, encoding="utf-8") as f:
        try:
            return parse_trace(f)
        except TraceError as e:
            raise TraceError(f"{path}: {e}") from None


def write_trace(path, requests):
    Path(path).write_text("".join(json.dumps(asdict(r)) + "\n" for r in requests), encoding="utf-8")


@dataclass(frozen=True)
class LengthDist:
    """Token lengths: lognormal with this mean and log-space `sigma`, uniform on 1..2*mean-1, or fixed."""
    kind: str = "lognormal"
    mean: float = 450
    sigma: float = 0.5

    def __post_init__(self):
        if self.kind not in DISTRIBUTIONS:
            raise TraceError(f"unknown distribution {self.kind!r}; choose one of {', '.join(DISTRIBUTIONS)}")
        if not (math.isfinite(self.mean) and self.mean >= 1):
            raise TraceError(f"mean length must be >= 1, got {self.mean}")
        if not (math.isfinite(self.sigma) and self.sigma >= 0):
            raise TraceError(f"sigma must be >= 0, got {self.sigma}")

    def sample(self, rng, n: int):
        import numpy as np

        if self.kind == "fixed":
            x = np.full(n, self.mean)
        elif self.kind == "uniform":
            x = rng.uniform(1, 2 * self.mean - 1, n)
        else:
            # E[exp(N(mu, s^2))] = exp(mu + s^2/2), so this mu gives the requested mean.
            x = rng.lognormal(math.log(self.mean) - self.sigma**2 / 2, self.sigma, n)
        return np.maximum(np.rint(x), 1).astype(np.int64)


@dataclass(frozen=True)
class TraceConfig:
    num_requests: int
    seed: int = 0
    rate: float = 4.0                 # mean arrivals per second (Poisson process)
    prompt: LengthDist = LengthDist("lognormal", 450)
    output: LengthDist = LengthDist("lognormal", 120)
    max_seq_len: int = 2048
    prefix_fraction: float = 0.0      # share of requests that start with a group's prefix
    prefix_groups: int = 4
    prefix_len: int = 0
    sample_prob: float = 0.0          # share of requests asking for `num_samples` parallel samples
    num_samples: int = 4

    def __post_init__(self):
        # max_seq_len must leave room for one prompt and one output token.
        for name, least in (("num_requests", 1), ("max_seq_len", 2), ("prefix_groups", 1), ("num_samples", 1)):
            value = getattr(self, name)
            if not _is_int(value) or value < least:
                raise TraceError(f"{name} must be an integer >= {least}, got {value!r}")
        if not (math.isfinite(self.rate) and self.rate > 0):
            raise TraceError(f"rate must be positive, got {self.rate}")
        for name in ("prefix_fraction", "sample_prob"):
            if not 0 <= getattr(self, name) <= 1:
                raise TraceError(f"{name} must lie in [0, 1], got {getattr(self, name)}")
        if not _is_int(self.prefix_len) or self.prefix_len < 0:
            raise TraceError(f"prefix_len must be an integer >= 0, got {self.prefix_len!r}")


def synthesize(cfg: TraceConfig) -> list[Request]:
    """The same config and seed give the same trace on every machine (numpy's PCG64 stream)."""
    import numpy as np

    rng = np.random.default_rng(cfg.seed)
    arrivals = np.cumsum(rng.exponential(1 / cfg.rate, cfg.num_requests))
    # A request needs at least one output token, so the prompt leaves room for it.
    prompts = np.minimum(cfg.prompt.sample(rng, cfg.num_requests), cfg.max_seq_len - 1)
    outputs = np.minimum(cfg.output.sample(rng, cfg.num_requests), cfg.max_seq_len - prompts)
    in_group = rng.random(cfg.num_requests) < cfg.prefix_fraction
    groups = rng.integers(0, cfg.prefix_groups, cfg.num_requests)
    sampled = rng.random(cfg.num_requests) < cfg.sample_prob
    return [
        Request(
            arrival=float(arrivals[i]),
            prompt_len=int(prompts[i]),
            output_len=int(outputs[i]),
            prefix_group=int(groups[i]) if in_group[i] else None,
            prefix_len=min(cfg.prefix_len, int(prompts[i])) if in_group[i] else 0,
            num_samples=cfg.num_samples if sampled[i] else 1,
        )
        for i in range(cfg.num_requests)
    ]


def trace_stats(requests: list[Request]) -> dict:
    """Counts, means and P50/P90/P99 of the lengths; rate is requests per second of trace span."""
    import numpy as np

    if not requests:
        raise TraceError("the trace holds no requests")

    def summary(values):
        a = np.asarray(values, dtype=float)
        p50, p90, p99 = np.percentile(a, [50, 90, 99])
        return {"mean": float(a.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99),
                "max": float(a.max())}

    span = requests[-1].arrival - requests[0].arrival
    return {
        "count": len(requests),
        "duration_s": requests[-1].arrival,
        "rate_per_s": (len(requests) - 1) / span if span > 0 else None,
        "prompt_len": summary([r.prompt_len for r in requests]),
        "output_len": summary([r.output_len for r in requests]),
        "total_len": summary([r.prompt_len + r.output_len for r in requests]),
        "prefix_fraction": sum(r.prefix_group is not None for r in requests) / len(requests),
        "prefix_groups": len({r.prefix_group for r in requests} - {None}),
        "multi_sample_fraction": sum(r.num_samples > 1 for r in requests) / len(requests),
        "total_samples": sum(r.num_samples for r in requests),
    }
