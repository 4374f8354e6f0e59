"""ctypes bindings of libkiln's builder and engine (include/kiln/kiln.h).

The structures and enums below mirror the public header field for field; a test checks
them against the library (op names, dtype names and sizes).
"""

import ctypes
import os

import torch

LIBRARY_ENV = "KILN_LIBRARY"
LIBRARY_NAME = "libkiln.so"

ERROR_MAX = 256
NAME_MAX = 64
MAX_RANK = 8
MAX_BINDINGS = 256
MAX_ALIASES = 64
MAX_OP_INPUTS = 8

# kiln_status
OK = 0
ERR_UNSUPPORTED = 7

# kiln_dtype
F32, F16, BF16, I64, I32, BOOL = range(6)
DTYPE_NAMES = ("f32", "f16", "bf16", "i64", "i32", "bool")
_TORCH_TO_KILN = {
    torch.float32: F32,
    torch.float16: F16,
    torch.bfloat16: BF16,
    torch.int64: I64,
    torch.int32: I32,
    torch.bool: BOOL,
}
_KILN_TO_TORCH = {v: k for k, v in _TORCH_TO_KILN.items()}

# kiln_op_kind, in the header's order; the names are those kiln_op_name returns.
OP_NAMES = (
    "linear", "matmul", "add", "sub", "mul", "div", "relu", "gelu", "silu", "sigmoid",
    "tanh", "exp", "sqrt", "rsqrt", "neg", "pow", "cast", "softmax", "log_softmax",
    "layer_norm", "rms_norm", "sum", "mean", "amax", "reshape", "permute", "expand", "cat",
    "slice", "select", "copy", "embedding", "index_select", "where", "sdpa", "pointwise",
    "compare", "logical", "bitwise", "abs", "log", "cos", "sin", "erf", "hardswish",
    "hardsigmoid", "minimum", "maximum",
    "conv", "conv_transpose", "batch_norm", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d",
    "upsample_nearest2d", "upsample_bilinear2d",
    "cumsum", "gather", "index", "argmax", "fused", "index_copy",
)
OP = {name: index for index, name in enumerate(OP_NAMES)}

# kiln_activation
ACT_NONE = 0

# kiln_compare and kiln_bool_op, the iattr0 of compare, logical and bitwise ops
COMPARE = {"eq": 0, "ne": 1, "lt": 2, "le": 3, "gt": 4, "ge": 5}
BOOL_OPS = {"and": 0, "or": 1, "xor": 2, "not": 3}

# kiln_io_kind
IO_INPUT, IO_OUTPUT = 0, 1

# kiln_device_kind
DEVICES = {"auto": 0, "cpu": 1, "cuda": 2}


def kiln_dtype(dtype):
    """The kiln_dtype of a torch dtype, or None when Kiln has no such dtype."""
    return _TORCH_TO_KILN.get(dtype)


def torch_dtype(dtype):
    return _KILN_TO_TORCH[dtype]


class KilnError(RuntimeError):
    """A refusal: status is the kiln_status code, message the C message (or the exporter's)."""

    def __init__(self, status, message):
        self.status = status
        self.message = message
        super().__init__(f"kiln: {lib.kiln_status_name(status).decode()}: {message}")


class Error(ctypes.Structure):
    _fields_ = [("status", ctypes.c_int), ("message", ctypes.c_char * ERROR_MAX)]


class TensorView(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("nbytes", ctypes.c_size_t),
        ("dtype", ctypes.c_int),
        ("rank", ctypes.c_int32),
        ("sizes", ctypes.c_int64 * MAX_RANK),
        ("strides", ctypes.c_int64 * MAX_RANK),
    ]


class SymSize(ctypes.Structure):
    _fields_ = [("symbol", ctypes.c_uint32), ("coeff", ctypes.c_int64), ("offset", ctypes.c_int64)]


class Binding(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char * NAME_MAX),
        ("kind", ctypes.c_int),
        ("dtype", ctypes.c_int),
        ("rank", ctypes.c_int32),
        ("shape", ctypes.c_int64 * MAX_RANK),
        ("max_shape", ctypes.c_int64 * MAX_RANK),
    ]


