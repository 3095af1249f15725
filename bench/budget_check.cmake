# The budget's own test: a row that cannot finish in its budget ends the run with status 3 and a
# message that names the subcommand and the row (bench/budget.hpp). A 20 ms workload of 300
# samples takes 6 s; the budget is 1 s.
execute_process(
  COMMAND ${BENCH} idle --budget-s 1 --device sim --lengths-us 20000 --streams 1 --no-lockstep
          --no-irregular --no-idle-case --methods default --deliveries post --floor-samples 10
  RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_VARIABLE out)
if(NOT rc EQUAL 3)
  message(FATAL_ERROR "expected exit status 3 from a run over its budget, got '${rc}':\n${err}")
endif()
if(NOT err MATCHES "evr-bench idle: over its budget of 1 s, still in row: steady 20 ms")
  message(FATAL_ERROR "the budget's message does not name the row:\n${err}")
endif()
if(NOT err MATCHES "progress: 1 lanes")
  message(FATAL_ERROR "the budget's message does not say how far the row got:\n${err}")
endif()
