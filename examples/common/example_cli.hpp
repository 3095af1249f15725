// How the examples read their command lines: tools/cli/evr_tool_cli.hpp (shared with evr-bench)
// under the examples' namespace.
//
//   CLI::App app{"what the example shows", "evr-example"};
//   std::string device = "auto";
//   examples::add_device_option(app, device);
//   if (int rc = examples::parse_cli(app, argc, argv); rc >= 0) return rc;
//   examples::device gpu(device);
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "evr_tool_cli.hpp"

namespace examples {

using evr::tool::add_device_option;
using evr::tool::parse_cli;

}  // namespace examples