class Alias(ctypes.Structure):
    _fields_ = [("output", ctypes.c_uint32), ("input", ctypes.c_uint32), ("kind", ctypes.c_char * 16)]


class Metadata(ctypes.Structure):
    _fields_ = [
        ("producer", ctypes.c_char * NAME_MAX),
        ("device_id", ctypes.c_int32),
        ("min_compute_capability", ctypes.c_int32),
        ("allow_tf32", ctypes.c_int),
        ("n_bindings", ctypes.c_uint32),
        ("bindings", Binding * MAX_BINDINGS),
        ("n_aliases", ctypes.c_uint32),
        ("aliases", Alias * MAX_ALIASES),
    ]


class BuildOptions(ctypes.Structure):
    _fields_ = [
        ("device_id", ctypes.c_int32),
        ("min_compute_capability", ctypes.c_int32),
        ("allow_tf32", ctypes.c_int),
        ("fuse", ctypes.c_int),
    ]


class EngineOptions(ctypes.Structure):
    _fields_ = [("device", ctypes.c_int), ("device_id", ctypes.c_int32)]


# kiln_cuda_stats (src/cuda/cuda_backend.h), field for field: the CUDA engine's counters.
CUDA_STATS_FIELDS = (
    "staged", "bound", "graph_replays", "graph_updates", "direct_runs", "init_allocs", "stage_chunks",
    "stage_threads", "stage_slot_bytes", "state_resets", "host_out_bytes", "shape_captures",
    "shape_evictions", "choices_measured", "choices_reused", "fused_compiled", "fused_interpreted",
    "attention_cudnn", "norms_in_gemv", "cache_writes_in_attention", "norms_after_gemv",
    "ops_beside",
)


class CudaStats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in CUDA_STATS_FIELDS]


def _library_path():
    path = os.environ.get(LIBRARY_ENV)
    if path:
        return path
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), LIBRARY_NAME)


