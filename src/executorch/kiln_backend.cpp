// kiln_backend.cpp - ExecuTorch's BackendInterface for Kiln: turns ExecuTorch values into the C
// core's views and statuses into ExecuTorch errors; registers "KilnBackend" when the library loads.
#include "kiln/kiln.h"

#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/core/exec_aten/util/tensor_util.h>
#include <executorch/runtime/platform/log.h>

#include <array>
#include <cstring>
#include <mutex>
#include <variant>

namespace {

using executorch::aten::ScalarType;
using executorch::aten::Tensor;
using executorch::runtime::ArrayRef;
using executorch::runtime::Backend;
using executorch::runtime::BackendExecutionContext;
using executorch::runtime::BackendInitContext;
using executorch::runtime::BackendInterface;
using executorch::runtime::BackendOption;
using executorch::runtime::BackendOptionContext;
using executorch::runtime::CompileSpec;
using executorch::runtime::DelegateHandle;
using executorch::runtime::Error;
using executorch::runtime::EValue;
using executorch::runtime::FreeableBuffer;
using executorch::runtime::kMaxOptionValueLength;
using executorch::runtime::MemoryAllocator;
using executorch::runtime::Result;
using executorch::runtime::Span;

using OptionString = std::array<char, kMaxOptionValueLength>;

// What init returns: the engine, and per delegate argument its binding and its view.
struct KilnHandle {
  kiln_engine *engine;
  uint32_t n_inputs;
  uint32_t n_outputs;
  uint32_t *binding_of_arg; // arguments are the inputs, then the outputs, in binding order
  kiln_tensor_view *views;  // written by execute; ExecuTorch never runs one method twice at once
};

Error to_et_error(kiln_status status) {
  switch (status) {
  case KILN_OK: return Error::Ok;
  case KILN_ERR_INVALID_PROGRAM: return Error::InvalidProgram;
  case KILN_ERR_INCOMPATIBLE: return Error::DelegateInvalidCompatibility;
  case KILN_ERR_INVALID_ARGUMENT: return Error::InvalidArgument;
  case KILN_ERR_OUT_OF_MEMORY: return Error::MemoryAllocationFailed;
  case KILN_ERR_INTERNAL: return Error::Internal;
  case KILN_ERR_UNAVAILABLE: return Error::NotSupported;
  case KILN_ERR_UNSUPPORTED: return Error::NotSupported;
  }
  return Error::Internal;
}

// Two lines so that the Kiln message keeps all of its 255 bytes in ExecuTorch's log. Bytes
// outside printable ASCII (a name copied from a damaged blob) become '?': ExecuTorch's Python
// log handler decodes messages as UTF-8 and aborts the process on anything else.
Error log_failure(const char *call, kiln_error &err) {
  for (char *c = err.message; *c != '\0'; c++) {
    if (*c < 0x20 || *c > 0x7e) {
      *c = '?';
    }
  }
  ET_LOG(Error, "KilnBackend %s failed with %s:", call, kiln_status_name(err.status));
  ET_LOG(Error, "%s", err.message);
  return to_et_error(err.status);
}

// The load-time options, process-wide (set_option) or per program (Module::load's options).
kiln_status apply_option(const BackendOption &option, kiln_engine_options *opts, kiln_error *err) {
  if (std::strcmp(option.key, "device") == 0) {
    const OptionString *value = std::get_if<OptionString>(&option.value);
    if (value == nullptr) {
      return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                       "backend option \"device\" is not a string: pass \"cpu\", \"cuda\" or "
                       "\"auto\"");
    }
    if (std::strcmp(value->data(), "cpu") == 0) {
      opts->device = KILN_DEVICE_CPU;
    } else if (std::strcmp(value->data(), "cuda") == 0) {
      opts->device = KILN_DEVICE_CUDA;
    } else if (std::strcmp(value->data(), "auto") == 0) {
      opts->device = KILN_DEVICE_AUTO;
    } else {
      return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                       "backend option \"device\" is \"%.32s\", which Kiln does not know: pass "
                       "\"cpu\", \"cuda\" or \"auto\"",
                       value->data());
    }
    return KILN_OK;
  }
  if (std::strcmp(option.key, "device_id") == 0) {
    const int *value = std::get_if<int>(&option.value);
    if (value == nullptr) {
      return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                       "backend option \"device_id\" is not an integer: pass a CUDA device "
                       "number, or -1 for the program's own");
    }
    if (*value < -1) {
      return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                       "backend option \"device_id\" is %d, which names no device: pass a CUDA "
                       "device number (0 or more), or -1 for the program's own",
                       *value);
    }
    opts->device_id = static_cast<int32_t>(*value);
    return KILN_OK;
  }
  return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                   "backend option \"%.64s\" is not one of KilnBackend's: the options are "
                   "\"device\" and \"device_id\"",
                   option.key);
}

