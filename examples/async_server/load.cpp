#include "load.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string_view>
#include <thread>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/this_coro.hpp>

#include "busy_math.hpp"
#include "http_client.hpp"
#include "job.hpp"

namespace {

using clock_type = std::chrono::steady_clock;
using asio::ip::tcp;
using http_client::client;
using http_client::csv_rows;
using http_client::first_line;
using http_client::get;
using http_client::post;
using http_client::reply;

/// The self-test's request number i: the request, and what its answer must be.
struct planned {
  enum class route { job, busy, mlp, refused } what = route::job;
  std::string raw;
  job::spec spec;                 // route::job
  std::uint32_t seed = 0;         // route::busy
  std::vector<float> mlp_inputs;  // route::mlp: rows x in
  int status = 200;               // route::refused: the 4xx it must get
  std::string body_has;           // route::refused: a substring of the message
};

planned self_test_request(std::uint64_t i, const server_limits& lim) {
  planned p;
  const auto seed = static_cast<std::uint32_t>(i * 2654435761u);
  auto job_request = [&](job::kind k, std::size_t n, float a, bool use_post) {
    p.what = planned::route::job;
    p.spec = {k, std::min(n, lim.max_n), a, seed};
    char params[128];
    if (k == job::kind::saxpy)
      std::snprintf(params, sizeof params, "n=%zu&a=%g&seed=%u", p.spec.n, static_cast<double>(a),
                    seed);
    else
      std::snprintf(params, sizeof params, "n=%zu&seed=%u", p.spec.n, seed);
    const std::string path = std::string("/") + job::to_string(k);
    p.raw = use_post ? post(path, params) : get(path + "?" + params);
  };
  auto mlp_request = [&](std::size_t rows, bool use_post) {
    const mlp::shape& d = lim.model->dims();
    rows = std::min(rows, lim.mlp_max_rows);
    p.what = planned::route::mlp;
    p.mlp_inputs.resize(rows * static_cast<std::size_t>(d.in));
    for (std::size_t r = 0; r < rows; ++r)
      mlp::input_row(seed + static_cast<std::uint32_t>(r), d.in,
                     p.mlp_inputs.data() + r * static_cast<std::size_t>(d.in));
    p.raw = use_post
                ? post("/mlp", csv_rows(p.mlp_inputs, static_cast<std::size_t>(d.in)), "text/csv")
                : get("/mlp?seed=" + std::to_string(seed) + "&rows=" + std::to_string(rows));
  };
  auto refused = [&](std::string target, int status, std::string body_has) {
    p.what = planned::route::refused;
    p.raw = get(target);
    p.status = status;
    p.body_has = std::move(body_has);
  };
  switch (i % 12) {
    case 0: job_request(job::kind::saxpy, 65536, 2.5f, false); break;
    case 1: job_request(job::kind::sum, 65536, 2.0f, false); break;
    case 2: job_request(job::kind::saxpy, 1000, 0.1f, false); break;  // inexact: the tolerance path
    case 3: job_request(job::kind::sum, 4096, 2.0f, true); break;
    case 4: job_request(job::kind::sum, 262144 + i % 1000, 2.0f, false); break;  // odd sizes
    case 5:
    case 6: {
      p.what = planned::route::busy;
      p.seed = seed;
      const std::uint32_t us = std::min<std::uint32_t>(i % 12 == 5 ? 200 : 2000, lim.max_busy_us);
      p.raw = get("/busy?us=" + std::to_string(us) + "&seed=" + std::to_string(seed));
      break;
    }
    case 7: mlp_request(1, false); break;
    case 8: mlp_request(3, false); break;
    case 9: mlp_request(2, true); break;
    case 10: mlp_request(1 + i % 5, false); break;
    default:  // malformed requests between the good ones: each must get its 4xx, no one else's
      switch ((i / 12) % 4) {
        case 0: refused("/busy?us=0", 400, "us must be"); break;
        case 1: refused("/mlp?rows=" + std::to_string(lim.mlp_max_rows + 1), 413, "at most"); break;
        case 2:
          refused("/busy?us=" + std::to_string(lim.max_busy_us + 1), 400, "us must be");
          break;
        default: refused("/mlp?seed=1&bogus=2", 400, "unknown parameter"); break;
      }
  }
  return p;
}

/// The number after "name": in the server's JSON reply.
std::optional<double> number_field(const std::string& body, std::string_view name) {
  const std::string key = "\"" + std::string(name) + "\":";
  const std::size_t at = body.find(key);
  if (at == std::string::npos) return std::nullopt;
  const char* begin = body.c_str() + at + key.size();
  char* end = nullptr;
  const double v = std::strtod(begin, &end);
  if (end == begin) return std::nullopt;
  return v;
}

/// The numbers of the array "name":[...] in the server's JSON reply.
std::vector<double> array_field(const std::string& body, std::string_view name) {
  std::vector<double> out;
  const std::string key = "\"" + std::string(name) + "\":[";
  std::size_t at = body.find(key);
  if (at == std::string::npos) return out;
  const char* p = body.c_str() + at + key.size();
  while (*p != ']' && *p != '\0') {
    char* end = nullptr;
    const double v = std::strtod(p, &end);
    if (end == p) break;
    out.push_back(v);
    p = end;
    if (*p == ',') ++p;
  }
  return out;
}

/// What is wrong with the reply to `p`, or nothing.
std::optional<std::string> check_reply(const planned& p, const reply& r, const server_limits& lim) {
  char msg[240];
  if (p.what == planned::route::refused) {
    if (r.status != p.status)
      return "status " + std::to_string(r.status) + ", want " + std::to_string(p.status) + " (" +
             first_line(r.body) + ")";
    if (r.body.find(p.body_has) == std::string::npos)
      return "the refusal lacks '" + p.body_has + "': " + first_line(r.body);
    return std::nullopt;
  }
  if (r.status != 200) return "status " + std::to_string(r.status) + ": " + first_line(r.body);
  switch (p.what) {
    case planned::route::job: {
      const std::optional<double> got = number_field(r.body, "result");
      const double want = job::reference(p.spec);
      if (!got || !job::close_enough(*got, want)) {
        std::snprintf(msg, sizeof msg, "%s n=%zu seed=%u: result %s, the client's CPU says %.17g",
                      job::to_string(p.spec.kind), p.spec.n, p.spec.seed,
                      got ? std::to_string(*got).c_str() : "missing", want);
        return std::string(msg);
      }
      return std::nullopt;
    }
    case planned::route::busy: {
      const std::optional<double> got = number_field(r.body, "result");
      const std::uint32_t want = busy_math::reference(p.seed);
      if (!got || *got != static_cast<double>(want)) {
        std::snprintf(msg, sizeof msg, "busy seed=%u: result %s, the client's CPU says %u", p.seed,
                      got ? std::to_string(*got).c_str() : "missing", want);
        return std::string(msg);
      }
      return std::nullopt;
    }
    case planned::route::mlp: {
      const mlp::shape& d = lim.model->dims();
      const std::size_t in = static_cast<std::size_t>(d.in);
      const std::size_t rows = p.mlp_inputs.size() / in;
      const std::vector<double> sums = array_field(r.body, "checksums");
      if (sums.size() != rows)
        return "mlp: " + std::to_string(sums.size()) + " checksums for " + std::to_string(rows) +
               " rows: " + first_line(r.body);
      std::vector<float> want(static_cast<std::size_t>(d.out));
      for (std::size_t row = 0; row < rows; ++row) {
        lim.model->forward(p.mlp_inputs.data() + row * in, want.data());
        if (!mlp::checksum_agrees(sums[row], want.data(), d.out)) {
          std::snprintf(msg, sizeof msg, "mlp row %zu: checksum %.9g, the client's CPU says %.9g",
                        row, sums[row], mlp::checksum(want.data(), d.out));
          return std::string(msg);
        }
      }
      const std::optional<double> batch = number_field(r.body, "batch");
      if (!batch || *batch < static_cast<double>(rows) ||
          *batch > static_cast<double>(lim.mlp_max_rows))
        return "mlp: batch size out of range: " + first_line(r.body);
      return std::nullopt;
    }
    default: return std::nullopt;
  }
}

struct load_state {
  const load_options& options;
  clock_type::time_point deadline{};
  std::uint64_t issued = 0;
  load_report report{};
  std::string fixed_request{};

