#include "http.hpp"

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

std::string_view trim_ows(std::string_view s) noexcept {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

/// Takes the next CRLF-terminated line off `rest`. A bare LF is refused rather than tolerated:
/// accepting it in one place and not another is how request smuggling starts.
std::optional<error> next_line(std::string_view& rest, std::string_view& line) {
  const std::size_t lf = rest.find('\n');
  if (lf == std::string_view::npos) return error{400, "the head does not end with CRLF"};
  if (lf == 0 || rest[lf - 1] != '\r') return error{400, "lines must end with CRLF, not a bare LF"};
  line = rest.substr(0, lf - 1);
  rest.remove_prefix(lf + 1);
  return std::nullopt;
}

/// "HTTP/1.1" → 1. Other well-formed versions → 505; anything else → 400.
std::optional<error> parse_version(std::string_view v, int& minor) {
  if (v.size() == 8 && v.substr(0, 5) == "HTTP/" &&
      std::isdigit(static_cast<unsigned char>(v[5])) && v[6] == '.' &&
      std::isdigit(static_cast<unsigned char>(v[7]))) {
    if (v[5] == '1' && (v[7] == '0' || v[7] == '1')) {
      minor = v[7] - '0';
      return std::nullopt;
    }
    return error{505, "only HTTP/1.0 and HTTP/1.1 are supported, not " + std::string(v)};
  }
  return error{400, "malformed HTTP version"};
}

/// A plain decimal number (no sign, no spaces, no list). False on anything else or overflow.
bool parse_decimal(std::string_view v, std::size_t& out) noexcept {
  if (v.empty()) return false;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  return ec == std::errc{} && end == v.data() + v.size() && v.front() != '-' && v.front() != '+';
}

bool all_digits(std::string_view v) noexcept {
  return !v.empty() && v.find_first_not_of("0123456789") == std::string_view::npos;
}

/// A request's Content-Length: a decimal number of at most max_body_bytes.
std::optional<error> parse_content_length(std::string_view v, std::size_t& out) {
  std::size_t n = 0;
  const bool ok = parse_decimal(v, n);
  if ((ok && n > max_body_bytes) || (!ok && all_digits(v)))  // too large, or overflowing
    return error{413, "the body is larger than " + std::to_string(max_body_bytes) + " bytes"};
  if (!ok)
    return error{
        400, "Content-Length must be a decimal number, not '" + std::string(v.substr(0, 40)) + "'"};
  out = n;
  return std::nullopt;
}

/// Header lines up to the end of the head. Calls field(lower_name, value) for each.
template <typename Field>
std::optional<error> parse_fields(std::string_view rest, Field&& field) {
  std::size_t count = 0;
  while (!rest.empty()) {
    std::string_view line;
    if (auto e = next_line(rest, line)) return e;
    if (line.empty()) return error{400, "unexpected empty line inside the head"};
    if (line.front() == ' ' || line.front() == '\t')
      return error{400, "obsolete header line folding is not accepted"};
    if (++count > max_header_fields) return error{431, "too many header fields"};
    const std::size_t colon = line.find(':');
    if (colon == std::string_view::npos)
      return error{400, "header line without ':' ('" + std::string(line.substr(0, 40)) + "')"};
    const std::string_view name = line.substr(0, colon);
    if (!is_token(name))  // also refuses whitespace before the colon (RFC 9112 5.1)
      return error{400, "malformed header name '" + std::string(name.substr(0, 40)) + "'"};
    const std::string_view value = trim_ows(line.substr(colon + 1));
    for (char c : value) {
      const auto u = static_cast<unsigned char>(c);
      if ((u < 0x20 && c != '\t') || u == 0x7f)
        return error{400, "control character in the value of header '" + std::string(name) + "'"};
    }
    std::string lower;
    lower.reserve(name.size());
    for (char c : name) lower.push_back(to_lower(c));
    if (auto e = field(std::move(lower), value)) return e;
  }
  return std::nullopt;
}

/// Applies "Connection: a, b" tokens to a keep-alive default.
void apply_connection(std::string_view value, bool& keep_alive) {
  while (!value.empty()) {
    const std::size_t comma = value.find(',');
    const std::string_view token = trim_ows(value.substr(0, comma));
    if (iequals(token, "close"))
      keep_alive = false;
    else if (iequals(token, "keep-alive"))
      keep_alive = true;
    if (comma == std::string_view::npos) break;
    value.remove_prefix(comma + 1);
  }
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
      const int hi = hex_value(in[i + 1]);
      const int lo = hex_value(in[i + 2]);
      out.push_back(static_cast<char>(hi * 16 + lo));
      i += 2;
    } else {
      out.push_back(in[i]);
    }
  }
  return std::nullopt;
}

}  // namespace

