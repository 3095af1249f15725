// evr-async-server-alloc-test: a GET /busy request allocates nothing on the server's io threads
// once the server is warm (two simulated GPUs; evr, hostfunc and poll modes; 1 and 2 io threads):
// at most one in a thousand requests with a lane free for each, one in a hundred with requests
// waiting for lanes, from Asio's own per-thread cache (see main() for what is asserted and what
// reported).
//
// How: malloc and its relatives are replaced in this executable (forwarding to glibc's
// __libc_* functions) and count the calls made on a thread that has counting switched on: the
// server's io threads (instance_config::on_io_thread). What the device does is not the server's:
// the simulator's own allocations (it queues each launch and marker; a GPU driver has its own
// memory) are not counted, through a backend wrapper that switches counting off around every
// device call, used by the lanes' streams and the reactor alike, and a lane wrapper around the
// kernel launch. Everything else on an io thread counts: Asio (operations, coroutine frames),
// the evr front end (the wait's operation, the submit) and the server (parsing, lanes, the
// response).
//
// Warm-up: every connection serves requests before the count starts (its buffers grow to their
// size, Asio's per-thread caches fill). Then the measured requests over the same connections must
// make no allocation per request on the io threads (at most one in a thousand with lanes free,
// one in a hundred with half of the requests waiting for a lane, from Asio's own cache: see
// main()) with one io thread and with two io threads while lanes are free. With two io threads
// and requests waiting for lanes, the cross-thread hand-off of a lane allocates now and then:
// that run (evr mode) is reported, not asserted. The lanes are spread over two simulated GPUs, a
// lane pool each, as the server spreads them over a host's GPUs.
//
// Exit status: 0 pass, 1 fail, 77 skipped (sanitizer builds replace malloc themselves).
#include <execinfo.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <asio/connect.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/read.hpp>
#include <asio/read_until.hpp>
#include <asio/streambuf.hpp>
#include <asio/write.hpp>

#include <evr/evr.hpp>
#include <evr/sim/device.hpp>

#include "http.hpp"
#include "instance.hpp"
#include "lanes.hpp"
#include "mlp.hpp"
#include "sanitized.hpp"

namespace {

thread_local bool counting = false;
std::atomic<std::uint64_t> allocations{0};

int traces_left = 0;  // EVR_ALLOC_TEST_TRACE=N: print where the first N counted ones came from

// [[maybe_unused]]: sanitizer builds skip the test (EVR_SERVER_SANITIZED) and call neither.
[[maybe_unused]] void count(std::size_t size = 0) noexcept {
  if (!counting) return;
  allocations.fetch_add(1, std::memory_order_relaxed);
  if (traces_left > 0) {
    --traces_left;
    counting = false;  // backtrace() may allocate on its first use
    void* frames[24];
    const int n = backtrace(frames, 24);
    std::fprintf(stderr, "-- an allocation on an io thread: %zu bytes\n", size);
    backtrace_symbols_fd(frames, n, 2);
    counting = true;
  }
}

/// Switches counting off for the calling thread while it lives (a device call).
struct not_counted {
  bool was = counting;
  not_counted() noexcept { counting = false; }
  ~not_counted() { counting = was; }
};

}  // namespace

#if !EVR_SERVER_SANITIZED
extern "C" {
void* __libc_malloc(std::size_t size);
void* __libc_calloc(std::size_t n, std::size_t size);
void* __libc_realloc(void* p, std::size_t size);
void* __libc_memalign(std::size_t align, std::size_t size);
void __libc_free(void* p);

void* malloc(std::size_t size) {
  count(size);
  return __libc_malloc(size);
}
void* calloc(std::size_t n, std::size_t size) {
  count();
  return __libc_calloc(n, size);
}
void* realloc(void* p, std::size_t size) {
  count();
  return __libc_realloc(p, size);
}
void* memalign(std::size_t align, std::size_t size) {
  count(size);
  return __libc_memalign(align, size);
}
void* aligned_alloc(std::size_t align, std::size_t size) {
  count(size);
  return __libc_memalign(align, size);
}
int posix_memalign(void** out, std::size_t align, std::size_t size) {
  count();
  void* p = __libc_memalign(align, size);
  if (p == nullptr) return ENOMEM;
  *out = p;
  return 0;
}
void free(void* p) { __libc_free(p); }
}
#endif

namespace {

/// The simulated device, every call made with counting off: the device's memory is not the
/// server's.
class device_not_counted final : public evr::device::backend {
 public:
  explicit device_not_counted(evr::device::backend& inner) : b_(inner) {}
  using native_event = evr::device::native_event;
  using native_stream = evr::device::native_stream;

