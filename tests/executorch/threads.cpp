// kiln_threads: one program per thread. Every thread loads its own Module of the same .pte and
// runs it; each run's outputs must equal, byte for byte, those of a run made alone beforehand.
//
// usage: kiln_threads MODEL.pte INPUT [--threads T] [--runs N] [--output FILE] [--tolerance X]
//   --output    writes the outputs of the run made alone (to compare with PyTorch)
//   --tolerance accepts runs within X of the run alone, element by element (for GPU kernels
//               whose reductions are not bitwise reproducible); 0, the default, asks for bytes
#include "tensor_io.h"

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

using executorch::extension::module::Module;
using executorch::runtime::Error;

namespace {

struct Outcome {
  int equal = 0;
  int different = 0;
  double max_difference = 0.0; // over the runs that differ, element by element
  std::string error;
};

// The values of every output, in order, as doubles.
std::vector<double> values_of(const std::vector<executorch::runtime::EValue> &outputs) {
  std::vector<double> values;
  for (const auto &output : outputs) {
    if (output.isTensor()) {
      const auto t = output.toTensor();
      for (ssize_t i = 0; i < t.numel(); i++) {
        values.push_back(tensor_io::element_as_double(t, static_cast<size_t>(i)));
      }
    }
  }
  return values;
}

// Loads the program and runs it `runs` times, counting the runs whose outputs equal `expected`.
bool run_program(const std::string &model, const std::string &input, int runs,
                 const std::vector<uint8_t> *expected, const std::vector<double> *expected_values,
                 Outcome *outcome, std::vector<uint8_t> *first_output,
                 std::vector<double> *first_values, std::atomic<int> *waiting) {
  Module module(model, Module::LoadMode::Mmap);
  Error status = module.load_method("forward");
  if (status != Error::Ok) {
    outcome->error = "load_method failed: " + tensor_io::error_name(status);
    return false;
  }
  tensor_io::Inputs inputs;
  tensor_io::Outputs output_buffers;
  if (!tensor_io::make_inputs(module, "forward", input, &inputs, &outcome->error) ||
      !tensor_io::bind_outputs(module, "forward", &output_buffers, &outcome->error)) {
    return false;
  }
  if (waiting != nullptr) {
    // Start the runs of every thread together.
    waiting->fetch_sub(1);
    while (waiting->load() > 0) {
      std::this_thread::yield();
    }
  }
  for (int run = 0; run < runs; run++) {
    auto outputs = module.forward(inputs.values);
    if (!outputs.ok()) {
      outcome->error = "forward failed: " + tensor_io::error_name(outputs.error());
      return false;
    }
    std::vector<uint8_t> bytes;
    if (!tensor_io::append_outputs(*outputs, &bytes, &outcome->error)) {
      return false;
    }
    if (first_output != nullptr && run == 0) {
      *first_output = bytes;
      *first_values = values_of(*outputs);
    }
    if (expected == nullptr) {
      continue;
    }
    if (bytes == *expected) {
      outcome->equal++;
      continue;
    }
    outcome->different++;
    const std::vector<double> values = values_of(*outputs);
    for (size_t i = 0; i < values.size() && i < expected_values->size(); i++) {
      const double d = std::fabs(values[i] - (*expected_values)[i]);
      outcome->max_difference = d > outcome->max_difference ? d : outcome->max_difference;
    }
  }
  return true;
}

} // namespace

int main(int argc, char **argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: kiln_threads MODEL.pte INPUT [--threads T] [--runs N] [--output FILE]\n");
    return 1;
  }
  const std::string model = argv[1];
  const std::string input = argv[2];
  int threads = 4;
  int runs = 20;
  std::string output;
  double tolerance = 0.0;
  for (int i = 3; i + 1 < argc; i += 2) {
    const std::string arg = argv[i];
    if (arg == "--threads") {
      threads = std::atoi(argv[i + 1]);
    } else if (arg == "--runs") {
      runs = std::atoi(argv[i + 1]);
    } else if (arg == "--output") {
      output = argv[i + 1];
    } else if (arg == "--tolerance") {
      tolerance = std::atof(argv[i + 1]);
    } else {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 1;
    }
  }
  if (threads < 1 || runs < 1) {
    std::fprintf(stderr, "--threads and --runs take a positive number\n");
    return 1;
  }

  Outcome alone;
  std::vector<uint8_t> expected;
  std::vector<double> expected_values;
  if (!run_program(model, input, 1, nullptr, nullptr, &alone, &expected, &expected_values, nullptr)) {
    std::fprintf(stderr, "the run alone failed: %s\n", alone.error.c_str());
    return 2;
  }
  if (!output.empty() && !tensor_io::write_file(output, expected)) {
    std::fprintf(stderr, "cannot write %s\n", output.c_str());
    return 1;
  }

  std::vector<Outcome> outcomes(static_cast<size_t>(threads));
  std::vector<std::thread> workers;
  std::atomic<int> waiting(threads);
  for (int t = 0; t < threads; t++) {
    workers.emplace_back([&, t] {
      if (!run_program(model, input, runs, &expected, &expected_values, &outcomes[t], nullptr, nullptr,
                       &waiting)) {
        waiting.fetch_sub(1); // a thread that failed before the start must not hold the others back
      }
    });
  }
  for (std::thread &worker : workers) {
    worker.join();
  }

  int equal = 0;
  int different = 0;
  int failed = 0;
  double max_difference = 0.0;
  for (int t = 0; t < threads; t++) {
    equal += outcomes[t].equal;
    different += outcomes[t].different;
    max_difference = outcomes[t].max_difference > max_difference ? outcomes[t].max_difference : max_difference;
    if (!outcomes[t].error.empty()) {
      std::fprintf(stderr, "thread %d: %s\n", t, outcomes[t].error.c_str());
      failed++;
    }
  }
  if (failed == 0 && different == 0 && equal == threads * runs) {
    std::printf("%d threads x %d runs: all equal\n", threads, runs);
    return 0;
  }
  if (failed == 0 && equal + different == threads * runs && tolerance > 0.0 && max_difference <= tolerance) {
    std::printf("%d threads x %d runs: %d equal, %d within %.3g (max |difference| %.3g)\n", threads, runs,
                equal, different, tolerance, max_difference);
    return 0;
  }
  std::printf("%d threads x %d runs: %d equal, %d different (max |difference| %.3g), %d threads failed\n",
              threads, runs, equal, different, max_difference, failed);
  return 3;
}