bool iequals(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (to_lower(a[i]) != to_lower(b[i])) return false;
  return true;
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
  out = request{};
  while (head.substr(0, 2) == "\r\n") head.remove_prefix(2);  // stray CRLFs after a body

  std::string_view line;
  if (auto e = next_line(head, line)) return e;
  // request-line = method SP request-target SP HTTP-version, single spaces (RFC 9112 3).
  const std::size_t sp1 = line.find(' ');
  const std::size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos)
    return error{400, "malformed request line (want: METHOD /path HTTP/1.1)"};
  const std::string_view method = line.substr(0, sp1);
  const std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  if (!is_token(method)) return error{400, "malformed method"};
  if (target.empty() || target.front() != '/')
    return error{400, "the target must be a path starting with '/' (origin form)"};
  for (char c : target) {
    const auto u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u >= 0x7f) return error{400, "invalid character in the target"};
  }
  if (auto e = parse_version(line.substr(sp2 + 1), out.version_minor)) return e;
  out.method = method;
  out.target = target;
  out.keep_alive = out.version_minor >= 1;

  bool have_length = false;
  int hosts = 0;
  std::optional<bool> connection_keep_alive;
  auto e =
      parse_fields(head, [&](std::string name, std::string_view value) -> std::optional<error> {
        if (name == "content-length") {
          std::size_t n = 0;
          if (auto le = parse_content_length(value, n)) return le;
          // Two different lengths would let two parties frame the message differently.
          if (have_length && n != out.content_length)
            return error{400, "conflicting Content-Length"};
          have_length = true;
          out.content_length = n;
        } else if (name == "transfer-encoding") {
          return error{501, "Transfer-Encoding is not supported; send a Content-Length body"};
        } else if (name == "host") {
          ++hosts;
        } else if (name == "connection") {
          bool keep = out.keep_alive;
          apply_connection(value, keep);
          connection_keep_alive = keep;
        }
        out.headers.emplace_back(std::move(name), std::string(value));
        return std::nullopt;
      });
  if (e) return e;
  if (out.version_minor == 1 && hosts != 1)
    return error{400, hosts == 0 ? "HTTP/1.1 requires a Host header" : "more than one Host header"};
  if (connection_keep_alive) out.keep_alive = *connection_keep_alive;
  return std::nullopt;
}

std::optional<error> parse_query(std::string_view query,
                                 std::vector<std::pair<std::string, std::string>>& out) {
  out.clear();
  while (!query.empty()) {
    const std::size_t amp = query.find('&');
    const std::string_view part = query.substr(0, amp);
    if (!part.empty()) {
      const std::size_t eq = part.find('=');
      std::string key, value;
      if (auto e = decode(part.substr(0, eq), key)) return e;
      if (eq != std::string_view::npos)
        if (auto e = decode(part.substr(eq + 1), value)) return e;
      out.emplace_back(std::move(key), std::move(value));
    }
    if (amp == std::string_view::npos) break;
    query.remove_prefix(amp + 1);
  }
  return std::nullopt;
}

const char* reason_phrase(int status) noexcept {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Content Too Large";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
  }
}

std::string format_response(int status, std::string_view content_type, std::string_view body,
                            bool keep_alive, std::string_view extra_headers) {
  std::string out;
  out.reserve(128 + extra_headers.size() + body.size());
  out += "HTTP/1.1 ";
  out += std::to_string(status);
  out += ' ';
  out += reason_phrase(status);
  out += "\r\nContent-Type: ";
  out += content_type;
  out += "\r\nContent-Length: ";
  out += std::to_string(body.size());
  out += keep_alive ? "\r\nConnection: keep-alive\r\n" : "\r\nConnection: close\r\n";
  out += extra_headers;
  out += "\r\n";
  out += body;
  return out;
}

std::optional<error> parse_response_head(std::string_view head, response_head& out) {
  out = response_head{};
  std::string_view line;
  if (auto e = next_line(head, line)) return e;
  // status-line = HTTP-version SP status-code SP [reason-phrase]
  if (line.size() < 12 || line.substr(0, 7) != "HTTP/1." || line[8] != ' ' ||
      (line.size() > 12 && line[12] != ' '))
    return error{400, "malformed status line '" + std::string(line.substr(0, 40)) + "'"};
  int status = 0;
  auto [end, ec] = std::from_chars(line.data() + 9, line.data() + 12, status);
  if (ec != std::errc{} || end != line.data() + 12 || status < 100)
    return error{400, "malformed status code"};
  out.status = status;
  out.keep_alive = line[7] == '1';
  bool have_length = false;
  auto e =
      parse_fields(head, [&](std::string name, std::string_view value) -> std::optional<error> {
        if (name == "content-length") {
          // No size limit here: responses (/metrics) may be larger than requests.
          if (!parse_decimal(value, out.content_length))
            return error{400, "malformed Content-Length in the response"};
          have_length = true;
        } else if (name == "connection") {
          apply_connection(value, out.keep_alive);
        }
        return std::nullopt;
      });
  if (e) return e;
  if (!have_length) return error{400, "response without Content-Length"};
  return std::nullopt;
}

}  // namespace http
