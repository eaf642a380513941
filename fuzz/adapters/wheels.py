"""Pinned engine wheels without their dependencies, and their modules loaded in a private namespace.

Real-engine adapters (vLLM, SGLang) check the engine's own code, unchanged, on machines that cannot
install the engine (no GPU, no CUDA libraries, a different Python environment). Two steps:

1. `install(name, version)` puts the wheel's files in a cache folder and never touches the user's
   environment: `<cache>/<name>-<version>/`, where `<cache>` is `$PAGEDKV_WHEEL_CACHE` or
   `~/.cache/pagedkv/wheels`. The wheel comes from a folder that already holds it (`wheel_dirs`, or
   `$PAGEDKV_WHEEL_DIRS`, `os.pathsep`-separated) or else from `pip download --no-deps` (pip run with
   an argv list, no shell). A wheel is a zip: it is unpacked with `zipfile` (members that would land
   outside the folder are refused), optionally keeping only some members (`keep`, e.g. the `.py`
   sources: compiled extensions cannot load here anyway), into a temporary folder that is renamed
   into place, so an interrupted install never looks complete.

2. `load(roots, packages, modules, stubs)` imports `modules` from the `roots` (the engine's folder
   and those of pure-Python dependencies installed the same way) and returns a `LoadedEngine`.
   While it loads, and only then, a meta-path finder at the front of `sys.meta_path`:
   - resolves the top-level `packages` from `roots` only (never from the user's `sys.path`);
   - serves each name in `stubs` (a table of `Stub`, module name -> why and what it provides). A stub
     stands in for an import that pulls a GPU, distributed or multimodal subsystem, or a compiled
     extension that is not available; never for the logic under test. Names it provides but the
     logic must not need are `unavailable` classes: making one raises, naming the stub. `Stub(why, hollow=True)` keeps
     a package's submodules from the wheel but skips its `__init__` (which imports the subsystem);
     a plain stub is a module holding only the attributes its `provide` function sets.
   Isolation: before loading, entries of `sys.modules` under `packages` (another version of the
   engine, say) are set aside; after loading, every module the load added under `packages`, and
   every stub, is moved out of `sys.modules` into the `LoadedEngine`, and the set-aside entries are
   put back. So the user's `sys.modules` ends as it was (apart from ordinary third-party packages of
   the user's own environment that the engine imported, such as torch), several versions of one
   engine can be loaded in one process, and a stubbed `zmq` never hides the user's real one. Engine
   code that imports lazily, inside a function, must run inside `LoadedEngine.active()`, which puts
   the engine's modules back in `sys.modules` for the duration.

`importable(name, version)` says whether the engine is installed normally at exactly that version
(a full install): adapters then import it normally and use none of this.
"""

import contextlib
import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tempfile
import types
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping

MARKER = ".pagedkv-unpacked"  # written last: its presence means the unpacked folder is complete
#: The one version of each dependency an adapter loads beside its engine (pinned here once, so two
#: adapters needing msgspec share one wheel in the cache). None of them is GPU code.
PINS = {"msgspec": "0.23.0", "pyzmq": "27.3.0", "psutil": "7.2.2", "pybase64": "1.5.1",
        "starlette": "1.10.0", "anyio": "4.16.0", "sniffio": "1.3.1", "idna": "3.20", "cloudpickle": "3.1.1"}


def pinned(*names: str) -> tuple:
    """(name, version) of each named dependency, at its pin."""
    return tuple((name, PINS[name]) for name in names)


class WheelError(Exception):
    """The wheel cannot be had or unpacked; the message says why (and what was tried)."""


# ---------------------------------------------------------------------- cache and wheel files


def cache_root() -> Path:
    return Path(os.environ.get("PAGEDKV_WHEEL_CACHE") or Path.home() / ".cache" / "pagedkv" / "wheels")


def install_dir(name: str, version: str) -> Path:
    return cache_root() / f"{_normalize(name)}-{version}"


