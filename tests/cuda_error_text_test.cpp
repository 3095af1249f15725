// What a CUDA error says to a user (device/src/error.cpp, cuda_category): the runtime's text and
// name, and, where CUDA's code means two things, what tells them apart. No device needed.
#include <doctest/doctest.h>

#include <string>

#include <evr/device/error.hpp>

#include "support/helpers.hpp"

using evr::test::contains;

TEST_CASE(
    "cuda error text: 'insufficient driver', also CUDA's answer without any driver, names the "
    "probe") {
  // A program built with CUDA that runs where no NVIDIA driver is installed gets
  // cudaErrorInsufficientDriver from its first CUDA call (evr::stream's constructor, say), which
  // reads as if a driver were there but old. The message says so and names what tells them apart.
  namespace cuda_value = evr::cuda_value;
  const std::string driver = evr::make_cuda_error(cuda_value::insufficient_driver).message();
  CHECK(contains(driver, "cudaErrorInsufficientDriver 35"));
  CHECK(contains(driver, "no NVIDIA driver is installed"));
  CHECK(contains(driver, "evr::device::probe_cuda()"));
  CHECK(contains(driver, "evr.cuda_status()"));
  CHECK_FALSE(contains(evr::make_cuda_error(cuda_value::no_device).message(), "probe_cuda"));
}
