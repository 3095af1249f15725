// examples::device_from_cli (example_device_cli.hpp): CLI11 compiled once for the examples whose
// only option is --device.
#include <cstdlib>
#include <string>

#include "example_cli.hpp"

namespace examples {

std::string device_from_cli(int argc, char** argv, const std::string& description,
                            const std::string& name) {
  CLI::App app{description, name};
  std::string device = "auto";
  add_device_option(app, device);
  if (int rc = parse_cli(app, argc, argv); rc >= 0) std::exit(rc);
  return device;
}

}  // namespace examples