def _normalize(name: str) -> str:
    """A distribution name as wheel file names spell it (PEP 427: runs of -_. become _)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def _wheel_dirs(extra: Iterable) -> list:
    from_env = [Path(p) for p in os.environ.get("PAGEDKV_WHEEL_DIRS", "").split(os.pathsep) if p]
    return [Path(d) for d in extra] + from_env + [cache_root() / "downloads"]


def find_wheel(name: str, version: str, wheel_dirs: Iterable = ()) -> Path | None:
    """A wheel file of exactly `name==version` in one of the folders, or None."""
    prefix = f"{_normalize(name)}-{version}-"
    for folder in _wheel_dirs(wheel_dirs):
        if folder.is_dir():
            for candidate in sorted(folder.iterdir()):
                if candidate.suffix == ".whl" and candidate.name.lower().startswith(prefix):
                    return candidate
    return None


def download(name: str, version: str, pip_args: Iterable = ()) -> Path:
    """`pip download --no-deps` of the pinned wheel into `<cache>/downloads`."""
    dest = cache_root() / "downloads"
    dest.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--disable-pip-version-check", "--dest", str(dest), f"{name}=={version}", *pip_args]
    done = subprocess.run(argv, capture_output=True, text=True)
    wheel = find_wheel(name, version, ())
    if done.returncode != 0 or wheel is None:
        raise WheelError(f"pip download of {name}=={version} failed (exit {done.returncode}): "
                         f"{(done.stderr or done.stdout).strip()[-800:]}")
    return wheel


def unpack(wheel: Path, dest: Path, keep: Callable[[str], bool] = lambda member: True) -> Path:
    """Unpack the members of `wheel` that `keep` accepts into `dest`, atomically. Returns `dest`."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        with zipfile.ZipFile(wheel) as archive:
            for member in archive.infolist():
                if member.is_dir() or not keep(member.filename):
                    continue
                target = (staging / member.filename).resolve()
                if not target.is_relative_to(staging.resolve()):
                    raise WheelError(f"{wheel.name}: member {member.filename!r} leaves the install folder")
                archive.extract(member, staging)
        (staging / MARKER).write_text(wheel.name + "\n")
        if dest.exists():  # an incomplete earlier attempt (no marker): replace it
            shutil.rmtree(dest)
        staging.rename(dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return dest


def install(name: str, version: str, *, wheel_dirs: Iterable = (), keep: Callable[[str], bool] = None,
            pip_args: Iterable = ()) -> Path:
    """The unpacked `name==version` in the cache, installing it first if needed. Returns its folder
    (the one to put in front of the import path: it holds the top-level packages)."""
    dest = install_dir(name, version)
    if (dest / MARKER).is_file():
        return dest
    with _install_lock(dest):  # several processes (pytest-xdist workers, campaign workers) may race here
        if (dest / MARKER).is_file():
            return dest
        wheel = find_wheel(name, version, wheel_dirs) or download(name, version, pip_args)
        return unpack(wheel, dest, keep or (lambda member: True))


@contextlib.contextmanager
def _install_lock(dest: Path) -> Iterator[None]:
    """An exclusive lock on `<dest>.lock` (POSIX `flock`), held while one process installs `dest`."""
    import fcntl
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.parent / f".{dest.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def importable(name: str, version: str) -> bool:
    """Whether `name` is installed normally (importable without this module) at exactly `version`."""
    try:
        return importlib.metadata.version(name) == version
    except importlib.metadata.PackageNotFoundError:
        return False


def python_sources(member: str) -> bool:
    """A `keep` filter: Python sources and the wheel's metadata; no compiled code or bundled binaries,
    which cannot load on the machines these loaders are for (a vLLM wheel: 50 MB kept of 840)."""
    return member.endswith(".py") or ".dist-info/" in member


# ---------------------------------------------------------------------- stubs and the private loader


@dataclass(frozen=True)
class Stub:
    """One entry of an adapter's stub table. `why` is said in the docs and in errors.

    hollow: the module is a package whose submodules load from the wheel but whose `__init__` is
    skipped. Otherwise the module holds only what `provide(module)` sets, and, with `any_name`, any
    other name read from it is `unavailable` (for a grab-bag import such as psutil, whose names a
    module reads at import time for annotations and defaults; using one still raises)."""
    why: str
    provide: Callable[[types.ModuleType], None] = None
    hollow: bool = False
    any_name: bool = False


class _UnavailableMeta(type):
    """Class attributes of a stubbed name (an enum member used as a default argument, say) are
    stubbed names too, so module-level references import; using any of them raises."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return unavailable(f"{cls.__qualname__}.{name}", cls.__pagedkv_why__)


def unavailable(qualname: str, why: str) -> type:
    """A stubbed name: a class, so importing, subclassing and `isinstance` work; making one raises,
    saying which stub and why (the code under test must never need it)."""
    message = f"{qualname} is stubbed by pagedkv ({why}); the code under test used it"

    def refuse(self, *args, **kwargs):
        raise RuntimeError(message)

    return _UnavailableMeta(qualname.rpartition(".")[2], (), {
        "__init__": refuse, "__doc__": message, "__qualname__": qualname, "__pagedkv_why__": why,
        "__init_subclass__": classmethod(lambda cls, **kw: None)})


def placeholders(*names: str, **values) -> Callable[[types.ModuleType], None]:
    """A `provide` that defines each of `names` as `unavailable` and each of `values` as given
    (plain constants the importing modules read, such as a medium name)."""
    def provide(module: types.ModuleType) -> None:
        why = getattr(module, "__pagedkv_stub__", "stub")
        for name in names:
            setattr(module, name, unavailable(f"{module.__name__}.{name}", why))
        for name, value in values.items():
            setattr(module, name, value)
    return provide


def _any_name(module_name: str, why: str, name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    return unavailable(f"{module_name}.{name}", why)


class _StubLoader(importlib.abc.Loader):
    def __init__(self, stub: Stub):
        self.stub = stub

    def create_module(self, spec):
        return None  # the default module object

    def exec_module(self, module):
        module.__pagedkv_stub__ = self.stub.why
        if self.stub.provide is not None:
            self.stub.provide(module)
        if self.stub.any_name:
            module.__getattr__ = functools.partial(_any_name, module.__name__, self.stub.why)


class _EngineFinder(importlib.abc.MetaPathFinder):
    """Resolves the engine's packages from `root` and serves the stub table (installed while loading)."""

    def __init__(self, roots: tuple, packages: frozenset, stubs: Mapping[str, Stub]):
        self.roots, self.packages, self.stubs = roots, packages, stubs

    def find_spec(self, fullname, path, target=None):
        stub = self.stubs.get(fullname)
        if stub is not None and stub.hollow:
            real = self._real_spec(fullname, path)
            if real is None or real.submodule_search_locations is None:
                raise ImportError(f"hollow stub {fullname!r}: no such package in {self.roots}")
            spec = importlib.machinery.ModuleSpec(fullname, _StubLoader(stub), is_package=True)
            spec.submodule_search_locations = list(real.submodule_search_locations)
            return spec
        if stub is not None:
            return importlib.machinery.ModuleSpec(fullname, _StubLoader(stub), is_package=True)
        if fullname in self.packages:
            return importlib.machinery.PathFinder.find_spec(fullname, [str(root) for root in self.roots])
        return None  # submodules: found through the parent's __path__, which lies under root

    def _real_spec(self, fullname, path):
        search = [str(root) for root in self.roots] if "." not in fullname else path
        return importlib.machinery.PathFinder.find_spec(fullname, search)


def _owned(name: str, packages: frozenset, stubs: Mapping) -> bool:
    return name.partition(".")[0] in packages or name in stubs


@dataclass
class LoadedEngine:
    """The modules of one engine version, outside `sys.modules` (see the module docstring)."""
    roots: tuple
    packages: frozenset
    stubs: Mapping[str, Stub]
    modules: dict = field(default_factory=dict)

    def __getitem__(self, name: str) -> types.ModuleType:
        return self.modules[name]

    @contextlib.contextmanager
    def active(self) -> Iterator["LoadedEngine"]:
        """The engine's modules (and its finder) in `sys.modules` for the duration; the user's back after."""
        finder = _EngineFinder(self.roots, self.packages, self.stubs)
        saved = {name: sys.modules.pop(name) for name in list(sys.modules) if _owned(name, self.packages, self.stubs)}
        sys.modules.update(self.modules)
        sys.meta_path.insert(0, finder)
        try:
            yield self
        finally:
            sys.meta_path.remove(finder)
            for name in [n for n in sys.modules if _owned(n, self.packages, self.stubs)]:
                self.modules[name] = sys.modules.pop(name)  # lazily imported ones are kept too
            sys.modules.update(saved)
            importlib.invalidate_caches()

    def load(self, names: Iterable[str]) -> "LoadedEngine":
        with self.active():
            for name in names:
                importlib.import_module(name)
        return self


class InstalledEngine(dict):
    """The modules of a normally installed engine: the same interface as `LoadedEngine`."""

    @contextlib.contextmanager
    def active(self) -> Iterator["InstalledEngine"]:
        yield self  # already in sys.modules, with the ordinary import system behind it


def installed(modules: Iterable[str]) -> InstalledEngine:
    """Import `modules` normally (the engine is installed in the user's environment)."""
    return InstalledEngine({name: importlib.import_module(name) for name in modules})


def load(roots: Iterable[Path], packages: Iterable[str], modules: Iterable[str],
         stubs: Mapping[str, Stub] = None) -> LoadedEngine:
    """Import `modules` (and what they import) of the top-level `packages` from the `roots` (the
    engine's folder and those of the pure-Python dependencies it needs), privately."""
    return LoadedEngine(tuple(Path(root) for root in roots), frozenset(packages), dict(stubs or {})).load(modules)
