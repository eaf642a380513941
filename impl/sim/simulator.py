"""Replay a request trace against a KV allocator in simulated time, and measure what paging buys.

Two backends share one replay loop:
- `paged`: the real `Scheduler` over the real `BlockManager` (continuous batching, watermark
  admission, preemption by recompute or swap, optional prefix caching, parallel samples by fork);
- `contiguous`: the baseline of `pagedkv.impl.contiguous`, each request reserving `max_seq_len` slots
  per sample in one range, first fit, admitted first come first served (it never preempts: its
  reservation already holds the whole sequence).

Requests become token ids so that prefix caching really hits: the first `prefix_len` tokens of a
request in prefix group g are the group's own (the same ids for every request of g), every other token
is unique to its request. Parallel samples (num_samples > 1) share the prompt's prefill.

Cost model (simulated seconds; `CostModel`, printed with every report). One engine step costs

    step_overhead_s + prefill_token_s * prompt tokens computed (incl. recomputation after preemption)
                    + decode_seq_s * sequences decoded + swap bytes / swap_bytes_per_s

Defaults: 5 ms per step (reading a 7B model's weights once at ~3 TB/s), 50 us per prompt token
(20,000 tokens/s, the seed's recompute rate), 0.05 ms per decoded sequence (its KV reads and
sampling), 25 GiB/s host link (the seed's swap bandwidth). Every sequence that ran in a
step gets its token at the step's end; TTFT = first token - arrival, inter-token latency = the gaps
between one sequence's tokens (a preempted sequence's stall shows there).

Measures, sampled at every step once its batch is placed (before finished sequences free):
utilization = useful KV slots (slots holding a token's K/V, a shared block counted once) / reserved
slots (paged: slots of blocks held by live sequences; contiguous: reserved ranges); it is averaged
weighted by step duration. Tail waste = reserved - useful slots, in MiB at the model's bytes per token.
For paged it is bounded by the partly filled tail blocks, so utilization >= 1 - (B-1) * sequences /
reserved at every step (`tail_bound`); with lengths uniform modulo B it sits near 1 - (B-1)/2 *
sequences / reserved (`tail_expected`).
"""
import math
from collections import defaultdict, deque
from dataclasses import dataclass, field

import numpy as np

from pagedkv.impl.alloc import BlockManager
from pagedkv.impl.sched import Scheduler, SchedulerConfig

from .contiguous import ContiguousAllocator
from .planner import MiB
from .trace import Request

ALLOCATORS = ("contiguous", "paged")
# Token id spaces (ids fit in int64; positions stay below 2**24): request r owns [(r+1) * 2**32,
# (r+2) * 2**32) -- its prompt at offset 0, sample k's outputs at offset (k+1) * 2**24 -- and the
# shared prefix of the g-th distinct group (numbered in order of first appearance, whatever ids the
# trace uses) starts at 2**62 + g * 2**24. Both spaces hold 2**30 - 1 requests or groups.
_REQUEST_SPACE, _POSITIONS, _GROUP_SPACE = 1 << 32, 1 << 24, 1 << 62
MAX_REQUESTS = 2**30 - 1
TIMELINE = ("time", "dt", "useful", "reserved", "sequences", "waiting", "table_blocks", "table_max", "preempted")


@dataclass(frozen=True)
class CostModel:
    step_overhead_s: float = 0.005
    prefill_token_s: float = 1 / 20000
    decode_seq_s: float = 0.00005
    swap_bytes_per_s: float = 25 * 2**30

    def step_seconds(self, prefill_tokens: int, decode_seqs: int, swap_bytes: int) -> float:
        return (self.step_overhead_s + self.prefill_token_s * prefill_tokens
                + self.decode_seq_s * decode_seqs + swap_bytes / self.swap_bytes_per_s)

    def describe(self) -> str:
        return (f"step = {self.step_overhead_s * 1e3:g} ms + {self.prefill_token_s * 1e6:g} us x prompt tokens"
                f" + {self.decode_seq_s * 1e3:g} ms x decoded sequences"
                f" + swap bytes / {self.swap_bytes_per_s / 2**30:g} GiB/s")


