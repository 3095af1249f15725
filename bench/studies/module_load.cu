// bench/studies/module_load.cu — what loading a module (cuModuleLoadData of PTX, then
// cuModuleGetFunction, then the first launch) waits for, and whom it holds up, while another
// kernel runs that ends only when the host says so.
//
//   evr-module-load [--rounds 3]
//   CUDA_MODULE_LOADING=EAGER evr-module-load
//
// Why: evr once loaded its fence kernel when a device first had more busy streams than hardware
// queues. Loaded on the submitting thread, tests whose kernels wait for the host hung; loaded on
// a thread of its own, the bench's lockstep rows (kernels that wait for the host) still hung.
// CUDA's programming guide says that loading a kernel may need the context to synchronise. If the
// load also holds up other threads' driver calls until it ends, a program whose kernels wait for
// a host thread's next call deadlocks, and evr must load its kernels only where it knows no such
// kernel runs.
//
// Each round, for each case:
//   1. a one-thread kernel on stream A spins until a word of mapped host memory is set, or
//      until 2 s of the GPU's timer have passed (so that no case can hang the study);
//   2. a loader thread loads a fresh module of a one-thread PTX kernel (the text differs by
//      round, so that the driver cannot reuse an earlier one), gets its function and launches it
//      once on stream B, timing each step from the kernel's start;
//   3. the main thread, 50 ms after the loader began, makes driver calls of its own on stream C
//      (an event record, a launch of a kernel already loaded, a stream query), timing each, and
//      at 300 ms sets the word.
// A step that ends only after 300 ms waited for the spinning kernel; a main-thread call that
// takes about 2 s was held up by the load, which waited for the kernel, which waited for the
// main thread: the deadlock, ended here by the kernel's own time limit.
// Cases: "load" (all three steps while the kernel spins), "preloaded" (the module loaded and its
// function got before the kernel starts; only the first launch while it spins), and "no spin"
// (all three with nothing running: the steps' own cost). Then "capture": a load while another
// thread captures a graph in the global mode (a load is a call CUDA may refuse then), from a
// thread in the default global mode and from one switched to the relaxed mode: what the load
// returned, and whether the other thread's capture survived.
#include <cuda.h>  // driver types only: the functions are fetched at run time
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "study_common.cuh"

namespace {

using study::check;
using clock_type = std::chrono::steady_clock;

using module_load_data_fn = CUresult(CUDAAPI*)(CUmodule*, const void*);
using module_get_function_fn = CUresult(CUDAAPI*)(CUfunction*, CUmodule, const char*);
using launch_kernel_fn = CUresult(CUDAAPI*)(CUfunction, unsigned, unsigned, unsigned, unsigned,
                                            unsigned, unsigned, unsigned, CUstream, void**, void**);

struct driver {
  module_load_data_fn load_data =
      reinterpret_cast<module_load_data_fn>(study::driver_entry_point("cuModuleLoadData"));
  module_get_function_fn get_function =
      reinterpret_cast<module_get_function_fn>(study::driver_entry_point("cuModuleGetFunction"));
  launch_kernel_fn launch =
      reinterpret_cast<launch_kernel_fn>(study::driver_entry_point("cuLaunchKernel"));
};

void check_driver(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "%s: CUresult %d\n", what, static_cast<int>(r));
    std::exit(1);
  }
}

/// A one-thread kernel that stores `salt` to its parameter's address: PTX whose text differs by
/// salt, so each load is a new module.
std::string ptx_for(int salt) {
  return ".version 7.0\n.target sm_70\n.address_size 64\n"
         ".visible .entry marker(.param .u64 p)\n{\n"
         "  .reg .b64 %rd<3>;\n"
         "  ld.param.u64 %rd1, [p];\n"
         "  cvta.to.global.u64 %rd2, %rd1;\n"
         "  st.global.u64 [%rd2], " +
         std::to_string(salt) + ";\n  ret;\n}\n";
}

/// Spins until *stop is non-zero or `limit_ns` of the GPU's timer have passed.
__global__ void spin_until_or(volatile const unsigned* stop, unsigned long long limit_ns) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (*stop == 0 && now - start < limit_ns);
}

double ms_since(clock_type::time_point start) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - start).count();
}

struct loaded_module {
  CUmodule module = nullptr;
  CUfunction function = nullptr;
};

loaded_module load_module(const driver& d, const std::string& ptx, double* load_ms,
                          double* function_ms, clock_type::time_point from) {
  loaded_module m;
  check_driver(d.load_data(&m.module, ptx.c_str()), "cuModuleLoadData");
  *load_ms = ms_since(from);
  check_driver(d.get_function(&m.function, m.module, "marker"), "cuModuleGetFunction");
  *function_ms = ms_since(from);
  return m;
}

double launch_once(const driver& d, const loaded_module& m, cudaStream_t s,
                   unsigned long long* target, clock_type::time_point from) {
  void* params[] = {&target};
  check_driver(
      d.launch(m.function, 1, 1, 1, 1, 1, 1, 0, reinterpret_cast<CUstream>(s), params, nullptr),
      "cuLaunchKernel");
  return ms_since(from);
}

enum class scenario { load, preloaded, no_spin };
const char* name_of(scenario s) {
  return s == scenario::load ? "load" : s == scenario::preloaded ? "preloaded" : "no spin";
}

