#include "load.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string_view>

#include <asio/co_spawn.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/io_context.hpp>
#include <asio/read.hpp>
#include <asio/read_until.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>

#include "http.hpp"
#include "job.hpp"

namespace {

using clock_type = std::chrono::steady_clock;
using asio::ip::tcp;
constexpr auto use_tuple = asio::experimental::as_tuple(asio::use_awaitable);

struct reply {
  int status = 0;
  std::string body;
  bool keep_alive = true;
};

/// One keep-alive client connection: writes raw requests, reads Content-Length framed responses.
class client {
 public:
  explicit client(const asio::any_io_executor& ex) : socket_(ex) {}

  bool is_open() const { return socket_.is_open(); }

  asio::awaitable<std::error_code> connect(const tcp::endpoint& ep) {
    close();
    auto [ec] = co_await socket_.async_connect(ep, use_tuple);
    std::error_code ignored;
    if (!ec) socket_.set_option(tcp::no_delay(true), ignored);
    co_return ec;
  }

  asio::awaitable<std::error_code> send(std::string_view raw) {
    auto [ec, n] = co_await asio::async_write(socket_, asio::buffer(raw), use_tuple);
    co_return ec;
  }

  asio::awaitable<std::error_code> receive(reply& out, std::string& why) {
    auto [ec, head] = co_await asio::async_read_until(
        socket_, asio::dynamic_buffer(buffer_, 64 * 1024), "\r\n\r\n", use_tuple);
    if (ec) co_return ec;
    http::response_head h;
    if (auto bad = http::parse_response_head(std::string_view(buffer_).substr(0, head - 2), h)) {
      why = bad->message;
      co_return std::make_error_code(std::errc::bad_message);
    }
    buffer_.erase(0, head);
    if (buffer_.size() < h.content_length) {
      auto [bec, n] = co_await asio::async_read(
          socket_, asio::dynamic_buffer(buffer_),
          asio::transfer_exactly(h.content_length - buffer_.size()), use_tuple);
      if (bec) co_return bec;
    }
    out.status = h.status;
    out.keep_alive = h.keep_alive;
    out.body = buffer_.substr(0, h.content_length);
    buffer_.erase(0, h.content_length);
    co_return std::error_code{};
  }

  /// True when the server closes the connection with nothing more to read.
  asio::awaitable<bool> closed_by_peer() {
    if (!buffer_.empty()) co_return false;
    char byte;
    auto [ec, n] = co_await socket_.async_read_some(asio::buffer(&byte, 1), use_tuple);
    co_return ec == asio::error::eof || ec == asio::error::connection_reset;
  }

  void close() {
    std::error_code ignored;
    socket_.close(ignored);
    buffer_.clear();
  }

