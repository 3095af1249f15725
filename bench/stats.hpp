// bench/stats.hpp — percentiles, a results table and a small JSON writer for evr-bench.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

namespace evr::bench {

using bench_clock = std::chrono::steady_clock;

inline double ns_between(bench_clock::time_point a, bench_clock::time_point b) {
  return std::chrono::duration<double, std::nano>(b - a).count();
}

inline double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(q * static_cast<double>(v.size())))];
}

/// A named series of samples (nanoseconds, or any unit the subcommand states).
struct series {
  std::string name;
  std::string group;  // e.g. "baseline", "evr", "hand-off"
  std::vector<double> samples;
  double p50() const { return percentile(samples, 0.50); }
  double p90() const { return percentile(samples, 0.90); }
  double p99() const { return percentile(samples, 0.99); }
};

/// Minimal JSON output (the bench writes only numbers, strings without control characters,
/// arrays and objects).
class json_writer {
 public:
  explicit json_writer(std::FILE* f) : f_(f) {}
  void raw(const std::string& s) { std::fputs(s.c_str(), f_); }
  static std::string quote(const std::string& s) {
    std::string out = "\"";
    for (char c : s) {
      if (c == '"' || c == '\\') out += '\\';
      out += c;
    }
    return out + "\"";
  }
  static std::string number(double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.6g", v);
    return buf;
  }
  static std::string array(const std::vector<double>& v) {
    std::string out = "[";
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (i) out += ",";
      out += number(v[i]);
    }
    return out + "]";
  }

 private:
  std::FILE* f_;
};

}  // namespace evr::bench
