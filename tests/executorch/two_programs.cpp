// kiln_two_programs: two different programs loaded at once in one process, run in turn; every
// run of each must equal, byte for byte, that program's first run.
//
// usage: kiln_two_programs A.pte A_INPUT B.pte B_INPUT [--runs N] [--output-a FILE] [--output-b FILE]
#include "tensor_io.h"

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

using executorch::extension::module::Module;
using executorch::runtime::Error;

namespace {

struct Program {
  std::unique_ptr<Module> module;
  tensor_io::Inputs inputs;
  tensor_io::Outputs outputs;
  std::vector<uint8_t> first;
  int equal = 0;
};

bool load(const std::string &model, const std::string &input, Program *program, std::string *error) {
  program->module = std::make_unique<Module>(model, Module::LoadMode::Mmap);
  const Error status = program->module->load_method("forward");
  if (status != Error::Ok) {
    *error = model + ": load_method failed: " + tensor_io::error_name(status);
    return false;
  }
  return tensor_io::make_inputs(*program->module, "forward", input, &program->inputs, error) &&
         tensor_io::bind_outputs(*program->module, "forward", &program->outputs, error);
}

bool run(Program *program, std::string *error) {
  auto outputs = program->module->forward(program->inputs.values);
  if (!outputs.ok()) {
    *error = "forward failed: " + tensor_io::error_name(outputs.error());
    return false;
  }
  std::vector<uint8_t> bytes;
  if (!tensor_io::append_outputs(*outputs, &bytes, error)) {
    return false;
  }
  if (program->first.empty()) {
    program->first = bytes;
  }
  program->equal += bytes == program->first ? 1 : 0;
  return true;
}

} // namespace

int main(int argc, char **argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: kiln_two_programs A.pte A_INPUT B.pte B_INPUT [--runs N] "
                         "[--output-a FILE] [--output-b FILE]\n");
    return 1;
  }
  int runs = 10;
  std::string output_a;
  std::string output_b;
  for (int i = 5; i + 1 < argc; i += 2) {
    const std::string arg = argv[i];
    if (arg == "--runs") {
      runs = std::atoi(argv[i + 1]);
    } else if (arg == "--output-a") {
      output_a = argv[i + 1];
    } else if (arg == "--output-b") {
      output_b = argv[i + 1];
    } else {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 1;
    }
  }
  if (runs < 1) {
    std::fprintf(stderr, "--runs takes a positive number\n");
    return 1;
  }

  Program a;
  Program b;
  std::string error;
  if (!load(argv[1], argv[2], &a, &error) || !load(argv[3], argv[4], &b, &error)) {
    std::fprintf(stderr, "%s\n", error.c_str());
    return 2;
  }
  for (int r = 0; r < runs; r++) {
    if (!run(&a, &error) || !run(&b, &error)) {
      std::fprintf(stderr, "run %d: %s\n", r, error.c_str());
      return 3;
    }
  }
  if ((!output_a.empty() && !tensor_io::write_file(output_a, a.first)) ||
      (!output_b.empty() && !tensor_io::write_file(output_b, b.first))) {
    std::fprintf(stderr, "cannot write the outputs\n");
    return 1;
  }
  if (a.equal == runs && b.equal == runs) {
    std::printf("two programs at once x %d runs each: all equal\n", runs);
    return 0;
  }
  std::printf("two programs at once x %d runs each: %d and %d equal\n", runs, a.equal, b.equal);
  return 3;
}
