// The built-in HTTP client's pieces that load.cpp (the self-test mix, the load, the shutdown
// check) and edge_cases.cpp share: one keep-alive connection, and the requests it writes.
// Test code for the example server, not a general HTTP client: Content-Length framing only.
#pragma once

#include <algorithm>
#include <cstdio>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <asio/awaitable.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/read.hpp>
#include <asio/read_until.hpp>
#include <asio/write.hpp>

#include "http.hpp"
#include "use_tuple.hpp"

namespace http_client {

using asio::ip::tcp;

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
    if (auto bad = http::parse_response_head(std::string_view(buffer_).substr(0, head), h)) {
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

inline std::string get(std::string_view target, std::string_view extra_headers = {}) {
  std::string r = "GET ";
  r += target;
  r += " HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  r += extra_headers;
  r += "\r\n";
  return r;
}

inline std::string post(std::string_view target, std::string_view body,
                        std::string_view content_type = "application/x-www-form-urlencoded") {
  std::string r = "POST ";
  r += target;
  r += " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: ";
  r += content_type;
  r += "\r\nContent-Length: ";
  r += std::to_string(body.size());
  r += "\r\n\r\n";
  r += body;
  return r;
}

/// Rows of numbers as the server's POST /mlp takes them: one row per line, comma-separated, with
/// 9 significant digits (a float survives the round trip exactly).
inline std::string csv_rows(const std::vector<float>& values, std::size_t per_row) {
  std::string out;
  char num[32];
  for (std::size_t i = 0; i < values.size(); ++i) {
    std::snprintf(num, sizeof num, "%.9g", static_cast<double>(values[i]));
    out += num;
    out += (i + 1) % per_row == 0 ? '\n' : ',';
  }
  return out;
}

/// The first line of a body, at most 160 characters: for a failure message.
inline std::string first_line(const std::string& s) {
  return s.substr(0, std::min(s.find('\n'), std::size_t{160}));
}

}  // namespace http_client
