// Timing entry points for bench/bench.py and bench/generate_bench.py, which load this library
// with ctypes: a .pte run through ExecuTorch's Module API (the way an application runs Kiln) on
// host or device tensors, a blob run through Kiln's C API alone, so the difference is what
// ExecuTorch adds per call, and greedy generation through Module from a decoder program.
#include "kiln/kiln.h"

#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

using executorch::extension::module::Module;
using executorch::runtime::Error;
using executorch::runtime::EValue;

namespace {

double now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A .pte's forward method through Module, ready to call on the given inputs (ExecuTorch
// ScalarType codes; host or device memory, as from_blob tensors). Outputs the program leaves
// to the caller get out_data[i] (n_outputs of them, host or device memory) or, when out_data
// is null, host buffers of its own.
struct PteRun {
  Module module;
  std::vector<executorch::extension::TensorPtr> tensors;
  std::vector<EValue> args;
  std::vector<std::vector<uint8_t>> host_outputs;

  explicit PteRun(const char *path) : module(path, Module::LoadMode::Mmap) {}

  int prepare(int n_inputs, void *const *data, const int64_t *sizes, const int *ranks,
              const int *dtypes, int n_outputs, void *const *out_data, char *msg, int msg_len) {
    const Error loaded = module.load_forward();
    if (loaded != Error::Ok) {
      std::snprintf(msg, msg_len, "load_forward failed: error %d", static_cast<int>(loaded));
      return 1;
    }
    const int64_t *dims = sizes;
    for (int i = 0; i < n_inputs; i++) {
      std::vector<executorch::aten::SizesType> shape(dims, dims + ranks[i]);
      dims += ranks[i];
      tensors.push_back(executorch::extension::from_blob(
          data[i], shape, static_cast<executorch::aten::ScalarType>(dtypes[i])));
      args.emplace_back(*tensors.back());
    }
    auto meta = module.method_meta("forward");
    if (!meta.ok()) {
      std::snprintf(msg, msg_len, "method_meta failed: error %d", static_cast<int>(meta.error()));
      return 1;
    }
    host_outputs.reserve(meta->num_outputs());  // from_blob keeps pointers into these
    int given = 0;
    for (size_t i = 0; i < meta->num_outputs(); i++) {
      auto info = meta->output_tensor_meta(i);
      if (!info.ok() || info->is_memory_planned()) continue;
      void *buffer = nullptr;
      if (out_data != nullptr) {
        if (given >= n_outputs) {
          std::snprintf(msg, msg_len, "the program leaves more than %d outputs to the caller", n_outputs);
          return 1;
        }
        buffer = out_data[given++];
      } else {
        host_outputs.emplace_back(info->nbytes());
        buffer = host_outputs.back().data();
      }
      std::vector<executorch::aten::SizesType> shape(info->sizes().begin(), info->sizes().end());
      tensors.push_back(executorch::extension::from_blob(buffer, shape, info->scalar_type()));
      const Error bound = module.set_output("forward", *tensors.back(), i);
      if (bound != Error::Ok) {
        std::snprintf(msg, msg_len, "set_output %zu failed: error %d", i, static_cast<int>(bound));
        return 1;
      }
    }
    if (out_data != nullptr && given != n_outputs) {
      std::snprintf(msg, msg_len, "%d output buffers given but the program leaves %d to the caller",
                    n_outputs, given);
      return 1;
    }
    return 0;
  }

  // One synchronous forward(); its microseconds, or a negative value with msg set.
  double call(char *msg, int msg_len) {
    const double t0 = now_us();
    auto result = module.forward(args);
    const double t1 = now_us();
    if (!result.ok()) {
      std::snprintf(msg, msg_len, "forward failed: error %d", static_cast<int>(result.error()));
      return -1.0;
    }
    return t1 - t0;
  }
};

// A blob loaded on CUDA through the C API, on the caller's buffers when ptrs holds one per
// binding (in binding order; device memory is bound in place), else on host buffers shaped by
// its bindings and filled with small pseudo-random values.
struct BlobRun {
  kiln_engine *engine = nullptr;
  std::vector<std::vector<uint8_t>> buffers;
  std::vector<kiln_tensor_view> in, out;

  ~BlobRun() { kiln_engine_destroy(engine); }