  std::string_view name() const noexcept override { return b_.name(); }
  bool is_simulated() const noexcept override { return b_.is_simulated(); }
  std::string describe() const override { return b_.describe(); }
  std::error_code device_count(int& n) noexcept override {
    not_counted off;
    return b_.device_count(n);
  }
  std::error_code create_event(int d, evr::device::event_flags f,
                               native_event& out) noexcept override {
    not_counted off;
    return b_.create_event(d, f, out);
  }
  void destroy_event(native_event e) noexcept override {
    not_counted off;
    b_.destroy_event(e);
  }
  std::error_code record_event(native_event e, native_stream s) noexcept override {
    not_counted off;
    return b_.record_event(e, s);
  }
  std::error_code query_event(native_event e) noexcept override {
    not_counted off;
    return b_.query_event(e);
  }
  std::error_code synchronize_event(native_event e) noexcept override {
    not_counted off;
    return b_.synchronize_event(e);
  }
  std::error_code elapsed_ms(native_event a, native_event z, float& ms) noexcept override {
    not_counted off;
    return b_.elapsed_ms(a, z, ms);
  }
  std::error_code export_event(native_event e,
                               evr::device::ipc_event_handle& out) noexcept override {
    not_counted off;
    return b_.export_event(e, out);
  }
  std::error_code import_event(const evr::device::ipc_event_handle& h,
                               native_event& out) noexcept override {
    not_counted off;
    return b_.import_event(h, out);
  }
  std::error_code create_stream(int d, int prio, native_stream& out) noexcept override {
    not_counted off;
    return b_.create_stream(d, prio, out);
  }
  void destroy_stream(native_stream s) noexcept override {
    not_counted off;
    b_.destroy_stream(s);
  }
  std::error_code stream_device(native_stream s, int& d) noexcept override {
    not_counted off;
    return b_.stream_device(s, d);
  }
  std::error_code stream_priority(native_stream s, int& p) noexcept override {
    not_counted off;
    return b_.stream_priority(s, p);
  }
  std::error_code query_stream(native_stream s) noexcept override {
    not_counted off;
    return b_.query_stream(s);
  }
  std::error_code synchronize_stream(native_stream s) noexcept override {
    not_counted off;
    return b_.synchronize_stream(s);
  }
  std::error_code stream_wait_event(native_stream s, native_event e) noexcept override {
    not_counted off;
    return b_.stream_wait_event(s, e);
  }
  std::error_code launch_host_func(native_stream s, void (*fn)(void*),
                                   void* arg) noexcept override {
    not_counted off;
    return b_.launch_host_func(s, fn, arg);
  }
  std::size_t hardware_queues() const noexcept override { return b_.hardware_queues(); }
  bool stream_is_capturing(native_stream s) noexcept override {
    not_counted off;
    return b_.stream_is_capturing(s);
  }
  std::error_code allocate_fence_block(int d, std::size_t words,
                                       evr::device::fence_block& out) noexcept override {
    not_counted off;
    return b_.allocate_fence_block(d, words, out);
  }
  void free_fence_block(evr::device::fence_block& block) noexcept override {
    not_counted off;
    b_.free_fence_block(block);
  }
  std::error_code allocate_signal_block(int d, std::size_t slots,
                                        evr::device::signal_block& out) noexcept override {
    not_counted off;
    return b_.allocate_signal_block(d, slots, out);
  }
  void free_signal_block(evr::device::signal_block& block) noexcept override {
    not_counted off;
    b_.free_signal_block(block);
  }
  std::error_code write_fence(native_stream s, std::uint64_t address,
                              std::uint64_t value) noexcept override {
    not_counted off;
    return b_.write_fence(s, address, value);
  }
  std::error_code set_current_device(int d) noexcept override {
    not_counted off;
    return b_.set_current_device(d);
  }
  std::error_code current_device(int& d) noexcept override {
    not_counted off;
    return b_.current_device(d);
  }
  void prepare_polling_thread() noexcept override {
    not_counted off;
    b_.prepare_polling_thread();
  }
  bool in_host_func() const noexcept override { return b_.in_host_func(); }
  std::error_code load_fence_kernels(int d) noexcept override {
    not_counted off;
    return b_.load_fence_kernels(d);
  }
  std::error_code enqueue_signal(int d, native_stream s,
                                 const evr::signal_ref& ref) noexcept override {
    not_counted off;
    return b_.enqueue_signal(d, s, ref);
  }
  std::error_code load_signal_kernel(int d) noexcept override {
    not_counted off;
    return b_.load_signal_kernel(d);
  }
  std::vector<int> devices_in_use() noexcept override {
    not_counted off;
    return b_.devices_in_use();
  }
  bool fence_kernels(int d) noexcept override { return b_.fence_kernels(d); }
  std::error_code write_fence_by_kernel(int d, native_stream s, std::uint64_t address,
                                        std::uint64_t value) noexcept override {
    not_counted off;
    return b_.write_fence_by_kernel(d, s, address, value);
  }

