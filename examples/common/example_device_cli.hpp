// The whole command line of an example whose only option is --device, without CLI11 in the
// example's own source: CLI11 is header-only and its inline code is most of the compile time of
// every file that includes it (15 s of CPU in Release, 32 s under ASan+UBSan, 13 s under TSan,
// per file, on the CI machine), so it is compiled once, in example_cli.cpp.
//
//   const std::string device = examples::device_from_cli(argc, argv, "what it shows", "evr-x");
//   examples::device gpu(device);
#pragma once

#include <string>

namespace examples {

/// Parses `--device auto|cuda|sim` (and --help) and returns its value. After --help the process
/// exits with 0; after a bad value, with CLI11's code and a message naming the option. Call it
/// first in main, before anything needs destroying.
[[nodiscard]] std::string device_from_cli(int argc, char** argv, const std::string& description,
                                          const std::string& name);

}  // namespace examples
