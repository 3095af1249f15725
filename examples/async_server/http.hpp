// Minimal HTTP/1.1 message parsing and formatting for the example server and its load generator.
//
// What it handles: a request line in origin form, header fields, a Content-Length body, keep-alive
// (HTTP/1.1 default, "Connection: close" / HTTP/1.0 "keep-alive"), pipelined requests (the caller
// keeps the bytes after a message for the next one). What it refuses, each with the status a
// client can act on: malformed lines (400), obsolete line folding (400), a missing Host in
// HTTP/1.1 (400), a bad or conflicting Content-Length (400), a body over the limit (413),
// Transfer-Encoding (501: no chunked bodies here), versions other than 1.0/1.1 (505).
//
// Everything here is pure functions on strings: no I/O, no Asio, easy to reason about and to test.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace http {

/// A request head (request line + headers + final CRLF) longer than this is refused with 431.
inline constexpr std::size_t max_head_bytes = 8192;
/// A body longer than this is refused with 413 (the server's bodies are a few parameters).
inline constexpr std::size_t max_body_bytes = 64 * 1024;

struct request {
  std::string method;     ///< e.g. "GET" (case-sensitive, as the RFC says)
  std::string target;     ///< origin form: "/path?query"
  int version_minor = 1;  ///< HTTP/1.<minor>
  std::vector<std::pair<std::string, std::string>> headers;  ///< names lower-cased
  std::size_t content_length = 0;
  bool keep_alive = true;
  std::string body;

  std::string_view path() const noexcept;   ///< target up to '?'
  std::string_view query() const noexcept;  ///< after '?', or empty
  /// The first header named `lower_name`, or nullptr.
  const std::string* header(std::string_view lower_name) const noexcept;
};

/// Why a message was refused: the status to answer with and a message for a human.
struct error {
  int status = 400;
  std::string message;
};

/// Parses a request head: the bytes up to and including the CRLF of the last header line (the
/// empty line that ends the head excluded). Leading empty lines are skipped (RFC 9112 2.2).
std::optional<error> parse_request_head(std::string_view head, request& out);

/// Splits "a=1&b=two" into pairs, decoding %XX and '+'. Returns an error for a bad escape.
std::optional<error> parse_query(std::string_view query,
                                 std::vector<std::pair<std::string, std::string>>& out);

/// ASCII case-insensitive equality (header values such as "close", "100-continue").
bool iequals(std::string_view a, std::string_view b) noexcept;

/// "OK", "Bad Request", ... ("Unknown" for codes this server never sends).
const char* reason_phrase(int status) noexcept;

/// A complete response: status line, Content-Type, Content-Length, Connection, extra header lines
/// (each "Name: value\r\n"), blank line, body.
std::string format_response(int status, std::string_view content_type, std::string_view body,
                            bool keep_alive, std::string_view extra_headers = {});

/// What the load generator needs from a response head.
struct response_head {
  int status = 0;
  std::size_t content_length = 0;
  bool keep_alive = true;
};

/// Parses a response head (same framing as parse_request_head). Content-Length is required: this
/// server always sends one, and the client must know where the next response starts.
std::optional<error> parse_response_head(std::string_view head, response_head& out);

}  // namespace http
