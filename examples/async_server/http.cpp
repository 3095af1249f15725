#include "http.hpp"

#include <http_parser.h>

#include <cctype>
#include <charconv>

namespace http {

namespace {

constexpr std::size_t max_header_fields = 100;

bool is_tchar(char c) noexcept {
  return std::isalnum(static_cast<unsigned char>(c)) ||
         std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

bool is_token(std::string_view s) noexcept {
  if (s.empty()) return false;
  for (char c : s)
    if (!is_tchar(c)) return false;
  return true;
}

char to_lower(char c) noexcept {
  return static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
}

/// What http_parser tolerates and this server does not: bare LF or CR line endings and obsolete
/// line folding (a header line starting with a space or tab).
std::optional<error> check_line_endings(std::string_view head) {
  bool seen_line = false;  // a non-empty line went by: later lines are header lines
  for (std::size_t i = 0; i < head.size(); ++i) {
    // A CR without its LF: the parser would end the headers at "\r\n\r" and take what follows
    // as a body and a second message inside one head (found by fuzz_http.cpp).
    if (head[i] == '\r' && (i + 1 == head.size() || head[i + 1] != '\n'))
      return error{400, "lines must end with CRLF, not a bare CR"};
    if (head[i] != '\n') continue;
    if (i == 0 || head[i - 1] != '\r') return error{400, "lines must end with CRLF, not a bare LF"};
    if (i >= 2 && head[i - 2] != '\n') seen_line = true;
    if (seen_line && i + 1 < head.size() && (head[i + 1] == ' ' || head[i + 1] == '\t'))
      return error{400, "obsolete header line folding is not accepted"};
  }
  return std::nullopt;
}

/// Collects a request head from http_parser's callbacks. A callback that finds a problem stores
/// it and returns non-zero, which stops the parser (HPE_CB_*); the stored error is reported.
/// Header fields go straight into out->headers[fields] (a slot reused from the previous request
/// when there is one: its strings keep their storage); `fields` counts the finished ones, the
/// slot past them is the one being filled.
struct request_collector {
  request* out = nullptr;
  bool in_value = false;
  bool in_field = false;
  std::size_t fields = 0;
  int hosts = 0;
  int messages = 0;  // begun: a head holds one
  bool keep_alive = true;
  std::optional<error> refused;

  std::pair<std::string, std::string>& slot() {
    if (out->headers.size() <= fields) out->headers.emplace_back();
    return out->headers[fields];
  }

  int flush() {
    if (!in_value) return 0;
    in_value = false;
    in_field = false;
    auto& [field, value] = slot();
    // The parser takes "Host :" as the field "Host " (whitespace before the colon, RFC 9112 5.1).
    if (!is_token(field)) {
      refused = error{400, "malformed header name '" + field.substr(0, 40) + "'"};
      return 1;
    }
    if (fields + 1 > max_header_fields) {
      refused = error{431, "too many header fields"};
      return 1;
    }
    for (char& c : field) c = to_lower(c);
    if (field == "host") ++hosts;
    ++fields;
    return 0;
  }

  static request_collector& of(http_parser* p) { return *static_cast<request_collector*>(p->data); }

  static const http_parser_settings& settings() {
    static const http_parser_settings s = [] {
      http_parser_settings st;
      http_parser_settings_init(&st);
      st.on_message_begin = [](http_parser* p) {
        ++of(p).messages;
        return 0;
      };
      st.on_url = [](http_parser* p, const char* at, std::size_t n) {
        of(p).out->target.append(at, n);
        return 0;
      };
      st.on_header_field = [](http_parser* p, const char* at, std::size_t n) {
        request_collector& c = of(p);
        if (int rc = c.flush()) return rc;
        auto& [field, value] = c.slot();
        if (!c.in_field) {  // a new field (the parser may deliver one in several pieces)
          field.clear();
          value.clear();
          c.in_field = true;
        }
        field.append(at, n);
        return 0;
      };
      st.on_header_value = [](http_parser* p, const char* at, std::size_t n) {
        request_collector& c = of(p);
        c.in_value = true;
        c.slot().second.append(at, n);
        return 0;
      };
      st.on_headers_complete = [](http_parser* p) {
        request_collector& c = of(p);
        c.keep_alive = http_should_keep_alive(p) != 0;
        return c.flush();
      };
      return st;
    }();
    return s;
  }
};

/// The message for a parser error in a request head.
error request_error(http_errno e) {
  const std::string what = http_errno_description(e);
  switch (e) {
    case HPE_INVALID_METHOD:
    case HPE_INVALID_URL:
    case HPE_INVALID_VERSION:
      return {400, "malformed request line (want: METHOD /path HTTP/1.1): " + what};
    case HPE_INVALID_HEADER_TOKEN: return {400, "malformed header line: " + what};
    case HPE_INVALID_CONTENT_LENGTH:
      return {400, "Content-Length must be a decimal number that fits 64 bits"};
    case HPE_UNEXPECTED_CONTENT_LENGTH: return {400, "more than one Content-Length"};
    case HPE_HEADER_OVERFLOW: return {431, "the request head is too large"};
    case HPE_INVALID_TRANSFER_ENCODING:
      return {501, "Transfer-Encoding is not supported; send a Content-Length body"};
    default: return {400, "malformed request head: " + what};
  }
}

/// True when a header line of `head` (after the request line) is named `lower_name`.
bool has_header_line(std::string_view head, std::string_view lower_name) noexcept {
  for (std::size_t at = head.find('\n'); at != std::string_view::npos;
       at = head.find('\n', at + 1)) {
    std::string_view line = head.substr(at + 1);
    line = line.substr(0, line.find('\n'));
    const std::size_t colon = line.find(':');
    if (colon != std::string_view::npos && iequals(line.substr(0, colon), lower_name)) return true;
  }
  return false;
}

int hex_value(char c) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::optional<error> decode(std::string_view in, std::string& out) {
  out.clear();
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (in[i] == '+') {
      out.push_back(' ');
    } else if (in[i] == '%') {
      if (i + 2 >= in.size() || hex_value(in[i + 1]) < 0 || hex_value(in[i + 2]) < 0)
        return error{400, "bad percent-escape in the query"};
      out.push_back(static_cast<char>(hex_value(in[i + 1]) * 16 + hex_value(in[i + 2])));
      i += 2;
    } else {
      out.push_back(in[i]);
    }
  }
  return std::nullopt;
}

}  // namespace

bool only_line_ends(std::string_view s) noexcept {
  return s.find_first_not_of("\r\n") == std::string_view::npos;
}

bool iequals(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (to_lower(a[i]) != to_lower(b[i])) return false;
  return true;
}

void request::clear() noexcept {
  method.clear();
  target.clear();
  version_minor = 1;
  headers.clear();  // (destroys the pairs; parse_request_head keeps them instead)
  content_length = 0;
  keep_alive = true;
  body.clear();
}

std::string_view request::path() const noexcept {
  return std::string_view(target).substr(0, target.find('?'));
}

std::string_view request::query() const noexcept {
  const std::size_t q = target.find('?');
  return q == std::string::npos ? std::string_view{} : std::string_view(target).substr(q + 1);
}

const std::string* request::header(std::string_view lower_name) const noexcept {
  for (const auto& [name, value] : headers)
    if (name == lower_name) return &value;
  return nullptr;
}

std::optional<error> parse_request_head(std::string_view head, request& out) {
  // Cleared but for the header slots, which the collector overwrites in place (their strings keep
  // their storage) and which are trimmed to the fields seen at the end.
  out.method.clear();
  out.target.clear();
  out.version_minor = 1;
  out.content_length = 0;
  out.keep_alive = true;
  out.body.clear();
  request_collector c;
  c.out = &out;
  struct trim {
    request_collector& c;
    ~trim() { c.out->headers.resize(c.fields); }
  } trim_headers{c};
  if (auto e = check_line_endings(head)) return e;

  http_parser p;
  http_parser_init(&p, HTTP_REQUEST);
  p.data = &c;
  const std::size_t parsed =
      http_parser_execute(&p, &request_collector::settings(), head.data(), head.size());
  if (c.refused) return c.refused;
  if (const auto e = HTTP_PARSER_ERRNO(&p); e != HPE_OK) {
    // The parser reports both a repeated Content-Length and one beside Transfer-Encoding so.
    if (e == HPE_UNEXPECTED_CONTENT_LENGTH && has_header_line(head, "transfer-encoding"))
      return error{400,
                   "Transfer-Encoding together with Content-Length is not accepted (the two "
                   "disagree on where the body ends); send a Content-Length body alone"};
    return request_error(e);
  }
  if (parsed != head.size() || c.in_value || p.http_major == 0)
    return error{400, "the request head is incomplete"};
  if (c.messages != 1) return error{400, "one request head at a time"};

  if (out.target.empty() || out.target.front() != '/')
    return error{400, "the target must be a path starting with '/' (origin form)"};
  if (p.http_major != 1 || p.http_minor > 1)
    return error{505, "only HTTP/1.0 and HTTP/1.1 are supported, not HTTP/" +
                          std::to_string(p.http_major) + "." + std::to_string(p.http_minor)};
  if (p.uses_transfer_encoding || (p.flags & F_CHUNKED) != 0)
    return error{501, "Transfer-Encoding is not supported; send a Content-Length body"};
  if ((p.flags & F_CONTENTLENGTH) != 0) {
    if (p.content_length > max_body_bytes)
      return error{413, "the body is larger than " + std::to_string(max_body_bytes) + " bytes"};
    out.content_length = static_cast<std::size_t>(p.content_length);
  }
  out.version_minor = p.http_minor;
  if (out.version_minor == 1 && c.hosts != 1)
    return error{400,
                 c.hosts == 0 ? "HTTP/1.1 requires a Host header" : "more than one Host header"};
  out.method.assign(http_method_str(static_cast<http_method>(p.method)));
  out.keep_alive = c.keep_alive;
  return std::nullopt;
}

std::optional<error> parse_query(std::string_view query,
                                 std::vector<std::pair<std::string, std::string>>& out) {
  std::size_t n = 0;  // pairs filled; out[n..] are spare slots from an earlier query
  struct trim {
    std::vector<std::pair<std::string, std::string>>& out;
    std::size_t& n;
    ~trim() { out.resize(n); }
  } trim_pairs{out, n};
  while (!query.empty()) {
    const std::size_t amp = query.find('&');
    const std::string_view part = query.substr(0, amp);
    if (!part.empty()) {
      const std::size_t eq = part.find('=');
      if (out.size() <= n) out.emplace_back();
      auto& [key, value] = out[n];
      if (auto e = decode(part.substr(0, eq), key)) return e;
      value.clear();
      if (eq != std::string_view::npos)
        if (auto e = decode(part.substr(eq + 1), value)) return e;
      ++n;
    }
    if (amp == std::string_view::npos) break;
    query.remove_prefix(amp + 1);
  }
  return std::nullopt;
}

const char* reason_phrase(int status) noexcept {
  return http_status_str(static_cast<http_status>(status));
}

std::string format_response(int status, std::string_view content_type, std::string_view body,
                            bool keep_alive, std::string_view extra_headers) {
  std::string out;
  append_response(out, status, content_type, body, keep_alive, extra_headers);
  return out;
}

void append_response(std::string& out, int status, std::string_view content_type,
                     std::string_view body, bool keep_alive, std::string_view extra_headers) {
  out.reserve(out.size() + 128 + extra_headers.size() + body.size());
  char digits[24];
  out += "HTTP/1.1 ";
  out.append(digits, std::to_chars(digits, digits + sizeof digits, status).ptr);
  out += ' ';
  out += reason_phrase(status);
  out += "\r\nContent-Type: ";
  out += content_type;
  out += "\r\nContent-Length: ";
  out.append(digits, std::to_chars(digits, digits + sizeof digits, body.size()).ptr);
  out += keep_alive ? "\r\nConnection: keep-alive\r\n" : "\r\nConnection: close\r\n";
  out += extra_headers;
  out += "\r\n";
  out += body;
}

std::optional<error> parse_response_head(std::string_view head, response_head& out) {
  out = response_head{};
  if (auto e = check_line_endings(head)) return e;
  struct collector {
    bool keep_alive = true;
    bool complete = false;
  } c;
  static const http_parser_settings settings = [] {
    http_parser_settings st;
    http_parser_settings_init(&st);
    st.on_headers_complete = [](http_parser* p) {
      auto& c = *static_cast<collector*>(p->data);
      c.keep_alive = http_should_keep_alive(p) != 0;
      c.complete = true;
      return 0;
    };
    return st;
  }();
  http_parser p;
  http_parser_init(&p, HTTP_RESPONSE);
  p.data = &c;
  http_parser_execute(&p, &settings, head.data(), head.size());
  if (const auto e = HTTP_PARSER_ERRNO(&p); e != HPE_OK)
    return error{400, std::string("malformed response head: ") + http_errno_description(e)};
  if (!c.complete) return error{400, "the response head is incomplete"};
  if ((p.flags & F_CONTENTLENGTH) == 0) return error{400, "response without Content-Length"};
  out.status = static_cast<int>(p.status_code);
  out.content_length = static_cast<std::size_t>(p.content_length);
  out.keep_alive = c.keep_alive;
  return std::nullopt;
}

}  // namespace http
