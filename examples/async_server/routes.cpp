// The routes of the server (server.hpp lists them): what each request asks for, the GPU work it
// launches, its checks and its answer. The connections that carry the requests are server.cpp's.
#include "server.hpp"

#include <malloc.h>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <utility>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/use_awaitable.hpp>

#include "busy_math.hpp"
#include "sanitized.hpp"
#include "use_tuple.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

// Gives the pages of freed buffers back to the system. Under ASan or TSan the sanitizer's
// allocator serves malloc and glibc's heap is never set up: malloc_trim would set it up on first
// use, and two large-request threads doing so at once crash inside glibc (seen in an ASan run).
void give_freed_pages_back() {
  if constexpr (!EVR_SERVER_SANITIZED) malloc_trim(0);
}

std::string json_number(double v) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

void append_uint(std::string& out, std::uint64_t v) {
  char buf[24];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, end);
}

/// v with one decimal, like printf's %.1f (but for halfway cases, which round away from zero),
/// without printf's cost (a few thousand instructions per call: it was 9 % of a /busy request).
void append_fixed1(std::string& out, double v) {
  if (!(std::fabs(v) < 1e15)) {  // NaN, infinities, absurd values: printf's way
    char buf[48];
    const int n = std::snprintf(buf, sizeof buf, "%.1f", v);
    out.append(buf, n > 0 ? static_cast<std::size_t>(n) : 0);
    return;
  }
  long long tenths = std::llround(v * 10);
  if (tenths < 0) {
    out += '-';
    tenths = -tenths;
  }
  append_uint(out, static_cast<std::uint64_t>(tenths / 10));
  out += '.';
  out += static_cast<char>('0' + tenths % 10);
}

std::string fixed1(double v) {
  std::string s;
  append_fixed1(s, v);
  return s;
}

}  // namespace

server::response server::error_response(connection& c, int status, std::string_view message,
                                        bool close) {
  response r;
  r.status = status;
  r.content_type = "text/plain; charset=utf-8";
  c.body.clear();
  c.body += "error ";
  append_uint(c.body, static_cast<std::uint64_t>(status));
  c.body += ": ";
  c.body += message;
  c.body += '\n';
  r.close = close;
  return r;
}

bool server::sample_check() noexcept {
  return answers_.fetch_add(1, std::memory_order_relaxed) % cfg_.check_every == 0;
}

asio::awaitable<server::response> server::handle(const http::request& req, connection& c) {
  const std::string_view path = req.path();
  auto method_not_allowed = [&c](std::string_view what, const char* allow) {
    response r = error_response(c, 405, std::string(what) + " takes " + allow);
    r.extra_headers = std::string("Allow: ") + allow + "\r\n";
    return r;
  };
  if (path == "/metrics") {
    if (req.method != "GET") co_return method_not_allowed("/metrics", "GET");
    const std::optional<evr::reactor_metrics> m =
        reactor_ != nullptr ? std::optional(reactor_->metrics()) : std::nullopt;
    response r;
    r.content_type = "text/plain; version=0.0.4; charset=utf-8";
    server_metrics::gauges now;
    {
      std::lock_guard lock(mutex_);
      now.connections = table_.size();
    }
    now.lanes_leased = lanes_.leased();
    now.request_memory = budget_.used();
    now.request_memory_limit = budget_.limit();
    now.large_running = large_turns_.taken();
    now.large_waiting = large_turns_.waiting();
    c.body = metrics_.render(m ? &*m : nullptr, cfg_.info, now);
    co_return r;
  }

  const bool known = path == "/saxpy" || path == "/sum" || path == "/busy" || path == "/mlp";
  if (!known)
    co_return error_response(c, 404,
                             "no such path '" + std::string(path.substr(0, 64)) +
                                 "'; try /busy?us=2000, /mlp?seed=1, /saxpy?n=65536, "
                                 "/sum?n=65536, /healthz, /readyz or /metrics");
  if (path == "/busy" ? req.method != "GET" : req.method != "GET" && req.method != "POST")
    co_return method_not_allowed(path, path == "/busy" ? "GET" : "GET, POST");

  // Parameters in the query; for POST /saxpy and /sum also in the body (form encoding), after any
  // in the query. POST /mlp carries its rows in the body (CSV).
  params::list& query = c.query;  // the connection's: reused, no allocation per request
  params::list& body_params = c.form;
  if (auto bad = http::parse_query(req.query(), query))
    co_return error_response(c, bad->status, bad->message);

  // (GET /busy is served by serve() itself: see busy_request.)
  if (path == "/mlp") {
    mlp::request mreq;
    if (auto bad =
            mlp::parse(query, req.body, req.method == "POST", model_, cfg_.batching.max_rows, mreq))
      co_return error_response(c, bad->status, bad->message);
    co_return co_await run_mlp(mreq, c);
  }
  const job::kind kind = path == "/saxpy" ? job::kind::saxpy : job::kind::sum;
  if (req.method == "POST") {
    if (auto bad = http::parse_query(req.body, body_params))
      co_return error_response(c, bad->status, bad->message);
    query.insert(query.end(), body_params.begin(), body_params.end());
  }
  job::spec spec;
  if (auto bad = job::parse(kind, query, cfg_.max_n, spec)) co_return error_response(c, 400, *bad);
  co_return co_await run_job(spec, c);
}

