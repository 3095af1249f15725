# ctest helper: runs an example's command line and checks how it ends.
#   cmake -DEXE=<program> "-DARGS=--device;nowhere" -DEXPECT=fail "-DMATCH=--device" -P check_cli.cmake
# EXPECT=ok: exit status 0; EXPECT=fail: a non-zero exit status. MATCH: a regular expression that
# stdout + stderr must contain (for --help: the usage names the option; for a bad value: the
# message names the option).
if(NOT EXE OR NOT EXPECT)
  message(FATAL_ERROR "check_cli.cmake: pass -DEXE=<program> and -DEXPECT=ok|fail")
endif()
execute_process(COMMAND "${EXE}" ${ARGS}
  RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
set(all "${out}${err}")
if(EXPECT STREQUAL "ok" AND NOT status EQUAL 0)
  message(FATAL_ERROR "${EXE} ${ARGS}: exit status ${status}, expected 0\n${all}")
endif()
if(EXPECT STREQUAL "fail" AND (status EQUAL 0 OR NOT status MATCHES "^[0-9]+$"))
  message(FATAL_ERROR "${EXE} ${ARGS}: exit status '${status}', expected a non-zero exit\n${all}")
endif()
if(MATCH AND NOT all MATCHES "${MATCH}")
  message(FATAL_ERROR "${EXE} ${ARGS}: the output does not contain '${MATCH}'\n${all}")
endif()
message(STATUS "${EXE} ${ARGS}: exit status ${status}, as expected")