  int prepare(const void *blob, size_t size, void *const *ptrs, char *msg, int msg_len) {
    kiln_error err;
    kiln_engine_options opts;
    kiln_engine_options_default(&opts);
    opts.device = KILN_DEVICE_CUDA;
    if (kiln_engine_load(blob, size, &opts, &engine, &err) != KILN_OK) {
      std::snprintf(msg, msg_len, "%s", err.message);
      return 1;
    }
    const kiln_metadata *md = kiln_engine_metadata(engine);
    buffers.resize(md->n_bindings);
    uint32_t seed = 1;
    for (uint32_t b = 0; b < md->n_bindings; b++) {
      const kiln_binding &bd = md->bindings[b];
      kiln_tensor_view v;
      std::memset(&v, 0, sizeof v);
      size_t n = 1;
      for (int d = bd.rank - 1; d >= 0; d--) {
        v.sizes[d] = bd.shape[d];
        v.strides[d] = static_cast<int64_t>(n);
        n *= static_cast<size_t>(bd.shape[d]);
      }
      if (!ptrs) {
        buffers[b].resize(n * kiln_dtype_size(bd.dtype) + 1);
        for (auto &byte : buffers[b]) {
          seed = seed * 1664525u + 1013904223u;
          byte = static_cast<uint8_t>((seed >> 24) & 0x3f);  // small finite values in any float type
        }
      }
      v.data = ptrs ? ptrs[b] : buffers[b].data();
      v.nbytes = n * kiln_dtype_size(bd.dtype);
      v.dtype = bd.dtype;
      v.rank = bd.rank;
      (bd.kind == KILN_IO_INPUT ? in : out).push_back(v);
    }
    return 0;
  }

  double call(char *msg, int msg_len) {
    kiln_error err;
    const double t0 = now_us();
    const kiln_status st = kiln_engine_execute(engine, in.data(), static_cast<uint32_t>(in.size()),
                                               out.data(), static_cast<uint32_t>(out.size()), &err);
    const double t1 = now_us();
    if (st != KILN_OK) {
      std::snprintf(msg, msg_len, "%s", err.message);
      return -1.0;
    }
    return t1 - t0;
  }
};

// A decoder program for greedy generation through Module: forward(input_ids [1, n],
// cache_position [n]) -> the next token's id [1], its KV cache kept by the delegate across calls.
// The ids, positions and token slots live wherever the caller put them (host or device memory):
// each call points the tensors at the next slots, so generated tokens never pass through here.
struct GenerateRun {
  Module module;
  executorch::extension::TensorPtr ids, positions, token;
  // Whether the inputs reach the delegate as the caller's buffers; planned ones are copied into
  // ExecuTorch's plan on the host, so they must then be host memory.
  bool caller_inputs = false;

  explicit GenerateRun(const char *path) : module(path, Module::LoadMode::Mmap) {}

  int load(char *msg, int msg_len) {
    const Error loaded = module.load_method("forward");
    if (loaded != Error::Ok) {
      std::snprintf(msg, msg_len, "load_method(forward) failed: error %d", static_cast<int>(loaded));
      return 1;
    }
    auto meta = module.method_meta("forward");
    if (!meta.ok() || meta->num_inputs() != 2 || meta->num_outputs() != 1) {
      std::snprintf(msg, msg_len, "forward is not (input_ids, cache_position) -> token id: give a "
                                  "greedy decoder program with two inputs and one output");
      return 1;
    }
    caller_inputs = true;
    for (size_t i = 0; i < 2; i++) {
      auto in = meta->input_tensor_meta(i);
      if (!in.ok() || in->scalar_type() != executorch::aten::ScalarType::Long) {
        std::snprintf(msg, msg_len, "forward's input %zu is not an int64 tensor: give a greedy decoder "
                                    "program taking input_ids and cache_position", i);
        return 1;
      }
      caller_inputs = caller_inputs && !in->is_memory_planned();
    }
    auto out = meta->output_tensor_meta(0);
    if (!out.ok() || out->is_memory_planned() || out->scalar_type() != executorch::aten::ScalarType::Long) {
      std::snprintf(msg, msg_len, "forward's output is not a caller-bound int64 token id: export the "
                                  "decoder with kiln.export, which leaves outputs to the caller");
      return 1;
    }
    return 0;
  }

  // The delegate's state lives in its handle: unloading forward destroys it (and the engine),
  // loading it again starts from the program's initial cache.
  int reset(double *load_us, char *msg, int msg_len) {
    const double t0 = now_us();
    module.unload_method("forward");
    const int rc = load(msg, msg_len);
    *load_us = now_us() - t0;
    return rc;
  }

