"""The package as a user gets it: `evr.sim` after a plain `import evr`, one version everywhere, and
every file that must ship (the extension, the stubs, py.typed) next to the imported package.

Against an installed wheel (scripts/ci/check-python-package.sh sets EVR_EXPECT_INSTALLED=1) the
installed distribution is checked too: evr must be imported from it, its metadata's version must be
evr.__version__, and its RECORD must list the files. From the CMake build tree (ctest) those
checks are skipped: there is no distribution there."""

import importlib.metadata
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import evr

REPO = Path(__file__).resolve().parents[2]
SHIPPED = ["__init__.py", "sim.py", "_errors.py", "_loop.py", "_targets.py", "_signals.py", "__init__.pyi",
           "_evr.pyi", "py.typed", "_evr" + sysconfig.get_config_var("EXT_SUFFIX")]


def installed_distribution():
    """The installed distribution evr was imported from, or None (a build tree, PYTHONPATH)."""
    try:
        dist = importlib.metadata.distribution("evr")
    except importlib.metadata.PackageNotFoundError:
        return None
    init = Path(dist.locate_file("evr/__init__.py"))
    if not init.exists() or init.resolve() != Path(evr.__file__).resolve():
        return None
    return dist


def need_installed():
    dist = installed_distribution()
    if dist is None:
        if os.environ.get("EVR_EXPECT_INSTALLED") == "1":
            pytest.fail(f"EVR_EXPECT_INSTALLED=1 but evr was imported from {evr.__file__}, not "
                        "from an installed distribution")
        pytest.skip(f"evr is not an installed distribution here ({evr.__file__})")
    return dist


def test_sim_after_plain_import():
    # A fresh interpreter: conftest.py has imported evr.sim in this one already.
    code = ("import evr\n"
            "d = evr.sim.Device()\n"
            "s = d.stream()\n"
            "d.launch_kernel(s, 0.001)\n"
            "evr.wait_future(s).result(timeout=30)\n"
            "d.shutdown()\n"
            "print(type(d).__module__, evr.sim.__name__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["evr.sim", "evr.sim"]
    assert "sim" in evr.__all__ and evr.sim is sys.modules["evr.sim"]


def test_version_is_the_modules():
    assert re.fullmatch(r"[0-9]+(\.[0-9]+)*", evr.__version__), evr.__version__
    assert evr.__version__ == evr._evr.__version__


def test_version_matches_cmake_project():
    cmake = REPO / "CMakeLists.txt"
    if not cmake.exists():
        pytest.skip(f"no repository around the tests ({cmake})")
    m = re.search(r"\bproject\(\s*evr\s+VERSION\s+([0-9.]+)", cmake.read_text(encoding="utf-8"))
    assert m, f"no project(evr VERSION ...) in {cmake}"
    assert evr.__version__ == m.group(1)


def test_version_matches_installed_metadata():
    dist = need_installed()
    assert dist.version == evr.__version__ == importlib.metadata.version("evr")


def test_shipped_files_present():
    here = Path(evr.__file__).parent
    missing = [f for f in SHIPPED if not (here / f).is_file()]
    assert not missing, f"missing next to {here}: {missing}"
    assert Path(evr._evr.__file__).parent == here


def test_installed_record_lists_shipped_files():
    dist = need_installed()
    listed = {str(f).replace(os.sep, "/") for f in dist.files or []}
    missing = [f for f in SHIPPED if "evr/" + f not in listed]
    assert not missing, f"not in the wheel's RECORD: {missing}"
    # Nothing of the build tree or the repository rides along.
    stray = sorted(f for f in listed if not (f.startswith("evr/") or ".dist-info/" in f
                                             or f.startswith("../") or "__pycache__" in f))
    assert not stray, f"unexpected files installed: {stray}"


def test_build_backend_asks_for_cmake_and_ninja_only_where_missing(monkeypatch):
    """pyproject.toml's backend adds cmake>=3.25 / ninja to the build's requirements only where the
    machine lacks them (the online path CI cannot run; its decision is checked here)."""
    path = Path(__file__).resolve().parents[1] / "build_backend" / "evr_build_backend.py"
    if not path.exists():
        pytest.skip(f"no build backend beside the tests ({path})")
    pytest.importorskip("setuptools.build_meta")
    import importlib.util
    spec = importlib.util.spec_from_file_location("evr_build_backend_under_test", path)
    backend = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(backend)

    def machine(cmake, ninja):
        monkeypatch.setattr(backend, "_cmake_version", lambda: cmake)
        monkeypatch.setattr(backend.shutil, "which", lambda name: "/usr/bin/ninja" if ninja else None)
        return backend._tools()

    cmake, ninja = "cmake>=3.25,<5", "ninja>=1.10,<2"
    assert machine((3, 25), True) == []
    assert machine((3, 31), True) == []
    assert machine((3, 18), True) == [cmake]
    assert machine(None, True) == [cmake]
    assert machine((3, 25), False) == [ninja]
    assert machine(None, False) == [cmake, ninja]
    assert backend.build_wheel is backend._setuptools.build_wheel
    assert backend.build_sdist is backend._setuptools.build_sdist
