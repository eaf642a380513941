"""The rooms' import arrows (docs/design.md, "Rooms"), read from the source: every `import`, and
every string literal naming a pagedkv module (importlib targets), points only where allowed."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: room -> folder. impl's subpackages are rooms of their own.
FOLDERS = {
    "spec": "spec", "kernels": "kernels", "proofs": "proofs", "fuzz": "fuzz", "cli": "cli",
    "impl": "impl", "impl.alloc": "impl/alloc", "impl.sched": "impl/sched",
    "impl.engine": "impl/engine", "impl.sim": "impl/sim",
}

#: room -> the rooms it may import (itself always).
ALLOWED = {
    "spec": set(),
    "kernels": set(),
    "proofs": {"spec"},
    "impl.alloc": {"spec"},
    "impl.sched": {"spec", "impl.alloc"},
    "impl.engine": {"spec", "kernels", "impl.alloc", "impl.sched"},
    "impl.sim": {"spec", "impl.alloc", "impl.sched"},
    "impl": {"spec", "impl.alloc", "impl.sched"},   # impl/__init__.py re-exports alloc and sched
    "fuzz": {"spec", "kernels", "impl", "impl.alloc", "impl.sched", "impl.engine", "impl.sim"},
    "cli": set(FOLDERS) - {"cli"},
}

_MODULE_NAME = re.compile(r"^pagedkv\.[a-z_]+(\.[a-z_]+)*(:[\w.]+)?$")


def room_of_file(path: Path) -> str:
    relative = path.relative_to(ROOT).parent.as_posix()
    return max((room for room, folder in FOLDERS.items() if relative == folder or relative.startswith(folder + "/")),
               key=lambda room: len(FOLDERS[room]))


def room_of_module(module: str):
    """`pagedkv.impl.alloc.rows` -> "impl.alloc"; None for a module outside pagedkv's rooms."""
    parts = module.split(":")[0].split(".")
    if parts[0] != "pagedkv" or len(parts) < 2:
        return None
    if parts[1] == "impl" and len(parts) > 2 and f"impl.{parts[2]}" in FOLDERS:
        return f"impl.{parts[2]}"
    return parts[1] if parts[1] in FOLDERS else None


def package_of(path: Path) -> list:
    """The dotted package a file lives in, e.g. ["pagedkv", "impl", "alloc"]."""
    folder = path.relative_to(ROOT).parent.as_posix()
    room = room_of_file(path)
    return ["pagedkv", *room.split("."), *filter(None, folder[len(FOLDERS[room]):].split("/"))]


def imported_modules(path: Path):
    tree = ast.parse(path.read_text(), str(path))
    package = package_of(path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            yield node.lineno, module
            if not node.module:   # `from . import x`: x is a module of that package
                for alias in node.names:
                    yield node.lineno, f"{module}.{alias.name}"
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _MODULE_NAME.match(node.value):
            yield node.lineno, node.value


SOURCES = sorted(p for folder in ("spec", "kernels", "proofs", "fuzz", "cli", "impl") for p in (ROOT / folder).rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_imports_follow_the_arrows(path):
    room = room_of_file(path)
    wrong = [f"line {line}: {module} ({room_of_module(module)})" for line, module in imported_modules(path)
             if room_of_module(module) not in (None, room, *ALLOWED[room])]
    assert not wrong, f"{room} may import only {sorted(ALLOWED[room])}: {wrong}"


def test_nothing_imports_the_cli():
    importers = [p for p in SOURCES if room_of_file(p) != "cli"
                 and any(room_of_module(m) == "cli" for _, m in imported_modules(p))]
    assert not importers


def test_the_checker_sees_a_wrong_arrow(tmp_path, monkeypatch):
    # A planted file in the spec room that imports the allocator must be reported.
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    planted = tmp_path / "spec" / "planted.py"
    planted.parent.mkdir()
    planted.write_text("from pagedkv.impl.alloc import BlockManager\nNAME = 'pagedkv.fuzz.harness'\n")
    assert room_of_file(planted) == "spec"
    assert [(line, room_of_module(m)) for line, m in imported_modules(planted)] == \
        [(1, "impl.alloc"), (2, "fuzz")]
