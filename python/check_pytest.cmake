# ctest entry python_tests: runs pytest on the given folder and fails on any non-zero exit,
# including 5 ("no tests collected", which a plain exit-code check would also catch, but say so).
#   cmake -DPYTHON=... -DTESTS=<folder> -DWORKDIR=<folder> -P check_pytest.cmake
execute_process(
  COMMAND ${PYTHON} -m pytest -q -p no:cacheprovider ${TESTS}
  WORKING_DIRECTORY ${WORKDIR}
  RESULT_VARIABLE rc)
if(rc EQUAL 5)
  message(FATAL_ERROR "python_tests: pytest collected no tests in ${TESTS}")
elseif(NOT rc EQUAL 0)
  message(FATAL_ERROR "python_tests: pytest failed (exit ${rc})")
endif()