def _load():
    path = _library_path()
    try:
        lib = ctypes.CDLL(path)
    except OSError as exc:
        if "libcudnn" in str(exc):
            raise ImportError(
                f"kiln: the Kiln library {path} needs cuDNN 9, which the loader did not find ({exc}): "
                "pip install nvidia-cudnn-cu13, or put cuDNN 9's lib directory on LD_LIBRARY_PATH"
            ) from exc
        raise ImportError(
            f"kiln: cannot load the Kiln library {path} ({exc}); build it with "
            f"`make build` (CMake copies build/{LIBRARY_NAME} into the kiln package) "
            f"or set {LIBRARY_ENV} to the path of a built {LIBRARY_NAME}"
        ) from exc
    p = ctypes.POINTER
    i32, i64, u32 = ctypes.c_int32, ctypes.c_int64, ctypes.c_uint32
    vp, sz, err = ctypes.c_void_p, ctypes.c_size_t, p(Error)
    signatures = {
        "kiln_op_name": (ctypes.c_char_p, [ctypes.c_int]),
        "kiln_dtype_name": (ctypes.c_char_p, [ctypes.c_int]),
        "kiln_dtype_size": (sz, [ctypes.c_int]),
        "kiln_status_name": (ctypes.c_char_p, [ctypes.c_int]),
        "kiln_free": (None, [vp]),
        "kiln_builder_create": (vp, []),
        "kiln_builder_destroy": (None, [vp]),
        "kiln_builder_add_input": (i32, [vp, ctypes.c_char_p, ctypes.c_int, i32, p(i64), err]),
        "kiln_builder_add_constant": (i32, [vp, ctypes.c_int, i32, p(i64), vp, sz, err]),
        "kiln_builder_add_op": (
            i32,
            [vp, ctypes.c_int, p(i32), u32, p(i64), u32, p(ctypes.c_double), u32, err],
        ),
        "kiln_builder_add_symbol": (i32, [vp, ctypes.c_char_p, i64, i64, err]),
        "kiln_builder_add_input_sym": (
            i32, [vp, ctypes.c_char_p, ctypes.c_int, i32, p(i64), p(SymSize), err],
        ),
        "kiln_builder_add_op_sym": (
            i32,
            [vp, ctypes.c_int, p(i32), u32, p(i64), p(SymSize), u32, p(ctypes.c_double), u32, err],
        ),
        "kiln_builder_get_shape": (ctypes.c_int, [vp, i32, p(ctypes.c_int), p(i32), p(i64), err]),
        "kiln_builder_mark_output": (ctypes.c_int, [vp, i32, ctypes.c_char_p, err]),
        "kiln_builder_add_state": (i32, [vp, ctypes.c_int, i32, p(i64), vp, sz, err]),
        "kiln_builder_write_state": (ctypes.c_int, [vp, i32, i32, err]),
        "kiln_engine_reset_state": (ctypes.c_int, [vp, err]),
        "kiln_build_options_default": (None, [p(BuildOptions)]),
        "kiln_builder_build": (ctypes.c_int, [vp, p(BuildOptions), p(vp), p(sz), err]),
        "kiln_engine_options_default": (None, [p(EngineOptions)]),
        "kiln_engine_load": (ctypes.c_int, [ctypes.c_char_p, sz, p(EngineOptions), p(vp), err]),
        "kiln_engine_execute": (ctypes.c_int, [vp, p(TensorView), u32, p(TensorView), u32, err]),
        "kiln_engine_destroy": (None, [vp]),
        "kiln_engine_metadata": (p(Metadata), [vp]),
        "kiln_engine_output_shape": (ctypes.c_int, [vp, u32, p(i32), p(i64), err]),
    }
    for name, (restype, argtypes) in signatures.items():
        try:
            fn = getattr(lib, name)
        except AttributeError as exc:
            raise ImportError(
                f"kiln: {path} lacks the symbol {name}; rebuild it with `make build`"
            ) from exc
        fn.restype = restype
        fn.argtypes = argtypes
    if hasattr(lib, "kiln_cuda_engine_stats"):  # only in a library built with the CUDA engine
        lib.kiln_cuda_engine_stats.restype = ctypes.c_int
        lib.kiln_cuda_engine_stats.argtypes = [vp, p(CudaStats), err]
    return lib


lib = _load()


def check_int32(name, value):
    # ctypes would silently wrap a larger value into another device number.
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**31:
        raise ValueError(f"kiln: {name} must be an int in [0, 2**31), got {value!r}")


def _raise(error):
    raise KilnError(error.status, error.message.decode("utf-8", "replace"))


def _dims(shape):
    return (ctypes.c_int64 * max(len(shape), 1))(*shape)


def _sym_sizes(sizes):
    """A SymSize array for (symbol, coeff, offset) or None entries; None when all are static."""
    if not sizes or all(size is None for size in sizes):
        return None
    return (SymSize * len(sizes))(*[SymSize(*size) if size else SymSize(0, 0, 0) for size in sizes])


class _Owned:
    """A C handle released by the subclass's _release function once, on close or collection."""

    _handle = None

    def close(self):
        if self._handle:
            self._release(self._handle)
            self._handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()