kiln_engine_options default_options() {
  kiln_engine_options opts;
  kiln_engine_options_default(&opts);
  return opts;
}

std::mutex process_options_lock;
kiln_engine_options process_options = default_options();

kiln_engine_options current_process_options() {
  std::lock_guard<std::mutex> guard(process_options_lock);
  return process_options;
}

bool kiln_dtype_of(ScalarType type, kiln_dtype *out) {
  switch (type) {
  case ScalarType::Float: *out = KILN_F32; return true;
  case ScalarType::Half: *out = KILN_F16; return true;
  case ScalarType::BFloat16: *out = KILN_BF16; return true;
  case ScalarType::Long: *out = KILN_I64; return true;
  case ScalarType::Int: *out = KILN_I32; return true;
  case ScalarType::Bool: *out = KILN_BOOL; return true;
  default: return false;
  }
}

const char *kind_name(const kiln_binding &binding) {
  return binding.kind == KILN_IO_INPUT ? "input" : "output";
}

// Resizes an output of a dynamic plan (ExecuTorch plans it for its bound) to dims.
kiln_status resize_output(EValue &value, const kiln_binding &binding, int32_t rank,
                          const int64_t *dims, kiln_error *err) {
  if (!value.isTensor()) {
    return KILN_OK; // view_of refuses it
  }
  const Error status = executorch::runtime::resize_tensor(
      value.toTensor(), ArrayRef<int64_t>(dims, static_cast<size_t>(rank)));
  if (status != Error::Ok) {
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "output %.64s cannot be resized to this call's shape (ExecuTorch error 0x%x): "
                     "export the program with its dynamic dims so ExecuTorch plans their bound",
                     binding.name, static_cast<unsigned>(status));
  }
  return KILN_OK;
}

// Describes an ExecuTorch tensor to the C core, which checks it against the binding.
kiln_status view_of(const EValue &value, const kiln_binding &binding, kiln_tensor_view *view,
                    kiln_error *err) {
  if (!value.isTensor()) {
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "%.6s %.64s is passed as an ExecuTorch value of tag %d, not a tensor: "
                     "re-export the program with this version of Kiln",
                     kind_name(binding), binding.name, static_cast<int>(value.tag));
  }
  const Tensor tensor = value.toTensor();
  if (!kiln_dtype_of(tensor.scalar_type(), &view->dtype)) {
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "%.6s %.64s has ExecuTorch dtype %d, which Kiln does not run: pass f32, "
                     "f16, bf16, i64, i32 or bool as the program was exported",
                     kind_name(binding), binding.name, static_cast<int>(tensor.scalar_type()));
  }
  if (tensor.dim() > KILN_MAX_RANK) {
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "%.6s %.64s has rank %lld, above Kiln's limit of %d: pass the shape the "
                     "program was exported with",
                     kind_name(binding), binding.name, static_cast<long long>(tensor.dim()),
                     KILN_MAX_RANK);
  }
  if (binding.kind == KILN_IO_OUTPUT && tensor.mutable_data_ptr() == nullptr && tensor.nbytes() > 0) {
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "output %.64s has no buffer: the program leaves it to the caller; give one "
                     "with Module::set_output or Method::set_output_data_ptr before execute",
                     binding.name);
  }
  view->data = tensor.mutable_data_ptr();
  view->nbytes = tensor.nbytes();
  view->rank = static_cast<int32_t>(tensor.dim());
  for (int32_t d = 0; d < view->rank; d++) {
    view->sizes[d] = tensor.sizes()[d];
    view->strides[d] = tensor.strides()[d];
  }
  return KILN_OK;
}