asio::awaitable<std::error_code> server::wait_gpu(lane_pool::lease& lease, connection& c,
                                                  std::string_view path, double& waited_us) {
  const auto t0 = clock_type::now();
  std::error_code ec;
  if (c.gpu) {
    // evr, hostfunc, poll: this thread serves other connections until the work is done.
    auto [wec] = co_await c.gpu->async_wait(*lease, abandon_signal(c), use_tuple);
    ec = wec;
    if (ec && c.gone) release_when_done(lease);
  } else {
    // pool / thread: this thread can do nothing else until the GPU is done.
    ec = lease->wait_blocking(cfg_.sync);
  }
  const auto d = clock_type::now() - t0;
  waited_us = micros(d);
  if (!ec) waited(lease, path, d);
  co_return ec;
}

void server::waited(lane_pool::lease& lease, std::string_view path, clock_type::duration d) {
  lease.mark_idle();
  metrics_.record_gpu_wait(path, d);
}

asio::awaitable<server::response> server::run_job(const job::spec& spec, connection& c) {
  if (spec.n > cfg_.large_n) co_return co_await run_large_job(spec, c);
  // Waits (suspended) while every lane is taken: bounded GPU memory and streams under any load.
  lane_pool::lease lease = lanes_.try_acquire(c.device);
  if (!lease) lease = co_await home_pool(c).acquire_waiting(c.abandon.slot());
  if (!lease || c.gone) co_return abandoned_response(dropped::queued);
  lane& l = *lease;
  // (No co_return inside the handlers: the response is built after the try statement.)
  std::optional<response> refused;
  try {
    l.reserve(spec.n);
    job::fill_inputs(spec, l.x(), l.y());
    lease.mark_busy();  // from here on, an early exit drains the lane before it is reused
    l.enqueue(spec);
  } catch (const std::bad_alloc&) {
    refused = overloaded_response(c, "out of memory for n=" + std::to_string(spec.n));
  } catch (const std::exception& e) {
    refused = error_response(c, 500, std::string("launching the GPU work failed: ") + e.what());
  }
  if (refused) co_return std::move(*refused);

  double gpu_us = 0;
  const std::error_code ec = co_await wait_gpu(lease, c, job_path(spec), gpu_us);
  if (c.gone) co_return abandoned_response(dropped::running);
  if (ec) co_return error_response(c, 500, "waiting for the GPU failed: " + ec.message());
  double value = 0;
  if (auto wrong = check_job(spec, l, value)) co_return error_response(c, 500, *wrong);
  co_return job_answer(c, spec, value, gpu_us);
}

