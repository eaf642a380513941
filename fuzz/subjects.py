"""Resolve a fuzz TARGET into a subject factory: `spec`, `impl`, or `module:factory` for anyone's.

A factory takes `num_blocks`, `block_size`, `prefix_caching`, `num_cpu_blocks` as keywords and returns
a subject with the protocol methods (docs/design.md, "The conformance protocol"). Resolving builds one
small probe subject, so a factory that cannot be imported, called or that lacks methods is reported
here, as a `UsageError` with the reason, before any fuzzing starts.

Where modules come from: the built-in targets (`NAMED`) import only installed packages, so resolving
them leaves `sys.path` alone, and nothing in an untrusted working directory (a planted `redis.py`,
say) is ever imported by `pagedkv fuzz spec`. A `module:factory` target is the user's own adapter,
usually a file in the directory they run from (the `pagedkv` script does not put that directory on
`sys.path` the way `python -m` does), so for those targets only, the working directory is *appended*
to `sys.path`: the adapter and the files beside it import, and none of them can shadow an installed
module.
"""

import importlib
import os
import sys
from dataclasses import dataclass

from .guard import Deadline, SubjectFault
from .targets import factory_in, split_target
from .harness import (BATCH_PROTOCOL, CAPABILITIES, DEFAULT_CAPABILITIES, PROTOCOL, SWAP_PROTOCOL, ConfigSpaceError,
                      declared_config_space, probe_config)

NAMED = {
    "spec": "pagedkv.spec.kvspec:KVSpec",
    "impl": "pagedkv.impl:BlockManager",
    "vllm": "pagedkv.fuzz.adapters.vllm_v1:make",     # vLLM 0.33.0's v1 KVCacheManager (fuzz/adapters/vllm_v1.py)
    "sglang": "pagedkv.fuzz.adapters.sglang:make",   # SGLang 0.5.23's radix cache (fuzz/adapters/sglang.py)
}
#: Built-in targets that take a release, `NAME@VERSION` (`vllm@0.4.2`; plain `vllm` is its pinned
#: release): the function named here returns that release's factory, its wheel installed into
#: pagedkv's wheel cache and its modules loaded before the probe's call deadline starts (a first
#: download takes minutes), or raises ValueError.
RELEASED = {"vllm": "pagedkv.fuzz.adapters.vllm_v0:release"}


class UsageError(Exception):
    """The target cannot be fuzzed; the message says why. The CLI exits 2."""


@dataclass(frozen=True)
class Subject:
    target: str             # as given: "spec", "impl" or "module:factory"
    factory: object
    capabilities: frozenset
    search_path: str = ""   # directory to put on sys.path so the module imports elsewhere too
    config_space: dict = None  # what the factory (or its subject) declares it can be built with; None: anything


def resolve(target: str, block_sizes: tuple = None) -> Subject:
    """The subject factory named by `target`, probed once (at the smallest configuration it declares,
    or at the smallest of `block_sizes` when given: an override of what the kit may draw). Raises
    UsageError with the reason."""
    name, at, release = target.partition("@")
    if name in RELEASED and (at or target == name):  # plain `vllm`: the pinned release
        return _released(target, name, release or None, block_sizes)
    spec = NAMED.get(target, target)
    module_name, attr = split_target(target, spec, UsageError, "'spec', 'impl' or 'module:factory'")
    _refuse_file_path(target, module_name, attr)
    module = _import(target, module_name)
    factory = factory_in(module, target, module_name, attr, UsageError)
    capabilities, space = _probe(target, factory, block_sizes)
    where = os.path.dirname(os.path.abspath(getattr(module, "__file__", "") or ""))
    return Subject(target, factory, capabilities, "" if target in NAMED else where, space)


def _refuse_file_path(target: str, module_name: str, attr: str) -> None:
    """`./mine.py:make` names a file, and a file can be imported under many module names: ask for one."""
    if module_name.endswith(".py") or "/" in module_name or os.sep in module_name:
        folder, file = os.path.split(os.path.abspath(module_name))
        name = file[:-3] if file.endswith(".py") else file
        raise UsageError(f"target {target!r} is a file path; give a module name: '{name}:{attr}', run from "
                         f"{folder} (or with that folder on PYTHONPATH)")


def _released(target: str, name: str, release: str, block_sizes: tuple = None) -> Subject:
    module_name, _, attr = RELEASED[name].partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)(release)
    except Exception as error:  # an unknown release, a failed wheel download: say which and why
        raise UsageError(f"target {target!r}: {type(error).__name__}: {error}") from error
    capabilities, space = _probe(target, factory, block_sizes)
    return Subject(target, factory, capabilities, config_space=space)


def _import(target: str, module_name: str):
    if target not in NAMED and os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())  # the user's adapter beside them imports; it shadows nothing installed
    try:
        return importlib.import_module(module_name)
    except Exception as error:  # any import failure is the user's to fix: say which and why
        raise UsageError(f"target {target!r}: cannot import {module_name!r}: "
                         f"{type(error).__name__}: {error}") from error


def _probe(target: str, factory, block_sizes: tuple = None) -> tuple:
    """(capabilities, config_space) of one probe subject, built with the smallest configuration the
    factory declares it supports (`block_sizes` overriding)."""
    try:
        override = {"block_sizes": tuple(block_sizes)} if block_sizes else {}
        probe = probe_config({**declared_config_space(factory), **override})
    except ConfigSpaceError as error:
        raise UsageError(f"target {target!r}: {error}") from error
    call = f"factory({', '.join(f'{k}={v!r}' for k, v in probe.items())})"
    try:
        with Deadline() as deadline:
            subject = deadline.call("factory", lambda: factory(**probe))
    except SubjectFault as fault:  # a hang or a sys.exit while probing
        raise UsageError(f"target {target!r}: {call}: {fault}") from fault
    except Exception as error:
        raise UsageError(f"target {target!r}: {call} raised {type(error).__name__}: {error}") from error
    capabilities = frozenset(getattr(subject, "capabilities", DEFAULT_CAPABILITIES))
    if not capabilities <= CAPABILITIES:
        raise UsageError(f"target {target!r}: unknown capabilities {sorted(capabilities - CAPABILITIES)}; "
                         f"known: {sorted(CAPABILITIES)}")
    needed = PROTOCOL + (SWAP_PROTOCOL if "swap" in capabilities else ()) + (
        BATCH_PROTOCOL if "batch_tables" in capabilities else ())
    missing = [name for name in needed if not callable(getattr(subject, name, None))]
    if missing:
        raise UsageError(f"target {target!r}: the subject lacks protocol method(s) {', '.join(missing)}")
    try:
        return capabilities, declared_config_space(factory, subject) or None
    except ConfigSpaceError as error:
        raise UsageError(f"target {target!r}: {error}") from error
