// tools/cli/evr_tool_cli.hpp — the command-line pieces every evr executable shares (evr-bench's
// subcommands, the examples; CLI11, Debian libcli11-dev): --help prints the usage and exits 0, a
// bad value exits non-zero with a message that names the option.
//
//   CLI::App app{"what it does", "evr-something"};
//   std::string device = "auto";
//   evr::tool::add_device_option(app, device);
//   if (int rc = evr::tool::parse_cli(app, argc, argv); rc >= 0) return rc;
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace evr::tool {

/// Adds `--device auto|cuda|sim` to `app`, bound to `choice` (keep its default, "auto": the GPU
/// when there is one, else evr's simulated device).
inline CLI::Option* add_device_option(CLI::App& app, std::string& choice) {
  return app
      .add_option("--device", choice,
                  "where the work runs: auto (the GPU when there is one), cuda (fails without "
                  "one), or sim (evr's simulated device)")
      ->check(CLI::IsMember({"auto", "cuda", "sim"}))
      ->capture_default_str();
}

/// Parses argv. Returns -1 when the program should run, or the exit code when it should not: 0
/// after --help (usage on stdout), non-zero for a bad command line (the reason on stderr).
inline int parse_cli(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return -1;
}

}  // namespace evr::tool
