// How the examples read their command lines: tools/cli/evr_tool_cli.hpp (shared with evr-bench)
// under the examples' namespace.
//
//   CLI::App app{"what the example shows", "evr-example"};
//   std::string device = "auto";
//   examples::add_device_option(app, device);
//   if (int rc = examples::parse_cli(app, argc, argv); rc >= 0) return rc;
//   examples::device gpu(device);
//
// An example whose only option is --device says it in one statement:
//
//   const std::string device = examples::device_from_cli(argc, argv, "what it shows", "evr-x");
#pragma once

#include <cstdlib>
#include <string>

#include <CLI/CLI.hpp>

#include "evr_tool_cli.hpp"

namespace examples {

using evr::tool::add_device_option;
using evr::tool::parse_cli;

/// The whole command line of an example whose only option is --device: returns its value (auto,
/// cuda or sim). After --help the process exits with 0; after a bad value, with CLI11's code and
/// a message naming the option. Call it first in main, before anything needs destroying.
[[nodiscard]] inline std::string device_from_cli(int argc, char** argv,
                                                 const std::string& description,
                                                 const std::string& name) {
  CLI::App app{description, name};
  std::string device = "auto";
  add_device_option(app, device);
  if (int rc = parse_cli(app, argc, argv); rc >= 0) std::exit(rc);
  return device;
}

}  // namespace examples