 private:
  evr::device::backend& b_;
};

/// A simulated lane whose kernel launch is the device's business (not counted).
class lane_launch_not_counted final : public lane {
 public:
  explicit lane_launch_not_counted(std::unique_ptr<lane> inner) : l_(std::move(inner)) {}
  const evr::stream& stream() const noexcept override { return l_->stream(); }
  void reserve(std::size_t n) override { l_->reserve(n); }
  float* x() noexcept override { return l_->x(); }
  float* y() noexcept override { return l_->y(); }
  void enqueue(const job::spec& s) override {
    not_counted off;
    l_->enqueue(s);
  }
  const float* out() const noexcept override { return l_->out(); }
  double sum() const noexcept override { return l_->sum(); }
  void shrink(std::size_t n) override { l_->shrink(n); }
  void enqueue_busy(const busy::spec& s) override {
    not_counted off;
    l_->enqueue_busy(s);
  }
  std::uint32_t busy_result() const noexcept override { return l_->busy_result(); }
  void reserve_rows(std::size_t rows) override { l_->reserve_rows(rows); }
  float* mlp_input() noexcept override { return l_->mlp_input(); }
  void enqueue_mlp(std::size_t rows) override {
    not_counted off;
    l_->enqueue_mlp(rows);
  }
  const float* mlp_output() const noexcept override { return l_->mlp_output(); }
  void use_signal(evr::signal_slot slot) noexcept override { l_->use_signal(std::move(slot)); }
  evr::wait_target wait_target() const noexcept override { return l_->wait_target(); }

 private:
  std::unique_ptr<lane> l_;
};

/// Sends `rounds` requests on each connection (all connections in flight together), reads and
/// checks every response. Returns false (and says why) on a bad response.
bool drive(std::vector<asio::ip::tcp::socket>& conns, int rounds, int& seed) {
  std::vector<std::string> in(conns.size());
  for (int r = 0; r < rounds; ++r) {
    for (auto& s : conns) {
      const std::string req = "GET /busy?us=50&seed=" + std::to_string(100 + seed++ % 900) +
                              " HTTP/1.1\r\nHost: test\r\n\r\n";
      asio::write(s, asio::buffer(req));
    }
    for (std::size_t i = 0; i < conns.size(); ++i) {
      const std::size_t head = asio::read_until(conns[i], asio::dynamic_buffer(in[i]), "\r\n\r\n");
      http::response_head h;
      if (auto bad = http::parse_response_head(std::string_view(in[i]).substr(0, head), h)) {
        std::printf("FAILED: a bad response head: %s\n", bad->message.c_str());
        return false;
      }
      if (in[i].size() < head + h.content_length)
        asio::read(conns[i], asio::dynamic_buffer(in[i]),
                   asio::transfer_exactly(head + h.content_length - in[i].size()));
      if (h.status != 200) {
        std::printf("FAILED: status %d: %s\n", h.status, in[i].c_str());
        return false;
      }
      in[i].erase(0, head + h.content_length);
    }
  }
  return true;
}

/// Returns the allocations per request on the io threads (negative when the run failed).
/// `lanes[d]`: the lanes of simulated device d.
[[maybe_unused]] double run(wait_mode mode, int threads, device_not_counted& device,
                            const std::vector<std::vector<lane*>>& lanes, const mlp::model& model) {
  // (With fewer lanes than connections, requests wait for lanes: that path is covered too.)
  instance_config cfg;
  cfg.threads = threads;
  cfg.server.mode = mode;
  cfg.server.check_every = 16;
  cfg.on_io_thread = [] { counting = true; };
  instance inst(device, lanes, model, cfg);
  asio::io_context client;
  std::vector<asio::ip::tcp::socket> conns;
  for (int i = 0; i < 16; ++i) {
    conns.emplace_back(client);
    conns.back().connect(inst.endpoint());
  }
  int seed = 0;
  const int warm_rounds = 100, measured_rounds = 200;
  bool ok = drive(conns, warm_rounds, seed);
  if (const char* t = std::getenv("EVR_ALLOC_TEST_TRACE")) traces_left = std::atoi(t);
  const std::uint64_t before = allocations.load();
  ok = ok && drive(conns, measured_rounds, seed);
  const std::uint64_t made = allocations.load() - before;
  traces_left = 0;  // what teardown allocates is not the measured window's
  const std::uint64_t requests = static_cast<std::uint64_t>(measured_rounds) * conns.size();
  std::printf(
      "%s mode, %d io thread%s, %zu lanes on %zu devices, %zu connections: %llu GET /busy "
      "requests after %d each to warm up: %llu allocations on the io threads (%.3f per request)\n",
      to_string(mode), threads, threads == 1 ? "" : "s", inst.lanes().size(), lanes.size(),
      conns.size(), static_cast<unsigned long long>(requests), warm_rounds,
      static_cast<unsigned long long>(made),
      static_cast<double>(made) / static_cast<double>(requests));
  conns.clear();
  inst.stop();
  ok = inst.join() && ok;
  return ok ? static_cast<double>(made) / static_cast<double>(requests) : -1;
}

}  // namespace

