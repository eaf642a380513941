"""A tiny engine on the paged pieces: `TinyTransformer` run by `PagedRunner` on the real kernels,
scheduled by the `Scheduler`, checked token for token against a dense model. The only room of
impl that imports `pagedkv.kernels`."""

from .cache_copies import perform_copies
from .model import ModelConfig, TinyTransformer, dense_causal_attention, pick, reference_generate
from .paged_runner import Batch, PagedRunner
from .tiny_engine import LOGIT_TOLERANCE, SCENARIOS, Engine, Generation, run_engine_check, run_scenario

__all__ = ["Batch", "Engine", "Generation", "LOGIT_TOLERANCE", "ModelConfig", "PagedRunner", "SCENARIOS",
           "TinyTransformer", "dense_causal_attention", "perform_copies", "pick", "reference_generate", "run_engine_check",
           "run_scenario"]
