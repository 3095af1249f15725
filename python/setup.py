"""Builds evr._evr with evr's own CMake build (target evr_python) and puts it in the package.

  pip install --no-build-isolation ./python            # from the repository root
  EVR_CMAKE_ARGS="-DEVR_THIRD_PARTY_INCLUDE_DIR=$PWD/.deps/include" pip install ...  # staged headers

The CMake build uses this Python (sys.executable) and its pybind11 when it has one, else the
system's pybind11. EVR_SOURCE_DIR names the repository when ./python is not inside it.
"""

import os
import shlex
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.extension import Extension

HERE = os.path.dirname(os.path.abspath(__file__))


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        source = os.environ.get("EVR_SOURCE_DIR", os.path.dirname(HERE))
        if not os.path.exists(os.path.join(source, "CMakeLists.txt")):
            raise RuntimeError(f"evr: no CMakeLists.txt in {source}; set EVR_SOURCE_DIR to the "
                               "repository (pip install --no-build-isolation <repo>/python)")
        build = os.path.abspath(os.path.join(self.build_temp, "cmake"))
        os.makedirs(build, exist_ok=True)
        args = [
            "cmake", "-S", source, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
            "-DEVR_BUILD_PYTHON=ON", "-DEVR_BUILD_TESTS=OFF", "-DEVR_BUILD_EXAMPLES=OFF",
            "-DEVR_BUILD_BENCH=OFF", f"-DPython3_EXECUTABLE={sys.executable}",
        ]
        if subprocess.call(["ninja", "--version"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL) == 0:
            args += ["-G", "Ninja"]
        args += shlex.split(os.environ.get("EVR_CMAKE_ARGS", ""))
        subprocess.check_call(args)
        jobs = os.environ.get("EVR_JOBS", str(os.cpu_count() or 2))
        subprocess.check_call(["cmake", "--build", build, "--target", "evr_python", "-j", jobs])
        built = os.path.join(build, "python", "evr", os.path.basename(self.get_ext_fullpath(ext.name)))
        dest = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        self.copy_file(built, dest)


setup(ext_modules=[CMakeExtension("evr._evr")], cmdclass={"build_ext": CMakeBuild})