@dataclass(frozen=True)
class SimConfig:
    allocator: str
    block_size: int
    num_blocks: int                  # paged pool; the contiguous pool has num_blocks * block_size slots
    bytes_per_token: int
    max_seq_len: int = 2048
    prefix_caching: bool = False
    num_cpu_blocks: int = 0          # swap space (paged)
    max_num_seqs: int = 256
    cost: CostModel = CostModel()

    def __post_init__(self):
        if self.allocator not in ALLOCATORS:
            raise ValueError(f"allocator must be one of {ALLOCATORS}, got {self.allocator!r}")
        if min(self.block_size, self.num_blocks, self.bytes_per_token, self.max_seq_len) < 1:
            raise ValueError("block_size, num_blocks, bytes_per_token and max_seq_len must be >= 1")

    @property
    def capacity_slots(self) -> int:
        return self.num_blocks * self.block_size


def prompt_tokens(request_id: int, request: Request, group: int = None) -> list:
    """Token ids: the group's shared prefix, then ids no other request uses. `group` numbers the
    request's prefix group densely (0, 1, ... in order of appearance); without it, the trace's own id
    is used, which must then be below 2**30."""
    shared = request.prefix_len if request.prefix_group is not None else 0
    group = request.prefix_group if group is None else group
    prefix = [_GROUP_SPACE + group * _POSITIONS + i for i in range(shared)]
    unique = (request_id + 1) * _REQUEST_SPACE
    return prefix + list(range(unique + shared, unique + request.prompt_len))


def output_token(request_id: int, sample: int, index: int) -> int:
    """A generated token: unique per sample, so samples never look alike to the prefix cache."""
    return (request_id + 1) * _REQUEST_SPACE + (sample + 1) * _POSITIONS + index


# ------------------------------------------------------------------------- one step's outcome

@dataclass
class Occupancy:
    useful: int           # slots holding K/V
    reserved: int         # slots set aside for live sequences
    sequences: int        # live sequences holding KV
    table_blocks: int = 0 # blocks in their tables, summed (paged)
    table_max: int = 0


@dataclass
class StepOutcome:
    prefill_tokens: int = 0
    decode_seqs: int = 0
    swap_blocks: int = 0
    emitted: list = field(default_factory=list)     # (request_id, sample): one token each
    occupancy: Occupancy = None
    preempted: int = 0                              # sequences preempted (recompute or swap)

    @property
    def progressed(self) -> bool:
        return bool(self.prefill_tokens or self.decode_seqs or self.swap_blocks)


class _Backend:
    """What both backends count the same way: an out-of-memory event is a step in which KV memory
    refused the next admission or forced a preemption; every request waiting at such a step has its
    admission delayed."""

    def __init__(self, cfg: SimConfig):
        self.cfg = cfg
        self.rejected_too_long = 0       # prompt + output > max_seq_len
        self.rejected_too_large = 0      # more than the whole pool or the sequence slots hold, even alone
        self.oom_events = 0
        self.delayed: set = set()

    def submit(self, request_id: int, request: Request) -> None:
        """Queue a request, or reject it for good: longer than max_seq_len, or too big for the pool
        even alone, or with more samples than sequence slots (it would wait, or be preempted and
        resumed, forever)."""
        if request.prompt_len + request.output_len > self.cfg.max_seq_len:
            self.rejected_too_long += 1
        elif request.num_samples > self.cfg.max_num_seqs or not self._fits_alone(request):
            self.rejected_too_large += 1
        else:
            self._enqueue(request_id, request)

    def _memory_refused(self, waiting_ids) -> None:
        self.oom_events += 1
        self.delayed.update(waiting_ids)

    def summary(self) -> dict:
        return {"rejected": self.rejected_too_long + self.rejected_too_large,
                "rejected_too_long": self.rejected_too_long, "rejected_too_large": self.rejected_too_large,
                "oom_events": self.oom_events, "admissions_delayed": len(self.delayed)}


