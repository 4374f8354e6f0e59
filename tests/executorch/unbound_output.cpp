// kiln_unbound_output: a program whose outputs are left to the caller, run through Module
// without set_output: the call must fail with InvalidArgument (Kiln names the remedy in the
// log) rather than write through a null pointer. Usage: kiln_unbound_output MODEL.pte
#include "tensor_io.h"

#include <cstdio>
#include <string>

using executorch::extension::module::Module;
using executorch::runtime::Error;

int main(int argc, char **argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: kiln_unbound_output MODEL.pte\n");
    return 1;
  }
  Module module(argv[1], Module::LoadMode::Mmap);
  tensor_io::Inputs inputs;
  std::string error;
  if (module.load_method("forward") != Error::Ok ||
      !tensor_io::make_inputs(module, "forward", "", &inputs, &error)) {
    std::fprintf(stderr, "cannot load %s: %s\n", argv[1], error.c_str());
    return 2;
  }
  auto outputs = module.forward(inputs.values);
  std::printf("forward without output buffers: %s\n",
              outputs.ok() ? "ran" : tensor_io::error_name(outputs.error()).c_str());
  return outputs.ok() ? 3 : 0;
}
