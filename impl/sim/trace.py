"""Request traces: a JSONL file format, validation, a seeded synthesizer and summary statistics.

One JSON object per line, sorted by arrival:

    {"arrival": 0.42, "prompt_len": 450, "output_len": 120, "prefix_group": 3, "prefix_len": 64, "num_samples": 1}

- `arrival`: seconds since the trace starts (0..2**32, ~136 years, non-decreasing down the file:
  the simulator's float clock keeps microseconds up to there; at 1e15 s a 5 ms step would vanish);
- `prompt_len`, `output_len`: tokens (1..2**24); `num_samples`: parallel samples sharing the prompt
  (1..1024);
- `prefix_group`: requests with the same group id (an int in 0..2**63-1) begin with the same tokens,
  or null;
- `prefix_len`: how many leading prompt tokens come from the group (0..prompt_len); optional,
  0 when absent, and must be 0 without a group.
The default synthesizer's lengths (prompts averaging 450 tokens, outputs 120, prompt + output <=
max_seq_len 2048) are the workload of the README's utilization figures.

Errors name the file, the line and the field. Reading, synthesis and writing stream (a line longer
than MAX_LINE bytes is an error, not a read of the whole file), so a trace of millions of requests
never sits in memory.
"""
import json
import math
import sys
from dataclasses import dataclass

FIELDS = ("arrival", "prompt_len", "output_len", "prefix_group", "prefix_len", "num_samples")
MAX_TOKENS = 2**24          # token positions the simulator numbers per sequence
MAX_SAMPLES = 1024
MAX_GROUP = 2**63 - 1       # group ids are int64 in every tool that reads traces
MAX_ARRIVAL = 2**32         # seconds: a float's step there is ~1 microsecond
# A synthesized trace's mean span (num_requests / rate) stays below MAX_ARRIVAL / 64: even one
# request's exponential gap passes 64 means with probability e**-64.
MAX_MEAN_SPAN = MAX_ARRIVAL / 64
MAX_LINE = 65_536           # bytes; a record is under 200
CHUNK = 65_536              # requests synthesized and written at a time
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