asio::awaitable<server::response> server::run_large_job(const job::spec& spec, connection& c) {
  const memory_budget::charge held(budget_, job_bytes(spec.n));
  if (!held) co_return over_budget(c, job_bytes(spec.n));
  // One of large_concurrency turns, waited for first come, first served (no lane is held
  // meanwhile); then a lane; then the work, on a large-request thread.
  std::uint32_t turn = large_turns_.try_take();
  if (turn == index_pool::none)
    turn = co_await large_turns_.async_take(
        asio::bind_cancellation_slot(c.abandon.slot(), asio::use_awaitable));
  if (turn == index_pool::cancelled) co_return abandoned_response(dropped::queued);
  const struct turn_back {
    index_pool& turns;
    std::uint32_t turn;
    ~turn_back() { turns.give_back(turn); }
  } give_back{large_turns_, turn};
  lane_pool::lease lease = lanes_.try_acquire(c.device);
  if (!lease) lease = co_await home_pool(c).acquire_waiting(c.abandon.slot());
  if (!lease || c.gone) co_return abandoned_response(dropped::queued);
  large_outcome out;
  auto step = [&] { out = run_large_step(spec, lease); };
  co_await large_threads_.async_run(step, asio::use_awaitable);
  if (c.gone) co_return abandoned_response(dropped::running);
  if (out.status == 503) co_return overloaded_response(c, out.message);
  if (out.status != 200) co_return error_response(c, out.status, out.message);
  co_return job_answer(c, spec, out.value, out.gpu_us);
}

server::large_outcome server::run_large_step(const job::spec& spec, lane_pool::lease& lease) {
  large_outcome out;
  lane& l = *lease;
  try {
    l.reserve(spec.n);
    job::fill_inputs(spec, l.x(), l.y());
    lease.mark_busy();
    l.enqueue(spec);
    const auto t0 = clock_type::now();
    if (const std::error_code ec = l.wait_blocking(cfg_.sync)) {
      out = {500, "waiting for the GPU failed: " + ec.message()};
    } else {
      const auto d = clock_type::now() - t0;
      out.gpu_us = micros(d);
      waited(lease, job_path(spec), d);
      if (auto wrong = check_job(spec, l, out.value)) out = {500, *wrong};
    }
  } catch (const std::bad_alloc&) {
    out = {503, "out of memory for n=" + std::to_string(spec.n)};
  } catch (const std::exception& e) {
    out = {500, std::string("launching the GPU work failed: ") + e.what()};
  }
  if (lease.busy()) {  // a failure left work queued: drain it here, not on the io thread
    if (const std::error_code ec = l.wait_blocking(cfg_.sync))
      std::fprintf(stderr, "evr-async-server: draining a lane after a failure: %s\n",
                   ec.message().c_str());
    lease.mark_idle();
  }
  // The buffers go back to the system (not only to the allocator) before the next request.
  l.shrink(cfg_.large_n);
  give_freed_pages_back();
  return out;
}

std::optional<std::string> server::check_job(const job::spec& spec, lane& l, double& value) {
  auto wrong = job::check(spec, l.x(), l.y(), l.out(), l.sum(), value);
  metrics_.record_check(!wrong);
  if (wrong)
    std::fprintf(stderr, "evr-async-server: %s (n=%zu seed=%u)\n", wrong->c_str(), spec.n,
                 spec.seed);
  return wrong;
}

server::response server::job_answer(connection& c, const job::spec& spec, double value,
                                    double gpu_us) const {
  c.body = std::string("{\"op\":\"") + job::to_string(spec.kind) +
           "\",\"n\":" + std::to_string(spec.n) +
           (spec.kind == job::kind::saxpy ? ",\"a\":" + json_number(spec.a) : std::string()) +
           ",\"seed\":" + std::to_string(spec.seed) + ",\"result\":" + json_number(value) +
           ",\"checked\":true,\"wait_us\":" + fixed1(gpu_us) + ",\"wait\":\"" +
           to_string(cfg_.mode) + "\"}\n";
  return response{};
}

std::string_view server::job_path(const job::spec& spec) noexcept {
  return spec.kind == job::kind::saxpy ? "/saxpy" : "/sum";
}

std::uint64_t server::job_bytes(std::size_t n) noexcept {
  return std::uint64_t{3} * sizeof(float) * n;  // x, y and out
}

server::response server::overloaded_response(connection& c, std::string_view message) {
  response r = error_response(c, 503, message);
  r.extra_headers = "Retry-After: 1\r\n";
  return r;
}

