// evr-ipc: a GPU event shared between two processes. The parent queues work, records an
// interprocess event behind it and hands the event's handle (64 bytes, as hex on the command
// line) to a child process. The child opens the event and awaits it through evr, as a second
// server would await the first one's result without polling or blocking a thread.
//
//   evr-ipc [--device auto|cuda|sim]     the parent (no argument: the GPU if there is one; --help)
//   evr-ipc --child HEX                  the child (started by the parent)
//
// CUDA rules this follows: an event to be shared needs cudaEventInterprocess (evr:
// event_flags::interprocess, which excludes timing); the child starts by exec'ing a fresh
// process (posix_spawn: CUDA must not be used in a forked child before exec); the parent keeps the
// event alive until the child is done with it. On the simulated device an event cannot leave its
// process, so there the child's part runs inside the parent, on the same simulated device.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <system_error>

#include <asio.hpp>

#include <evr/evr.hpp>

#include "example_cli.hpp"
#include "example_device.hpp"

extern char** environ;

namespace {

using namespace std::chrono_literals;

std::string to_hex(const evr::device::ipc_event_handle& h) {
  static const char digits[] = "0123456789abcdef";
  std::string s;
  for (unsigned char b : h.bytes) {
    s += digits[b >> 4];
    s += digits[b & 15];
  }
  return s;
}

evr::device::ipc_event_handle from_hex(const std::string& s) {
  evr::device::ipc_event_handle h;
  if (s.size() != 2 * sizeof h.bytes)
    throw std::invalid_argument("the handle must be 128 hex digits");
  for (std::size_t i = 0; i < sizeof h.bytes; ++i)
    h.bytes[i] = static_cast<unsigned char>(std::stoi(s.substr(2 * i, 2), nullptr, 16));
  return h;
}

// The child's part: open the event from its handle and await it through evr. `backend` is the
// CUDA backend in a child process, or the parent's simulated device.
bool child_role(evr::device::backend& backend, const std::string& hex, const char* who) {
  evr::event remote = evr::event::open(backend, from_hex(hex), /*device=*/0);
  const bool pending = !remote.query();
  std::printf("   %s: opened the event; the parent's work is %s\n", who,
              pending ? "still running" : "already done");

  evr::reactor reactor(backend);
  asio::io_context io;
  evr::gpu_waiter waiter(io.get_executor(), reactor);
  std::error_code outcome = asio::error::would_block;
  waiter.async_wait(remote, [&](std::error_code ec) { outcome = ec; });  // the event, not a stream
  io.run();  // returns once the wait completed
  std::printf("   %s: evr says the parent's work is %s\n", who,
              outcome ? outcome.message().c_str() : "done");
  return !outcome;
}

// Starts `this program --child HEX` and returns its pid.
pid_t spawn_child(const char* argv0, const std::string& hex) {
  std::string flag = "--child";
  std::string arg = hex;
  char* args[] = {const_cast<char*>(argv0), flag.data(), arg.data(), nullptr};
  pid_t pid = 0;
  // posix_spawn is fork + an immediate exec: nothing runs in between, CUDA included.
  if (int e = posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, args, environ); e != 0)
    throw std::system_error(e, std::generic_category(), "posix_spawn");
  return pid;
}

}  // namespace

int main(int argc, char** argv) try {
  CLI::App app{
      "A GPU event shared between two processes: the child awaits the parent's "
      "interprocess event through evr",
      "evr-ipc"};
  std::string device = "auto";
  std::string child_handle;
  auto* device_option = examples::add_device_option(app, device);
  app.add_option("--child", child_handle,
                 "run as the child process, awaiting the event with this handle (128 hex digits; "
                 "the parent passes it)")
      ->check(CLI::Validator(
          [](std::string& hex) -> std::string {
            if (hex.size() != 2 * sizeof(evr::device::ipc_event_handle::bytes) ||
                hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
              return "the handle must be 128 hex digits";
            return {};
          },
          "HANDLE"))
      ->excludes(device_option);
  if (int rc = examples::parse_cli(app, argc, argv); rc >= 0) return rc;

  examples::ms_since_start();  // t = 0
  if (!child_handle.empty()) {
    // The child process: the GPU only (the simulated device never spawns one).
    return child_role(evr::device::cuda_backend(), child_handle, "child process") ? 0 : 1;
  }

  examples::device gpu(device);
  evr::reactor reactor(gpu.backend());
  evr::stream stream(gpu.backend(), 0);

  // The parent's work, and an interprocess event recorded behind it.
  evr::event finished(gpu.backend(), evr::device::event_flags::interprocess);
  gpu.busy(stream, 1000ms);
  finished.record(stream);
  const std::string hex = to_hex(finished.ipc_handle());  // valid while `finished` lives
  std::printf("parent: 1 s of GPU work queued, event recorded behind it\n   handle: %s\n",
              hex.c_str());

  bool child_ok = false;
  pid_t child = -1;
  std::fflush(stdout);  // before the child writes to the same output
  if (gpu.on_gpu()) {
    child = spawn_child(argv[0], hex);
    std::printf("parent: started child process %d with --child HANDLE\n", static_cast<int>(child));
    std::fflush(stdout);
  } else {
    std::printf(
        "parent: the simulated device cannot share an event with another process: the\n"
        "        child's part runs here, importing the handle from the same simulated device\n");
    child_ok = child_role(gpu.backend(), hex, "child (in-process)");
  }

  // The parent awaits the same event through its own reactor.
  asio::io_context io;
  evr::gpu_waiter waiter(io.get_executor(), reactor);
  std::error_code outcome = asio::error::would_block;
  waiter.async_wait(finished, [&](std::error_code ec) { outcome = ec; });
  io.run();
  std::printf("parent: %7.1f ms  evr says its own work is %s\n", examples::ms_since_start(),
              outcome ? outcome.message().c_str() : "done");

  if (child > 0) {
    // `finished` must outlive the child's use of it: wait for the child before leaving main.
    int status = 0;
    if (waitpid(child, &status, 0) != child)
      throw std::system_error(errno, std::generic_category(), "waitpid");
    child_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    std::printf("parent: the child exited with %s\n", child_ok ? "success" : "a failure");
  }

  const bool ok = !outcome && child_ok;
  std::printf("result: %s on the %s\n", ok ? "OK" : "FAILED", gpu.kind());
  return ok ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "evr-ipc: %s\n", e.what());
  return 1;
}