def _shown(value) -> str:
    """A bad value as the message shows it: a 5000-digit integer is not worth printing whole."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} characters)"


def _check_request(r: Request):
    arrival = r.arrival
    # NaN fails both comparisons; an int of any size compares exactly.
    if isinstance(arrival, bool) or not isinstance(arrival, (int, float)) or not 0 <= arrival <= MAX_ARRIVAL:
        raise TraceError(f"field 'arrival' must be a number of seconds in 0..2**32, got {_shown(arrival)}")
    for name, most in (("prompt_len", MAX_TOKENS), ("output_len", MAX_TOKENS), ("num_samples", MAX_SAMPLES)):
        value = getattr(r, name)
        if not _is_int(value) or not 1 <= value <= most:
            raise TraceError(f"field '{name}' must be an integer in 1..{most}, got {_shown(value)}")
    if r.prefix_group is not None and (not _is_int(r.prefix_group) or not 0 <= r.prefix_group <= MAX_GROUP):
        raise TraceError(f"field 'prefix_group' must be null or an integer in 0..2**63-1, "
                         f"got {_shown(r.prefix_group)}")
    if not _is_int(r.prefix_len) or not 0 <= r.prefix_len <= r.prompt_len:
        raise TraceError(f"field 'prefix_len' must be an integer in 0..prompt_len={r.prompt_len}, "
                         f"got {_shown(r.prefix_len)}")
    if r.prefix_group is None and r.prefix_len:
        raise TraceError(f"field 'prefix_len' is {r.prefix_len} but 'prefix_group' is null")


def _parse_line(text) -> Request:
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise TraceError(f"not UTF-8 text (byte {e.start + 1} of the line)") from None
    try:
        record = json.loads(text)
    except json.JSONDecodeError as e:
        raise TraceError(f"not valid JSON ({e.msg}, column {e.colno})") from None
    except RecursionError:
        raise TraceError("JSON nested too deeply") from None
    except ValueError as e:   # an integer longer than Python's 4300-digit conversion limit
        raise TraceError(f"not usable JSON ({e})") from None
    if not isinstance(record, dict):
        raise TraceError(f"expected a JSON object, got {type(record).__name__}")
    unknown = sorted(set(record) - set(FIELDS))
    if unknown:
        raise TraceError(f"unknown field(s) {', '.join(unknown)}")
    missing = [f for f in ("arrival", "prompt_len", "output_len") if f not in record]
    if missing:
        raise TraceError(f"missing field(s) {', '.join(missing)}")
    return Request(**record)


def iter_trace(lines):
    """The requests of `lines` (str or bytes, UTF-8) one at a time; blank lines are skipped; an error
    names the 1-based line."""
    last = None
    for lineno, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            request = _parse_line(text)
        except TraceError as e:
            raise TraceError(f"line {lineno}: {e}") from None
        if last is not None and request.arrival < last.arrival:
            raise TraceError(f"line {lineno}: field 'arrival' is {request.arrival}, earlier than the line "
                             f"before ({last.arrival}); sort the trace by arrival")
        last = request
        yield request


def parse_trace(lines) -> list[Request]:
    return list(iter_trace(lines))


def read_trace(path) -> list[Request]:
    return list(stream_trace(path))


def stream_trace(path):
    """`read_trace`, one request at a time (for statistics over traces too large to hold)."""
    with open(path, "rb") as f:   # bytes: a line that is not UTF-8 is reported by number
        try:
            yield from iter_trace(_bounded_lines(f))
        except TraceError as e:
            raise TraceError(f"{path}: {e}") from None


def _bounded_lines(f):
    """The lines of a binary file, none read past MAX_LINE bytes (a file with no newline, such as
    /dev/zero, would otherwise be read whole as one line)."""
    for lineno, line in enumerate(iter(lambda: f.readline(MAX_LINE + 1), b""), 1):
        if len(line) > MAX_LINE:
            raise TraceError(f"line {lineno}: longer than {MAX_LINE} bytes (a record is one short JSON object)")
        yield line


def write_trace(target, requests) -> int:
    """Write `requests` (any iterable, consumed as it goes) to the file `target`, '-' for stdout;
    returns how many were written."""
    out = sys.stdout if target == "-" else open(target, "w", encoding="utf-8")
    count = 0
    try:
        for request in requests:
            out.write(json.dumps({name: getattr(request, name) for name in FIELDS}) + "\n")
            count += 1
    finally:
        if out is not sys.stdout:
            out.close()
    return count


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
        if self.num_requests / self.rate > MAX_MEAN_SPAN:
            raise TraceError(f"{self.num_requests} requests at {self.rate}/s would span some "
                             f"{self.num_requests / self.rate:.3g} s; arrivals stop at 2**32 s: "
                             f"a higher rate, or fewer requests")
        for name in ("prefix_fraction", "sample_prob"):
            if not 0 <= getattr(self, name) <= 1:
                raise TraceError(f"{name} must lie in [0, 1], got {getattr(self, name)}")
        if not _is_int(self.prefix_len) or self.prefix_len < 0:
            raise TraceError(f"prefix_len must be an integer >= 0, got {self.prefix_len!r}")


def synthesize(cfg: TraceConfig) -> list[Request]:
    """The same config and seed give the same trace on every machine (numpy's PCG64 stream)."""
    return [request for chunk in synthesize_chunks(cfg) for request in chunk]


def _columns(cfg: TraceConfig):
    """The random draws, one column after the other from one seeded stream: arrival gaps, prompt
    lengths, output lengths, in-group coins, group ids, multi-sample coins (numpy draws the same
    numbers whether a column is drawn at once or in pieces)."""
    return (lambda rng, n: rng.exponential(1 / cfg.rate, n), cfg.prompt.sample, cfg.output.sample,
            lambda rng, n: rng.random(n), lambda rng, n: rng.integers(0, cfg.prefix_groups, n),
            lambda rng, n: rng.random(n))


def _sizes(total: int, chunk: int):
    for start in range(0, total, chunk):
        yield min(chunk, total - start)


def synthesize_chunks(cfg: TraceConfig, chunk: int = CHUNK):
    """`synthesize`, in lists of up to `chunk` requests, in constant memory. Each column is drawn
    from its own generator, positioned where one generator drawing the columns in turn would be:
    a first pass draws and discards each column to find those positions."""
    import numpy as np

    draw = _columns(cfg)
    rng, starts = np.random.default_rng(cfg.seed), []
    for column in draw:
        starts.append(rng.bit_generator.state)
        for size in _sizes(cfg.num_requests, chunk):
            column(rng, size)
    generators = []
    for state in starts:
        generator = np.random.default_rng()
        generator.bit_generator.state = state
        generators.append(generator)
    clock = 0.0
    for size in _sizes(cfg.num_requests, chunk):
        gaps, prompts, outputs, group_coins, groups, sample_coins = (
            column(generator, size) for column, generator in zip(draw, generators))
        # A running sum continued from the last chunk adds in the same order as one cumsum.
        arrivals = np.cumsum(np.concatenate(([clock], gaps)))[1:]
        clock = float(arrivals[-1])
        # A request needs at least one output token, so the prompt leaves room for it.
        prompts = np.minimum(prompts, cfg.max_seq_len - 1)
        outputs = np.minimum(outputs, cfg.max_seq_len - prompts)
        in_group, sampled = group_coins < cfg.prefix_fraction, sample_coins < cfg.sample_prob
        yield [Request(arrival=float(arrivals[i]), prompt_len=int(prompts[i]), output_len=int(outputs[i]),
                       prefix_group=int(groups[i]) if in_group[i] else None,
                       prefix_len=min(cfg.prefix_len, int(prompts[i])) if in_group[i] else 0,
                       num_samples=cfg.num_samples if sampled[i] else 1)
               for i in range(size)]


def trace_stats(requests) -> dict:
    """Counts, means and P50/P90/P99 of the lengths; rate is requests per second of trace span.
    `requests` is any iterable, read once: only the lengths are kept, as machine integers."""
    from array import array

    import numpy as np

    prompt, output = array("q"), array("q")
    first = last = None
    grouped = multi = samples = 0
    groups = set()
    for r in requests:
        first = r if first is None else first
        last = r
        prompt.append(r.prompt_len)
        output.append(r.output_len)
        if r.prefix_group is not None:
            grouped += 1
            groups.add(r.prefix_group)
        multi += r.num_samples > 1
        samples += r.num_samples
    if first is None:
        raise TraceError("the trace holds no requests")

    def summary(values):
        a = values.astype(float)
        p50, p90, p99 = np.percentile(a, [50, 90, 99])
        return {"mean": float(a.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99),
                "max": float(a.max())}

    count, span = len(prompt), last.arrival - first.arrival
    prompts, outputs = np.frombuffer(prompt, dtype=np.int64), np.frombuffer(output, dtype=np.int64)
    return {
        "count": count,
        "duration_s": last.arrival,
        "rate_per_s": (count - 1) / span if span > 0 else None,
        "prompt_len": summary(prompts),
        "output_len": summary(outputs),
        "total_len": summary(prompts + outputs),
        "prefix_fraction": grouped / count,
        "prefix_groups": len(groups),
        "multi_sample_fraction": multi / count,
        "total_samples": samples,
    }
