// HTTP/1.1 message heads for the example server and its load generator, parsed by the nodejs
// http_parser library (Debian's libhttp-parser-dev, version 2.9) and formatted here.
//
// The parser does the framing and the grammar: request line, methods, versions, header tokens,
// Content-Length (malformed or repeated: refused), keep-alive, chunked detection. On top of it
// this file applies the server's policy, each refusal with the status a client can act on:
//   400  a bare LF or CR line ending or obsolete line folding (the parser tolerates them; accepting
//        them here and not elsewhere is how request smuggling starts), whitespace before a
//        header's colon, a target not in origin form ("/path?query"), a missing or repeated Host
//        in HTTP/1.1, more than one Content-Length, Transfer-Encoding with Content-Length
//   413  a Content-Length above max_body_bytes
//   431  more than 100 header fields (the reader refuses heads above max_head_bytes itself)
//   501  Transfer-Encoding (no chunked bodies here)
//   505  versions other than HTTP/1.0 and HTTP/1.1
// Bodies are exactly Content-Length bytes, read by the caller.
//
// Everything here is a pure function on strings: no I/O, no Asio. Thread-safe.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace http {

/// A request head (request line + headers + the empty line) longer than this is refused with 431.
inline constexpr std::size_t max_head_bytes = 8192;
/// A body longer than this is refused with 413 (/mlp rows, form parameters).
inline constexpr std::size_t max_body_bytes = 64 * 1024;

struct request {
  std::string method;     ///< e.g. "GET" (case-sensitive, as the RFC says)
  std::string target;     ///< origin form: "/path?query"
  int version_minor = 1;  ///< HTTP/1.<minor>
  std::vector<std::pair<std::string, std::string>> headers;  ///< names lower-cased
  std::size_t content_length = 0;
  bool keep_alive = true;
  std::string body;

  /// Empties every field, keeping the strings' and the vector's capacity (a connection reuses
  /// one request object: no allocation per request once it has grown).
  void clear() noexcept;
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

/// Parses a request head: the bytes up to and including the empty line that ends it ("\r\n\r\n").
/// Empty lines before the request line are skipped (RFC 9112 2.2). `out` is cleared first, its
/// storage reused.
std::optional<error> parse_request_head(std::string_view head, request& out);

/// True when `s` holds nothing but CR and LF: empty lines a client may send before a request.
bool only_line_ends(std::string_view s) noexcept;

/// Splits "a=1&b=two" into pairs, decoding %XX and '+'. Returns an error for a bad escape. The
/// pairs already in `out` are overwritten in place (their strings' storage reused).
std::optional<error> parse_query(std::string_view query,
                                 std::vector<std::pair<std::string, std::string>>& out);

/// ASCII case-insensitive equality (header values such as "close", "100-continue").
bool iequals(std::string_view a, std::string_view b) noexcept;

/// "OK", "Bad Request", ... (the parser library's table).
const char* reason_phrase(int status) noexcept;

/// A complete response: status line, Content-Type, Content-Length, Connection, extra header lines
/// (each "Name: value\r\n"), blank line, body.
std::string format_response(int status, std::string_view content_type, std::string_view body,
                            bool keep_alive, std::string_view extra_headers = {});
/// The same, appended to `out` (a buffer reused from response to response).
void append_response(std::string& out, int status, std::string_view content_type,
                     std::string_view body, bool keep_alive, std::string_view extra_headers = {});

/// What the load generator needs from a response head.
struct response_head {
  int status = 0;
  std::size_t content_length = 0;
  bool keep_alive = true;
};

/// Parses a response head (up to and including the empty line). Content-Length is required: this
/// server always sends one, and the client must know where the next response starts.
std::optional<error> parse_response_head(std::string_view head, response_head& out);

}  // namespace http
