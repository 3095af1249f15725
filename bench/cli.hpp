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

namespace evr::bench {

/// --device cuda|sim|auto (every subcommand has it).
inline void add_device_option(CLI::App& app, std::string& device) {
  app.add_option("--device", device,
                 "cuda: the GPU (fails without one); sim: the simulated device; auto: cuda when a "
                 "GPU is usable, else sim")
      ->check(CLI::IsMember({"auto", "cuda", "sim"}))
      ->capture_default_str();
}

/// --json FILE.
inline void add_json_option(CLI::App& app, std::string& file) {
  app.add_option("--json", file, "also write every figure to FILE");
}

/// Parses argv (argv[0] is the subcommand's name). Returns -1 when the subcommand should run, or
/// the process exit code when it should not (0 after --help, non-zero for a bad command line).
inline int parse_cli(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return -1;
}

}  // namespace evr::bench
