// bench/subcommands.hpp — the subcommands of evr-bench, one function each. A subcommand gets the
// arguments after its name (argv[0] is the subcommand's name, argv[1..] its options) and returns
// the process's exit code. To add one: declare it here, define it in its own file, add a row to the
// table in main.cpp and the file to add_executable in CMakeLists.txt.
#pragma once

/// `evr-bench pool`: acquire+release pairs per second of evr's event pool and of the pools users
/// write instead, at 1..16 threads (bench/pool_bench.cpp).
int evr_bench_pool(int argc, char** argv);

/// `evr-bench latency`: GPU done -> handler runs, per evr strategy and delivery, against the
/// floor and the baselines a user would pick instead (bench/latency_bench.cpp).
int evr_bench_latency(int argc, char** argv);
/// `evr-bench throughput`: completions/s and reactor CPU per completion; memory per in-flight
/// wait (bench/throughput_bench.cpp).
int evr_bench_throughput(int argc, char** argv);
/// `evr-bench cpu`: reactor CPU while waits sit on a long kernel, and when idle
/// (bench/throughput_bench.cpp).
int evr_bench_cpu(int argc, char** argv);
/// `evr-bench idle`: GPU work of the lengths users run, steady and irregular, on 1 and 64
/// streams: notification latency (ratio to the floor) and CPU per strategy and baseline
/// (bench/idle_bench.cpp).
int evr_bench_idle(int argc, char** argv);
/// `evr-bench sim`: what the simulated device costs: ns per enqueued and per completed operation,
/// and end-to-end completions per second of a reactor on it (bench/sim_bench.cpp).
int evr_bench_sim(int argc, char** argv);
/// `evr-bench calls`: the host's ns per device call on a wait's path and per submit
/// (bench/calls_bench.cpp).
int evr_bench_calls(int argc, char** argv);
/// `evr-bench timer`: how late this machine's timed sleeps end, single and with a short final
/// sleep (bench/timer_bench.cpp). No GPU needed.
int evr_bench_timer(int argc, char** argv);
