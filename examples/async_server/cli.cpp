#include "cli.hpp"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace {

constexpr const char* usage_text =
    "usage: evr-async-server [options]\n"
    "\n"
    "An HTTP/1.1 server whose requests run GPU work and co_await it through evr\n"
    "(GET /saxpy?n=N[&a=A][&seed=S], GET /sum?n=N[&seed=S], GET /metrics).\n"
    "\n"
    "What to do (default, with no arguments: --self-test 200):\n"
    "  --self-test N           serve on an ephemeral loopback port, check malformed requests, run "
    "N\n"
    "                          checked requests over --connections connections, print a summary\n"
    "  --load-connections C    closed-loop load with C keep-alive connections (default 4) ...\n"
    "  --load-seconds S        ... for S seconds (default 3) ...\n"
    "  --load-path PATH        ... on PATH (default /saxpy?n=65536); prints requests/s and "
    "latency\n"
    "  --port P                serve on port P (0: any free port) until SIGINT/SIGTERM\n"
    "\n"
    "How:\n"
    "  --connections C         client connections of the self-test (default 4)\n"
    "  --mode evr|blocking     evr: co_await the GPU (default); blocking: each request blocks its\n"
    "                          thread in synchronize_stream (cudaStreamSynchronize), the "
    "comparison\n"
    "  --threads T             threads running the server (default: 1 for evr, 8 for blocking)\n"
    "  --device auto|cuda|sim  auto: the GPU when there is one, else the simulated device\n"
    "  --streams S             GPU streams (lanes) shared by all requests (default 8)\n"
    "  --strategy adaptive|poll|fence|host_func   the evr reactor's strategy (default adaptive)\n"
    "  --max-n N               largest n a request may ask for (default 4194304)\n"
    "  --address A             address to listen on (default 127.0.0.1)\n"
    "  --timeout S             close a connection idle (or stuck sending/receiving) for S seconds\n"
    "                          (default 30)\n";

[[noreturn]] void usage_error(const std::string& why) {
  std::fprintf(stderr, "evr-async-server: %s\n(--help lists the options)\n", why.c_str());
  std::exit(2);
}

}  // namespace

int default_threads(wait_mode m) { return m == wait_mode::evr ? 1 : 8; }

settings parse_command_line(int argc, char** argv) {
  settings s;
  bool self_test = false, load = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error("missing value after " + a);
      return argv[++i];
    };
    auto whole = [&](long long lo, long long hi) {
      const std::string v = value();
      char* end = nullptr;
      errno = 0;
      const long long n = std::strtoll(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || errno != 0 || n < lo || n > hi)
        usage_error(a + " takes a whole number from " + std::to_string(lo) + " to " +
                    std::to_string(hi) + ", not '" + v + "'");
      return n;
    };
    if (a == "--self-test") {
      s.self_test_requests = static_cast<std::uint64_t>(whole(1, 100000000));
      self_test = true;
    } else if (a == "--load-connections") {
      s.connections = static_cast<int>(whole(1, 10000));
      load = true;
    } else if (a == "--connections") {
      s.connections = static_cast<int>(whole(1, 10000));
    } else if (a == "--load-seconds") {
      const std::string v = value();
      char* end = nullptr;
      const double sec = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !(sec > 0 && sec <= 3600))
        usage_error("--load-seconds takes a number of seconds above 0 and at most 3600, not '" + v +
                    "'");
      s.load_seconds = sec;
      load = true;
    } else if (a == "--load-path") {
      s.load_path = value();
      if (s.load_path.empty() || s.load_path.front() != '/' ||
          s.load_path.find_first_of(" \r\n\t") != std::string::npos)
        usage_error(
            "--load-path takes a path starting with '/' without spaces, like /saxpy?n=65536");
      load = true;
    } else if (a == "--port") {
      s.port = static_cast<int>(whole(0, 65535));
    } else if (a == "--timeout") {
      s.timeout_seconds = static_cast<int>(whole(1, 86400));
    } else if (a == "--address") {
      s.address = value();
    } else if (a == "--mode") {
      const std::string v = value();
      if (v == "evr")
        s.mode = wait_mode::evr;
      else if (v == "blocking")
        s.mode = wait_mode::blocking;
      else
        usage_error("--mode takes evr or blocking, not '" + v + "'");
    } else if (a == "--device") {
      s.device = value();
      if (s.device != "auto" && s.device != "cuda" && s.device != "sim")
        usage_error("--device takes auto, cuda or sim, not '" + s.device + "'");
    } else if (a == "--threads") {
      s.threads = static_cast<int>(whole(1, 1024));
    } else if (a == "--streams") {
      s.streams = static_cast<int>(whole(1, 1024));
    } else if (a == "--max-n") {
      s.max_n = static_cast<std::size_t>(whole(1, 1LL << 28));
    } else if (a == "--strategy") {
      const std::string v = value();
      if (v == "adaptive")
        s.strategy = evr::strategy::adaptive;
      else if (v == "poll")
        s.strategy = evr::strategy::poll;
      else if (v == "fence")
        s.strategy = evr::strategy::fence;
      else if (v == "host_func")
        s.strategy = evr::strategy::host_func;
      else
        usage_error("--strategy takes adaptive, poll, fence or host_func, not '" + v + "'");
    } else if (a == "--help" || a == "-h") {
      std::fputs(usage_text, stdout);
      std::exit(0);
    } else {
      usage_error("unknown argument '" + a + "'");
    }
  }
  if (self_test && load) usage_error("--self-test and --load-* are different runs: pick one");
  if (load)
    s.what = action::load;
  else if (self_test || s.port < 0)
    s.what = action::self_test;
  else
    s.what = action::serve;
  if (s.threads == 0) s.threads = default_threads(s.mode);
  return s;
}
