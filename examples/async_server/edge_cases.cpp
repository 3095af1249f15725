// The example server's edge cases (load.hpp, run_edge_cases): malformed and unusual requests,
// each on its own connection, with the status and connection behaviour each must get.
#include <exception>
#include <string>
#include <vector>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/this_coro.hpp>

#include "http_client.hpp"
#include "load.hpp"

using asio::ip::tcp;
using http_client::client;
using http_client::first_line;
using http_client::get;
using http_client::post;
using http_client::reply;

namespace {

struct edge_case {
  std::string name;
  std::vector<std::string> parts;     ///< written one after another (a head split across writes)
  std::vector<int> statuses;          ///< the responses expected, in order
  bool closes = false;                ///< the server must close after the last one
  std::vector<std::string> body_has;  ///< substrings the last body must contain
};

std::vector<edge_case> edge_cases(const server_limits& lim) {
  const std::string host = "Host: 127.0.0.1\r\n";
  const std::size_t in = static_cast<std::size_t>(lim.model->dims().in);
  const std::string max_rows = std::to_string(lim.mlp_max_rows);
  const std::string zero_row = [&] {  // a row of `in` zeros, as POST /mlp takes it
    std::string r;
    for (std::size_t j = 0; j < in; ++j) r += j + 1 < in ? "0," : "0\n";
    return r;
  }();
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
      {"a bare CR ending the headers early, a second request behind",
       {"POST /sum HTTP/1.1\r\n" + host +
        "Content-Length: 5\r\n\r?n=1&xGET /sum?n=2 HTTP/1.1\r\nHost: x\r\n\r\n"},
       {400},
       true,
       {"bare CR"}},
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
      {"Transfer-Encoding with Content-Length",
       {"POST /sum HTTP/1.1\r\n" + host +
        "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"},
       {400},
       true,
       {"Transfer-Encoding together with Content-Length"}},
      {"Content-Length after Transfer-Encoding",
       {"POST /sum HTTP/1.1\r\n" + host +
        "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n"},
       {400},
       true,
       {"Transfer-Encoding together with Content-Length"}},
      {"POST form body", {post("/sum", "n=100&seed=3")}, {200}, false, {"\"n\":100", "\"seed\":3"}},
      {"pipelined requests", {get("/sum?n=10") + get("/saxpy?n=10")}, {200, 200}, false, {"saxpy"}},
      {"CRLF before a request", {"\r\n" + get("/sum?n=1")}, {200}, false, {}},
      {"empty lines before a request", {"\r\n\r\n\r\n" + get("/sum?n=1")}, {200}, false, {}},
      {"empty lines written one by one", {"\r\n", "\r\n", get("/sum?n=1")}, {200}, false, {}},
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
       {"evr_server_requests_total", "evr_server_info", "evr_server_mlp_batch_rows_sum"}},
      {"healthz", {get("/healthz")}, {200}, false, {"ok"}},
      {"POST /healthz", {post("/healthz", "")}, {405}, false, {"takes GET"}},
      // --- /busy ---
      {"busy", {get("/busy?us=100&seed=7")}, {200}, false, {"\"op\":\"busy\"", "\"result\":"}},
      {"busy us=0", {get("/busy?us=0")}, {400}, false, {"us must be"}},
      {"busy us not a number", {get("/busy?us=abc")}, {400}, false, {"us must be"}},
      {"busy us over the limit",
       {get("/busy?us=" + std::to_string(lim.max_busy_us + 1))},
       {400},
       false,
       {"us must be"}},
      {"busy us missing", {get("/busy?seed=1")}, {400}, false, {"missing parameter us"}},
      {"busy unknown parameter", {get("/busy?us=5&n=1")}, {400}, false, {"unknown parameter"}},
      {"POST /busy", {post("/busy", "us=5")}, {405}, false, {}},
      // --- /mlp ---
      {"mlp", {get("/mlp?seed=5&rows=2")}, {200}, false, {"\"op\":\"mlp\"", "\"checksums\":["}},
      {"mlp POST", {post("/mlp", zero_row + zero_row, "text/csv")}, {200}, false, {"\"rows\":2"}},
      {"mlp rows=0", {get("/mlp?rows=0")}, {400}, false, {"rows must be"}},
      {"mlp rows not a number", {get("/mlp?rows=x")}, {400}, false, {"rows must be"}},
      {"mlp batch overflow (rows)",
       {get("/mlp?rows=" + std::to_string(lim.mlp_max_rows + 1))},
       {413},
       false,
       {"at most " + max_rows + " rows"}},
      {"mlp unknown parameter", {get("/mlp?seed=1&n=4")}, {400}, false, {"unknown parameter"}},
      {"mlp POST with query parameters",
       {post("/mlp?seed=1", zero_row, "text/csv")},
       {400},
       false,
       {"not query parameters"}},
      {"mlp POST empty body", {post("/mlp", "", "text/csv")}, {400}, false, {"the body has none"}},
      {"mlp POST short row",
       {post("/mlp", "1,2,3\n", "text/csv")},
       {400},
       false,
       {"has 3 numbers"}},
      {"mlp POST not a number",
       {post("/mlp", "1,x," + zero_row, "text/csv")},
       {400},
       false,
       {"not a finite number"}},
      {"mlp POST beyond the model's finite range",
       {post("/mlp", "3e38," + zero_row, "text/csv")},
       {422},
       false,
       {"number 1: '3e38' is beyond what the model keeps finite"}},
      {"mlp POST oversized body",
       {post("/mlp", std::string(70000, '0'), "text/csv")},
       {413},
       true,
       {"larger than"}},
      {"DELETE /mlp", {"DELETE /mlp HTTP/1.1\r\n" + host + "\r\n"}, {405}, false, {}},
  };
  // Batch overflow through a body too, when max+1 rows of zeros fit the body limit.
  if ((lim.mlp_max_rows + 1) * zero_row.size() <= http::max_body_bytes) {
    std::string rows;
    for (std::size_t r = 0; r <= lim.mlp_max_rows; ++r) rows += zero_row;
    v.push_back({"mlp batch overflow (body)",
                 {post("/mlp", rows, "text/csv")},
                 {413},
                 false,
                 {"at most " + max_rows + " rows"}});
  }
  if (lim.evr_mode) {
    for (auto& c : v)
      if (c.name == "GET /metrics") c.body_has.push_back("evr_reactor_completed_total");
  }
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
    // The connection must still serve requests after this one: a refusal loses nothing.
    std::string why;
    if (auto e = co_await c.send(get("/sum?n=1")); e)
      co_return fail("follow-up send: " + e.message());
    if (auto e = co_await c.receive(r, why))
      co_return fail("no follow-up response: " + (why.empty() ? e.message() : why));
    if (r.status != 200) co_return fail("follow-up status " + std::to_string(r.status));
  }
}

}  // namespace

edge_report run_edge_cases(const tcp::endpoint& server, const server_limits& limits) {
  edge_report report;
  if (limits.model == nullptr) {
    report.failures.push_back("the edge cases need the /mlp model (server_limits::model)");
    return report;
  }
  const std::vector<edge_case> cases = edge_cases(limits);
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
