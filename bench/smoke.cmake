# Runs every evr-bench subcommand at a small size on the simulated device and checks each JSON
# file is well formed and complete. No timing assertion (CI machines are not the GPU).
file(MAKE_DIRECTORY ${OUT})
set(args_latency --device sim --samples 20 --warmup 2 --gap-us 50)
set(args_throughput --device sim --streams 8 --ops 2000 --threads 2 --inflight-streams 16 --inflight-waits 2000)
set(args_pool --device sim --ms 20 --threads 1,2)
set(args_cpu --device sim --waits 100)
set(args_idle --device sim --lengths-us 200,2000 --streams 1,3 --scale 0.03 --floor-samples 20
    --methods default,fence-spin,ladder,host-func-promise)
foreach(name latency throughput pool cpu idle)
  execute_process(COMMAND ${BENCH} ${name} ${args_${name}} --json ${OUT}/${name}.json RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "evr-bench ${name} ${args_${name}} failed (${rc})")
  endif()
  execute_process(COMMAND python3 ${CHECK} ${name} ${OUT}/${name}.json RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${OUT}/${name}.json is incomplete (${rc})")
  endif()
endforeach()