# ------------------------------------------------------------------------- contiguous backend

class ContiguousBackend(_Backend):
    """First come first served over a first-fit contiguous pool; a request's samples share one range
    (each sample still stores its own copy of the prompt: nothing can be shared in place)."""

    def __init__(self, cfg: SimConfig):
        super().__init__(cfg)
        self.alloc = ContiguousAllocator(cfg.capacity_slots)
        self.waiting: deque = deque()     # (request_id, request)
        self.running: dict = {}           # request_id -> (request, tokens generated per sample)

    def _fits_alone(self, request: Request) -> bool:
        return request.num_samples * self.cfg.max_seq_len <= self.cfg.capacity_slots

    def _enqueue(self, request_id: int, request: Request) -> None:
        self.waiting.append((request_id, request))

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def step(self) -> StepOutcome:
        out = StepOutcome()
        decoding = list(self.running)
        for request_id in decoding:
            self.alloc.grow(request_id, self.running[request_id][0].num_samples)   # the token fed now
        out.decode_seqs = sum(self.running[r][0].num_samples for r in decoding)
        admitted = self._admit(out.decode_seqs)
        out.prefill_tokens = sum(self.running[r][0].prompt_len for r in admitted)
        out.occupancy = Occupancy(self.alloc.used_slots, self.alloc.reserved_slots,
                                  sum(self.running[r][0].num_samples for r in self.running))
        for request_id in decoding + admitted:
            request, generated = self.running[request_id]
            out.emitted += [(request_id, s) for s in range(request.num_samples)]
            self.running[request_id] = (request, generated + 1)
            if generated + 1 == request.output_len:
                del self.running[request_id]
                self.alloc.free(request_id)
        return out

    def _admit(self, running_seqs: int) -> list:
        admitted = []
        while self.waiting:
            request_id, request = self.waiting[0]
            n = request.num_samples
            if running_seqs + n > self.cfg.max_num_seqs:
                break
            if not self.alloc.admit(request_id, n * self.cfg.max_seq_len, n * request.prompt_len):
                self._memory_refused(r for r, _ in self.waiting)
                break
            self.waiting.popleft()
            self.running[request_id] = (request, 0)
            admitted.append(request_id)
            running_seqs += n
        return admitted

    def summary(self) -> dict:
        return {**super().summary(), "fragmented_oom": self.alloc.fragmented_refusals,
                "preempt_recompute": 0, "preempt_swap": 0, "prefix_hit_rate": 0.0, "cow_copies": 0}


# ------------------------------------------------------------------------- paged backend

