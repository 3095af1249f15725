// doctest's main, shared by evr_tests and evr_gpu_tests. A binary may refuse to run (no GPU):
// evr::test::skip_reason() then names why and the process exits with 77, which ctest reports as
// "Skipped".
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <string>

namespace evr::test {
std::string skip_reason();  // defined next to dut()
}

int main(int argc, char** argv) {
  if (std::string why = evr::test::skip_reason(); !why.empty()) {
    std::printf("SKIPPED: %s\n", why.c_str());
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
