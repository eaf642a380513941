"""Continuous-batching scheduler over a `BlockManager`.

Each `schedule()` call is one engine step:
1. decode: the block manager's `step` (the spec's): every running sequence writes its last sampled
   token; while the blocks that takes exceed the free ones, the most recently admitted running
   sequence is preempted, by recompute or swap, whichever the cost model says is cheaper for that
   victim (swap only when the CPU pool has room).
2. if nothing was preempted: swap sequences back in, then admit waiting ones (preempted by
   recompute first, then new requests, FIFO), each only while its blocks fit above the watermark.
3. the output names what the engine runs and the tensors its kernels read.

`update(outputs)` takes the sampled tokens of the sequences the last `schedule()` ran, finishes those
that reached `max_new_tokens` (or the request's `eos`) and keeps the others' tokens for the next step.

Reliability: every argument is checked at the door (a typed `pagedkv.spec` error, nothing queued),
and so is a request that could never be admitted (a prompt beyond the pool above the watermark, or
more samples than `max_num_seqs`: a request's samples are admitted together) and would wait forever;
`schedule()` and `update()` are transactions: if anything raises inside (the block manager's own
calls included, through `BlockManager.transaction`), the scheduler and its block manager are left
as they were. Single-threaded by contract: one engine loop owns a scheduler and its block manager
(sequence ids are the scheduler's to hand out; the block manager is thread-safe on its own).
"""

import math
from collections import deque
from dataclasses import dataclass, field
from numbers import Real
from typing import Optional

import numpy as np
import torch

from pagedkv.spec import SWAPPED, InvalidArgument, InvalidState, UnknownSequence
from pagedkv.spec.arguments import MAX_TOKEN, check_int, is_int, require

from pagedkv.impl.alloc import BlockManager, Copies
from pagedkv.spec.blocks import blocks_needed


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 256
    watermark: float = 0.01                # fraction of GPU blocks admission keeps free
    prefill_tokens_per_s: float = 10_000.0   # recompute cost: tokens / rate
    swap_bytes_per_s: float = 25e9         # link bandwidth; swap cost: 2 x KV bytes / bandwidth
    kv_bytes_per_token: int = 131_072      # K and V of one token over all layers: Llama-3-8B in bf16

    def __post_init__(self):
        # Frozen: the plain values are set through object.__setattr__ (an int or float subclass's
        # operators would otherwise answer every later comparison, sum and product).
        object.__setattr__(self, "max_num_seqs", check_int(self.max_num_seqs, 1, math.inf,
                                                            "max_num_seqs must be an int >= 1"))
        watermark = _plain_real(self.watermark)
        require(watermark is not None and 0 <= watermark < 1,
                f"watermark must be a fraction in [0, 1), got {self.watermark!r}")
        object.__setattr__(self, "watermark", watermark)
        for name in ("prefill_tokens_per_s", "swap_bytes_per_s"):
            value = _plain_real(getattr(self, name))
            require(value is not None and 0 < value < math.inf,
                    f"{name} must be a positive number, got {getattr(self, name)!r}")
            object.__setattr__(self, name, value)
        object.__setattr__(self, "kv_bytes_per_token", check_int(self.kv_bytes_per_token, 1, math.inf,
                                                                  "kv_bytes_per_token must be an int >= 1"))


def _plain_real(value):
    """A real number that is not a bool as a plain float, read by value (a float or int subclass's
    own operators may disagree with it), or None. NaN then fails every comparison the checks make."""
    if isinstance(value, bool) or not isinstance(value, Real):
        return None
    if isinstance(value, float):
        return float.__float__(value)
    try:
        return float(int.__index__(value)) if isinstance(value, int) else float(value)
    except OverflowError:   # an int past a float's range
        return math.inf


def plain_token(token, what: str = "token") -> int:
    """A token id as a plain int in 0..2**63-1 (`check_int`); a numpy integer scalar (what a
    sampler's argmax gives) passes too."""
    if type(token) is int and 0 <= token <= MAX_TOKEN:   # the common case, no message formatted
        return token
    return check_int(int(token) if isinstance(token, np.integer) else token, 0, MAX_TOKEN,
                      f"a {what} is an int in 0..2**63-1")


@dataclass
class Prefill:
    seq_id: int
    num_cached_tokens: int     # served from the prefix cache
    num_computed_tokens: int   # the rest, which this step's forward pass computes and writes