 private:
  tcp::socket socket_;
  std::string buffer_;
};

std::string get(std::string_view target, std::string_view extra_headers = {}) {
  std::string r = "GET ";
  r += target;
  r += " HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  r += extra_headers;
  r += "\r\n";
  return r;
}

std::string post(std::string_view target, std::string_view form) {
  std::string r = "POST ";
  r += target;
  r += " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
       "application/x-www-form-urlencoded\r\nContent-Length: ";
  r += std::to_string(form.size());
  r += "\r\n\r\n";
  r += form;
  return r;
}

/// The self-test's request number i: a request and the job it asks for (to check the answer).
struct planned {
  std::string raw;
  job::spec spec;
};

planned self_test_request(std::uint64_t i, std::size_t max_n) {
  job::spec s;
  s.seed = static_cast<std::uint32_t>(i * 2654435761u);
  bool use_post = false;
  switch (i % 6) {
    case 0: s = {job::kind::saxpy, 65536, 2.5f, s.seed}; break;
    case 1: s = {job::kind::sum, 65536, 2.0f, s.seed}; break;
    case 2: s = {job::kind::saxpy, 1000, 0.1f, s.seed}; break;  // inexact: the tolerance path
    case 3:
      s = {job::kind::sum, 4096, 2.0f, s.seed};
      use_post = true;
      break;
    case 4: s = {job::kind::saxpy, 1, -3.0f, s.seed}; break;
    default: s = {job::kind::sum, 262144 + i % 1000, 2.0f, s.seed}; break;  // odd sizes
  }
  s.n = std::min(s.n, max_n);
  char params[128];
  if (s.kind == job::kind::saxpy)
    std::snprintf(params, sizeof params, "n=%zu&a=%g&seed=%u", s.n, static_cast<double>(s.a),
                  s.seed);
  else
    std::snprintf(params, sizeof params, "n=%zu&seed=%u", s.n, s.seed);
  const std::string path = std::string("/") + job::to_string(s.kind);
  return {use_post ? post(path, params) : get(path + "?" + params), s};
}

/// The "result" field of the server's JSON reply.
std::optional<double> result_field(const std::string& body) {
  const std::size_t at = body.find("\"result\":");
  if (at == std::string::npos) return std::nullopt;
  const char* begin = body.c_str() + at + 9;
  char* end = nullptr;
  const double v = std::strtod(begin, &end);
  if (end == begin) return std::nullopt;
  return v;
}

std::string first_line(const std::string& s) {
  return s.substr(0, std::min(s.find('\n'), std::size_t{160}));
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
    if (st.options.target.empty()) p = self_test_request(i, st.options.max_n);
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
    if (r.status != 200) {
      st.fail("request " + std::to_string(i) + ": status " + std::to_string(r.status) + ": " +
              first_line(r.body));
    } else if (p) {
      const std::optional<double> got = result_field(r.body);
      const double want = job::reference(p->spec);
      if (!got || !job::close_enough(*got, want)) {
        char msg[200];
        std::snprintf(msg, sizeof msg,
                      "request %llu (%s n=%zu seed=%u): result %s, the client's CPU says %.17g",
                      static_cast<unsigned long long>(i), job::to_string(p->spec.kind), p->spec.n,
                      p->spec.seed, got ? std::to_string(*got).c_str() : "missing", want);
        st.fail(msg);
      }
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
  st.fixed_request = get(options.target);
  asio::io_context io(1);
  const auto t0 = clock_type::now();
  st.deadline = t0 + options.duration;
  for (int i = 0; i < options.connections; ++i)
    asio::co_spawn(io, load_worker(st), [](std::exception_ptr e) {
      if (e) std::rethrow_exception(e);
    });
  // A server that stops answering must not hang the test: give up well after the plan's end.
  const auto limit = options.requests > 0 ? std::chrono::milliseconds(120000)
                                          : options.duration + std::chrono::milliseconds(30000);
  io.run_for(limit);
  if (!io.stopped())
    st.fail("the load did not finish within " + std::to_string(limit.count() / 1000) + " s");
  st.report.seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
  return std::move(st.report);
}

// --- edge cases --------------------------------------------------------------------------------

namespace {

struct edge_case {
  std::string name;
  std::vector<std::string> parts;     ///< written one after another (a head split across writes)
  std::vector<int> statuses;          ///< the responses expected, in order
  bool closes = false;                ///< the server must close after the last one
  std::vector<std::string> body_has;  ///< substrings the last body must contain
};

std::vector<edge_case> edge_cases(bool evr_mode) {
  const std::string host = "Host: 127.0.0.1\r\n";
  std::vector<edge_case> v = {
      {"n=0", {get("/saxpy?n=0")}, {400}, false, {"n must be"}},
      {"n not a number", {get("/sum?n=abc")}, {400}, false, {"n must be"}},
      {"n negative", {get("/sum?n=-5")}, {400}, false, {"n must be"}},
      {"n overflowing", {get("/sum?n=99999999999999999999999")}, {400}, false, {"n must be"}},
      {"n missing", {get("/sum")}, {400}, false, {"missing parameter n"}},
      {"unknown parameter", {get("/sum?n=5&bogus=1")}, {400}, false, {"unknown parameter"}},
      {"a not finite", {get("/saxpy?n=5&a=nan")}, {400}, false, {"a must be"}},
      {"bad percent-escape", {get("/sum?n=%zz")}, {400}, false, {"percent"}},
      {"unknown path", {get("/nope")}, {404}, false, {"no such path"}},
      {"wrong method", {"DELETE /sum?n=1 HTTP/1.1\r\n" + host + "\r\n"}, {405}, false, {}},
      {"POST /metrics", {post("/metrics", "")}, {405}, false, {}},
      {"garbage request line", {"GARBAGE\r\n\r\n"}, {400}, true, {"malformed request line"}},
      {"header without colon",
       {"GET /sum?n=1 HTTP/1.1\r\n" + host + "NoColonHere\r\n\r\n"},
       {400},
       true,
       {}},
      {"space before colon", {"GET /sum?n=1 HTTP/1.1\r\nHost : x\r\n\r\n"}, {400}, true, {}},
      {"bare LF line endings", {"GET /sum?n=1 HTTP/1.1\nHost: x\n\n"}, {400}, true, {"CRLF"}},
      {"bad Content-Length",
       {"POST /sum HTTP/1.1\r\n" + host + "Content-Length: abc\r\n\r\n"},
       {400},
       true,
       {}},
      {"conflicting Content-Length",
       {"POST /sum HTTP/1.1\r\n" + host + "Content-Length: 5\r\nContent-Length: 6\r\n\r\nn=1&s"},
       {400},
       true,
       {}},
      {"body too large",
       {"POST /sum HTTP/1.1\r\n" + host + "Content-Length: 100000000\r\n\r\n"},
       {413},
       true,
       {}},
      {"oversized head",
       {"GET /sum?n=1 HTTP/1.1\r\n" + host + "X-Pad: " + std::string(9000, 'p') + "\r\n\r\n"},
       {431},
       true,
       {}},
      {"HTTP/1.1 without Host", {"GET /sum?n=1 HTTP/1.1\r\n\r\n"}, {400}, true, {"Host"}},
      {"HTTP/2.0", {"GET /sum?n=1 HTTP/2.0\r\n" + host + "\r\n"}, {505}, true, {}},
      {"chunked body",
       {"POST /sum HTTP/1.1\r\n" + host + "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"},
       {501},
       true,
       {}},
      {"POST form body", {post("/sum", "n=100&seed=3")}, {200}, false, {"\"n\":100", "\"seed\":3"}},
      {"pipelined requests", {get("/sum?n=10") + get("/saxpy?n=10")}, {200, 200}, false, {"saxpy"}},
      {"CRLF before a request", {"\r\n" + get("/sum?n=1")}, {200}, false, {}},
      {"head split across writes",
       {"GET /sum?n=10 HT", "TP/1.1\r\nHo", "st: x\r\n", "\r\n"},
       {200},
       false,
       {}},
      {"HTTP/1.0 closes", {"GET /sum?n=10 HTTP/1.0\r\n\r\n"}, {200}, true, {}},
      {"Connection: close", {get("/sum?n=10", "Connection: close\r\n")}, {200}, true, {}},
      {"GET /metrics",
       {get("/metrics")},
       {200},
       false,
       {"evr_server_requests_total", "evr_server_info"}},
  };
  if (evr_mode) v.back().body_has.push_back("evr_reactor_completed_total");
  return v;
}

asio::awaitable<void> run_case(const tcp::endpoint& ep, const edge_case& ec, edge_report& out) {
  client c(co_await asio::this_coro::executor);
  auto fail = [&](const std::string& why) { out.failures.push_back(ec.name + ": " + why); };
  if (auto e = co_await c.connect(ep)) co_return fail("connect: " + e.message());
  for (const std::string& part : ec.parts)
    if (auto e = co_await c.send(part)) co_return fail("send: " + e.message());
  reply r;
  for (int want : ec.statuses) {
    std::string why;
    if (auto e = co_await c.receive(r, why))
      co_return fail("no response: " + (why.empty() ? e.message() : why));
    if (r.status != want)
      co_return fail("status " + std::to_string(r.status) + ", want " + std::to_string(want) +
                     " (" + first_line(r.body) + ")");
  }
  for (const std::string& s : ec.body_has)
    if (r.body.find(s) == std::string::npos)
      co_return fail("the body lacks '" + s + "': " + first_line(r.body));
  if (ec.closes) {
    if (r.keep_alive) co_return fail("the response does not say Connection: close");
    if (!co_await c.closed_by_peer()) co_return fail("the server did not close the connection");
  } else {
    // The connection must still serve requests after this one.
    std::string why;
    if (auto e = co_await c.send(get("/sum?n=1")); e)
      co_return fail("follow-up send: " + e.message());
    if (auto e = co_await c.receive(r, why))
      co_return fail("no follow-up response: " + (why.empty() ? e.message() : why));
    if (r.status != 200) co_return fail("follow-up status " + std::to_string(r.status));
  }
}

}  // namespace

edge_report run_edge_cases(const tcp::endpoint& server, bool evr_mode) {
  const std::vector<edge_case> cases = edge_cases(evr_mode);
  edge_report report;
  asio::io_context io(1);
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        for (const edge_case& ec : cases) {
          co_await run_case(server, ec, report);
          ++report.checked;
        }
      },
      [](std::exception_ptr e) {
        if (e) std::rethrow_exception(e);
      });
  io.run_for(std::chrono::seconds(60));
  if (!io.stopped()) report.failures.push_back("the edge cases did not finish within 60 s");
  return report;
}