class PagedBackend(_Backend):
    """The real Scheduler over the real BlockManager; the forward pass is only timed, and every
    sampled token is a fresh id (`output_token`)."""

    def __init__(self, cfg: SimConfig):
        super().__init__(cfg)
        self.bm = BlockManager(cfg.num_blocks, cfg.block_size, num_cpu_blocks=cfg.num_cpu_blocks,
                               prefix_caching=cfg.prefix_caching)
        self.scheduler = Scheduler(self.bm, SchedulerConfig(
            max_num_seqs=cfg.max_num_seqs, prefill_tokens_per_s=1 / cfg.cost.prefill_token_s,
            swap_bytes_per_s=cfg.cost.swap_bytes_per_s, kv_bytes_per_token=cfg.bytes_per_token))
        self.sample_of: dict = {}         # seq id -> (request_id, sample)
        self.generated: dict = {}         # seq id -> tokens sampled
        self.groups: dict = {}            # the trace's prefix group id -> dense number (prompt_tokens)

    @property
    def waiting(self):
        return self.scheduler.waiting

    def _fits_alone(self, request: Request) -> bool:
        return self.scheduler.can_ever_fit(request.prompt_len, request.output_len)

    def _enqueue(self, request_id: int, request: Request) -> None:
        group = None if request.prefix_group is None else self.groups.setdefault(request.prefix_group,
                                                                                   len(self.groups))
        seq_ids = self.scheduler.add_request(request_id, prompt_tokens(request_id, request, group),
                                             request.output_len, n=request.num_samples)
        for sample, seq_id in enumerate(seq_ids):
            self.sample_of[seq_id], self.generated[seq_id] = (request_id, sample), 0

    def has_work(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> StepOutcome:
        sched = self.scheduler
        out = sched.schedule()
        if out.preempted or out.swapped_out or sched.waits_for_blocks():
            self._memory_refused(r.req_id for r in sched.waiting)
        ran = [p.seq_id for p in out.prefills] + list(out.forked) + out.decodes
        step = StepOutcome(prefill_tokens=sum(p.num_computed_tokens for p in out.prefills),
                           decode_seqs=len(out.decodes),
                           swap_blocks=len(out.copies.swap_out) + len(out.copies.swap_in),
                           emitted=[self.sample_of[s] for s in ran], occupancy=self._occupancy(),
                           preempted=len(out.preempted) + len(out.swapped_out))
        tokens = {}
        for seq_id in ran:
            tokens[seq_id] = output_token(*self.sample_of[seq_id], self.generated[seq_id])
            self.generated[seq_id] += 1
        for seq_id in sched.update(tokens):
            del self.sample_of[seq_id], self.generated[seq_id]
        return step

    def _occupancy(self) -> Occupancy:
        """Useful slots count each physical block once, however many tables share it."""
        seq_ids = list(self.scheduler.running)
        if not seq_ids:
            return Occupancy(0, 0, 0)
        tables = self.bm.block_tables(seq_ids).numpy()
        lens = self.bm.seq_lens(seq_ids).numpy().astype(np.int64)
        B = self.cfg.block_size
        held = tables >= 0
        fill = np.clip(lens[:, None] - B * np.arange(tables.shape[1])[None, :], 0, B)
        # Per distinct block held (not per block of the pool: pools run to millions of blocks).
        blocks, which = np.unique(tables[held], return_inverse=True)
        per_block = np.zeros(len(blocks), dtype=np.int64)
        np.maximum.at(per_block, which, fill[held])
        counts = held.sum(axis=1)
        return Occupancy(int(per_block.sum()), len(blocks) * B, len(seq_ids),
                         int(counts.sum()), int(counts.max()))

    def summary(self) -> dict:
        metrics = self.bm.metrics()
        return {**super().summary(), "fragmented_oom": 0, "preempt_recompute": metrics["preempt_recompute"],
                "preempt_swap": metrics["preempt_swap"], "prefix_hit_rate": metrics["prefix_hit_rate"],
                "cow_copies": metrics["copies"]}


# ------------------------------------------------------------------------- the replay loop

class SimulationStuck(RuntimeError):
    """Work remains but a step made no progress and no arrival can change that."""


@dataclass
class SimResult:
    config: SimConfig
    timeline: dict          # per-step columns: time, dt, useful, reserved, sequences, waiting
    ttft: list              # seconds, per request
    itl: list               # seconds, every gap between a sequence's tokens
    counters: dict

    def summary(self) -> dict:
        t = {k: np.asarray(v, dtype=float) for k, v in self.timeline.items()}
        dt, useful, reserved = t["dt"], t["useful"], t["reserved"]
        busy = reserved > 0
        weights = dt[busy]
        util_steps = useful[busy] / reserved[busy]
        waste = (reserved - useful) * self.config.bytes_per_token / MiB
        seqs = t["sequences"]
        # Worst-case tail waste per reserved slot: B-1 empty slots per sequence.
        worst = float(np.average((self.config.block_size - 1) * seqs[busy] / reserved[busy], weights=weights)
                      ) if busy.any() else 0.0
        return {
            "allocator": self.config.allocator,
            "block_size": self.config.block_size,
            "pool_blocks": self.config.num_blocks,
            "pool_mib": self.config.capacity_slots * self.config.bytes_per_token / MiB,
            "prefix_caching": self.config.prefix_caching,
            "requests": len(self.ttft),
            "simulated_s": float(t["time"][-1] + dt[-1]) if len(dt) else 0.0,
            "steps": int(len(dt)),
            "utilization_mean": _ratio((useful * dt).sum(), (reserved * dt).sum()),
            "utilization_min": float(util_steps.min()) if busy.any() else 0.0,
            # Paged only (contiguous waste is not tail-bounded): the worst case, and the expectation
            # when lengths are uniform modulo B, (B-1)/2 empty slots per sequence.
            "tail_bound_mean": self._paged(1 - worst),
            "tail_expected_mean": self._paged(1 - worst / 2),
            "waste_mib_mean": _ratio((waste * dt).sum(), dt.sum()),
            "waste_mib_peak": float(waste.max(initial=0)),
            "pool_occupancy_mean": _ratio((reserved * dt).sum(), dt.sum() * self.config.capacity_slots),
            "concurrency_peak": int(seqs.max(initial=0)),
            "concurrency_mean": _ratio((seqs * dt).sum(), dt.sum()),
            "block_table_len_mean": _ratio(t["table_blocks"].sum(), seqs.sum()),
            "block_table_len_max": int(t["table_max"].max(initial=0)),
            "ttft_p50_s": _pct(self.ttft, 50), "ttft_p99_s": _pct(self.ttft, 99),
            "itl_p50_s": _pct(self.itl, 50), "itl_p99_s": _pct(self.itl, 99),
            **self.counters,
        }

    def _paged(self, value):
        return float(value) if self.config.allocator == "paged" else None


def simulate(requests: list, cfg: SimConfig) -> SimResult:
    if len(requests) > MAX_REQUESTS:
        raise ValueError(f"the simulator numbers at most {MAX_REQUESTS:,} requests, got {len(requests):,}")
    backend = make_backend(cfg)
    arrivals = deque(enumerate(requests))
    columns = {name: [] for name in TIMELINE}
    emitted_at = defaultdict(list)    # (request_id, sample) -> token times
    clock = 0.0
    while arrivals or backend.has_work():
        while arrivals and arrivals[0][1].arrival <= clock:
            backend.submit(*arrivals.popleft())
        if not backend.has_work():
            clock = arrivals[0][1].arrival if arrivals else clock
            continue
        out = backend.step()
        if not out.progressed:
            if not arrivals:
                raise SimulationStuck(f"no step can run at t={clock:.3f}s: {backend.summary()}")
            clock = arrivals[0][1].arrival
            continue
        dt = cfg.cost.step_seconds(out.prefill_tokens, out.decode_seqs,
                                   out.swap_blocks * cfg.block_size * cfg.bytes_per_token)
        occ = out.occupancy
        for name, value in zip(TIMELINE, (clock, dt, occ.useful, occ.reserved, occ.sequences, len(backend.waiting),
                                          occ.table_blocks, occ.table_max, out.preempted)):
            columns[name].append(value)
        clock += dt
        for key in out.emitted:
            emitted_at[key].append(clock)
    first = {}
    for (request_id, _), times in emitted_at.items():
        first[request_id] = min(first.get(request_id, math.inf), times[0])
    ttft = [first[i] - requests[i].arrival for i in sorted(first)]
    itl = [b - a for times in emitted_at.values() for a, b in zip(times, times[1:])]
    return SimResult(cfg, columns, ttft, itl, backend.summary())


def make_backend(cfg: SimConfig):
    return (ContiguousBackend if cfg.allocator == "contiguous" else PagedBackend)(cfg)


def _ratio(a, b) -> float:
    return float(a / b) if b else 0.0


def _pct(values, q) -> float:
    return float(np.percentile(values, q)) if len(values) else 0.0
