# evrPython.cmake — decides whether the Python binding (python/) is built: EVR_BUILD_PYTHON is
# ON, OFF or AUTO (the default: built when a Python with its development files and pybind11 are
# found). Sets EVR_PYTHON_ENABLED, Python3_EXECUTABLE, EVR_PYBIND11_INCLUDE_DIRS,
# EVR_PYTHON_EXT_SUFFIX. See python/CMakeLists.txt for how the Python and pybind11 are chosen.

set(EVR_PYTHON_ENABLED OFF)
if(EVR_BUILD_PYTHON STREQUAL "OFF")
  return()
endif()

function(evr_python_fail why)
  if(EVR_BUILD_PYTHON STREQUAL "ON")
    message(FATAL_ERROR "evr: EVR_BUILD_PYTHON=ON but ${why}")
  endif()
  message(STATUS "evr: Python binding not built: ${why}")
endfunction()

# A Python that can run the tests (imports pytest) is preferred.
if(NOT Python3_EXECUTABLE)
  set(candidates)
  find_program(evr_path_python3 NAMES python3 NO_CACHE)
  foreach(p IN ITEMS "${evr_path_python3}" /usr/bin/python3)
    if(p AND EXISTS "${p}" AND NOT p IN_LIST candidates)
      list(APPEND candidates "${p}")
    endif()
  endforeach()
  set(chosen "")
  foreach(p IN LISTS candidates)
    execute_process(COMMAND "${p}" -c "import pytest, sysconfig, os; assert os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h'))"
      RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
    if(rc EQUAL 0)
      set(chosen "${p}")
      break()
    endif()
  endforeach()
  if(NOT chosen AND candidates)
    list(GET candidates 0 chosen)
  endif()
  if(chosen)
    set(Python3_EXECUTABLE "${chosen}" CACHE FILEPATH "The Python of evr's binding")
  endif()
endif()

find_package(Python3 COMPONENTS Interpreter Development.Module QUIET)
if(NOT Python3_FOUND OR NOT TARGET Python3::Module)
  evr_python_fail("no Python 3 with development files (Debian: python3-dev)")
  return()
endif()

# pybind11's headers: the Python's own pybind11 (pip), else the system's, else staged ones.
set(pb_inc "")
execute_process(COMMAND "${Python3_EXECUTABLE}" -c "import pybind11; print(pybind11.get_include())"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(rc EQUAL 0 AND EXISTS "${out}/pybind11/pybind11.h")
  set(pb_inc "${out}")
else()
  find_path(EVR_PYBIND11_INCLUDE pybind11/pybind11.h
    HINTS ${EVR_THIRD_PARTY_INCLUDE_DIR} PATHS /usr/include /usr/local/include)
  if(EVR_PYBIND11_INCLUDE)
    set(pb_inc "${EVR_PYBIND11_INCLUDE}")
  endif()
endif()
if(NOT pb_inc)
  evr_python_fail("pybind11 was not found (Debian: pybind11-dev; pip: pybind11)")
  return()
endif()
file(STRINGS "${pb_inc}/pybind11/detail/common.h" pb_ver REGEX "define PYBIND11_VERSION_(MAJOR|MINOR) ")
string(REGEX REPLACE ".*MAJOR ([0-9]+).*MINOR ([0-9]+).*" "\\1.\\2" pb_ver "${pb_ver}")

execute_process(COMMAND "${Python3_EXECUTABLE}" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))"
  OUTPUT_VARIABLE suffix OUTPUT_STRIP_TRAILING_WHITESPACE)
set(EVR_PYTHON_EXT_SUFFIX "${suffix}")
set(EVR_PYBIND11_INCLUDE_DIRS "${pb_inc}")
set(EVR_PYTHON_ENABLED ON)
message(STATUS "evr: Python binding ON: ${Python3_EXECUTABLE} (${Python3_VERSION}), pybind11 ${pb_ver} (${pb_inc})")