  void fail(std::string why) {
    ++report.errors;
    if (report.first_error.empty()) report.first_error = std::move(why);
  }
};

asio::awaitable<void> load_worker(load_state& st) {
  client c(co_await asio::this_coro::executor);
  int consecutive_failures = 0;
  for (;;) {
    if (st.options.requests > 0 ? st.issued >= st.options.requests
                                : clock_type::now() >= st.deadline)
      break;
    const std::uint64_t i = st.issued++;
    std::optional<planned> p;
    if (st.options.target.empty()) p = self_test_request(i, st.options.limits);
    const std::string& raw = p ? p->raw : st.fixed_request;

    std::string why;
    std::error_code ec;
    if (!c.is_open()) {
      ec = co_await c.connect(st.options.server);
      if (ec) why = "connect: " + ec.message();
    }
    reply r;
    const auto t0 = clock_type::now();
    if (!ec) {
      ec = co_await c.send(raw);
      if (!ec) ec = co_await c.receive(r, why);
      if (ec && why.empty()) why = ec.message();
    }
    if (ec) {
      st.fail("request " + std::to_string(i) + ": " + why);
      c.close();
      if (++consecutive_failures >= 10)
        break;  // the server is gone: do not spin until the deadline
      continue;
    }
    consecutive_failures = 0;
    st.report.latency_us.push_back(
        std::chrono::duration<double, std::micro>(clock_type::now() - t0).count());
    ++st.report.requests;
    if (p) {
      if (p->what == planned::route::refused) ++st.report.refused;
      if (auto wrong = check_reply(*p, r, st.options.limits))
        st.fail("request " + std::to_string(i) + ": " + *wrong);
    } else if (r.status != 200) {
      st.fail("request " + std::to_string(i) + ": status " + std::to_string(r.status) + ": " +
              first_line(r.body));
    }
    if (!r.keep_alive) c.close();
  }
}

}  // namespace

