// kiln_device_io: device memory through ExecuTorch's Module into a Kiln program. The input is
// a from_blob tensor over cudaMalloc'd memory and the output is given with set_output over
// device memory; the result must equal the same call on host buffers, the returned output must
// be the caller's device buffer, and an input changed in place after set_input must be what
// the engine reads. Run on a GPU machine: kiln_device_io MODEL.pte
#include "tensor_io.h"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <string>
#include <vector>

using executorch::extension::TensorPtr;
using executorch::extension::module::Module;
using executorch::runtime::Error;
using executorch::runtime::EValue;

namespace {

int failures = 0;

void check(bool ok, const std::string &what) {
  std::printf("%s: %s\n", ok ? "ok" : "FAIL", what.c_str());
  failures += ok ? 0 : 1;
}

}  // namespace

int main(int argc, char **argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: kiln_device_io MODEL.pte\n");
    return 1;
  }
  Module module(argv[1], Module::LoadMode::Mmap);
  if (module.load_method("forward") != Error::Ok) {
    std::fprintf(stderr, "load_method forward failed\n");
    return 2;
  }
  auto meta = module.method_meta("forward");
  if (!meta.ok() || meta->num_inputs() != 1 || meta->num_outputs() != 1) {
    std::fprintf(stderr, "kiln_device_io takes a program of one input and one output\n");
    return 1;
  }
  auto in_info = meta->input_tensor_meta(0);
  auto out_info = meta->output_tensor_meta(0);
  check(!in_info->is_memory_planned() && !out_info->is_memory_planned(),
        "the program leaves its input and output to the caller");

  // Host reference through the same Module.
  tensor_io::Inputs host_in;
  tensor_io::Outputs host_out;
  std::string error;
  if (!tensor_io::make_inputs(module, "forward", "", &host_in, &error) ||
      !tensor_io::bind_outputs(module, "forward", &host_out, &error)) {
    std::fprintf(stderr, "%s\n", error.c_str());
    return 1;
  }
  auto host_result = module.forward(host_in.values);
  check(host_result.ok(), "forward on host buffers");
  if (!host_result.ok()) return 3;
  const std::vector<uint8_t> want = host_out.bytes[0];

  // The same values on the device.
  const size_t in_bytes = in_info->nbytes(), out_bytes = out_info->nbytes();
  void *d_in = nullptr, *d_out = nullptr;
  if (cudaMalloc(&d_in, in_bytes) != cudaSuccess || cudaMalloc(&d_out, out_bytes) != cudaSuccess) {
    std::fprintf(stderr, "cudaMalloc failed: run on a GPU machine\n");
    return 2;
  }
  cudaMemcpy(d_in, host_in.bytes[0].data(), in_bytes, cudaMemcpyHostToDevice);
  cudaMemset(d_out, 0xff, out_bytes);
  std::vector<executorch::aten::SizesType> in_shape(in_info->sizes().begin(), in_info->sizes().end());
  std::vector<executorch::aten::SizesType> out_shape(out_info->sizes().begin(), out_info->sizes().end());
  TensorPtr x = executorch::extension::from_blob(d_in, in_shape, in_info->scalar_type());
  TensorPtr y = executorch::extension::from_blob(d_out, out_shape, out_info->scalar_type());
  check(module.set_output("forward", *y, 0) == Error::Ok, "set_output on device memory");
  auto result = module.forward(std::vector<EValue>{EValue(*x)});
  check(result.ok(), "forward on device buffers");
  if (!result.ok()) return 3;
  check((*result)[0].toTensor().const_data_ptr() == d_out, "the output is the caller's device buffer");
  std::vector<uint8_t> got(out_bytes);
  cudaMemcpy(got.data(), d_out, out_bytes, cudaMemcpyDeviceToHost);
  check(got == want, "device output equals the host output");

  // Changed in place after set_input: the engine reads the caller's buffer at execute.
  check(module.set_input("forward", EValue(*x), 0) == Error::Ok, "set_input on device memory");
  cudaMemset(d_in, 0, in_bytes);
  check(module.execute("forward").ok(), "execute after the input changed in place");
  cudaMemcpy(got.data(), d_out, out_bytes, cudaMemcpyDeviceToHost);
  check(got != want, "the engine read the changed device input");

  cudaFree(d_in);
  cudaFree(d_out);
  std::printf("%d failed\n", failures);
  return failures == 0 ? 0 : 4;
}