  static void point(executorch::extension::TensorPtr &t, void *data,
                    std::vector<executorch::aten::SizesType> shape) {
    if (t && std::equal(shape.begin(), shape.end(), t->sizes().begin(), t->sizes().end())) {
      t->unsafeGetTensorImpl()->set_data(data);
      return;
    }
    t = executorch::extension::from_blob(data, shape, executorch::aten::ScalarType::Long);
  }

  // One call on n tokens at ids/pos, writing the next token to *next; its microseconds or < 0.
  double call(int64_t *ids_at, int64_t *pos_at, int64_t n, int64_t *next, char *msg, int msg_len) {
    const auto len = static_cast<executorch::aten::SizesType>(n);
    point(ids, ids_at, {1, len});
    point(positions, pos_at, {len});
    point(token, next, {1});
    const double t0 = now_us();
    Error bound = module.set_output("forward", EValue(*token), 0);
    if (bound != Error::Ok) {
      std::snprintf(msg, msg_len, "set_output failed: error %d", static_cast<int>(bound));
      return -1.0;
    }
    auto result = module.execute("forward", {EValue(*ids), EValue(*positions)});
    const double t1 = now_us();
    if (!result.ok()) {
      std::snprintf(msg, msg_len, "forward failed at position %lld: error %d",
                    static_cast<long long>(*pos_at), static_cast<int>(result.error()));
      return -1.0;
    }
    return t1 - t0;
  }
};

}  // namespace

// Loads path's forward method (see PteRun), then times warmup + iters synchronous forward()
// calls; times_us receives the last iters.
extern "C" __attribute__((visibility("default"))) int kb_time_pte(
    const char *path, int n_inputs, void *const *data, const int64_t *sizes, const int *ranks,
    const int *dtypes, int n_outputs, void *const *out_data, int warmup, int iters,
    double *times_us, char *msg, int msg_len) {
  PteRun run(path);
  if (run.prepare(n_inputs, data, sizes, ranks, dtypes, n_outputs, out_data, msg, msg_len) != 0) return 1;
  for (int it = 0; it < warmup + iters; it++) {
    const double t = run.call(msg, msg_len);
    if (t < 0) return 2;
    if (it >= warmup) times_us[it - warmup] = t;
  }
  return 0;
}

// Loads a blob on CUDA (see BlobRun) and times warmup + iters executes.
extern "C" __attribute__((visibility("default"))) int kb_time_blob(
    const void *blob, size_t size, void *const *ptrs, int warmup, int iters, double *times_us,
    char *msg, int msg_len) {
  BlobRun run;
  if (run.prepare(blob, size, ptrs, msg, msg_len) != 0) return 1;
  for (int it = 0; it < warmup + iters; it++) {
    const double t = run.call(msg, msg_len);
    if (t < 0) return 2;
    if (it >= warmup) times_us[it - warmup] = t;
  }
  return 0;
}

// The .pte through Module (as kb_time_pte) and its blob through the C API (as kb_time_blob),
// loaded side by side and called alternately, the order swapped every iteration: both see the
// same clocks and temperature, so their difference is what ExecuTorch and the adapter add, not
// the drift between two runs minutes apart. times_pte and times_blob receive the last iters.
extern "C" __attribute__((visibility("default"))) int kb_time_pair(
    const char *path, int n_inputs, void *const *data, const int64_t *sizes, const int *ranks,
    const int *dtypes, int n_outputs, void *const *out_data, const void *blob, size_t size,
    void *const *ptrs, int warmup, int iters, double *times_pte, double *times_blob, char *msg,
    int msg_len) {
  PteRun pte(path);
  if (pte.prepare(n_inputs, data, sizes, ranks, dtypes, n_outputs, out_data, msg, msg_len) != 0) return 1;
  BlobRun c;
  if (c.prepare(blob, size, ptrs, msg, msg_len) != 0) return 1;
  for (int it = 0; it < warmup + iters; it++) {
    double tp = 0, tb = 0;
    if (it % 2 == 0) {
      tp = pte.call(msg, msg_len);
      tb = tp < 0 ? tp : c.call(msg, msg_len);
    } else {
      tb = c.call(msg, msg_len);
      tp = tb < 0 ? tb : pte.call(msg, msg_len);
    }
    if (tp < 0 || tb < 0) return 2;
    if (it >= warmup) {
      times_pte[it - warmup] = tp;
      times_blob[it - warmup] = tb;
    }
  }
  return 0;
}