class KilnBackend final : public BackendInterface {
 public:
  // The CPU reference engine is always present; which device runs is decided at init.
  bool is_available() const override { return true; }

  Result<DelegateHandle *> init(BackendInitContext &context, FreeableBuffer *processed,
                                ArrayRef<CompileSpec> compile_specs) const override {
    (void)compile_specs; // the blob's metadata carries everything the engine needs
    kiln_error err = {};
    kiln_engine_options opts = current_process_options();
    for (const BackendOption &option : context.runtime_specs()) {
      if (apply_option(option, &opts, &err) != KILN_OK) {
        processed->Free();
        return log_failure("init", err);
      }
    }
    kiln_engine *engine = nullptr;
    const kiln_status status =
        kiln_engine_load(processed->data(), processed->size(), &opts, &engine, &err);
    processed->Free(); // the engine keeps its own copy of what it needs
    if (status != KILN_OK) {
      return log_failure("init", err);
    }
    KilnHandle *handle = new_handle(context.get_runtime_allocator(), engine, &err);
    if (handle == nullptr) {
      kiln_engine_destroy(engine);
      return log_failure("init", err);
    }
    return handle;
  }

  Error execute(BackendExecutionContext &context, DelegateHandle *opaque,
                Span<EValue *> args) const override {
    (void)context;
    KilnHandle *handle = static_cast<KilnHandle *>(opaque);
    const kiln_metadata *metadata = kiln_engine_metadata(handle->engine);
    kiln_error err = {};
    const size_t expected = static_cast<size_t>(handle->n_inputs) + handle->n_outputs;
    // A dynamic plan's outputs take their bound before the call and this call's shape after;
    // the dynamic sizes ExecuTorch also passes (integers) are read from the input shapes instead.
    const bool dynamic = kiln_engine_plan(handle->engine)->n_symbols > 0;
    EValue *tensors[KILN_MAX_BINDINGS];
    size_t n = 0;
    for (size_t i = 0; i < args.size(); i++) {
      if (dynamic && args[i]->isInt()) continue;
      if (n < KILN_MAX_BINDINGS) tensors[n] = args[i];
      n++;
    }
    if (n != expected) {
      kiln_fail(&err, KILN_ERR_INVALID_PROGRAM,
                "the delegate call passes %llu values but its Kiln blob has %u inputs and %u "
                "outputs: the program does not match its blob; re-export it",
                static_cast<unsigned long long>(n), handle->n_inputs, handle->n_outputs);
      return log_failure("execute", err);
    }
    for (size_t i = 0; i < n; i++) {
      // A shape other than the binding's (an output planned larger) is refused by the engine.
      const kiln_binding &binding = metadata->bindings[handle->binding_of_arg[i]];
      if ((dynamic && i >= handle->n_inputs &&
           resize_output(*tensors[i], binding, binding.rank, binding.shape, &err) != KILN_OK) ||
          view_of(*tensors[i], binding, &handle->views[i], &err) != KILN_OK) {
        return log_failure("execute", err);
      }
    }
    if (kiln_engine_execute(handle->engine, handle->views, handle->n_inputs,
                            handle->views + handle->n_inputs, handle->n_outputs,
                            &err) != KILN_OK) {
      return log_failure("execute", err);
    }
    for (uint32_t k = 0; dynamic && k < handle->n_outputs; k++) {
      const size_t i = handle->n_inputs + k;
      int32_t rank = 0;
      int64_t dims[KILN_MAX_RANK];
      if (kiln_engine_output_shape(handle->engine, k, &rank, dims, &err) != KILN_OK ||
          resize_output(*tensors[i], metadata->bindings[handle->binding_of_arg[i]], rank, dims,
                        &err) != KILN_OK) {
        return log_failure("execute", err);
      }
    }
    return Error::Ok;
  }

