"""Builds evr._evr with evr's own CMake build (target evr_python) and puts it in the package.

  pip install ./python                                  # from the repository root, with an index
  pip install --no-build-isolation ./python             # offline: see README.md (which venv)
  python -m build ./python                              # sdist + wheel (the wheel from the sdist)
  EVR_CMAKE_ARGS="-DEVR_THIRD_PARTY_INCLUDE_DIR=$PWD/.deps/include" pip install ...  # staged headers

Where the C++ sources are: EVR_SOURCE_DIR when set; else cpp/ beside this file (an sdist: its
sdist command copies the C++ tree there); else the repository this folder is in.

The version is the C++ library's: project(evr VERSION x.y.z) of that CMakeLists.txt, for the
wheel's metadata here and compiled into the module (evr.__version__) by python/CMakeLists.txt.

The CMake build uses this Python (sys.executable) and its pybind11 when it has one, else the
system's pybind11. The CUDA backend is built when CMake finds the CUDA toolkit (EVR_WITH_CUDA
AUTO); EVR_CMAKE_ARGS=-DEVR_WITH_CUDA=OFF builds the simulated device only, =ON insists.
"""

import os
import re
import shlex
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.command.sdist import sdist
from setuptools.extension import Extension

HERE = os.path.dirname(os.path.abspath(__file__))
SDIST_CPP = "cpp"  # the C++ tree's folder inside an sdist

# What the CMake build of evr_python reads, relative to the repository: the library and the
# binding's own CMake part, and the license the library installs beside its headers. Tests,
# examples, bench, docs stay out (setup.py turns them off).
CPP_PATHS = [
    "LICENSE", "CMakeLists.txt", "cmake", "include", "device", "pool", "reactor", "callbacks",
    "third_party",
    "python/CMakeLists.txt", "python/check_pytest.cmake", "python/src", "python/evr",
]


def source_dir():
    env = os.environ.get("EVR_SOURCE_DIR")
    candidates = [env] if env else [os.path.join(HERE, SDIST_CPP), os.path.dirname(HERE)]
    for c in candidates:
        if os.path.exists(os.path.join(c, "CMakeLists.txt")):
            return os.path.abspath(c)
    raise RuntimeError("evr: no CMakeLists.txt of evr in " + " or ".join(candidates) + "; set "
                       "EVR_SOURCE_DIR to the repository (pip install <repo>/python)")


def evr_version(source):
    path = os.path.join(source, "CMakeLists.txt")
    with open(path, encoding="utf-8") as f:
        m = re.search(r"\bproject\(\s*evr\s+VERSION\s+([0-9]+(?:\.[0-9]+)*)", f.read())
    if not m:
        raise RuntimeError(f"evr: no 'project(evr VERSION x.y.z' in {path}")
    return m.group(1)


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        source = source_dir()
        build = os.path.abspath(os.path.join(self.build_temp, "cmake"))
        os.makedirs(build, exist_ok=True)
        args = [
            "cmake", "-S", source, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
            "-DEVR_BUILD_PYTHON=ON", "-DEVR_BUILD_TESTS=OFF", "-DEVR_BUILD_EXAMPLES=OFF",
            "-DEVR_BUILD_BENCH=OFF", f"-DPython3_EXECUTABLE={sys.executable}",
        ]
        cache = os.path.join(build, "CMakeCache.txt")
        reuse_generator = os.path.exists(cache)
        if not reuse_generator and subprocess.call(["ninja", "--version"], stdout=subprocess.DEVNULL,
                                                   stderr=subprocess.DEVNULL) == 0:
            args += ["-G", "Ninja"]
        args += shlex.split(os.environ.get("EVR_CMAKE_ARGS", ""))
        # pip shows these (and CMake's output) with -v; the whole build takes a minute or two.
        print(f"evr: configuring evr's C++ build (CMake) in {build}", flush=True)
        subprocess.check_call(args)
        print("evr: compiling the extension module evr._evr", flush=True)
        jobs = os.environ.get("EVR_JOBS", str(os.cpu_count() or 2))
        subprocess.check_call(["cmake", "--build", build, "--target", "evr_python", "-j", jobs])
        built = os.path.join(build, "python", "evr", os.path.basename(self.get_ext_fullpath(ext.name)))
        dest = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        self.copy_file(built, dest)


def _tracked_files(repo, paths):
    """The files under `paths` that git tracks in `repo` (None when `repo` is no git checkout)."""
    try:
        out = subprocess.run(["git", "-C", repo, "ls-files", "-z", "--"] + paths,
                             capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    files = [f for f in out.decode().split("\0") if f]
    return [f for f in files if os.path.isfile(os.path.join(repo, f))] or None


def _walked_files(root, paths):
    files = []
    for p in paths:
        full = os.path.join(root, p)
        if os.path.isfile(full):
            files.append(p)
            continue
        for d, dirs, names in os.walk(full):
            dirs[:] = [x for x in dirs if x != "__pycache__" and not x.startswith(("build", "."))]
            files += [os.path.relpath(os.path.join(d, n), root) for n in names
                      if not n.endswith((".pyc", ".so"))]
    return files


class SdistWithCpp(sdist):
    """The sdist of ./python alone could not build: it also carries the C++ tree the extension is
    built from, in cpp/ (from the repository: the files git tracks; from an unpacked sdist: its
    cpp/). Installing from the sdist still needs CMake, a C++20 compiler and the system headers
    evr uses (Asio, moodycamel::ConcurrentQueue), as a build from the repository does."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        source = source_dir()
        files = _tracked_files(source, CPP_PATHS) or _walked_files(source, CPP_PATHS)
        for rel in files:
            dest = os.path.join(base_dir, SDIST_CPP, rel)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            shutil.copy2(os.path.join(source, rel), dest)
        print(f"evr: sdist: {len(files)} files of the C++ tree ({source}) in {SDIST_CPP}/")


def _check_wheel_package():
    """setuptools < 70.1 builds wheels (and their metadata) with the `wheel` package. Without it,
    pip --no-build-isolation fails with "invalid command 'bdist_wheel'"; say what to do instead."""
    if not {"bdist_wheel", "dist_info", "editable_wheel"} & set(sys.argv[1:]):
        return
    import setuptools
    try:
        major, minor = (int(x) for x in setuptools.__version__.split(".")[:2])
    except ValueError:
        return
    if (major, minor) >= (70, 1):
        return
    try:
        import wheel  # noqa: F401
    except ImportError:
        sys.exit(f"evr: setuptools {setuptools.__version__} ({sys.executable}) needs the 'wheel' "
                 "package to build a wheel, and this Python has none. With a package index: "
                 "pip install ./python (without --no-build-isolation: pip fetches what "
                 "pyproject.toml declares). Offline on Debian/Ubuntu: apt-get install "
                 "python3-wheel python3-setuptools python3-pybind11, then a venv made with "
                 "/usr/bin/python3 -m venv --system-site-packages (python/README.md).")


_check_wheel_package()

setup(
    version=evr_version(source_dir()),
    ext_modules=[Extension("evr._evr", sources=[])],
    cmdclass={"build_ext": CMakeBuild, "sdist": SdistWithCpp},
)
