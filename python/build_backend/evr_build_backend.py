"""evr's PEP 517 build backend: setuptools.build_meta, plus CMake and Ninja from the package index
only where the machine has none (or a CMake older than evr needs).

pyproject.toml names this module (backend-path = ["build_backend"]). Everything else, and every
hook, is setuptools' own; only get_requires_for_build_wheel/_editable add to what setuptools asks
for. This is how scikit-build-core decides the same question. With --no-build-isolation (the
offline path) pip installs nothing: the CMake and Ninja on PATH are used, as setup.py always does.
"""

import re
import shutil
import subprocess

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F401,F403  (every hook setuptools provides)

CMAKE_MIN = (3, 25)  # cmake_minimum_required of evr's CMakeLists.txt
# What is asked of the index: from evr's minimum to before the next major release (CMake 4.x and
# Ninja 1.x build evr; pyproject.toml pins its own requirements the same way).
CMAKE_REQUIREMENT = "cmake>=%d.%d,<5" % CMAKE_MIN
NINJA_REQUIREMENT = "ninja>=1.10,<2"


def _cmake_version():
    exe = shutil.which("cmake")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"version (\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _tools():
    need = []
    v = _cmake_version()
    if v is None or v < CMAKE_MIN:
        need.append(CMAKE_REQUIREMENT)
    if shutil.which("ninja") is None:
        need.append(NINJA_REQUIREMENT)
    return need


def get_requires_for_build_wheel(config_settings=None):
    return _setuptools.get_requires_for_build_wheel(config_settings) + _tools()


def get_requires_for_build_editable(config_settings=None):
    return _setuptools.get_requires_for_build_editable(config_settings) + _tools()
