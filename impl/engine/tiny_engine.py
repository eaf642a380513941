"""A tiny end-to-end engine on the real pieces, checked token for token against a dense model.

`Engine` generates with `TinyTransformer`: the `Scheduler` and `BlockManager` decide what runs and
where its KV lives, `PagedRunner` performs their copies (copy-on-write with `copy_blocks`, swaps
between the device pool and a host pool) and runs the forward pass (`write_kv`, `paged_prefill`,
`paged_decode`). `reference_generate` recomputes every sequence densely, with no cache at all.

Scenarios (`run_scenario`), each one engine run compared with the reference:
- mixed: prompts of mixed lengths (inside one block, exactly one, just past one, several) in one batch;
- parallel: one prompt, n=4 samples forked after the prefill; sample k takes the k-th best token
  first (`pick`), so the samples diverge and their shared partial tail is copied on write;
- prefix: prompts sharing a 2-block prefix with prefix caching on; cache hits must happen;
- preempt-recompute / preempt-swap: a pool so small that sequences are preempted mid-generation and
  resumed; the scheduler's cost model is set so that re-prefilling (or swapping) is the cheaper way.
Greedy tokens must match exactly and logits within `LOGIT_TOLERANCE`.
"""
import time
from dataclasses import dataclass, field

import torch

from pagedkv.impl.alloc import BlockManager
from pagedkv.impl.sched import Scheduler, SchedulerConfig

from .model import ModelConfig, TinyTransformer, pick, reference_generate
from .paged_runner import Batch, PagedRunner

LOGIT_TOLERANCE = 1e-3
SCENARIOS = ("mixed", "parallel", "prefix", "preempt-recompute", "preempt-swap")


@dataclass
class Generation:
    prompt: list
    sample: int                 # index among the request's parallel samples
    max_new_tokens: int
    tokens: list = field(default_factory=list)
    logits: list = field(default_factory=list)   # the logits each token was picked from


class Engine:
    def __init__(self, model: TinyTransformer, *, num_blocks: int, block_size: int, num_cpu_blocks: int = 0,
                 prefix_caching: bool = False, scheduler_config: SchedulerConfig = None):
        self.bm = BlockManager(num_blocks, block_size, num_cpu_blocks=num_cpu_blocks, prefix_caching=prefix_caching)
        self.scheduler = Scheduler(self.bm, scheduler_config or SchedulerConfig(
            kv_bytes_per_token=model.cfg.kv_bytes_per_token))
        self.runner = PagedRunner(model, num_blocks, block_size, num_cpu_blocks)
        self.outputs: dict = {}    # seq id -> Generation

    def add_request(self, prompt: list, max_new_tokens: int, n: int = 1) -> list:
        seq_ids = self.scheduler.add_request(len(self.outputs), prompt, max_new_tokens, n=n)
        for sample, seq_id in enumerate(seq_ids):
            self.outputs[seq_id] = Generation(list(prompt), sample, max_new_tokens)
        return seq_ids

    def run(self) -> dict:
        while self.scheduler.has_unfinished():
            self.step()
        return self.outputs

    def step(self) -> None:
        out = self.scheduler.schedule()
        self.runner.apply_copies(out.copies)
        if not out.seq_ids:
            raise RuntimeError("the scheduler ran nothing although requests are unfinished")
        logits = dict(zip(out.seq_ids, self.runner.forward(self._batch(out))))
        for child, parent in out.forked.items():   # samples start from their parent's prefill
            logits[child] = logits[parent]
        sampled = {}
        for seq_id, row in logits.items():
            gen = self.outputs[seq_id]
            sampled[seq_id] = pick(row, gen.sample, len(gen.tokens))
            gen.tokens.append(sampled[seq_id])
            gen.logits.append(row)
        self.scheduler.update(sampled)

    def _batch(self, out) -> Batch:
        query_lens = [p.num_computed_tokens for p in out.prefills] + [1] * len(out.decodes)
        rows = [self.outputs[s].prompt + self.outputs[s].tokens for s in out.seq_ids]
        if [len(r) for r in rows] != out.seq_lens.tolist():
            raise RuntimeError(f"engine and block manager disagree on lengths: "
                               f"{[len(r) for r in rows]} vs {out.seq_lens.tolist()}")
        return Batch(tokens=torch.tensor([t for r, n in zip(rows, query_lens) for t in r[len(r) - n:]]),
                     query_lens=torch.tensor(query_lens), seq_lens=out.seq_lens, block_tables=out.block_tables,
                     slot_mapping=out.slot_mapping, num_prefills=len(out.prefills))