  void destroy(DelegateHandle *opaque) const override {
    // The handle's memory belongs to the method's runtime allocator.
    if (opaque != nullptr) {
      kiln_engine_destroy(static_cast<KilnHandle *>(opaque)->engine);
    }
  }

  Error set_option(BackendOptionContext &context,
                   const Span<BackendOption> &options) override {
    (void)context;
    kiln_error err = {};
    std::lock_guard<std::mutex> guard(process_options_lock);
    kiln_engine_options next = process_options;
    for (const BackendOption &option : options) {
      if (apply_option(option, &next, &err) != KILN_OK) {
        return log_failure("set_option", err);
      }
    }
    process_options = next;
    return Error::Ok;
  }

  Error get_option(BackendOptionContext &context, Span<BackendOption> &options) override {
    (void)context;
    const kiln_engine_options current = current_process_options();
    for (BackendOption &option : options) {
      if (std::strcmp(option.key, "device") == 0) {
        OptionString value{};
        const char *name = current.device == KILN_DEVICE_CPU    ? "cpu"
                           : current.device == KILN_DEVICE_CUDA ? "cuda"
                                                                : "auto";
        std::strncpy(value.data(), name, value.size() - 1);
        option.value = value;
      } else if (std::strcmp(option.key, "device_id") == 0) {
        option.value = static_cast<int>(current.device_id);
      } else {
        return Error::NotFound;
      }
    }
    return Error::Ok;
  }

 private:
  static KilnHandle *new_handle(MemoryAllocator *allocator, kiln_engine *engine,
                                kiln_error *err) {
    const kiln_metadata *metadata = kiln_engine_metadata(engine);
    const uint32_t n = metadata->n_bindings;
    const size_t slots = n > 0 ? n : 1; // an allocator may answer a request of 0 bytes with null
    KilnHandle *handle = allocator->allocateInstance<KilnHandle>();
    uint32_t *binding_of_arg = allocator->allocateList<uint32_t>(slots);
    kiln_tensor_view *views = allocator->allocateList<kiln_tensor_view>(slots);
    if (handle == nullptr || binding_of_arg == nullptr || views == nullptr) {
      kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                "ExecuTorch's runtime allocator has no room for the handle of %u bindings: "
                "give the method a larger runtime allocator",
                n);
      return nullptr;
    }
    uint32_t n_inputs = 0;
    for (uint32_t b = 0; b < n; b++) {
      n_inputs += metadata->bindings[b].kind == KILN_IO_INPUT ? 1u : 0u;
    }
    uint32_t next_input = 0;
    uint32_t next_output = n_inputs;
    for (uint32_t b = 0; b < n; b++) {
      if (metadata->bindings[b].kind == KILN_IO_INPUT) {
        binding_of_arg[next_input++] = b;
      } else {
        binding_of_arg[next_output++] = b;
      }
    }
    handle->engine = engine;
    handle->n_inputs = n_inputs;
    handle->n_outputs = n - n_inputs;
    handle->binding_of_arg = binding_of_arg;
    handle->views = views;
    return handle;
  }
};

KilnBackend backend;

Error register_kiln() {
  const Error status = executorch::runtime::register_backend(Backend{KILN_BACKEND_ID, &backend});
  if (status != Error::Ok) {
    ET_LOG(Error,
           "KilnBackend was not registered (error 0x%x): a backend of this name is already "
           "registered or the registry is full; load one copy of libexecutorch_backend_kiln.so",
           static_cast<unsigned>(status));
  }
  return status;
}

[[maybe_unused]] const Error registration = register_kiln();

} // namespace
