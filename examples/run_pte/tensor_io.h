// tensor_io.h - a method's tensors as raw bytes: inputs read from a file or filled with
// deterministic values, outputs copied out, written and printed. Header only.
#pragma once

#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor.h>
#include <executorch/runtime/core/exec_aten/util/scalar_type_util.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace tensor_io {

using executorch::aten::ScalarType;
using executorch::aten::Tensor;
using executorch::extension::TensorPtr;
using executorch::extension::module::Module;
using executorch::runtime::Error;
using executorch::runtime::EValue;
using executorch::runtime::Tag;

// The inputs of one call: the bytes, the tensors over them, and the values passed to execute.
struct Inputs {
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<TensorPtr> tensors;
  std::vector<EValue> values;
};

// The caller's buffers for the outputs the program leaves out of its memory plan.
struct Outputs {
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<TensorPtr> tensors;
};

inline std::string error_name(Error error) {
  char text[64];
  std::snprintf(text, sizeof text, "%s (0x%x)", executorch::runtime::to_string(error),
                static_cast<unsigned>(error));
  return text;
}

inline bool read_file(const std::string &path, std::vector<uint8_t> *out) {
  FILE *f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    return false;
  }
  uint8_t chunk[65536];
  size_t n;
  while ((n = std::fread(chunk, 1, sizeof chunk, f)) > 0) {
    out->insert(out->end(), chunk, chunk + n);
  }
  const bool ok = std::ferror(f) == 0;
  std::fclose(f);
  return ok;
}

inline bool write_file(const std::string &path, const std::vector<uint8_t> &bytes) {
  FILE *f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    return false;
  }
  const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  return std::fclose(f) == 0 && ok;
}

// Element i of a deterministic input: small values of both signs, exact in every dtype.
inline void fill_deterministic(ScalarType type, size_t count, uint8_t *out) {
  for (size_t i = 0; i < count; i++) {
    const float v = static_cast<float>(static_cast<int>((i * 7 + 3) % 17) - 8) / 8.0f;
    switch (type) {
    case ScalarType::Float: reinterpret_cast<float *>(out)[i] = v; break;
    case ScalarType::Half: reinterpret_cast<executorch::aten::Half *>(out)[i] = v; break;
    case ScalarType::BFloat16: reinterpret_cast<executorch::aten::BFloat16 *>(out)[i] = v; break;
    case ScalarType::Long: reinterpret_cast<int64_t *>(out)[i] = static_cast<int64_t>(i % 5); break;
    case ScalarType::Int: reinterpret_cast<int32_t *>(out)[i] = static_cast<int32_t>(i % 5); break;
    case ScalarType::Bool: reinterpret_cast<bool *>(out)[i] = i % 2 == 0; break;
    default: std::memset(out, 0, count * executorch::runtime::elementSize(type)); return;
    }
  }
}

// Builds the method's inputs from `path` (every input's bytes in order) or, when path is empty,
// from deterministic values.
inline bool make_inputs(Module &module, const std::string &method, const std::string &path,
                        Inputs *inputs, std::string *error) {
  auto meta = module.method_meta(method);
  if (!meta.ok()) {
    *error = "method_meta(" + method + ") failed: " + error_name(meta.error());
    return false;
  }
  std::vector<uint8_t> file;
  if (!path.empty() && !read_file(path, &file)) {
    *error = "cannot read the input file " + path;
    return false;
  }
  size_t offset = 0;
  for (size_t i = 0; i < meta->num_inputs(); i++) {
    auto tag = meta->input_tag(i);
    if (!tag.ok() || *tag != Tag::Tensor) {
      *error = "input " + std::to_string(i) + " is not a tensor; only tensor inputs are supported";
      return false;
    }
    auto info = meta->input_tensor_meta(i);
    if (!info.ok()) {
      *error = "input_tensor_meta(" + std::to_string(i) + ") failed: " + error_name(info.error());
      return false;
    }
    std::vector<uint8_t> bytes(info->nbytes());
    if (path.empty()) {
      fill_deterministic(info->scalar_type(), bytes.size() / executorch::runtime::elementSize(info->scalar_type()),
                         bytes.data());
    } else {
      if (file.size() - offset < bytes.size()) {
        *error = "the input file " + path + " holds " + std::to_string(file.size()) +
                 " bytes, fewer than the inputs need";
        return false;
      }
      std::memcpy(bytes.data(), file.data() + offset, bytes.size());
      offset += bytes.size();
    }
    inputs->bytes.push_back(std::move(bytes));
    std::vector<executorch::aten::SizesType> sizes(info->sizes().begin(), info->sizes().end());
    inputs->tensors.push_back(executorch::extension::from_blob(inputs->bytes.back().data(),
                                                               std::move(sizes), info->scalar_type()));
    inputs->values.emplace_back(*inputs->tensors.back());
  }
  if (!path.empty() && offset != file.size()) {
    *error = "the input file " + path + " holds " + std::to_string(file.size()) + " bytes, the inputs need " +
             std::to_string(offset);
    return false;
  }
  return true;
}

