#include "busy.hpp"

namespace busy {

std::optional<std::string> parse(const params::list& query, std::uint32_t max_us, spec& out) {
  out = spec{};
  bool have_us = false;
  for (const auto& [key, value] : query) {
    if (key == "us") {
      if (!params::parse_whole(value, out.us) || out.us < 1 || out.us > max_us)
        return "us must be a whole number from 1 to " + std::to_string(max_us) + ", not " +
               params::quoted(value);
      have_us = true;
    } else if (key == "seed") {
      if (!params::parse_whole(value, out.seed))
        return "seed must be a whole number from 0 to 4294967295, not " + params::quoted(value);
    } else {
      return "unknown parameter " + params::quoted(key) + " for /busy (takes us, seed)";
    }
  }
  if (!have_us)
    return std::string("missing parameter us (the kernel's duration in microseconds), e.g. ") +
           "/busy?us=2000";
  return std::nullopt;
}

}  // namespace busy
