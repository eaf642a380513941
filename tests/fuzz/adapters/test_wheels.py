"""fuzz/adapters/wheels.py on wheels built here: install into the cache, refuse unsafe members, load a
package privately with its stub table, and leave the user's sys.modules as it was."""

import sys
import zipfile

import pytest

from pagedkv.fuzz.adapters import wheels
from pagedkv.fuzz.adapters.wheels import Stub, WheelError, placeholders

ENGINE = {
    "toyengine/__init__.py": "import toyengine_gpu_runtime  # what a hollow stub must skip\n",
    "toyengine/core.py": ("from toyengine.gpu import Device, KIND\n"
                          "from toyengine.alloc import take\n"
                          "def lazy():\n    from toyengine.alloc import take as again\n    return again\n"),
    "toyengine/gpu.py": "raise ImportError('needs a GPU')\n",
    "toyengine/alloc.py": "def take(n):\n    return list(range(n))\n",
    "toyengine/_C.so": "not loadable here",
    "toyengine-1.0.dist-info/METADATA": "Name: toyengine\nVersion: 1.0\n",
}
STUBS = {"toyengine": Stub("runtime setup", hollow=True),
         "toyengine.gpu": Stub("the GPU runtime", placeholders("Device", KIND="gpu"))}


def build_wheel(folder, members, name="toyengine-1.0-py3-none-any.whl"):
    path = folder / name
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in members.items():
            archive.writestr(member, text)
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PAGEDKV_WHEEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("PAGEDKV_WHEEL_DIRS", raising=False)
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    build_wheel(wheelhouse, ENGINE)
    return wheelhouse


def test_install_unpacks_a_wheel_from_a_folder_into_the_cache_keeping_what_is_asked(cache, tmp_path):
    root = wheels.install("toyengine", "1.0", wheel_dirs=[cache], keep=wheels.python_sources)
    assert root == tmp_path / "cache" / "toyengine-1.0"
    assert (root / "toyengine" / "alloc.py").read_text().startswith("def take")
    assert not (root / "toyengine" / "_C.so").exists()            # compiled code is left in the wheel
    assert (root / "toyengine-1.0.dist-info" / "METADATA").exists()
    assert (root / wheels.MARKER).read_text().strip() == "toyengine-1.0-py3-none-any.whl"


def test_a_completed_install_is_reused_without_the_wheel(cache):
    root = wheels.install("toyengine", "1.0", wheel_dirs=[cache])
    (cache / "toyengine-1.0-py3-none-any.whl").unlink()
    assert wheels.install("toyengine", "1.0", wheel_dirs=[cache]) == root


def test_wheel_dirs_from_the_environment(cache, monkeypatch):
    monkeypatch.setenv("PAGEDKV_WHEEL_DIRS", str(cache))
    assert wheels.find_wheel("toyengine", "1.0") == cache / "toyengine-1.0-py3-none-any.whl"
    assert wheels.find_wheel("toyengine", "2.0") is None


def test_a_member_leaving_the_folder_is_refused_and_nothing_is_installed(tmp_path, monkeypatch):
    monkeypatch.setenv("PAGEDKV_WHEEL_CACHE", str(tmp_path / "cache"))
    evil = build_wheel(tmp_path, {"toyengine/__init__.py": "", "../../escaped.py": "x = 1\n"})
    with pytest.raises(WheelError, match="leaves the install folder"):
        wheels.unpack(evil, wheels.install_dir("toyengine", "1.0"))
    assert not wheels.install_dir("toyengine", "1.0").exists()
    assert not (tmp_path / "escaped.py").exists()
    assert list((tmp_path / "cache").iterdir()) == []             # the staging folder is gone too


def test_a_failed_download_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("PAGEDKV_WHEEL_CACHE", str(tmp_path / "cache"))
    with pytest.raises(WheelError, match="pip download of pagedkv-no-such-engine==0.0.1 failed"):
        wheels.install("pagedkv-no-such-engine", "0.0.1", pip_args=["--no-index"])


def test_load_is_private_and_serves_the_stubs_only_while_loading(cache):
    root = wheels.install("toyengine", "1.0", wheel_dirs=[cache])
    before_modules, before_finders = dict(sys.modules), list(sys.meta_path)
    engine = wheels.load([root], ["toyengine"], ["toyengine.core"], STUBS)
    assert sys.meta_path == before_finders
    assert not [name for name in set(sys.modules) - set(before_modules) if name.startswith("toyengine")]
    core = engine["toyengine.core"]
    assert core.take(3) == [0, 1, 2]                               # the real module, from the wheel
    assert core.KIND == "gpu" and engine["toyengine.gpu"].__pagedkv_stub__ == "the GPU runtime"
    with pytest.raises(RuntimeError, match="toyengine.gpu.Device is stubbed by pagedkv"):
        core.Device()
    with pytest.raises(ModuleNotFoundError):                      # lazy imports need active()
        core.lazy()
    with engine.active():
        assert core.lazy() is core.take
    assert "toyengine" not in sys.modules


def test_loading_sets_aside_and_restores_another_version(cache):
    root = wheels.install("toyengine", "1.0", wheel_dirs=[cache])
    other = type(sys)("toyengine")
    sys.modules["toyengine"] = other
    try:
        engine = wheels.load([root], ["toyengine"], ["toyengine.alloc"], STUBS)
        assert sys.modules["toyengine"] is other
        assert engine["toyengine"] is not other
    finally:
        del sys.modules["toyengine"]


def test_without_a_hollow_stub_the_package_init_runs(cache):
    root = wheels.install("toyengine", "1.0", wheel_dirs=[cache])
    with pytest.raises(ModuleNotFoundError, match="toyengine_gpu_runtime"):
        wheels.load([root], ["toyengine"], ["toyengine.alloc"], {})
    assert "toyengine" not in sys.modules


def test_an_install_waits_for_one_in_progress(cache, tmp_path):
    """pytest-xdist and campaign workers install the same wheel at once: while one holds the install
    lock the others wait, then find its folder complete and reuse it."""
    import multiprocessing

    dest = wheels.install_dir("toyengine", "1.0")
    context = multiprocessing.get_context("spawn")
    with wheels._install_lock(dest):
        child = context.Process(target=_install_in_child, args=(str(tmp_path / "cache"), str(cache)))
        child.start()
        child.join(timeout=3)
        assert child.is_alive() and not dest.exists()      # blocked on the lock, nothing unpacked
        wheels.unpack(cache / "toyengine-1.0-py3-none-any.whl", dest)
        unpacked = (dest / wheels.MARKER).stat().st_ino
    child.join(timeout=60)
    assert child.exitcode == 0
    assert (dest / wheels.MARKER).stat().st_ino == unpacked     # reused, not unpacked again
    assert [p.name for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock")] == ["toyengine-1.0"]


def _install_in_child(cache_root, wheelhouse):
    import os
    os.environ["PAGEDKV_WHEEL_CACHE"] = cache_root
    wheels.install("toyengine", "1.0", wheel_dirs=[wheelhouse])
