// bench/cli.hpp — how every evr-bench subcommand reads its command line (CLI11).
//
//   int evr_bench_example(int argc, char** argv) {
//     CLI::App app{"what it measures", "evr-bench example"};
//     int samples = 300;
//     app.add_option("--samples", samples, "samples per row")->check(CLI::Range(10, 1000000));
//     if (int rc = evr::bench::parse_cli(app, argc, argv); rc >= 0) return rc;
//     ...
//   }
//
// --help prints the usage and exits 0; a bad value exits non-zero with a message that names the
// option (CLI11's validators: CLI::Range, CLI::IsMember, ...).
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "evr_tool_cli.hpp"

namespace evr::bench {

using evr::tool::add_device_option;  // --device auto|cuda|sim (every subcommand has it)
using evr::tool::parse_cli;

/// --json FILE.
inline void add_json_option(CLI::App& app, std::string& file) {
  app.add_option("--json", file, "also write every figure to FILE");
}

}  // namespace evr::bench
