"""Resolve a fuzz TARGET into a subject factory: `spec`, `impl`, or `module:factory` for anyone's.

A factory takes `num_blocks`, `block_size`, `prefix_caching`, `num_cpu_blocks` as keywords and returns
a subject with the protocol methods (docs/design.md, "The conformance protocol"). Resolving builds one
small probe subject, so a factory that cannot be imported, called or that lacks methods is reported
here, as a `UsageError` with the reason, before any fuzzing starts.
"""

import importlib
import os
import sys
from dataclasses import dataclass

from .harness import CAPABILITIES, DEFAULT_CAPABILITIES, PROTOCOL, SWAP_PROTOCOL

NAMED = {
    "spec": "pagedkv.spec.kvspec:KVSpec",
    "impl": "pagedkv.impl:BlockManager",
    "sglang": "pagedkv.fuzz.adapters.sglang:make",   # SGLang 0.5.23's radix cache (fuzz/adapters/sglang.py)
}
PROBE = {"num_blocks": 2, "block_size": 2, "prefix_caching": False, "num_cpu_blocks": 0}


class UsageError(Exception):
    """The target cannot be fuzzed; the message says why. The CLI exits 2."""


@dataclass(frozen=True)
class Subject:
    target: str             # as given: "spec", "impl" or "module:factory"
    factory: object
    capabilities: frozenset
    search_path: str = ""   # directory to put on sys.path so the module imports elsewhere too


def resolve(target: str) -> Subject:
    """The subject factory named by `target`, probed once. Raises UsageError with the reason."""
    spec = NAMED.get(target, target)
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"bad target {target!r}: use 'spec', 'impl' or 'module:factory'")
    module = _import(target, module_name)
    factory = module
    for part in attr.split("."):
        factory = getattr(factory, part, None)
        if factory is None:
            raise UsageError(f"target {target!r}: module {module_name!r} has no attribute {attr!r}")
    if not callable(factory):
        raise UsageError(f"target {target!r}: {attr!r} is a {type(factory).__name__}, not a callable factory")
    capabilities = _probe(target, factory)
    where = os.path.dirname(os.path.abspath(getattr(module, "__file__", "") or ""))
    return Subject(target, factory, capabilities, "" if target in NAMED else where)


def _import(target: str, module_name: str):
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`: modules next to the caller import
    try:
        return importlib.import_module(module_name)
    except Exception as error:  # any import failure is the user's to fix: say which and why
        hint = " (the production allocator has not landed yet)" if target == "impl" else ""
        raise UsageError(f"target {target!r}: cannot import {module_name!r}{hint}: "
                         f"{type(error).__name__}: {error}") from error


def _probe(target: str, factory) -> frozenset:
    try:
        subject = factory(**PROBE)
    except Exception as error:
        raise UsageError(f"target {target!r}: factory({', '.join(f'{k}={v!r}' for k, v in PROBE.items())}) "
                         f"raised {type(error).__name__}: {error}") from error
    capabilities = frozenset(getattr(subject, "capabilities", DEFAULT_CAPABILITIES))
    if not capabilities <= CAPABILITIES:
        raise UsageError(f"target {target!r}: unknown capabilities {sorted(capabilities - CAPABILITIES)}; "
                         f"known: {sorted(CAPABILITIES)}")
    needed = PROTOCOL + (SWAP_PROTOCOL if "swap" in capabilities else ())
    missing = [name for name in needed if not callable(getattr(subject, name, None))]
    if missing:
        raise UsageError(f"target {target!r}: the subject lacks protocol method(s) {', '.join(missing)}")
    return capabilities