class Builder(_Owned):
    """One kiln_builder; every refusal raises KilnError with the builder's message."""

    def __init__(self):
        self._handle = lib.kiln_builder_create()
        if not self._handle:
            raise MemoryError("kiln: out of memory creating a builder")

    @staticmethod
    def _release(handle):
        lib.kiln_builder_destroy(handle)

    def add_symbol(self, name, low, high):
        """A bounded dynamic size; its number for the (symbol, coeff, offset) of sizes."""
        error = Error()
        number = lib.kiln_builder_add_symbol(self._handle, name.encode("ascii"), low, high, ctypes.byref(error))
        if number < 0:
            _raise(error)
        return number

    def add_input(self, name, dtype, shape, shape_sym=None):
        """shape_sym: per dim None or (symbol, coeff, offset); such dims are taken at the bound."""
        error = Error()
        tensor = lib.kiln_builder_add_input_sym(
            self._handle, name.encode("utf-8"), dtype, len(shape), _dims(shape), _sym_sizes(shape_sym),
            ctypes.byref(error)
        )
        if tensor < 0:
            _raise(error)
        return tensor

    def add_constant(self, tensor, add=None):
        """Adds a torch tensor's values as a constant (the builder copies them)."""
        add = add or lib.kiln_builder_add_constant
        dtype = kiln_dtype(tensor.dtype)
        if dtype is None:
            raise KilnError(ERR_UNSUPPORTED, f"constant of dtype {tensor.dtype} has no Kiln dtype")
        data = tensor.detach().to("cpu").contiguous()
        shape = tuple(data.shape)
        error = Error()
        # The builder copies the bytes before returning, so the tensor need only live until then.
        out = add(
            self._handle, dtype, len(shape), _dims(shape), data.data_ptr() or None,
            data.numel() * data.element_size(), ctypes.byref(error),
        )
        if out < 0:
            _raise(error)
        return out

    def add_state(self, initial):
        """Adds a state the engine keeps across executes, starting from initial's values."""
        return self.add_constant(initial, lib.kiln_builder_add_state)

    def write_state(self, state, value):
        """Declares tensor value the state's value after each run."""
        error = Error()
        if lib.kiln_builder_write_state(self._handle, state, value, ctypes.byref(error)) != OK:
            _raise(error)

    def add_op(self, op, inputs, iattr=(), fattr=(), iattr_sym=None):
        """iattr_sym: per attribute None or (symbol, coeff, offset) of a size that follows a symbol."""
        error = Error()
        ins = (ctypes.c_int32 * max(len(inputs), 1))(*inputs)
        ia = (ctypes.c_int64 * max(len(iattr), 1))(*iattr)
        fa = (ctypes.c_double * max(len(fattr), 1))(*fattr)
        out = lib.kiln_builder_add_op_sym(
            self._handle, OP[op], ins, len(inputs), ia, _sym_sizes(iattr_sym), len(iattr), fa, len(fattr),
            ctypes.byref(error),
        )
        if out < 0:
            _raise(error)
        return out

    def get_shape(self, tensor):
        """(kiln dtype, shape tuple) the builder inferred for a tensor."""
        error = Error()
        dtype, rank, dims = ctypes.c_int(), ctypes.c_int32(), (ctypes.c_int64 * MAX_RANK)()
        status = lib.kiln_builder_get_shape(
            self._handle, tensor, ctypes.byref(dtype), ctypes.byref(rank), dims, ctypes.byref(error)
        )
        if status != OK:
            _raise(error)
        return dtype.value, tuple(dims[: rank.value])

    def mark_output(self, tensor, name):
        error = Error()
        if lib.kiln_builder_mark_output(self._handle, tensor, name.encode("utf-8"), ctypes.byref(error)) != OK:
            _raise(error)

    def build(self, device_id=0, allow_tf32=False, fuse=True, min_compute_capability=0):
        check_int32("device_id", device_id)
        check_int32("min_compute_capability", min_compute_capability)
        options = BuildOptions()
        lib.kiln_build_options_default(ctypes.byref(options))
        options.device_id = device_id
        options.allow_tf32 = int(bool(allow_tf32))
        options.fuse = int(bool(fuse))
        options.min_compute_capability = min_compute_capability
        error = Error()
        blob, size = ctypes.c_void_p(), ctypes.c_size_t()
        status = lib.kiln_builder_build(
            self._handle, ctypes.byref(options), ctypes.byref(blob), ctypes.byref(size),
            ctypes.byref(error),
        )
        if status != OK:
            _raise(error)
        try:
            return ctypes.string_at(blob, size.value)
        finally:
            lib.kiln_free(blob)