void run_case(const driver& d, scenario sc, int salt, cudaStream_t a, cudaStream_t b,
              cudaStream_t c, cudaEvent_t event, unsigned long long* target) {
  study::mapped_words stop(1);
  const std::string ptx = ptx_for(salt);
  double load_ms = -1, function_ms = -1, launch_ms = -1;
  loaded_module pre;
  if (sc == scenario::preloaded) {
    double unused1, unused2;
    pre = load_module(d, ptx, &unused1, &unused2, clock_type::now());
  }
  const bool spin = sc != scenario::no_spin;
  if (spin) spin_until_or<<<1, 1, 0, a>>>(stop.device, 2'000'000'000ull);
  check(cudaGetLastError(), "spin launch");
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the spinning kernel starts
  const auto start = clock_type::now();
  std::thread loader([&] {
    check(cudaSetDevice(0), "cudaSetDevice");
    const loaded_module m =
        sc == scenario::preloaded ? pre : load_module(d, ptx, &load_ms, &function_ms, start);
    launch_ms = launch_once(d, m, b, target, start);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  study::call_times record, launch, query;
  record.time([&] { return cudaEventRecord(event, c); });
  launch.time([&] {
    study::busy_kernel<<<1, 1, 0, c>>>(1000);
    return cudaGetLastError();
  });
  query.time([&] { return cudaStreamQuery(c); });
  const double main_done_ms = ms_since(start);
  while (ms_since(start) < 300) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  *static_cast<volatile unsigned*>(stop.host) = 1;
  const double stop_ms = ms_since(start);
  loader.join();
  check(cudaDeviceSynchronize(), "synchronize");
  std::printf("%-10s %9.1f %9.1f %9.1f %9.3f %9.3f %9.3f %9.1f %9.1f\n", name_of(sc), load_ms,
              function_ms, launch_ms, record.ns[0] / 1e6, launch.ns[0] / 1e6, query.ns[0] / 1e6,
              main_done_ms, stop_ms);
}

/// While another thread captures a graph in the global mode, loads a new module on this thread,
/// in this thread's default (global) capture mode or switched to relaxed, and prints what the load
/// and the other thread's end of capture returned.
void run_capture_case(const driver& d, bool relaxed, int salt) {
  cudaStream_t captured;
  check(cudaStreamCreateWithFlags(&captured, cudaStreamNonBlocking), "stream");
  std::atomic<int> phase{0};
  cudaError_t begin = cudaSuccess, end = cudaSuccess;
  cudaGraph_t graph = nullptr;
  std::thread capturer([&] {
    check(cudaSetDevice(0), "cudaSetDevice");
    begin = cudaStreamBeginCapture(captured, cudaStreamCaptureModeGlobal);
    study::busy_kernel<<<1, 1, 0, captured>>>(1000);
    phase = 1;
    while (phase.load() != 2) std::this_thread::yield();
    study::busy_kernel<<<1, 1, 0, captured>>>(1000);
    end = cudaStreamEndCapture(captured, &graph);
  });
  while (phase.load() != 1) std::this_thread::yield();
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  if (relaxed) check(cudaThreadExchangeStreamCaptureMode(&mode), "capture mode");
  CUmodule module = nullptr;
  CUfunction function = nullptr;
  const std::string ptx = ptx_for(salt);
  const CUresult loaded = d.load_data(&module, ptx.c_str());
  const CUresult got =
      loaded == CUDA_SUCCESS ? d.get_function(&function, module, "marker") : loaded;
  if (relaxed) check(cudaThreadExchangeStreamCaptureMode(&mode), "capture mode");
  phase = 2;
  capturer.join();
  std::printf(
      "capture, %-8s load %d, function %d; the other thread: begin %d, end capture %d "
      "(%s)\n",
      relaxed ? "relaxed" : "global", static_cast<int>(loaded), static_cast<int>(got),
      static_cast<int>(begin), static_cast<int>(end), cudaGetErrorName(end));
  if (graph != nullptr) cudaGraphDestroy(graph);
  (void)cudaGetLastError();
  cudaStreamDestroy(captured);
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 3;
  if (argc == 3 && !std::strcmp(argv[1], "--rounds")) rounds = std::atoi(argv[2]);
  if ((argc != 1 && argc != 3) || rounds < 1) {
    std::fprintf(stderr, "usage: %s [--rounds N >= 1]\n", argv[0]);
    return 2;
  }
  check(cudaSetDevice(0), "cudaSetDevice");
  const driver d;
  cudaStream_t a, b, c;
  for (cudaStream_t* s : {&a, &b, &c})
    check(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking), "stream");
  cudaEvent_t event;
  check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "event");
  unsigned long long* target = nullptr;
  check(cudaMalloc(&target, sizeof(*target)), "cudaMalloc");
  study::busy_kernel<<<1, 1, 0, c>>>(1000);  // the study's own kernels loaded before any case
  check(cudaDeviceSynchronize(), "warm-up");
  const char* mode = std::getenv("CUDA_MODULE_LOADING");
  std::printf("CUDA_MODULE_LOADING=%s; ms from the loader's start; the host ends the spin at 300\n",
              mode != nullptr ? mode : "(unset)");
  std::printf("%-10s %9s %9s %9s %9s %9s %9s %9s %9s\n", "case", "loaded", "function", "launched",
              "record", "launch", "query", "main-done", "stop-set");
  int salt = 1;
  for (int r = 0; r < rounds; ++r)
    for (scenario sc : {scenario::no_spin, scenario::load, scenario::preloaded})
      run_case(d, sc, salt++, a, b, c, event, target);
  std::printf("CUDA error values: 0 success, 900 capture unsupported, 901 capture invalidated\n");
  for (int r = 0; r < rounds; ++r)
    for (bool relaxed : {false, true}) run_capture_case(d, relaxed, salt++);
  return 0;
}