// The host side of staging: the median rate (bytes per second) of copying n bytes from src to
// dst (pageable to pinned, as Kiln stages a host buffer) split over `threads` threads, over
// reps copies. It tells whether one CPU thread's copy keeps up with the link.
extern "C" __attribute__((visibility("default"))) double kb_host_copy_rate(
    void *dst, const void *src, size_t n, int threads, int reps) {
  std::vector<double> rates;
  for (int r = 0; r < reps + 1; r++) {
    const double t0 = now_us();
    std::vector<std::thread> pool;
    const size_t slice = (n + threads - 1) / threads;
    for (int t = 1; t < threads; t++) {
      const size_t off = std::min(n, slice * t), len = std::min(slice, n - off);
      pool.emplace_back([=] { std::memcpy(static_cast<char *>(dst) + off, static_cast<const char *>(src) + off, len); });
    }
    std::memcpy(dst, src, std::min(slice, n));
    for (auto &worker : pool) worker.join();
    const double t1 = now_us();
    if (r > 0) rates.push_back(n / ((t1 - t0) * 1e-6));  // the first copy faults the pages in
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

// A greedy decoder program (see GenerateRun) loaded through Module; null with msg set on failure.
extern "C" __attribute__((visibility("default"))) void *kb_gen_open(const char *path, char *msg, int msg_len) {
  auto *run = new GenerateRun(path);
  if (run->load(msg, msg_len) != 0) {
    delete run;
    return nullptr;
  }
  return run;
}

// 1 when forward's inputs are the caller's buffers (device memory allowed), 0 when ExecuTorch
// plans them (host memory only).
extern "C" __attribute__((visibility("default"))) int kb_gen_caller_inputs(void *run) {
  return static_cast<GenerateRun *>(run)->caller_inputs ? 1 : 0;
}

extern "C" __attribute__((visibility("default"))) void kb_gen_close(void *run) {
  delete static_cast<GenerateRun *>(run);
}

// Back to the program's initial state by reloading forward; load_us receives what that took.
extern "C" __attribute__((visibility("default"))) int kb_gen_reset(void *run, double *load_us, char *msg,
                                                                   int msg_len) {
  return static_cast<GenerateRun *>(run)->reset(load_us, msg, msg_len);
}

// Greedy generation from position 0: the prompt (slots 0 to prompt_len - 1) in calls of at most
// chunk tokens (1 for a program of static sequence length 1), then new_tokens - 1 decode steps,
// each feeding slot p at position slot p and writing the next token to slot p + 1. Slot p is
// seq[p * stride] and pos[p * stride]: prompt_len + new_tokens slots each, in host or device
// memory alike (a chunk of several tokens needs stride 1). times_us receives each call's
// microseconds: ceil(prompt_len / chunk) prefill calls, then the decode steps.
extern "C" __attribute__((visibility("default"))) int kb_gen_run(void *opaque, int64_t *seq, int64_t *pos,
                                                                 int prompt_len, int new_tokens, int chunk,
                                                                 int stride, double *times_us, char *msg,
                                                                 int msg_len) {
  auto *run = static_cast<GenerateRun *>(opaque);
  if (prompt_len < 1 || new_tokens < 1 || chunk < 1 || stride < 1 || (chunk > 1 && stride != 1)) {
    std::snprintf(msg, msg_len, "prompt_len %d, new_tokens %d, chunk %d and stride %d must all be at "
                  "least 1, and stride 1 when chunk is above 1", prompt_len, new_tokens, chunk, stride);
    return 1;
  }
  int k = 0;
  for (int at = 0; at < prompt_len; at += chunk) {
    const int n = std::min(chunk, prompt_len - at);
    // Every prefill call writes seq[prompt_len]; the last one's token is the first generated.
    const double t = run->call(seq + at * stride, pos + at * stride, n, seq + prompt_len * stride, msg, msg_len);
    if (t < 0) return 2;
    times_us[k++] = t;
  }
  for (int p = prompt_len; p < prompt_len + new_tokens - 1; p++) {
    const double t = run->call(seq + p * stride, pos + p * stride, 1, seq + (p + 1) * stride, msg, msg_len);
    if (t < 0) return 2;
    times_us[k++] = t;
  }
  return 0;
}