int main() {
#if EVR_SERVER_SANITIZED
  std::printf("skipped: the sanitizers replace malloc themselves\n");
  return 77;
#else
  // Two simulated GPUs: the server spreads its lanes over both (a lane pool per device).
  constexpr int devices = 2;
  evr::sim::device sim(evr::sim::options{.devices = devices, .mode = evr::sim::run_mode::threaded});
  device_not_counted device(sim);
  mlp::shape shape;
  shape.width = 64;
  shape.hidden = 1;
  const mlp::model model(shape);
  std::vector<std::unique_ptr<lane>> owned;
  std::vector<std::vector<lane*>> lanes(devices), few(devices);
  for (int d = 0; d < devices; ++d) {
    for (int i = 0; i < 16; ++i) {
      owned.push_back(
          std::make_unique<lane_launch_not_counted>(make_sim_lane(sim, d, model, {}, &device)));
      lanes[d].push_back(owned.back().get());
    }
    few[d].assign(lanes[d].begin(), lanes[d].begin() + 4);
  }
  bool ok = true;
  // One io thread, half the requests waiting for a lane; two io threads, a lane for every
  // request: nothing per request. A stray one in thousands is tolerated: Asio's per-thread cache
  // reuses a block only when it is large enough, and which sizes it holds depends on the order in
  // which completions run (a poll host's sweep finishing several waits at once posts several lane
  // hand-offs together), and with two threads the caches exchange blocks when one thread frees
  // what another allocated.
  // With requests waiting for lanes, a sweep that finds several waits done hands several lanes
  // over at once, and such a burst can outrun Asio's per-thread cache now and then (4 in 3200
  // requests once, on CI's 2-core machine): the bound there is one request in a hundred, which
  // still fails any allocation made per request (1.0) or per round of 16 connections (0.06).
  const double one = run(wait_mode::evr, 1, device, few, model);
  ok = one >= 0 && one <= 0.01 && ok;
  const double two = run(wait_mode::evr, 2, device, lanes, model);
  ok = two >= 0 && two <= 0.001 && ok;
  // Two io threads, requests waiting for lanes: a lane given back on one thread to a request of
  // the other is posted across threads, which allocates now and then (about 0.2 per request
  // here). Reported, not asserted: see docs/notebook.md ("The async HTTP server").
  const double handoff = run(wait_mode::evr, 2, device, few, model);
  ok = handoff >= 0 && ok;
  // The waits written by hand, the same two runs: the comparison is between ways of waiting, not
  // between a server that allocates and one that does not. (A host function's post is allocated
  // on the driver's thread, with operator new: see wait_op.hpp.) Asserted with lanes free;
  // reported with requests waiting for lanes: a poll sweep that finds several requests done
  // hands several lanes to waiters at once, and a burst of those posts can outrun Asio's cache
  // (0 to 4 in 3200 requests here, as for evr's hand-offs above).
  for (wait_mode m : {wait_mode::hostfunc, wait_mode::poll}) {
    ok = run(m, 1, device, few, model) >= 0 && ok;
    const double free_lanes = run(m, 2, device, lanes, model);
    ok = free_lanes >= 0 && free_lanes <= 0.001 && ok;
  }
  std::printf("result: %s\n", ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
#endif
}