class Engine(_Owned):
    """A loaded blob; execute takes contiguous torch tensors in binding order."""

    def __init__(self, blob, device="cpu", device_id=-1):
        if device not in DEVICES:
            raise ValueError(f"kiln: unknown device {device!r}; use one of {sorted(DEVICES)}")
        if device_id != -1:
            check_int32("device_id", device_id)
        blob = bytes(blob)
        options = EngineOptions()
        lib.kiln_engine_options_default(ctypes.byref(options))
        options.device = DEVICES[device]
        options.device_id = device_id
        error = Error()
        handle = ctypes.c_void_p()
        status = lib.kiln_engine_load(
            blob, len(blob), ctypes.byref(options), ctypes.byref(handle), ctypes.byref(error)
        )
        if status != OK:
            _raise(error)
        self._handle = handle

    @staticmethod
    def _release(handle):
        lib.kiln_engine_destroy(handle)

    def metadata(self):
        """The blob metadata's scalar fields."""
        md = lib.kiln_engine_metadata(self._handle).contents
        return {
            "producer": md.producer.decode("utf-8", "replace"),
            "device_id": md.device_id,
            "min_compute_capability": md.min_compute_capability,
            "allow_tf32": bool(md.allow_tf32),
        }

    def bindings(self):
        """[(name, kind, kiln dtype, shape)] of the metadata's I/O, in order."""
        md = lib.kiln_engine_metadata(self._handle).contents
        return [
            (b.name.decode("utf-8", "replace"), b.kind, b.dtype, tuple(b.shape[: b.rank]))
            for b in md.bindings[: md.n_bindings]
        ]

    def execute(self, inputs, outputs):
        error = Error()
        ins = (TensorView * max(len(inputs), 1))(*[_view(t) for t in inputs])
        outs = (TensorView * max(len(outputs), 1))(*[_view(t) for t in outputs])
        status = lib.kiln_engine_execute(
            self._handle, ins, len(inputs), outs, len(outputs), ctypes.byref(error)
        )
        if status != OK:
            _raise(error)

    def reset_state(self):
        """Sets every state back to its initial value."""
        error = Error()
        if lib.kiln_engine_reset_state(self._handle, ctypes.byref(error)) != OK:
            _raise(error)

    def cuda_stats(self):
        """The CUDA engine's counters (kiln_cuda_stats) as a dict: how caller buffers were bound or
        staged, output bytes copied to host memory, graph replays, state resets."""
        if not hasattr(lib, "kiln_cuda_engine_stats"):
            raise KilnError(ERR_UNSUPPORTED, "this libkiln.so exports no kiln_cuda_engine_stats (built without "
                                             "the CUDA engine, or an older build); rebuild it with the CUDA "
                                             "toolkit (nvcc) on the path")
        error, stats = Error(), CudaStats()
        if lib.kiln_cuda_engine_stats(self._handle, ctypes.byref(stats), ctypes.byref(error)) != OK:
            _raise(error)
        return {name: getattr(stats, name) for name in CUDA_STATS_FIELDS}

    def output_shape(self, index):
        """The shape output index had in the last execute (a dynamic output follows the inputs)."""
        error = Error()
        rank, dims = ctypes.c_int32(), (ctypes.c_int64 * MAX_RANK)()
        if lib.kiln_engine_output_shape(self._handle, index, ctypes.byref(rank), dims, ctypes.byref(error)) != OK:
            _raise(error)
        return tuple(dims[: rank.value])


def _view(tensor):
    dtype = kiln_dtype(tensor.dtype)
    if dtype is None:
        raise TypeError(f"kiln: tensor of dtype {tensor.dtype} has no Kiln dtype")
    if tensor.dim() > MAX_RANK:
        raise ValueError(f"kiln: tensor of rank {tensor.dim()} exceeds the Kiln limit {MAX_RANK}")
    view = TensorView()
    view.data = tensor.data_ptr() or None
    view.nbytes = tensor.numel() * tensor.element_size()
    view.dtype = dtype
    view.rank = tensor.dim()
    for i, (size, stride) in enumerate(zip(tensor.shape, tensor.stride())):
        view.sizes[i] = size
        view.strides[i] = stride
    return view