double load_report::percentile(double q) const {
  if (latency_us.empty()) return 0;
  std::vector<double> v = latency_us;
  const std::size_t k =
      std::min(v.size() - 1, static_cast<std::size_t>(q * static_cast<double>(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

load_report run_load(const load_options& options) {
  load_state st{options};  // declared before io: it outlives the coroutine frames io destroys
  if (options.target.empty() && options.limits.model == nullptr) {
    st.fail("the self-test mix needs the /mlp model (load_options::limits.model)");
    return std::move(st.report);
  }
  st.fixed_request = get(options.target);
  asio::io_context io(1);
  const auto t0 = clock_type::now();
  st.deadline = t0 + options.duration;
  for (int i = 0; i < options.connections; ++i)
    asio::co_spawn(io, load_worker(st), [](std::exception_ptr e) {
      if (e) std::rethrow_exception(e);
    });
  // A server that stops answering must not hang the test: give up well after the plan's end.
  const auto limit = options.requests > 0 ? std::chrono::milliseconds(300000)
                                          : options.duration + std::chrono::milliseconds(30000);
  io.run_for(limit);
  if (!io.stopped())
    st.fail("the load did not finish within " + std::to_string(limit.count() / 1000) + " s");
  st.report.seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
  return std::move(st.report);
}

// --- shutdown with requests in flight ----------------------------------------------------------

shutdown_report run_shutdown_check(const tcp::endpoint& server,
                                   const std::vector<std::string>& targets,
                                   const std::function<bool()>& ready,
                                   const std::function<void()>& stop) {
  shutdown_report report;
  asio::io_context io(1);
  std::vector<std::unique_ptr<client>> clients;
  int connected = 0;
  // 1. Connect and send every request.
  for (const std::string& t : targets) {
    clients.push_back(std::make_unique<client>(io.get_executor()));
    asio::co_spawn(
        io,
        [&, c = clients.back().get(), raw = get(t)]() -> asio::awaitable<void> {
          if (auto e = co_await c->connect(server)) {
            report.failures.push_back("connect: " + e.message());
            co_return;
          }
          if (auto e = co_await c->send(raw)) {
            report.failures.push_back("send: " + e.message());
            co_return;
          }
          ++report.sent;
          ++connected;
        },
        asio::detached);
  }
  io.run_for(std::chrono::seconds(10));
  io.restart();
  if (connected != static_cast<int>(targets.size())) {
    report.failures.push_back("only " + std::to_string(connected) + " of " +
                              std::to_string(targets.size()) + " requests were sent");
  }
  // 2. Wait until the server holds them, then stop it.
  const auto give_up = clock_type::now() + std::chrono::seconds(10);
  while (!ready() && clock_type::now() < give_up)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (!ready()) report.failures.push_back("the server never held the requests in flight");
  stop();
  // 3. Each connection: a 200, or closed. Nothing may hang.
  for (auto& c : clients) {
    if (!c->is_open()) continue;
    asio::co_spawn(
        io,
        [&, c = c.get()]() -> asio::awaitable<void> {
          reply r;
          std::string why;
          const std::error_code e = co_await c->receive(r, why);
          if (!e && r.status == 200) {
            ++report.answered;
          } else if (e == asio::error::eof || e == asio::error::connection_reset) {
            ++report.closed;
          } else {
            report.failures.push_back(e ? "unexpected end: " + (why.empty() ? e.message() : why)
                                        : "status " + std::to_string(r.status) + ": " +
                                              first_line(r.body));
          }
        },
        asio::detached);
  }
  io.run_for(std::chrono::seconds(30));
  if (!io.stopped())
    report.failures.push_back("a connection neither answered nor closed within 30 s of stop()");
  return report;
}
