"""A tiny decoder-only transformer with seeded random weights, and its dense-KV reference run.

The model (embedding, pre-RMSNorm layers of rotary GQA attention and a SiLU-gated MLP, final norm,
LM head; float32) takes its attention as an argument, `attend(layer, q, k, v, positions)`, so the
paged engine (`pagedkv.impl.engine`) and the dense reference below run the very same weights and
arithmetic everywhere except in where K and V live and how attention reads them.
"""
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 512
    hidden: int = 128
    layers: int = 2
    q_heads: int = 4
    kv_heads: int = 2
    head_dim: int = 64
    ffn: int = 256
    rope_theta: float = 10000.0
    seed: int = 0


    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token over all layers, float32: what a swap moves per token."""
        return 2 * self.layers * self.kv_heads * self.head_dim * 4


class TinyTransformer:
    def __init__(self, cfg: ModelConfig = ModelConfig()):
        self.cfg = cfg
        g = torch.Generator().manual_seed(cfg.seed)

        def weight(*shape):
            return torch.randn(*shape, generator=g) / shape[0] ** 0.5

        q, kv = cfg.q_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
        # The embedding is not scaled down: large logit gaps keep greedy choices far from ties.
        self.embed = torch.randn(cfg.vocab_size, cfg.hidden, generator=g)
        self.layers = [dict(qkv=weight(cfg.hidden, q + 2 * kv), out=weight(q, cfg.hidden),
                            gate_up=weight(cfg.hidden, 2 * cfg.ffn), down=weight(cfg.ffn, cfg.hidden))
                       for _ in range(cfg.layers)]
        self.lm_head = weight(cfg.hidden, cfg.vocab_size) * 4
        inv_freq = cfg.rope_theta ** (-torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim)
        self._inv_freq = inv_freq

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, attend) -> torch.Tensor:
        """tokens, positions: int64 [T]; attend(layer, q[T,Hq,D], k[T,Hkv,D], v[T,Hkv,D], positions)
        -> [T,Hq,D]. Returns float32 logits [T, vocab]."""
        cfg = self.cfg
        x = self.embed[tokens]
        cos, sin = self._rotary(positions)
        q_dim, kv_dim = cfg.q_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
        for i, w in enumerate(self.layers):
            q, k, v = (_rms_norm(x) @ w["qkv"]).split([q_dim, kv_dim, kv_dim], dim=-1)
            q = _rotate(q.view(-1, cfg.q_heads, cfg.head_dim), cos, sin)
            k = _rotate(k.view(-1, cfg.kv_heads, cfg.head_dim), cos, sin)
            v = v.reshape(-1, cfg.kv_heads, cfg.head_dim)
            x = x + attend(i, q, k, v, positions).reshape(-1, q_dim) @ w["out"]
            gate, up = (_rms_norm(x) @ w["gate_up"]).chunk(2, dim=-1)
            x = x + (F.silu(gate) * up) @ w["down"]
        return _rms_norm(x) @ self.lm_head

    def _rotary(self, positions: torch.Tensor):
        angles = positions.to(torch.float64)[:, None] * self._inv_freq[None, :]
        return angles.cos().float()[:, None, :], angles.sin().float()[:, None, :]


def _rms_norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).contiguous()


def dense_causal_attention(layer, q, k, v, positions):
    """One whole sequence at once: every query sees the keys at or before its position."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / q.shape[-1] ** 0.5
    scores = scores.masked_fill(positions[None, None, :] > positions[None, :, None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def pick(logits: torch.Tensor, sample: int, step: int) -> int:
    """Greedy, except that sample k takes the k-th best token at its first step: parallel samples of
    one prompt then differ while both runs stay deterministic."""
    if step == 0 and sample:
        return int(logits.topk(sample + 1).indices[-1])
    return int(logits.argmax())


def reference_generate(model: TinyTransformer, prompt: list, max_new_tokens: int, sample: int = 0):
    """Generation with the whole sequence recomputed each step (no cache at all, so nothing paged can
    leak in). Returns (generated tokens, logits [steps, vocab])."""
    tokens, generated, logits = list(prompt), [], []
    for step in range(max_new_tokens):
        ids = torch.tensor(tokens)
        last = model.forward(ids, torch.arange(len(ids)), dense_causal_attention)[-1]
        token = pick(last, sample, step)
        tokens.append(token)
        generated.append(token)
        logits.append(last)
    return generated, torch.stack(logits)
