// Helpers shared by the routes that read request parameters (job.*, busy.*, mlp.*): decoded
// query/form pairs in, typed values or a message fit for a 400 response out.
#pragma once

#include <charconv>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace params {

/// Decoded "key=value" pairs in request order (http::parse_query).
using list = std::vector<std::pair<std::string, std::string>>;

/// 'value' for messages, cut at 40 characters: a client's input is echoed, never trusted in full.
inline std::string quoted(std::string_view v) {
  std::string s = "'";
  s += v.substr(0, 40);
  if (v.size() > 40) s += "...";
  s += "'";
  return s;
}

/// The whole of `v` as a number of type T (no sign for unsigned types, no spaces, no suffix).
/// False on anything else, overflow included.
template <typename T>
bool parse_whole(std::string_view v, T& out) noexcept {
  if (v.empty()) return false;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  return ec == std::errc{} && end == v.data() + v.size();
}

}  // namespace params
