// handle_text.hpp — private to device/src: builds the context strings of evr::error messages
// ("evr::event::record(event 0x55d0.., stream 0x55d1.., device 1)"). Only called on failure paths.
#pragma once

#include <cstdio>
#include <initializer_list>
#include <string>

namespace evr::detail {

/// "event 0x7f3a...": a label and a handle's address ("stream 0x0" is the legacy default stream).
inline std::string handle_text(const char* label, const void* handle) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s %p", label, handle);
  return buf;
}

/// "call(part, part, ...)".
inline std::string call_text(const char* call, std::initializer_list<std::string> parts) {
  std::string text = call;
  text += '(';
  bool first = true;
  for (const auto& p : parts) {
    if (p.empty()) continue;
    if (!first) text += ", ";
    text += p;
    first = false;
  }
  text += ')';
  return text;
}

/// "device 3", or "" when unknown (negative).
inline std::string device_text(int device) {
  return device < 0 ? std::string() : "device " + std::to_string(device);
}

}  // namespace evr::detail
