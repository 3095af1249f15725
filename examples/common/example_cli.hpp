// How the examples read their command lines: tools/cli/evr_tool_cli.hpp (shared with evr-bench)
// under the examples' namespace.
//
//   CLI::App app{"what the example shows", "evr-example"};
//   std::string device = "auto";
//   examples::add_device_option(app, device);
//   if (int rc = examples::parse_cli(app, argc, argv); rc >= 0) return rc;
//   examples::device gpu(device);
//
// An example whose only option is --device says it in one statement, and includes
// example_device_cli.hpp alone (no CLI11 in its source: see there):
//
//   const std::string device = examples::device_from_cli(argc, argv, "what it shows", "evr-x");
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "evr_tool_cli.hpp"
#include "example_device_cli.hpp"

namespace examples {

using evr::tool::add_device_option;
using evr::tool::parse_cli;

}  // namespace examples
