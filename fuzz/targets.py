"""`module:factory` targets, shared by block-manager subjects (subjects.py) and kernels under test
(kernel_kit/protocol.py): split the name, then find a callable factory in the imported module."""


def split_target(target: str, spec: str, error, usage: str, kind: str = "target") -> tuple:
    """(module name, attribute path) of `spec` (what `target` names), or `error(...)` saying `usage`."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise error(f"bad {kind} {target!r}: use {usage}")
    return module_name, attr


def factory_in(module, target: str, module_name: str, attr: str, error, noun: str = "callable factory"):
    """The callable at dotted `attr` of `module`, or `error(...)` naming what is missing or wrong."""
    factory = module
    for part in attr.split("."):
        factory = getattr(factory, part, None)
        if factory is None:
            raise error(f"target {target!r}: module {module_name!r} has no attribute {attr!r}")
    if not callable(factory):
        raise error(f"target {target!r}: {attr!r} is a {type(factory).__name__}, not a {noun}")
    return factory