# ------------------------------------------------------------------------- scenarios

BLOCK_SIZE = 16


def _prompt(rng: torch.Generator, length: int, vocab: int) -> list:
    return torch.randint(0, vocab, (length,), generator=rng).tolist()


def _scenario(name: str, model: TinyTransformer):
    """(engine, requests as (prompt, n) in submission waves, what it must show)."""
    rng, vocab = torch.Generator().manual_seed(len(name)), model.cfg.vocab_size
    if name == "mixed":
        engine = Engine(model, num_blocks=32, block_size=BLOCK_SIZE)
        return engine, [[(_prompt(rng, n, vocab), 1) for n in (3, 16, 17, 40)]], {}
    if name == "parallel":
        engine = Engine(model, num_blocks=16, block_size=BLOCK_SIZE)
        return engine, [[(_prompt(rng, 21, vocab), 4)]], {"copies": 3}
    if name == "prefix":
        engine = Engine(model, num_blocks=32, block_size=BLOCK_SIZE, prefix_caching=True)
        shared = _prompt(rng, 2 * BLOCK_SIZE, vocab)
        # The first request fills the cache; the others arrive one step later and hit it.
        return engine, [[(shared + _prompt(rng, 5, vocab), 1)],
                        [(shared + _prompt(rng, n, vocab), 1) for n in (1, 9)]], {"cached_tokens": 2 * 2 * BLOCK_SIZE}
    # Preemption: three sequences cross a block boundary mid-generation in a 5-block pool. A free
    # re-prefill makes recompute the cheaper mode, a free link makes swap the cheaper one.
    costs = {"preempt-recompute": dict(prefill_tokens_per_s=1e15), "preempt-swap": dict(swap_bytes_per_s=1e18)}
    shows = {"preempt-recompute": {"preempt_recompute": 1}, "preempt-swap": {"preempt_swap": 1, "swap_ins": 1}}
    engine = Engine(model, num_blocks=5, block_size=BLOCK_SIZE, num_cpu_blocks=8,
                    scheduler_config=SchedulerConfig(kv_bytes_per_token=model.cfg.kv_bytes_per_token, **costs[name]))
    return engine, [[(_prompt(rng, n, vocab), 1) for n in (14, 15, 16)]], shows[name]


def run_scenario(name: str, model: TinyTransformer = None, new_tokens: int = 6) -> dict:
    model = model or TinyTransformer(ModelConfig())
    started = time.perf_counter()
    engine, waves, expect = _scenario(name, model)
    for i, wave in enumerate(waves):
        for prompt, n in wave:
            engine.add_request(prompt, new_tokens, n=n)
        if i + 1 < len(waves):
            engine.step()
    outputs = engine.run()
    match, diff = True, 0.0
    for gen in outputs.values():
        tokens, logits = reference_generate(model, gen.prompt, gen.max_new_tokens, gen.sample)
        match &= tokens == gen.tokens
        # NaN (a slot read before it was written) must count as a failure, not vanish in max().
        diff = max(diff, float((torch.stack(gen.logits) - logits).abs().nan_to_num(float("inf")).max()))
    stats = engine.bm.metrics()
    shown = {key: stats[key] for key in expect}
    return {
        "scenario": name,
        "sequences": len(outputs),
        "tokens": sum(len(g.tokens) for g in outputs.values()),
        "match": match,
        "max_logit_diff": diff,
        "preempt_recompute": stats["preempt_recompute"],
        "preempt_swap": stats["preempt_swap"],
        "cached_tokens": stats["cached_tokens"],
        "cow_copies": stats["copies"],
        "expected": expect,
        "passed": match and diff <= LOGIT_TOLERANCE and all(shown[k] >= v for k, v in expect.items()),
        "seconds": time.perf_counter() - started,
    }


def run_engine_check(profile: str) -> dict:
    """For `pagedkv check`: every scenario once (ci: 4 new tokens each; dev/deep: more)."""
    new_tokens = {"ci": 4, "dev": 8, "deep": 16}[profile]
    model = TinyTransformer(ModelConfig())
    rows = [run_scenario(name, model, new_tokens) for name in SCENARIOS]
    failed = [r for r in rows if not r["passed"]]
    return {
        "name": "engine",
        "covered": f"{len(rows)} scenarios ({', '.join(SCENARIOS)}), {sum(r['tokens'] for r in rows)} tokens "
                   f"vs dense reference",
        "passed": not failed,
        "detail": "; ".join(f"{r['scenario']}: match={r['match']} max_logit_diff={r['max_logit_diff']:.2e} "
                            f"expected {r['expected']}" for r in failed),
    }