@dataclass
class SchedulerOutput:
    prefills: list = field(default_factory=list)       # Prefill, in admission order
    decodes: list = field(default_factory=list)        # seq ids writing one token
    forked: dict = field(default_factory=dict)         # child -> parent: sample from the parent's logits
    preempted: list = field(default_factory=list)      # by recompute, latest admitted first
    swapped_out: list = field(default_factory=list)
    swapped_in: list = field(default_factory=list)
    aborted: list = field(default_factory=list)        # freed: the whole pool cannot hold their next token
    copies: Optional[Copies] = None
    block_tables: Optional[torch.Tensor] = None        # int32 [prefills + decodes, M]
    seq_lens: Optional[torch.Tensor] = None
    slot_mapping: Optional[torch.Tensor] = None        # int64, prefill tokens then decode tokens

    @property
    def seq_ids(self) -> list:
        """The rows of the tensors: prefills, then decodes."""
        return [p.seq_id for p in self.prefills] + self.decodes


@dataclass
class _Request:
    req_id: object
    prompt: list
    max_new_tokens: int
    seq_ids: list
    eos: Optional[int]


class Scheduler:
    def __init__(self, block_manager: BlockManager, config: SchedulerConfig = SchedulerConfig()):
        require(isinstance(block_manager, BlockManager), f"a Scheduler runs a BlockManager, got {block_manager!r}")
        require(isinstance(config, SchedulerConfig), f"config must be a SchedulerConfig, got {config!r}")
        # The scheduler hands out the sequence ids: a manager holding sequences would collide with them.
        require(not block_manager.seq_ids(), "a Scheduler needs a BlockManager that holds no sequences, "
                                             f"got one holding {block_manager.seq_ids()[:5]}")
        self.bm, self.config = block_manager, config
        self.waiting: deque = deque()     # requests not yet admitted, FIFO
        self.preempted: deque = deque()   # seq ids preempted by recompute, earliest admitted first
        self.swapped: deque = deque()     # seq ids swapped out, earliest admitted first
        self.pending: dict = {}           # seq id -> sampled token not yet written
        self.generated: dict = {}         # seq id -> tokens sampled so far
        self.request_of: dict = {}        # seq id -> _Request
        self.awaiting: set = set()        # seq ids the last schedule() ran, whose samples update() takes
        self.next_seq_id = 0
        self.watermark_blocks = math.ceil(config.watermark * block_manager.num_blocks)

    def add_request(self, req_id, prompt: list, max_new_tokens: int, n: int = 1,
                    eos: Optional[int] = None) -> list:
        """Queue a request for `n` samples of `prompt`; returns their sequence ids."""
        # n samples are admitted together, one sequence slot each: more than max_num_seqs would wait forever.
        n = check_int(n, 1, self.config.max_num_seqs, f"n must be an int in [1, max_num_seqs={self.config.max_num_seqs}]")
        max_new_tokens = check_int(max_new_tokens, 1, math.inf, "max_new_tokens must be an int >= 1")
        require(isinstance(prompt, (list, tuple)) and len(prompt) > 0,
                f"a prompt is a non-empty list of tokens, got {type(prompt).__name__}")
        prompt = [plain_token(token) for token in prompt]
        eos = None if eos is None else plain_token(eos, "eos token")
        if not self.can_ever_fit(len(prompt), 0):
            # It could never be admitted and would wait forever: refuse it now, loudly.
            raise InvalidArgument(
                f"request {req_id!r}'s prompt needs {blocks_needed(len(prompt), self.bm.block_size)} blocks; "
                f"the pool has {self.bm.num_blocks - self.watermark_blocks} above the watermark")
        seq_ids = list(range(self.next_seq_id, self.next_seq_id + n))
        self.next_seq_id += n
        request = _Request(req_id, prompt, max_new_tokens, seq_ids, eos)
        self.waiting.append(request)
        for seq_id in seq_ids:
            self.request_of[seq_id], self.generated[seq_id] = request, 0
        return seq_ids

    def can_ever_fit(self, prompt_len: int, max_new_tokens: int) -> bool:
        """Whether one sample with this prompt and output fits the pool above the watermark alone."""
        prompt_len = check_int(prompt_len, 0, math.inf, "lengths are ints >= 0")
        max_new_tokens = check_int(max_new_tokens, 0, math.inf, "lengths are ints >= 0")
        needed = blocks_needed(prompt_len + max_new_tokens, self.bm.block_size)
        return needed <= self.bm.num_blocks - self.watermark_blocks

    @property
    def running(self) -> list:
        """Running seq ids in admission order (the block manager's; the last is preempted first)."""
        return self.bm.running()

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.preempted or self.swapped or self.running)

    # ---------------------------------------------------------------- one step

    def schedule(self) -> SchedulerOutput:
        """One engine step (see the module docstring); all or nothing. Every sequence the last step
        ran must have had its sample given to `update()`: one without would never decode again."""
        if self.awaiting:
            raise InvalidState(f"update() has no sample yet for sequences {sorted(self.awaiting)} "
                               "that the last schedule() ran")
        return self._atomically(self._schedule)

    def update(self, outputs: dict) -> list:
        """Record each sequence's sampled token; returns the sequences that finished (freed).
        `outputs` maps sequences the last `schedule()` ran (prefills, forks, decodes) and not yet
        updated to their sampled token; anything else is refused before anything changes."""
        require(isinstance(outputs, dict), f"update takes a dict of seq_id -> token, got {type(outputs).__name__}")
        samples = {}
        for seq_id, token in outputs.items():
            require(is_int(seq_id), f"sequence ids are ints, got {seq_id!r}")
            seq_id = int.__index__(seq_id)
            if seq_id not in self.request_of:
                raise UnknownSequence(seq_id)
            if seq_id not in self.awaiting:
                raise InvalidState(f"sequence {seq_id} did not run in the last schedule(): nothing to sample")
            samples[seq_id] = plain_token(token, "sampled token")
        require(len(samples) == len(outputs), "update names a sequence twice")
        return self._atomically(lambda: self._update(samples))

    def _schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        self._decode(out)
        if not (out.preempted or out.swapped_out):
            self._swap_in(out)
            self._admit(out)
        ids = out.seq_ids
        counts = [p.num_computed_tokens for p in out.prefills] + [1] * len(out.decodes)
        out.block_tables = self.bm.block_tables(ids)
        out.seq_lens = self.bm.seq_lens(ids)
        out.slot_mapping = self.bm.slot_mapping(ids, counts)
        out.copies = self.bm.take_copies()
        self.awaiting = set(ids) | set(out.forked)
        return out

    def _update(self, samples: dict) -> list:
        finished = []
        for seq_id, token in samples.items():
            request = self.request_of[seq_id]
            self.awaiting.discard(seq_id)
            self.generated[seq_id] += 1
            if self.generated[seq_id] >= request.max_new_tokens or token == request.eos:
                self._finish(seq_id)
                finished.append(seq_id)
            else:
                self.pending[seq_id] = token
        return finished

    def _finish(self, seq_id: int) -> None:
        """Free a sequence and forget it everywhere (it may sit in no queue: it just ran)."""
        self.bm.free(seq_id)
        self.pending.pop(seq_id, None)
        self.awaiting.discard(seq_id)
        del self.request_of[seq_id], self.generated[seq_id]

    def _atomically(self, body):
        """Run `body` so that if it raises, the scheduler's queues and maps and the block manager
        (one `BlockManager.transaction`) are as before. The copies are O(sequences), as the step."""
        saved = (deque(self.waiting), deque(self.preempted), deque(self.swapped), dict(self.pending),
                 dict(self.generated), dict(self.request_of), set(self.awaiting), self.next_seq_id)
        try:
            return self.bm.transaction(body)
        except BaseException:
            (self.waiting, self.preempted, self.swapped, self.pending, self.generated, self.request_of,
             self.awaiting, self.next_seq_id) = saved
            raise

    # ---------------------------------------------------------------- phases

    def _decode(self, out: SchedulerOutput) -> None:
        """The block manager's `step`, each victim preempted the way `preempt_mode` prefers."""
        result = self.bm.step({s: self.pending[s] for s in self.running if s in self.pending},
                              preempt_mode=self.preempt_mode)
        for victim in result.preempted:
            if self.bm.status(victim) == SWAPPED:
                self.swapped.appendleft(victim)
                out.swapped_out.append(victim)
            else:
                self.preempted.appendleft(victim)
                out.preempted.append(victim)
        for seq_id in result.appended:
            del self.pending[seq_id]
        out.decodes = list(result.appended)

    def _abort_outgrown(self, queue: deque, out: SchedulerOutput, blocks_to_resume) -> None:
        """Free the preempted sequences that even an empty pool could not take back (they would
        wait forever): a sequence that alone outgrew the pool was preempted by its own decode."""
        for seq_id in [s for s in queue if blocks_to_resume(s) > self.bm.num_blocks - self.watermark_blocks]:
            queue.remove(seq_id)
            self._finish(seq_id)
            out.aborted.append(seq_id)

    def preempt_mode(self, seq_id: int) -> str:
        """Recompute re-prefills every token; swap moves the KV out and back. Swap needs room in
        the CPU pool for all of the victim's blocks."""
        blocks = len(self.bm.block_table(seq_id))
        if blocks > self.bm.num_free_cpu_blocks():
            return "recompute"
        cfg = self.config
        recompute_s = self.bm.length(seq_id) / cfg.prefill_tokens_per_s
        swap_s = 2 * blocks * self.bm.block_size * cfg.kv_bytes_per_token / cfg.swap_bytes_per_s
        return "swap" if swap_s < recompute_s else "recompute"

    def _fits(self, blocks: int) -> bool:
        return blocks <= self.bm.num_free_blocks() - self.watermark_blocks

    def _room_for(self, n: int) -> bool:
        return len(self.running) + n <= self.config.max_num_seqs

    # ---------------------------------------------------------------- admission: the one rule

    def _readmit_blocks(self, seq_id) -> int:
        """GPU blocks a preempted sequence needs back: its tokens plus its pending one, which it
        writes at once. A swapped one gets fresh blocks for its CPU table's ceil(length / B) and
        one more only if its tail is full; a recompute victim re-prefills (its cache hits are
        conservatively ignored when checking the fit)."""
        return blocks_needed(self.bm.length(seq_id) + 1, self.bm.block_size)

    def _prompt_blocks(self, request: _Request) -> int:
        return blocks_needed(len(request.prompt), self.bm.block_size)

    def admission_heads(self) -> list:
        """(sequences, blocks) each queue head the next step would place needs: swapped first,
        then recompute victims, then new requests, which wait while victims do."""
        heads = []
        if self.swapped:
            heads.append((1, self._readmit_blocks(self.swapped[0])))
        if self.preempted:
            heads.append((1, self._readmit_blocks(self.preempted[0])))
        elif self.waiting:
            heads.append((len(self.waiting[0].seq_ids), self._prompt_blocks(self.waiting[0])))
        return heads

    def waits_for_blocks(self) -> bool:
        """Whether a queue head that has a sequence slot waits for blocks (memory refuses it)."""
        return any(self._room_for(n) and not self._fits(blocks) for n, blocks in self.admission_heads())

    def _swap_in(self, out: SchedulerOutput) -> None:
        self._abort_outgrown(self.swapped, out, self._readmit_blocks)
        while self.swapped and self._room_for(1) and self._fits(self._readmit_blocks(self.swapped[0])):
            seq_id = self.swapped.popleft()
            self.bm.swap_in(seq_id)
            self.bm.append(seq_id, self.pending.pop(seq_id))
            out.swapped_in.append(seq_id)
            out.decodes.append(seq_id)

    def _admit(self, out: SchedulerOutput) -> None:
        self._abort_outgrown(self.preempted, out, self._readmit_blocks)
        while self.preempted and self._room_for(1) and self._fits(self._readmit_blocks(self.preempted[0])):
            seq_id = self.preempted.popleft()
            self.bm.resume(seq_id)
            self.bm.append(seq_id, self.pending.pop(seq_id))
            cached = self.bm.cached_tokens(seq_id)
            out.prefills.append(Prefill(seq_id, cached, self.bm.length(seq_id) - cached))
        while not self.preempted and self.waiting and self._room_for(len(self.waiting[0].seq_ids)) \
                and self._fits(self._prompt_blocks(self.waiting[0])):
            request = self.waiting.popleft()
            first, *children = request.seq_ids
            cached = self.bm.add(first, request.prompt)
            out.prefills.append(Prefill(first, cached, len(request.prompt) - cached))
            for child in children:
                self.bm.fork(first, child)
                out.forked[child] = first
