// run_pte: runs a method of an ExecuTorch program with ExecuTorch's Module API, prints its
// outputs and the median time of a run. Kiln takes no code here: linking
// executorch::backend_kiln registers KilnBackend when the program starts.
//
// usage: run_pte MODEL.pte [--input FILE] [--output FILE] [--runs N] [--method NAME]
//                [--device cpu|cuda|auto] [--device-id N]
//   --input    every input tensor's raw bytes, in order (default: deterministic values)
//   --output   writes every output tensor's raw bytes, in order
//   --device, --device-id   KilnBackend's load-time options
#include "tensor_io.h"

#include <executorch/runtime/backend/backend_options_map.h>
#include <executorch/runtime/backend/options.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

using executorch::extension::module::Module;
using executorch::runtime::BackendOptions;
using executorch::runtime::Error;
using executorch::runtime::LoadBackendOptionsMap;

namespace {

struct Args {
  std::string model;
  std::string input;
  std::string output;
  std::string method = "forward";
  std::string device;
  bool has_device_id = false;
  int device_id = -1;
  int runs = 10;
};

int usage() {
  std::fprintf(stderr,
               "usage: run_pte MODEL.pte [--input FILE] [--output FILE] [--runs N] [--method NAME]\n"
               "               [--device cpu|cuda|auto] [--device-id N]\n");
  return 1;
}

bool parse_int(const char *text, long low, long high, int *out) {
  char *end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || value < low || value > high) {
    return false;
  }
  *out = static_cast<int>(value);
  return true;
}

bool parse_args(int argc, char **argv, Args *args) {
  for (int i = 1; i < argc; i++) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--input" && has_value) {
      args->input = argv[++i];
    } else if (arg == "--output" && has_value) {
      args->output = argv[++i];
    } else if (arg == "--method" && has_value) {
      args->method = argv[++i];
    } else if (arg == "--device" && has_value) {
      args->device = argv[++i];
    } else if (arg == "--device-id" && has_value) {
      if (!parse_int(argv[++i], -1000000, 1000000, &args->device_id)) {
        return false;
      }
      args->has_device_id = true;
    } else if (arg == "--runs" && has_value) {
      if (!parse_int(argv[++i], 1, 1000000, &args->runs)) {
        return false;
      }
    } else if (arg[0] != '-' && args->model.empty()) {
      args->model = arg;
    } else {
      return false;
    }
  }
  return !args->model.empty();
}

} // namespace

int main(int argc, char **argv) {
  Args args;
  if (!parse_args(argc, argv, &args)) {
    return usage();
  }

  // KilnBackend's load-time options; the Module keeps its own copy.
  BackendOptions<2> kiln_options;
  if (!args.device.empty()) {
    (void)kiln_options.set_option("device", args.device.c_str());
  }
  if (args.has_device_id) {
    (void)kiln_options.set_option("device_id", args.device_id);
  }
  LoadBackendOptionsMap backend_options;
  if (backend_options.set_options("KilnBackend", kiln_options.view()) != Error::Ok) {
    std::fprintf(stderr, "cannot set KilnBackend's options\n");
    return 1;
  }

  Module module(args.model, Module::LoadMode::Mmap);
  Error status = module.load(backend_options);
  if (status != Error::Ok) {
    std::fprintf(stderr, "load %s failed: %s\n", args.model.c_str(), tensor_io::error_name(status).c_str());
    return 2;
  }
  status = module.load_method(args.method);
  if (status != Error::Ok) {
    std::fprintf(stderr, "load_method %s failed: %s\n", args.method.c_str(),
                 tensor_io::error_name(status).c_str());
    return 2;
  }

  tensor_io::Inputs inputs;
  std::string error;
  tensor_io::Outputs output_buffers;
  if (!tensor_io::make_inputs(module, args.method, args.input, &inputs, &error) ||
      !tensor_io::bind_outputs(module, args.method, &output_buffers, &error)) {
    std::fprintf(stderr, "%s\n", error.c_str());
    return 1;
  }

  std::vector<double> times_ms;
  std::vector<uint8_t> output_bytes;
  for (int run = 0; run < args.runs; run++) {
    const auto start = std::chrono::steady_clock::now();
    auto outputs = module.execute(args.method, inputs.values);
    const auto stop = std::chrono::steady_clock::now();
    if (!outputs.ok()) {
      std::fprintf(stderr, "execute %s failed: %s\n", args.method.c_str(),
                   tensor_io::error_name(outputs.error()).c_str());
      return 3;
    }
    times_ms.push_back(std::chrono::duration<double, std::milli>(stop - start).count());
    if (run == args.runs - 1) {
      std::printf("%s: method %s, %zu input(s), %zu output(s)\n", args.model.c_str(), args.method.c_str(),
                  inputs.values.size(), outputs->size());
      tensor_io::print_outputs(*outputs, 8);
      if (!tensor_io::append_outputs(*outputs, &output_bytes, &error)) {
        std::fprintf(stderr, "%s\n", error.c_str());
        return 1;
      }
    }
  }
  std::sort(times_ms.begin(), times_ms.end());
  std::printf("%s: median %.4f ms over %d runs\n", args.method.c_str(), times_ms[times_ms.size() / 2],
              args.runs);

  if (!args.output.empty() && !tensor_io::write_file(args.output, output_bytes)) {
    std::fprintf(stderr, "cannot write %s\n", args.output.c_str());
    return 1;
  }
  return 0;
}
