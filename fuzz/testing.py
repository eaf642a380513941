"""The conformance kit inside your own pytest suite: a factory becomes a test.

```python
# tests/test_my_block_manager.py
from pagedkv.fuzz.testing import conformance_test
from my_engine_adapter import make

test_conformance = conformance_test(make)                        # policy "any", profile "ci"
test_like_the_spec = conformance_test(make, policy="spec")       # the spec's own choices, exactly
```

The test runs the same harness, oracles and Hypothesis settings as `pagedkv fuzz` (every subject call
guarded by the same per-call timeout), and when it fails it shows every distinct oracle that fired,
each with its shrunk program as readable steps (`add(seq=1, tokens=[0, 1]) -> 0`) and the state
around it, instead of Hypothesis' raw form. Capabilities and `config_space` are read from the factory
(or the subject it builds), as the CLI does; pass them to override.
"""

from collections import Counter

from hypothesis import Phase, Verbosity
from hypothesis.stateful import run_state_machine_as_test

from .campaign import format_failure
from .guard import DEFAULT_TIMEOUT, Deadline, GuardedFactory
from .harness import DEFAULT_CAPABILITIES, declared_config_space, machine_for, probe_config
from .oracles import OracleFailure
from .profiles import check_profile, settings_for

#: Generation and shrinking, no explain phase (it replays the failure many times for little).
PHASES = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink)


class ConformanceFailure(AssertionError):
    """One or more oracles fired; the message holds each one's shrunk program. `failures` holds
    them as the CLI's failure dicts (oracle, message, config, policy, program, trace, state)."""

    def __init__(self, failures: list):
        super().__init__("\n\n".join(format_failure(failure) for failure in failures))
        self.failures = failures


def subject_declarations(factory, capabilities=None, config_space=None) -> tuple:
    """(capabilities, config_space) as declared by the factory or a probe subject, unless given."""
    if capabilities is not None and config_space is not None:
        return frozenset(capabilities), config_space
    probe = factory(**probe_config(declared_config_space(factory) if config_space is None else config_space))
    capabilities = frozenset(getattr(probe, "capabilities", DEFAULT_CAPABILITIES) if capabilities is None
                             else capabilities)
    return capabilities, declared_config_space(factory, probe) if config_space is None else config_space


def run_conformance(factory, *, policy: str = "any", profile: str = "ci", capabilities=None, config_space=None,
                    name: str = None, call_timeout: float = DEFAULT_TIMEOUT, **overrides) -> Counter:
    """Fuzz `factory` through the harness under `policy` and `profile` (Hypothesis settings
    `overrides` on top); return the tally, or raise ConformanceFailure naming every distinct oracle."""
    check_profile(profile)
    capabilities, space = subject_declarations(factory, capabilities, config_space)
    tally = Counter()
    settings = settings_for(profile, **{"verbosity": Verbosity.quiet, "phases": PHASES,
                                        "report_multiple_bugs": True, **overrides})
    deadline = Deadline(call_timeout)
    machine = machine_for(GuardedFactory(factory, deadline), capabilities, tally,
                          name or getattr(factory, "__qualname__", "subject"), policy=policy, config_space=space)
    try:
        with deadline:
            run_state_machine_as_test(machine, settings=settings)
    except OracleFailure as failure:
        raise ConformanceFailure([_as_dict(failure)]) from None
    except BaseExceptionGroup as group:   # several distinct oracles fired (one OracleFailure class each)
        found, other = group.split(OracleFailure)
        if other is not None:
            raise
        raise ConformanceFailure([_as_dict(failure) for failure in _leaves(found)]) from None
    return tally


def conformance_test(factory, **options):
    """A pytest test function running `run_conformance(factory, **options)`. Assign it to a name
    starting with `test_` in a test module."""
    def test():
        run_conformance(factory, **options)
    test.__name__ = f"test_conformance_{getattr(factory, '__name__', 'subject')}"
    test.__doc__ = f"pagedkv conformance of {getattr(factory, '__qualname__', factory)!s} ({options or 'defaults'})"
    return test


def _as_dict(failure: OracleFailure) -> dict:
    return {"oracle": failure.oracle, "message": failure.message, "found_in": "generate", **failure.report}


def _leaves(group) -> list:
    return [leaf for error in group.exceptions
            for leaf in (_leaves(error) if isinstance(error, BaseExceptionGroup) else [error])]