// Gives every tensor output the program does not plan a buffer of the caller's (kiln.export
// leaves a Kiln blob's outputs to the caller, so they reach the delegate without a copy).
inline bool bind_outputs(Module &module, const std::string &method, Outputs *outputs,
                         std::string *error) {
  auto meta = module.method_meta(method);
  if (!meta.ok()) {
    *error = "method_meta(" + method + ") failed: " + error_name(meta.error());
    return false;
  }
  for (size_t i = 0; i < meta->num_outputs(); i++) {
    auto tag = meta->output_tag(i);
    auto info = meta->output_tensor_meta(i);
    if (!tag.ok() || *tag != Tag::Tensor || !info.ok() || info->is_memory_planned()) {
      continue;
    }
    outputs->bytes.emplace_back(info->nbytes());
    std::vector<executorch::aten::SizesType> sizes(info->sizes().begin(), info->sizes().end());
    outputs->tensors.push_back(executorch::extension::from_blob(outputs->bytes.back().data(),
                                                                std::move(sizes), info->scalar_type()));
    const Error status = module.set_output(method, *outputs->tensors.back(), i);
    if (status != Error::Ok) {
      *error = "set_output(" + std::to_string(i) + ") failed: " + error_name(status);
      return false;
    }
  }
  return true;
}

// Appends the raw bytes of every tensor output.
inline bool append_outputs(const std::vector<EValue> &outputs, std::vector<uint8_t> *bytes,
                           std::string *error) {
  for (size_t i = 0; i < outputs.size(); i++) {
    if (!outputs[i].isTensor()) {
      *error = "output " + std::to_string(i) + " is not a tensor";
      return false;
    }
    const Tensor t = outputs[i].toTensor();
    const uint8_t *data = t.const_data_ptr<uint8_t>();
    bytes->insert(bytes->end(), data, data + t.nbytes());
  }
  return true;
}

inline double element_as_double(const Tensor &t, size_t i) {
  switch (t.scalar_type()) {
  case ScalarType::Float: return t.const_data_ptr<float>()[i];
  case ScalarType::Half: return static_cast<float>(t.const_data_ptr<executorch::aten::Half>()[i]);
  case ScalarType::BFloat16: return static_cast<float>(t.const_data_ptr<executorch::aten::BFloat16>()[i]);
  case ScalarType::Long: return static_cast<double>(t.const_data_ptr<int64_t>()[i]);
  case ScalarType::Int: return t.const_data_ptr<int32_t>()[i];
  case ScalarType::Bool: return t.const_data_ptr<bool>()[i] ? 1.0 : 0.0;
  default: return 0.0;
  }
}

// "output 0: Float [2, 4]: 0.125 -0.5 ..." with the first `first` values.
inline void print_outputs(const std::vector<EValue> &outputs, size_t first) {
  for (size_t i = 0; i < outputs.size(); i++) {
    if (!outputs[i].isTensor()) {
      std::printf("output %zu: not a tensor\n", i);
      continue;
    }
    const Tensor t = outputs[i].toTensor();
    std::printf("output %zu: %s [", i, executorch::runtime::toString(t.scalar_type()));
    for (ssize_t d = 0; d < t.dim(); d++) {
      std::printf(d == 0 ? "%d" : ", %d", static_cast<int>(t.sizes()[d]));
    }
    std::printf("]:");
    const size_t n = static_cast<size_t>(t.numel()) < first ? static_cast<size_t>(t.numel()) : first;
    for (size_t k = 0; k < n; k++) {
      std::printf(" %.6g", element_as_double(t, k));
    }
    std::printf(static_cast<size_t>(t.numel()) > n ? " ...\n" : "\n");
  }
}

} // namespace tensor_io
