# Runs every evr-bench subcommand at a small size on the simulated device and checks each JSON
# file is well formed and complete. No timing assertion (CI machines are not the GPU).
file(MAKE_DIRECTORY ${OUT})
set(args_latency --device sim --samples 20 --warmup 2 --gap-us 50)
set(args_throughput --device sim --streams 8 --ops 2000 --threads 2 --inflight-streams 16 --inflight-waits 2000)
set(args_pool --device sim --ms 20 --threads 1,2)
set(args_cpu --device sim --waits 100)
set(args_idle --device sim --lengths-us 200,2000 --streams 1,3 --scale 0.03 --floor-samples 20
    --methods default,fence-spin,ladder,host-func-promise)
set(args_sim --ops 2000 --streams 4 --waits 2000 --repeat 1)
set(args_calls --device sim --batches 5 --per-batch 16)
foreach(name latency throughput pool cpu idle sim calls)
  execute_process(COMMAND ${BENCH} ${name} --budget-s 240 ${args_${name}} --json ${OUT}/${name}.json
                  RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "evr-bench ${name} ${args_${name}} failed (${rc})")
  endif()
  execute_process(COMMAND python3 ${CHECK} ${name} ${OUT}/${name}.json RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${OUT}/${name}.json is incomplete (${rc})")
  endif()
endforeach()
