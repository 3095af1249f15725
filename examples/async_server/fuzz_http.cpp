// A libFuzzer target for the server's HTTP parsing (http.hpp): any bytes as a request head, the
// target's query and the bytes themselves as query or form parameters, and as a response head.
// Beyond not crashing (under ASan and UBSan), a head the parser accepts must keep what the server
// relies on, and a refusal must carry a 4xx/5xx status and a message; a broken promise aborts.
//
// Built and run by scripts/ci/fuzz-http.sh (clang-14, -fsanitize=fuzzer,address,undefined) from the
// seed corpus in fuzz/http/; not part of the CMake build.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "http.hpp"

namespace {

void require(bool holds, const char* promise, std::string_view input) {
  if (holds) return;
  std::fprintf(stderr, "fuzz_http: broken: %s, for %zu bytes of input\n", promise, input.size());
  std::abort();
}

bool lower_token(std::string_view name) {
  if (name.empty()) return false;
  for (char c : name)
    if (c <= ' ' || c >= 127 || (c >= 'A' && c <= 'Z') || c == ':') return false;
  return true;
}

void check_request(std::string_view in, const http::request& req) {
  require(!req.method.empty(), "an accepted head has a method", in);
  require(!req.target.empty() && req.target.front() == '/', "the target is in origin form", in);
  require(req.version_minor == 0 || req.version_minor == 1, "HTTP/1.0 or HTTP/1.1", in);
  require(req.content_length <= http::max_body_bytes, "Content-Length within the body limit", in);
  require(req.headers.size() <= 100, "at most 100 header fields", in);
  for (const auto& [name, value] : req.headers)
    require(lower_token(name), "header names are lower-case tokens", in);
  require(req.version_minor == 0 || req.header("host") != nullptr, "HTTP/1.1 has a Host", in);
  require(req.header("transfer-encoding") == nullptr, "no Transfer-Encoding accepted", in);
  require(req.path().size() + req.query().size() <= req.target.size(), "path and query fit", in);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // Reused from input to input, as a connection reuses its request and parameter lists.
  static http::request req;
  static std::vector<std::pair<std::string, std::string>> pairs;
  const std::string_view in(reinterpret_cast<const char*>(data), size);

  if (auto refused = http::parse_request_head(in, req)) {
    require(refused->status >= 400 && refused->status < 600, "a refusal is a 4xx or 5xx", in);
    require(!refused->message.empty(), "a refusal says why", in);
  } else {
    check_request(in, req);
    if (auto bad = http::parse_query(req.query(), pairs))
      require(bad->status == 400, "a bad query is a 400", in);
  }
  if (!http::parse_query(in, pairs))
    for (const auto& [key, value] : pairs)
      require(key.size() + value.size() <= in.size(), "decoding never grows", in);
  http::response_head head;
  if (!http::parse_response_head(in, head))
    require(head.status >= 0 && head.status <= 999, "a response status is three digits", in);
  require(http::only_line_ends(in) == (in.find_first_not_of("\r\n") == std::string_view::npos),
          "only_line_ends is what it says", in);
  return 0;
}