server::response server::over_budget(connection& c, std::uint64_t bytes) const {
  constexpr double mib = 1024.0 * 1024.0;
  char msg[200];
  std::snprintf(msg, sizeof msg,
                "the server's request memory is taken (%.0f of %.0f MiB, --request-memory-mib; "
                "this request needs %.1f MiB); retry later",
                static_cast<double>(budget_.used()) / mib,
                static_cast<double>(budget_.limit()) / mib, static_cast<double>(bytes) / mib);
  return overloaded_response(c, msg);
}

bool server::busy_request(const http::request& req, connection& c, busy::spec& spec, response& r) {
  if (req.path() != "/busy" || req.method != "GET") return false;
  if (auto bad = http::parse_query(req.query(), c.query)) {
    r = error_response(c, bad->status, bad->message);
  } else if (auto wrong = busy::parse(c.query, cfg_.max_busy_us, spec)) {
    r = error_response(c, 400, *wrong);
  } else {
    r = response{};
  }
  return true;
}

bool server::readyz_request(const http::request& req, connection& c, response& r) {
  if (req.path() != "/readyz") return false;
  // Ready: not draining, lanes set up, and in evr mode its reactor (which lives as long as the
  // server) taking waits.
  const bool reactor_ok = cfg_.mode != wait_mode::evr || reactor_ != nullptr;
  const char* not_ready = draining() ? "draining: not taking new work"
                          : (lanes_.size() == 0 || !reactor_ok)
                              ? "not ready: no lanes or no reactor"
                              : nullptr;
  probe_answer(req, c, r, "ready\n", not_ready);
  return true;
}

bool server::healthz_request(const http::request& req, connection& c, response& r) {
  if (req.path() != "/healthz") return false;
  probe_answer(req, c, r, "ok\n", nullptr);
  return true;
}

void server::probe_answer(const http::request& req, connection& c, response& r, const char* text,
                          const char* not_ready) {
  if (req.method != "GET") {
    r = error_response(c, 405, std::string(req.path()) + " takes GET");
    r.extra_headers = "Allow: GET\r\n";
  } else if (not_ready != nullptr) {
    r = error_response(c, 503, not_ready);
    r.extra_headers = "Retry-After: 1\r\n";
  } else {
    r = response{};
    r.content_type = "text/plain; charset=utf-8";
    c.body = text;
  }
}

bool server::launch_busy(lane_pool::lease& lease, const busy::spec& spec, connection& c,
                         response& r) {
  try {
    lease.mark_busy();
    lease->enqueue_busy(spec);
    return false;
  } catch (const std::exception& e) {
    r = error_response(c, 500, std::string("launching the GPU work failed: ") + e.what());
    return true;
  }
}

server::response server::answer_busy(connection& c, const busy::spec& spec, std::error_code ec,
                                     std::uint32_t result, double gpu_us) {
  if (ec) return error_response(c, 500, "waiting for the GPU failed: " + ec.message());
  const bool checked = sample_check();
  if (checked) {
    const std::uint32_t want = busy_math::reference(spec.seed);
    metrics_.record_check(result == want);
    if (result != want) {
      const std::string msg = "wrong busy answer from the device: got " + std::to_string(result) +
                              ", the CPU says " + std::to_string(want);
      std::fprintf(stderr, "evr-async-server: %s (seed=%u)\n", msg.c_str(), spec.seed);
      return error_response(c, 500, msg);
    }
  }
  std::string& b = c.body;
  b += "{\"op\":\"busy\",\"us\":";
  append_uint(b, spec.us);
  b += ",\"seed\":";
  append_uint(b, spec.seed);
  b += ",\"result\":";
  append_uint(b, result);
  b += checked ? ",\"checked\":true,\"wait_us\":" : ",\"checked\":false,\"wait_us\":";
  append_fixed1(b, gpu_us);
  b += ",\"wait\":\"";
  b += to_string(cfg_.mode);
  b += "\"}\n";
  return response{};
}

