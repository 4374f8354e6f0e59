// kiln_options: KilnBackend's process-wide options through ExecuTorch's set_option/get_option,
// the load-time options of Module::load overriding them, and a runtime allocator too small for
// Kiln's handle. Run without KILN_DEVICE.
//
// usage: kiln_options MODEL.pte
// Prints one line per check and "N passed, N failed"; the last lines name the error of a load
// asking for CUDA ("load device=cuda: ...") for the caller to judge against the machine.
#include "tensor_io.h"

#include <executorch/runtime/backend/backend_options_map.h>
#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/backend/options.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

using executorch::extension::module::Module;
using executorch::runtime::BackendOption;
using executorch::runtime::BackendOptions;
using executorch::runtime::Error;
using executorch::runtime::LoadBackendOptionsMap;
using executorch::runtime::MemoryAllocator;

namespace {

int passed = 0;
int failed = 0;

void check(bool ok, const std::string &what) {
  (ok ? passed : failed)++;
  std::printf("%s: %s\n", ok ? "ok" : "FAILED", what.c_str());
}

Error set_device(const char *device) {
  BackendOptions<1> options;
  (void)options.set_option("device", device);
  return executorch::runtime::set_option("KilnBackend", options.view());
}

std::string get_device() {
  BackendOptions<1> options;
  (void)options.set_option("device", "");
  if (executorch::runtime::get_option("KilnBackend", options.view()) != Error::Ok) {
    return "<get_option failed>";
  }
  const char *value = nullptr;
  return options.get_option("device", value) == Error::Ok ? value : "<not a string>";
}

int get_device_id() {
  BackendOptions<1> options;
  (void)options.set_option("device_id", 0);
  if (executorch::runtime::get_option("KilnBackend", options.view()) != Error::Ok) {
    return -100;
  }
  int value = -100;
  return options.get_option("device_id", value) == Error::Ok ? value : -100;
}

// Loads the forward method with the given load-time device (none when empty).
Error load_with(const std::string &model, const char *device) {
  BackendOptions<1> options;
  if (device != nullptr) {
    (void)options.set_option("device", device);
  }
  LoadBackendOptionsMap map;
  (void)map.set_options("KilnBackend", options.view());
  Module module(model, Module::LoadMode::Mmap);
  const Error status = module.load(map);
  return status != Error::Ok ? status : module.load_method("forward");
}

// Loads the program with runtime allocators of growing size until one is large enough; returns
// how many sizes ran out of memory on the way. Some of them leave room for ExecuTorch's own
// structures but not for Kiln's handle, which init must refuse cleanly.
int sweep_runtime_allocator(const std::string &model, size_t *fits) {
  static uint8_t memory[1 << 16];
  int refused = 0;
  for (size_t size = 8; size <= sizeof memory; size += 8) {
    Module module(model, Module::LoadMode::Mmap, nullptr,
                  std::make_unique<MemoryAllocator>(static_cast<uint32_t>(size), memory));
    const Error status = module.load_method("forward");
    if (status == Error::Ok) {
      *fits = size;
      return refused;
    }
    refused += status == Error::MemoryAllocationFailed ? 1 : 0;
  }
  *fits = 0;
  return refused;
}

} // namespace

int main(int argc, char **argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: kiln_options MODEL.pte\n");
    return 1;
  }
  const std::string model = argv[1];

  check(get_device() == "auto", "the process-wide device starts as auto, got " + get_device());
  check(get_device_id() == -1, "the process-wide device_id starts as -1");
  check(set_device("tpu") == Error::InvalidArgument, "set_option device=tpu is refused");
  check(get_device() == "auto", "a refused set_option changes nothing");
  {
    BackendOptions<2> options;
    (void)options.set_option("device", "cpu");
    (void)options.set_option("device_id", -5);
    check(executorch::runtime::set_option("KilnBackend", options.view()) == Error::InvalidArgument,
          "set_option device_id=-5 is refused");
    check(get_device() == "auto", "a refused set_option changes none of its options");
  }
  {
    BackendOptions<1> options;
    (void)options.set_option("devise", "cpu");
    check(executorch::runtime::set_option("KilnBackend", options.view()) == Error::InvalidArgument,
          "set_option of an unknown key is refused");
  }
  {
    BackendOptions<1> options;
    (void)options.set_option("device", 1);
    check(executorch::runtime::set_option("KilnBackend", options.view()) == Error::InvalidArgument,
          "set_option device=<int> is refused");
  }
  {
    BackendOptions<1> options;
    (void)options.set_option("colour", 1);
    check(executorch::runtime::get_option("KilnBackend", options.view()) == Error::NotFound,
          "get_option of an unknown key answers NotFound");
  }
  check(load_with(model, "gpu") == Error::InvalidArgument, "load-time device=gpu is refused");

  check(set_device("cpu") == Error::Ok, "set_option device=cpu");
  check(get_device() == "cpu", "get_option reads device=cpu back");
  check(load_with(model, nullptr) == Error::Ok, "a program loads on the process-wide cpu device");
  size_t fits = 0;
  const int refused = sweep_runtime_allocator(model, &fits);
  check(fits > 0 && refused > 0, "runtime allocators below " + std::to_string(fits) + " bytes refused " +
                                     std::to_string(refused) + " loads with MemoryAllocationFailed");
  const Error cuda = load_with(model, "cuda");
  std::printf("load device=cuda: %s\n", tensor_io::error_name(cuda).c_str());
  check(set_device("auto") == Error::Ok, "set_option device=auto");
  const Error automatic = load_with(model, nullptr);
  std::printf("load device=auto: %s\n", tensor_io::error_name(automatic).c_str());
  check(load_with(model, "cpu") == Error::Ok, "the load-time device=cpu overrides the process-wide auto");

  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
