// generate: greedy generation with ExecuTorch's Module API from a decoder program whose forward
// takes input_ids [1,1] and cache_position [1] and returns the next token's id [1] (the KV cache
// lives in the Kiln blob). Feeds the prompt one token per call (prefill), then N decode steps;
// prints the tokens and tokens per second of each phase. With --prefill whole the prompt goes in
// one call, for a program exported with a dynamic sequence dim (input_ids [1,seq],
// cache_position [seq]).
//
// usage: generate MODEL.pte [--prompt ID,ID,...] [--tokens N] [--device cpu|cuda|auto]
//                           [--prefill tokens|whole]
#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor.h>
#include <executorch/runtime/backend/backend_options_map.h>
#include <executorch/runtime/backend/options.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

using executorch::extension::from_blob;
using executorch::extension::module::Module;
using executorch::runtime::BackendOptions;
using executorch::runtime::Error;
using executorch::runtime::EValue;
using executorch::runtime::LoadBackendOptionsMap;

namespace {

bool parse_ids(const std::string &text, std::vector<int64_t> *ids) {
  size_t at = 0;
  while (at < text.size()) {
    char *end = nullptr;
    const long long value = std::strtoll(text.c_str() + at, &end, 10);
    if (end == text.c_str() + at || value < 0) return false;
    ids->push_back(value);
    at = static_cast<size_t>(end - text.c_str());
    if (at < text.size() && text[at++] != ',') return false;
  }
  return !ids->empty();
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char **argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: generate MODEL.pte [--prompt ID,ID,...] [--tokens N] [--device cpu|cuda|auto] "
                         "[--prefill tokens|whole]\n");
    return 1;
  }
  std::vector<int64_t> prompt;
  int tokens = 32;
  std::string device;
  bool whole_prompt = false;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--prompt" && parse_ids(value, &prompt)) continue;
    if (flag == "--tokens" && std::atoi(value.c_str()) > 0) {
      tokens = std::atoi(value.c_str());
      continue;
    }
    if (flag == "--device") {
      device = value;
      continue;
    }
    if (flag == "--prefill" && (value == "tokens" || value == "whole")) {
      whole_prompt = value == "whole";
      continue;
    }
    std::fprintf(stderr, "bad argument %s %s\n", flag.c_str(), value.c_str());
    return 1;
  }
  if (prompt.empty()) prompt = {1};

  BackendOptions<2> kiln_options;
  if (!device.empty()) (void)kiln_options.set_option("device", device.c_str());
  LoadBackendOptionsMap backend_options;
  if (backend_options.set_options("KilnBackend", kiln_options.view()) != Error::Ok) {
    std::fprintf(stderr, "cannot set KilnBackend's options\n");
    return 1;
  }
  Module module(argv[1], Module::LoadMode::Mmap);
  if (module.load(backend_options) != Error::Ok || module.load_method("forward") != Error::Ok) {
    std::fprintf(stderr, "cannot load forward of %s\n", argv[1]);
    return 2;
  }

  // The inputs and the output are caller buffers, rewritten in place each step.
  int64_t token_id = 0, position = 0, next = 0;
  auto ids = from_blob(&token_id, {1, 1}, executorch::aten::ScalarType::Long);
  auto pos = from_blob(&position, {1}, executorch::aten::ScalarType::Long);
  auto out = from_blob(&next, {1}, executorch::aten::ScalarType::Long);
  if (module.set_output("forward", EValue(*out), 0) != Error::Ok) {
    std::fprintf(stderr, "cannot bind the output buffer of forward\n");
    return 2;
  }
  const std::vector<EValue> inputs = {EValue(*ids), EValue(*pos)};
  auto step = [&](int64_t fed) {
    token_id = fed;
    const auto result = module.execute("forward", inputs);
    position++;
    return result.ok();
  };

  std::vector<int64_t> generated;
  std::vector<int64_t> positions(prompt.size());
  for (size_t i = 0; i < prompt.size(); i++) positions[i] = static_cast<int64_t>(i);
  const auto length = static_cast<executorch::aten::SizesType>(prompt.size());
  auto prompt_ids = from_blob(prompt.data(), {1, length}, executorch::aten::ScalarType::Long);
  auto prompt_pos = from_blob(positions.data(), {length}, executorch::aten::ScalarType::Long);
  auto start = std::chrono::steady_clock::now();
  if (whole_prompt) {  // one call: the program resizes to this prompt's length
    if (!module.execute("forward", {EValue(*prompt_ids), EValue(*prompt_pos)}).ok()) {
      std::fprintf(stderr, "prefill of %zu tokens in one call failed (a static program, or longer than its bound?)\n",
                   prompt.size());
      return 3;
    }
    position = static_cast<int64_t>(prompt.size());
  }
  for (size_t i = 0; !whole_prompt && i < prompt.size(); i++) {
    if (!step(prompt[i])) {
      std::fprintf(stderr, "prefill failed at position %lld\n", static_cast<long long>(position));
      return 3;
    }
  }
  const double prefill_s = seconds_since(start);
  generated.push_back(next);
  start = std::chrono::steady_clock::now();
  while (static_cast<int>(generated.size()) < tokens) {
    if (!step(generated.back())) {
      std::fprintf(stderr, "decode failed at position %lld (past the cache end?)\n", static_cast<long long>(position));
      return 3;
    }
    generated.push_back(next);
  }
  const double decode_s = seconds_since(start);

  std::printf("tokens:");
  for (int64_t t : generated) std::printf(" %lld", static_cast<long long>(t));
  std::printf("\nprefill: %zu tokens, %.1f tokens/s\n", prompt.size(), prompt.size() / prefill_s);
  std::printf("decode: %zu steps, %.1f tokens/s\n", generated.size() - 1,
              generated.size() > 1 ? (generated.size() - 1) / decode_s : 0.0);
  return 0;
}