asio::awaitable<server::response> server::run_mlp(const mlp::request& req, connection& c) {
  const mlp::shape& d = model_.dims();
  const std::size_t in = static_cast<std::size_t>(d.in), out = static_cast<std::size_t>(d.out);
  const std::uint64_t bytes = std::uint64_t{req.rows} * (in + out) * sizeof(float);
  const memory_budget::charge held(budget_, bytes);
  if (!held) co_return over_budget(c, bytes);
  std::vector<float> outputs(req.rows * out);
  std::size_t batch_rows = req.rows;
  double gpu_us = 0;
  if (!batchers_.empty()) {
    // The request joins a batch of its device; this coroutine (not a thread) waits for it.
    const auto t0 = clock_type::now();
    mlp_batcher& batcher = *batchers_[c.device % batchers_.size()];
    const mlp_batcher::result r =
        co_await batcher.run(req, outputs.data(), *c.mailbox, c.abandon.slot());
    gpu_us = micros(clock_type::now() - t0);
    if (r.ec == asio::error::operation_aborted && c.gone)
      co_return abandoned_response(dropped::queued);
    if (c.gone) co_return abandoned_response(dropped::running);
    if (r.ec) co_return error_response(c, 500, r.what);
    batch_rows = r.batch_rows;
  } else {
    // pool / thread: a batch of this request alone, waited for by blocking the thread.
    lane_pool::lease lease = lanes_.try_acquire(c.device);
    if (!lease) lease = co_await home_pool(c).acquire_waiting(c.abandon.slot());
    if (!lease || c.gone) co_return abandoned_response(dropped::queued);
    lane& l = *lease;
    std::optional<response> refused;
    try {
      l.reserve_rows(req.rows);
      std::memcpy(l.mlp_input(), req.inputs.data(), req.rows * in * sizeof(float));
      lease.mark_busy();
      l.enqueue_mlp(req.rows);
    } catch (const std::exception& e) {
      refused = error_response(c, 500, std::string("launching the GPU work failed: ") + e.what());
    }
    if (refused) co_return std::move(*refused);
    const std::error_code ec = co_await wait_gpu(lease, c, "/mlp", gpu_us);
    if (c.gone) co_return abandoned_response(dropped::running);
    if (ec) co_return error_response(c, 500, "waiting for the GPU failed: " + ec.message());
    std::memcpy(outputs.data(), l.mlp_output(), outputs.size() * sizeof(float));
    metrics_.record_batch(req.rows);
  }

  // Inputs within model::input_limit() keep every output finite (mlp.hpp): one that is not is
  // the device's fault, whichever answer the sampled check would look at. (A checksum is finite
  // only when every output of its row is.)
  for (std::size_t r = 0; r < req.rows; ++r) {
    if (!std::isfinite(mlp::checksum(outputs.data() + r * out, d.out))) {
      metrics_.record_check(false);
      const std::string msg =
          "wrong mlp answer from the device, row " + std::to_string(r) + ": not finite";
      std::fprintf(stderr, "evr-async-server: %s\n", msg.c_str());
      co_return error_response(c, 500, msg);
    }
  }
  const bool checked = sample_check();
  if (checked) {
    std::vector<float> want(out);
    for (std::size_t r = 0; r < req.rows; ++r) {
      model_.forward(req.inputs.data() + r * in, want.data());
      if (auto wrong = mlp::compare_row(outputs.data() + r * out, want.data(), d.out)) {
        metrics_.record_check(false);
        const std::string msg =
            "wrong mlp answer from the device, row " + std::to_string(r) + ", " + *wrong;
        std::fprintf(stderr, "evr-async-server: %s\n", msg.c_str());
        co_return error_response(c, 500, msg);
      }
    }
    metrics_.record_check(true);
  }
  std::string& body = c.body;
  body = "{\"op\":\"mlp\",\"rows\":" + std::to_string(req.rows) +
         ",\"batch\":" + std::to_string(batch_rows);
  if (req.seed) body += ",\"seed\":" + std::to_string(*req.seed);
  body += ",\"checksums\":[";
  for (std::size_t row = 0; row < req.rows; ++row) {
    if (row != 0) body += ',';
    body += json_number(mlp::checksum(outputs.data() + row * out, d.out));
  }
  body += "],\"first\":[";
  for (std::size_t i = 0; i < 4 && i < out; ++i) {
    if (i != 0) body += ',';
    body += json_number(outputs[i]);
  }
  body += std::string("],\"checked\":") + (checked ? "true" : "false") +
          ",\"wait_us\":" + fixed1(gpu_us) + ",\"wait\":\"" + to_string(cfg_.mode) + "\"}\n";
  co_return response{};
}
