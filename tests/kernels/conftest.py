"""Kernel tests run natively on CUDA and under Triton's interpreter elsewhere.

TRITON_INTERPRET must be set before Triton decorates the kernels, hence at the very top here.
The same test functions are parametrized over a ``size`` ("small" everywhere, "large" GPU-only) and
``dtype`` (bfloat16 GPU-only); GPU-only params carry @pytest.mark.gpu and skip cleanly without CUDA.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
GPU_ONLY = [pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")]


@pytest.fixture(scope="session")
def device():
    return "cuda" if HAS_CUDA else "cpu"


@pytest.fixture(params=[torch.float32, torch.float16, pytest.param(torch.bfloat16, marks=GPU_ONLY)],
                ids=["fp32", "fp16", "bf16"])
def dtype(request):
    return request.param


@pytest.fixture(params=["small", pytest.param("large", marks=GPU_ONLY)])
def size(request):
    """Scales test shapes: the long sequence length and the number of sequences."""
    return {"small": {"long": 70, "reps": 1}, "large": {"long": 3000, "reps": 4}}[request.param]


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)
