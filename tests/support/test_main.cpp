// doctest's main, shared by evr_tests and evr_gpu_tests. A binary may refuse to run (no GPU):
// evr::test::skip_reason() then names why and the process exits with 77, which ctest reports as
// "Skipped". A command line that only asks doctest for information (--list-test-cases, --count,
// --help, ...) needs no device and is answered everywhere.
//
// Test cases in the suite "poisons_process" (a real sticky fault) are decorated doctest::skip():
// run them alone, in a process of their own, with --test-suite=poisons_process --no-skip.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <iostream>
#include <string>
#include <string_view>

namespace evr::test {
std::string skip_reason();  // defined next to dut()
}

namespace {

/// True when an argument asks doctest to list or count test cases, or for its help or version
/// (spelled -ltc, --list-test-cases, --dt-list-test-cases, ...).
bool asks_for_information(int argc, char** argv) {
  // doctest's options that only inform, short and long names, each between spaces.
  constexpr std::string_view information =
      " ltc list-test-cases lts list-test-suites lr list-reporters c count h help ? v version ";
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (!arg.starts_with('-')) continue;
    arg.remove_prefix(arg.starts_with("--") ? 2 : 1);
    if (arg.starts_with("dt-")) arg.remove_prefix(3);
    arg = arg.substr(0, arg.find('='));
    // Built piece by piece: " " + std::string(arg) makes GCC 12 warn (-Wrestrict, a false
    // positive inside std::string's operator+).
    std::string word(" ");
    word.append(arg).append(" ");
    if (!arg.empty() && information.find(word) != std::string_view::npos) return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  if (!asks_for_information(argc, argv)) {
    if (std::string why = evr::test::skip_reason(); !why.empty()) {
      std::printf("SKIPPED: %s\n", why.c_str());
      return 77;
    }
  }
  // doctest reports on std::cout, which a pipe (ctest) buffers: flushed at every write, a failed
  // assertion's report reaches the log even when the test then hangs in its teardown (a reactor
  // joining its thread while that thread is stuck) and is killed at its timeout.
  std::cout << std::unitbuf;
  doctest::Context context(argc, argv);
  return context.run();
}
