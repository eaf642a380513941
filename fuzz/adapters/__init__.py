"""Adapters that put real engines' block managers and kernels behind pagedkv's conformance protocols.

`wheels` installs a pinned engine wheel into a cache folder (never the user's environment) and loads
only the modules under test, privately; `vllm_v1`, `vllm_v0` and `vllm_kernel` drive vLLM's own code,
`sglang` (radix cache and allocators) and `sglang_kernels` (Triton decode and extend) SGLang's.
"""
