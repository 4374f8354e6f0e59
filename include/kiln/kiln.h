/*
 * kiln.h - the whole public C API of Kiln, a GPU inference delegate for ExecuTorch.
 *
 * Ahead of time, a builder turns a graph of tensors and ops into a blob: a container
 * holding JSON metadata, a binary plan and the weights. At run time an engine loads a
 * blob (on a CUDA GPU, or on the CPU reference engine that checks every GPU result) and
 * executes it, synchronously, on caller buffers.
 *
 * Conventions: every fallible call returns a kiln_status and, on failure, writes a
 * message of at most 255 bytes into a caller-provided kiln_error (cause first, then the
 * remedy). Nothing aborts. Objects are created and destroyed in pairs.
 *
 * Threads: one engine handle is never run by two threads at once; kiln_engine_execute
 * serializes callers on one handle with a mutex. Load one engine per thread to run in
 * parallel. A caller that frees or rewrites an input from another thread while execute
 * runs gets a wrong answer that nothing below it can detect.
 */
#ifndef KILN_KILN_H
#define KILN_KILN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define KILN_API __attribute__((visibility("default")))
#define KILN_PRINTF(fmt_index, first_arg) __attribute__((format(printf, fmt_index, first_arg)))
#else
#define KILN_API
#define KILN_PRINTF(fmt_index, first_arg)
#endif

#define KILN_VERSION_STRING "0.1.0"
/* The id ExecuTorch knows the backend by; the Python BackendDetails class has this name. */
#define KILN_BACKEND_ID "KilnBackend"

/* ---------------------------------------------------------------- status and errors */

typedef enum kiln_status {
  KILN_OK = 0,
  KILN_ERR_INVALID_PROGRAM = 1, /* malformed blob, metadata or plan */
  KILN_ERR_INCOMPATIBLE = 2,    /* container/plan version or GPU architecture mismatch */
  KILN_ERR_INVALID_ARGUMENT = 3, /* bad caller buffer, shape, option or builder input */
  KILN_ERR_OUT_OF_MEMORY = 4,   /* host or device allocation failed */
  KILN_ERR_INTERNAL = 5,        /* device fault or library failure during a run */
  KILN_ERR_UNAVAILABLE = 6,     /* requested device is missing (no GPU, no such device) */
  KILN_ERR_UNSUPPORTED = 7      /* op, dtype or shape the builder or engine cannot handle */
} kiln_status;

/* ExecuTorch keeps 256 bytes of a log message: every Kiln message fits in 255. */
#define KILN_ERROR_MAX 256

typedef struct kiln_error {
  kiln_status status;
  char message[KILN_ERROR_MAX];
} kiln_error;

/* Writes a formatted message into err (truncated to 255 bytes) and returns status.
 * err may be NULL. */
KILN_API kiln_status kiln_fail(kiln_error *err, kiln_status status, const char *fmt, ...)
    KILN_PRINTF(3, 4);
KILN_API const char *kiln_status_name(kiln_status status);

/* ---------------------------------------------------------------- dtypes and tensors */

typedef enum kiln_dtype {
  KILN_F32 = 0,
  KILN_F16 = 1,
  KILN_BF16 = 2,
  KILN_I64 = 3,
  KILN_I32 = 4,
  KILN_BOOL = 5,
  KILN_DTYPE_COUNT = 6
} kiln_dtype;

#define KILN_MAX_RANK 8

KILN_API size_t kiln_dtype_size(kiln_dtype dtype);        /* 0 for an unknown dtype */
KILN_API const char *kiln_dtype_name(kiln_dtype dtype);   /* "f32", "f16", ... */
/* Parses a name written by kiln_dtype_name; returns 0 on success, -1 if unknown. */
KILN_API int kiln_dtype_from_name(const char *name, size_t len, kiln_dtype *out);

/* A caller's tensor: where the bytes are and what they hold. Strides are in elements;
 * the engine accepts only contiguous (row-major) views. */
typedef struct kiln_tensor_view {
  void *data;
  size_t nbytes;
  kiln_dtype dtype;
  int32_t rank;
  int64_t sizes[KILN_MAX_RANK];
  int64_t strides[KILN_MAX_RANK];
} kiln_tensor_view;

/* ---------------------------------------------------------------- blob container */

/* Layout (all little-endian), KILN_BLOB_HEADER_SIZE bytes, then sections:
 *   0  char[8] magic "KILNBLOB"
 *   8  u32 container version          12 u32 header size
 *  16  u64 metadata offset            24 u64 metadata size
 *  32  u64 plan offset                40 u64 plan size
 *  48  u64 weights offset             56 u64 weights size
 *  64  u64 total blob size
 * Sections lie inside the blob, do not overlap; the plan is 8-byte aligned and the
 * weights KILN_WEIGHTS_ALIGN-byte aligned (offsets from the blob start). */
#define KILN_BLOB_MAGIC "KILNBLOB"
#define KILN_CONTAINER_VERSION 1u
#define KILN_BLOB_HEADER_SIZE 72u
#define KILN_WEIGHTS_ALIGN 64u

typedef struct kiln_blob_view {
  uint32_t version;
  const uint8_t *metadata; /* JSON text, not NUL-terminated */
  size_t metadata_size;
  const uint8_t *plan;
  size_t plan_size;
  const uint8_t *weights;
  size_t weights_size;
} kiln_blob_view;

/* Checks the header and section bounds of untrusted bytes; the view points into data. */
KILN_API kiln_status kiln_blob_parse(const void *data, size_t size, kiln_blob_view *out,
                                     kiln_error *err);
/* Writes a blob into a buffer from malloc (release with kiln_free). */
KILN_API kiln_status kiln_blob_write(const void *metadata, size_t metadata_size, const void *plan,
                                     size_t plan_size, const void *weights, size_t weights_size,
                                     void **out, size_t *out_size, kiln_error *err);
KILN_API void kiln_free(void *p);

/* ---------------------------------------------------------------- metadata */

typedef enum kiln_io_kind { KILN_IO_INPUT = 0, KILN_IO_OUTPUT = 1 } kiln_io_kind;

#define KILN_NAME_MAX 64

/* One entry of the metadata's "io" array, in the order the delegate call passes them. */
typedef struct kiln_binding {
  char name[KILN_NAME_MAX];
  kiln_io_kind kind;
  kiln_dtype dtype;
  int32_t rank;
  int64_t shape[KILN_MAX_RANK];     /* the shape the plan was built for (a dynamic dim's bound;
                                       the plan's symbols hold its lower bound) */
  int64_t max_shape[KILN_MAX_RANK]; /* upper bound of each dimension (== shape if static) */
} kiln_binding;

/* An output whose result the runtime copies back into an input buffer (a KV cache). */
typedef struct kiln_alias {
  uint32_t output; /* index among outputs */
  uint32_t input;  /* index among inputs */
  char kind[16];   /* "inplace" */
} kiln_alias;

#define KILN_MAX_BINDINGS 256
#define KILN_MAX_ALIASES 64

typedef struct kiln_metadata {
  char producer[KILN_NAME_MAX];
  int32_t device_id;
  int32_t min_compute_capability; /* major*10+minor, e.g. 80 */
  int allow_tf32;                 /* 0 or 1 */
  uint32_t n_bindings;
  kiln_binding bindings[KILN_MAX_BINDINGS];
  uint32_t n_aliases;
  kiln_alias aliases[KILN_MAX_ALIASES];
} kiln_metadata;

/* Strict reader of the metadata JSON: unknown, duplicate, missing or nested-lookalike keys,
 * out-of-range numbers, malformed literals and strings are all refused. */
KILN_API kiln_status kiln_metadata_parse(const char *json, size_t len, kiln_metadata *out,
                                         kiln_error *err);
/* Serializes md as JSON into a malloc'd, NUL-terminated string (release with kiln_free). */
KILN_API kiln_status kiln_metadata_write(const kiln_metadata *md, char **out, size_t *out_len,
                                         kiln_error *err);

/* ---------------------------------------------------------------- the plan */

/* Ops, their inputs and attributes (iattr integers, fattr reals). Dims are normalized to
 * be non-negative by the builder. All tensors in a plan are contiguous. */
typedef enum kiln_op_kind {
  KILN_OP_LINEAR = 0,   /* x[...,K], w[N,K], bias[N]?, residual? -> [...,N]; iattr0 =
                           kiln_activation; iattr1 = 1: the last input, of the output's shape
                           and dtype, is added after the bias (activation NONE), one rounding.
                           KILN_ACT_SWIGLU: x, w[2N,K] only -> [...,N] */
  KILN_OP_MATMUL,       /* a[...,M,K], b[...,K,N] (batch dims broadcast) -> [...,M,N] */
  KILN_OP_ADD,          /* a + alpha*b, broadcasting; fattr0 = alpha */
  KILN_OP_SUB,          /* a - alpha*b, broadcasting; fattr0 = alpha */
  KILN_OP_MUL,          /* a * b, broadcasting */
  KILN_OP_DIV,          /* a / b, broadcasting */
  KILN_OP_RELU,
  KILN_OP_GELU,         /* iattr0: 0 = erf, 1 = tanh approximation */
  KILN_OP_SILU,
  KILN_OP_SIGMOID,
  KILN_OP_TANH,
  KILN_OP_EXP,
  KILN_OP_SQRT,
  KILN_OP_RSQRT,
  KILN_OP_NEG,
  KILN_OP_POW,          /* x ** fattr0 */
  KILN_OP_CAST,         /* iattr0 = target kiln_dtype */
  KILN_OP_SOFTMAX,      /* iattr0 = dim */
  KILN_OP_LOG_SOFTMAX,  /* iattr0 = dim */
  KILN_OP_LAYER_NORM,   /* x, weight?, bias?, operands...; iattr0 = normalized trailing dims,
                           iattr1 = bit0 weight present, bit1 bias present; fattr0 = eps. Fused
                           pointwise steps (see POINTWISE) when n_iattr > 2: iattr2 = how many
                           of the steps iattr3.. apply to x before normalizing, the rest apply
                           after weight and bias; binary steps read the operands after x,
                           weight and bias (each broadcasts to x, same dtype); fattr1 = the
                           exponent of its one POW step, else 0. All in f32, one rounding. */
  KILN_OP_RMS_NORM,     /* x, weight?, operands...; iattr0 = normalized trailing dims, iattr1 =
                           bit0 weight; fattr0 = eps; fused steps as LAYER_NORM */
  KILN_OP_SUM,          /* iattr0 = bitmask of reduced dims, iattr1 = keepdim */
  KILN_OP_MEAN,         /* as SUM */
  KILN_OP_AMAX,         /* as SUM */
  KILN_OP_RESHAPE,      /* view/reshape/squeeze/unsqueeze; iattr = output dims */
  KILN_OP_PERMUTE,      /* iattr = permutation */
  KILN_OP_EXPAND,       /* iattr = output dims */
  KILN_OP_CAT,          /* n inputs; iattr0 = dim */
  KILN_OP_SLICE,        /* iattr0 = dim, iattr1 = start, iattr2 = end, iattr3 = step */
  KILN_OP_SELECT,       /* iattr0 = dim, iattr1 = index (drops the dim) */
  KILN_OP_COPY,         /* clone / contiguous */
  KILN_OP_EMBEDDING,    /* weight[V,D], idx[...] (i32/i64) -> [...,D]; idx out of range faults */
  KILN_OP_INDEX_SELECT, /* x, idx[n]; iattr0 = dim */
  KILN_OP_WHERE,        /* cond (bool), a, b, broadcasting */
  KILN_OP_SDPA,         /* q[...,L,E], k[...,S,E], v[...,S,Ev], mask? (bool: true keeps, or additive
                           float), broadcast to [...,L,S]; iattr0 = causal, iattr1 = mask present;
                           fattr0 = scale (0 means 1/sqrt(E)). Batch dims of k and v equal
                           q's, but dim -3 (heads) may divide q's: grouped-query attention, key/
                           value head = query head / group. iattr2 = 1, packed heads: one
                           input qkv[B,L,3,H,E] (q, k, v = qkv[:,:,i] as [B,H,L,E]), mask? over
                           [B,H,L,L] -> [B,L,H,E], the heads back in place. iattr2 = 2, heads
                           last: q[B,H,L,E], k, v, mask? as above (rank 4) -> [B,L,H,Ev], the
                           result permuted (0,2,1,3) as it is written */
  KILN_OP_POINTWISE,    /* a fused chain of float pointwise steps, one pass over memory: x, then
                           extra operands of binary steps (each broadcasts to x, same dtype) ->
                           x's shape and dtype; iattr = steps in order (KILN_PW_STEP), 1..8;
                           fattr0 = the exponent of its one POW step, else 0. Intermediates stay
                           f32; only the result is rounded to the dtype. */
  KILN_OP_COMPARE,      /* a, b of one dtype, broadcasting -> bool; iattr0 = kiln_compare. Floats
                           compare in f32 (NaN is unequal to everything), integers exactly */
  KILN_OP_LOGICAL,      /* a, b? of any dtypes (nonzero is true), broadcasting -> bool; iattr0 =
                           kiln_bool_op; NOT takes one input, the others two */
  KILN_OP_BITWISE,      /* a, b? of one dtype, bool, i32 or i64, broadcasting -> that dtype; iattr0
                           = kiln_bool_op; NOT takes one input (on bool: logical not) */
  KILN_OP_ABS,          /* float, i32 or i64 (integers wrap: |INT_MIN| is INT_MIN) */
  KILN_OP_LOG,
  KILN_OP_COS,
  KILN_OP_SIN,
  KILN_OP_ERF,
  KILN_OP_HARDSWISH,    /* x * min(max(x + 3, 0), 6) / 6 */
  KILN_OP_HARDSIGMOID,  /* min(max(x + 3, 0), 6) / 6 */
  KILN_OP_MINIMUM,      /* a, b of one dtype, broadcasting; a NaN operand gives NaN. Clamp and
                           hardtanh are MAXIMUM with the lower bound, then MINIMUM with the upper */
  KILN_OP_MAXIMUM,      /* as MINIMUM */
  /* Vision ops. Spatial dims are the last one (1-d) or two (2-d); each spatial attribute is a
     pair KILN_PAIR(h, w) (1-d ops use h = stride 1, padding 0, dilation 1). Inputs and
     weights are NCHW (NCW for 1-d), contiguous, unless a channels_last attribute says NHWC.
     Sums accumulate in double, one rounding. The pooling and resize ops take an optional
     trailing channels_last attribute (absent = 0; named below): with 1, x is [N,H,W,C] and the
     output [N,OH,OW,C], contiguous. */
  KILN_OP_CONV,           /* x[N,C,(H,)W], w[O,C/g,(kh,)kw], bias[O]?, residual? -> [N,O,(OH,)OW];
                             iattr0 = stride, iattr1 = padding, iattr2 = dilation (pairs), iattr3
                             = groups g, iattr4 = 1 when the bias is present. Optional, absent =
                             0: iattr5 = channels_last (x [N,(H,)W,C], w [O,(kh,)kw,C/g], output
                             [N,(OH,)OW,O]), iattr6 = kiln_activation (NONE or RELU), iattr7 = 1:
                             the last input, of the output's shape and dtype, is added after the
                             bias and before the activation */
  KILN_OP_CONV_TRANSPOSE, /* x[N,C,(H,)W], w[C,O/g,(kh,)kw], bias[O]?, residual? -> [N,O,(OH,)OW],
                             OH = (H-1)*sh - 2*ph + dh*(kh-1) + oph + 1; iattr0..4 as CONV, iattr5
                             = output padding (pair); iattr6 = channels_last (w [C,(kh,)kw,O/g]),
                             iattr7 = activation, iattr8 = residual, as CONV's iattr5..7 */
  KILN_OP_BATCH_NORM,     /* x[N,C,...], mean[C], var[C], weight[C]?, bias[C]? -> x's shape;
                             (x - mean) / sqrt(var + eps) * weight + bias per channel (dim 1),
                             in f32; iattr0 = bit0 weight present, bit1 bias present; fattr0 =
                             eps. The builder folds it into a preceding CONV of constants. */
  KILN_OP_MAX_POOL2D,     /* x[...,H,W] -> [...,OH,OW]; iattr0 = kernel, iattr1 = stride,
                             iattr2 = padding, iattr3 = dilation (pairs), iattr4 = ceil_mode,
                             iattr5 = channels_last; padding reads as -infinity */
  KILN_OP_AVG_POOL2D,     /* x[...,H,W] -> [...,OH,OW]; iattr0 = kernel, iattr1 = stride,
                             iattr2 = padding (pairs), iattr3 = ceil_mode, iattr4 =
                             count_include_pad, iattr5 = divisor override (0: none), iattr6 =
                             channels_last, as PyTorch */
  KILN_OP_ADAPTIVE_AVG_POOL2D, /* x[...,H,W] -> [...,OH,OW]; iattr0 = output size (pair), iattr1 =
                             channels_last; window i spans floor(i*H/OH) .. ceil((i+1)*H/OH) */
  KILN_OP_UPSAMPLE_NEAREST2D, /* x[...,H,W] -> [...,OH,OW]; iattr0 = output size (pair), iattr1 =
                             channels_last; fattr0, fattr1 = scale factors h, w (0: from the
                             sizes); source index floor(dst * H/OH) in f32, as PyTorch */
  KILN_OP_UPSAMPLE_BILINEAR2D, /* as UPSAMPLE_NEAREST2D; iattr1 = align_corners, iattr2 =
                             channels_last; bilinear in f32 with PyTorch's source-index rule */
  KILN_OP_CUMSUM,       /* running sums of x along iattr0 = dim in dtype iattr1 (i32, i64 or a
                           float; x converted to it first, as PyTorch's dtype=): integers wrap,
                           floats accumulate in f32 or wider */
  KILN_OP_GATHER,       /* x, idx (i32/i64, x's rank, each dim but iattr0 at most x's) -> idx's
                           shape: out[i] = x[i with dim iattr0 replaced by idx[i]]; an index
                           outside 0..x.dims[iattr0]-1 faults */
  KILN_OP_INDEX,        /* x, idx... (i32/i64, one per set bit of iattr0 = the indexed dims of x,
                           broadcasting together to B): advanced indexing; B takes the place of
                           the indexed dims when they are adjacent, else leads the output; a
                           negative index counts from the end; one outside -n..n-1 faults */
  KILN_OP_ARGMAX,       /* x -> i64 index of the first maximum along iattr0 = dim (NaN is the
                           largest), iattr1 = keepdim */
  KILN_OP_FUSED,        /* a fused group: one pass over the output, its register program (see
                           KILN_FX) in the plan's words: iattr0 = first word, iattr1 = word count.
                           Inputs are read through the program's index maps (any float dtype);
                           the output is the program's STORE rounded to the output dtype */
  KILN_OP_INDEX_COPY,   /* x, idx[n] (i32/i64), values (x's dtype and shape but n along iattr0 =
                           dim) -> x with slot idx[k] along dim replaced by values' slot k; an
                           index outside 0..x.dims[dim]-1 refuses the run before this op writes.
                           The one op (with COPY) that may write a state tensor: in place when
                           x is that state */
  KILN_OP_COUNT
} kiln_op_kind;

/* KILN_OP_COMPARE's iattr0: a op b. */
typedef enum kiln_compare {
  KILN_CMP_EQ = 0,
  KILN_CMP_NE = 1,
  KILN_CMP_LT = 2,
  KILN_CMP_LE = 3,
  KILN_CMP_GT = 4,
  KILN_CMP_GE = 5
} kiln_compare;

/* KILN_OP_LOGICAL's and KILN_OP_BITWISE's iattr0. */
typedef enum kiln_bool_op {
  KILN_BOOL_AND = 0,
  KILN_BOOL_OR = 1,
  KILN_BOOL_XOR = 2,
  KILN_BOOL_NOT = 3 /* one input */
} kiln_bool_op;

/* One KILN_OP_POINTWISE step: bits 0-7 the op (RELU, GELU, SILU, SIGMOID, TANH, EXP, SQRT,
 * RSQRT, NEG, POW, ABS, LOG, COS, SIN, ERF, HARDSWISH, HARDSIGMOID, or ADD, SUB, MUL, DIV with
 * alpha 1, MINIMUM, MAXIMUM), bits 8-11 the input slot (1..7) of a binary step's other operand
 * (0 for unary), then flags. A binary step computes chain op operand, or operand op chain with
 * KILN_PW_REVERSED. */
#define KILN_PW_MAX_STEPS 8
#define KILN_PW_KIND_MASK 0xff
#define KILN_PW_INPUT_SHIFT 8
#define KILN_PW_INPUT_MASK 0xf
#define KILN_PW_REVERSED ((int64_t)1 << 16)  /* binary: operand op chain */
#define KILN_PW_GELU_TANH ((int64_t)1 << 17) /* GELU: the tanh approximation (else erf) */
#define KILN_PW_STEP(kind, input, flags) \
  ((int64_t)(kind) | ((int64_t)(input) << KILN_PW_INPUT_SHIFT) | (int64_t)(flags))
#define KILN_PW_STEP_KIND(step) ((kiln_op_kind)((step)&KILN_PW_KIND_MASK))
#define KILN_PW_STEP_INPUT(step) ((uint32_t)(((step) >> KILN_PW_INPUT_SHIFT) & KILN_PW_INPUT_MASK))

/* KILN_OP_FUSED's program, int64 words: n_maps, n_instrs, then n_maps index maps of 2 + 3R words
 * (R = the output's rank): input slot, element offset, R strides, R box starts, R box ends; then
 * n_instrs instructions of two words: KILN_FX_INSTR(code, dst, a, b, arg) and an immediate. A
 * LOAD of map m (arg) reads input slot at offset + sum(coord[d] * stride[d]) when every output
 * coordinate lies in the map's box, else gives 0; the parser checks every box's addresses lie in
 * its input. In a dynamic plan the words hold at the upper bounds and a call runs them over its
 * own output dims, each box (and SELECT bound) cut to them, its addresses checked again at the
 * call's sizes (so a box covering a dim covers it at every size). Registers hold f32 and are
 * written before they are read. UNARY: dst = arg(a)
 * (a KILN_OP_* pointwise kind; immediate = POW's exponent as double bits; flag GELU_TANH).
 * BINARY: dst = a arg b (ADD and SUB: a + alpha * b, alpha the immediate's double). ROUND: dst =
 * a rounded to dtype arg. SELECT: dst = coord[arg] < immediate ? a : b. STORE (last, once): a. */
#define KILN_FX_MAX_MAPS 12
#define KILN_FX_MAX_INSTRS 64
#define KILN_FX_MAX_REGS 16
typedef enum kiln_fx_code {
  KILN_FX_LOAD = 1,
  KILN_FX_UNARY = 2,
  KILN_FX_BINARY = 3,
  KILN_FX_ROUND = 4,
  KILN_FX_SELECT = 5,
  KILN_FX_STORE = 6
} kiln_fx_code;
#define KILN_FX_GELU_TANH ((int64_t)1 << 48)
#define KILN_FX_INSTR(code, dst, a, b, arg)                                                   \
  ((int64_t)(code) | ((int64_t)(dst) << 8) | ((int64_t)(a) << 16) | ((int64_t)(b) << 24) | \
   ((int64_t)(arg) << 32))
#define KILN_FX_CODE(w) ((uint32_t)((w)&0xff))
#define KILN_FX_DST(w) ((uint32_t)(((w) >> 8) & 0xff))
#define KILN_FX_A(w) ((uint32_t)(((w) >> 16) & 0xff))
#define KILN_FX_B(w) ((uint32_t)(((w) >> 24) & 0xff))
#define KILN_FX_ARG(w) ((uint32_t)(((w) >> 32) & 0xffff))
#define KILN_FX_KNOWN_BITS (((int64_t)1 << 48) - 1 + KILN_FX_GELU_TANH)

/* A spatial attribute pair (h, w) in one integer attribute; each of h and w is 0..2^31-1. */
#define KILN_PAIR(h, w) (((int64_t)(h) << 32) | (int64_t)(uint32_t)(w))
#define KILN_PAIR_H(pair) ((int64_t)((uint64_t)(pair) >> 32))
#define KILN_PAIR_W(pair) ((int64_t)(uint32_t)(uint64_t)(pair))

typedef enum kiln_activation {
  KILN_ACT_NONE = 0,
  KILN_ACT_RELU = 1,
  KILN_ACT_GELU_ERF = 2,
  KILN_ACT_GELU_TANH = 3,
  KILN_ACT_SWIGLU = 4 /* w [2N,K] is gate over up: y = silu(x gate^T) * (x up^T) -> [...,N];
                         no bias, no residual */
} kiln_activation;

KILN_API const char *kiln_op_name(kiln_op_kind op); /* "linear", "matmul", ... */

typedef enum kiln_storage {
  KILN_STORE_ARENA = 0,  /* offset into the run's arena */
  KILN_STORE_WEIGHT = 1, /* offset into the weights section */
  KILN_STORE_INPUT = 2,  /* offset 0 of the caller's input (index = tensor's io_index) */
  KILN_STORE_OUTPUT = 3, /* offset 0 of the caller's output (index = tensor's io_index) */
  KILN_STORE_STATE = 4   /* the engine's state buffer io_index, kept across executes; offset is
                            where its initial value lies in the weights section */
} kiln_storage;

/* A size that follows a bounded symbol of the plan: coeff * value + offset. Dynamic plans store
 * every size at its symbol's upper bound, so memory is planned for the largest call. */
typedef struct kiln_sym_size {
  uint32_t symbol; /* 1 + the symbol's index in the plan; 0: the size is static */
  int64_t coeff;   /* >= 1 */
  int64_t offset;
} kiln_sym_size;

#define KILN_MAX_SYMBOLS 8
#define KILN_SYMBOL_NAME_MAX 16

/* A dynamic dimension's symbol and the bounds its value may take at execute. */
typedef struct kiln_symbol {
  char name[KILN_SYMBOL_NAME_MAX]; /* 1..15 printable ASCII bytes, NUL-terminated */
  int64_t min, max;                /* 0 <= min <= max <= 2^62 */
} kiln_symbol;

typedef struct kiln_tensor_desc {
  kiln_dtype dtype;
  int32_t rank;
  int64_t dims[KILN_MAX_RANK]; /* at the symbols' upper bounds in a dynamic plan */
  kiln_sym_size sym[KILN_MAX_RANK]; /* which dims follow a symbol */
  kiln_storage storage;
  uint32_t io_index; /* for INPUT/OUTPUT storage */
  uint64_t offset;   /* bytes into the arena or weights section */
  uint64_t nbytes;   /* product of dims times dtype size */
} kiln_tensor_desc;

#define KILN_MAX_OP_INPUTS 8
#define KILN_MAX_IATTR 12
#define KILN_MAX_FATTR 2

typedef struct kiln_op {
  kiln_op_kind kind;
  uint32_t n_inputs;
  uint32_t inputs[KILN_MAX_OP_INPUTS];
  uint32_t output;
  uint32_t n_iattr;
  int64_t iattr[KILN_MAX_IATTR];
  double fattr[KILN_MAX_FATTR];
  /* Attributes that follow a symbol: reshape and expand target sizes, slice start and end,
   * select index. */
  kiln_sym_size iattr_sym[KILN_MAX_IATTR];
} kiln_op;

/* 2: twelve integer attributes per op and a symbol section (empty in a static plan); version 1
 * plans (eight attributes, static) still load. */
#define KILN_PLAN_VERSION 2u

typedef struct kiln_plan {
  uint32_t version;
  uint32_t n_tensors;
  uint32_t n_ops;
  uint32_t n_inputs;
  uint32_t n_outputs;
  uint64_t arena_size; /* bytes, from the builder's memory plan */
  kiln_tensor_desc *tensors;
  kiln_op *ops;
  uint32_t *inputs;  /* tensor index of each input, in binding order */
  uint32_t *outputs; /* tensor index of each output, in binding order */
  uint32_t n_words;  /* the FUSED ops' programs, one after another in op order */
  int64_t *words;
  uint32_t n_states; /* state buffers: 1 + the highest state index (set by parse, not stored) */
  uint32_t n_symbols; /* 0: every size is static */
  kiln_symbol symbols[KILN_MAX_SYMBOLS];
} kiln_plan;

/* Decodes and checks an untrusted plan section against the weights section size: every
 * index, dtype, rank, offset and size; refusals name the op or tensor at fault. */
KILN_API kiln_status kiln_plan_parse(const void *data, size_t size, uint64_t weights_size,
                                     kiln_plan *out, kiln_error *err);
KILN_API kiln_status kiln_plan_serialize(const kiln_plan *plan, void **out, size_t *out_size,
                                         kiln_error *err);
KILN_API void kiln_plan_release(kiln_plan *plan);

/* ---------------------------------------------------------------- builder */

/* Builds a plan from inputs, constants and ops: shape and dtype inference, dead-code
 * removal, memory planning by liveness into one arena, and serialization into a blob. */
typedef struct kiln_builder kiln_builder;

KILN_API kiln_builder *kiln_builder_create(void); /* NULL when out of memory */
KILN_API void kiln_builder_destroy(kiln_builder *b);

/* Each add returns a tensor id >= 0, or -1 with err set. */
KILN_API int32_t kiln_builder_add_input(kiln_builder *b, const char *name, kiln_dtype dtype,
                                        int32_t rank, const int64_t *dims, kiln_error *err);
/* The builder copies data (nbytes must equal the shape's byte size). */
KILN_API int32_t kiln_builder_add_constant(kiln_builder *b, kiln_dtype dtype, int32_t rank,
                                           const int64_t *dims, const void *data, size_t nbytes,
                                           kiln_error *err);
KILN_API int32_t kiln_builder_add_op(kiln_builder *b, kiln_op_kind op, const int32_t *inputs,
                                     uint32_t n_inputs, const int64_t *iattr, uint32_t n_iattr,
                                     const double *fattr, uint32_t n_fattr, kiln_error *err);
/* A bounded dynamic size; returns its symbol number (>= 1, for kiln_sym_size.symbol) or -1. */
KILN_API int32_t kiln_builder_add_symbol(kiln_builder *b, const char *name, int64_t min,
                                         int64_t max, kiln_error *err);
/* As add_input, where dims_sym (NULL: all static) gives the dims that follow a symbol; those
 * dims are taken at the symbol's upper bound. */
KILN_API int32_t kiln_builder_add_input_sym(kiln_builder *b, const char *name, kiln_dtype dtype,
                                            int32_t rank, const int64_t *dims,
                                            const kiln_sym_size *dims_sym, kiln_error *err);
/* As add_op, where iattr_sym (NULL: all static) gives the attributes that follow a symbol. */
KILN_API int32_t kiln_builder_add_op_sym(kiln_builder *b, kiln_op_kind op, const int32_t *inputs,
                                         uint32_t n_inputs, const int64_t *iattr,
                                         const kiln_sym_size *iattr_sym, uint32_t n_iattr,
                                         const double *fattr, uint32_t n_fattr, kiln_error *err);
KILN_API kiln_status kiln_builder_get_shape(const kiln_builder *b, int32_t tensor,
                                            kiln_dtype *dtype, int32_t *rank, int64_t *dims,
                                            kiln_error *err);
KILN_API kiln_status kiln_builder_mark_output(kiln_builder *b, int32_t tensor, const char *name,
                                              kiln_error *err);
/* Mutable state (a KV cache): a tensor the engine keeps across executes, starting from the
 * initial bytes (copied; nbytes must equal the shape's byte size). Reading the returned id
 * reads the state's value at the start of the run. */
KILN_API int32_t kiln_builder_add_state(kiln_builder *b, kiln_dtype dtype, int32_t rank,
                                        const int64_t *dims, const void *initial, size_t nbytes,
                                        kiln_error *err);
/* The state's value after each run is tensor value (same dtype and shape), once per state. An
 * INDEX_COPY of the state that is its last reader becomes an in-place write; any other value
 * is copied into the state at the end of the run. */
KILN_API kiln_status kiln_builder_write_state(kiln_builder *b, int32_t state, int32_t value,
                                              kiln_error *err);

typedef struct kiln_build_options {
  int32_t device_id;              /* recorded in the metadata */
  int32_t min_compute_capability; /* 0: the lowest the kernels are built for */
  int allow_tf32;
  int fuse; /* 1: merge ops that compute what an earlier op computed (and small constants of
               equal bytes), fuse GEMM and convolution epilogues, pointwise chains, and pointwise ops
               into norms, and run a plan's 2-d convolutions, and the elementwise, pooling
               and resize ops they feed, channels-last (NHWC) between one PERMUTE in and one
               out at each edge of that region */
} kiln_build_options;

KILN_API void kiln_build_options_default(kiln_build_options *opts);
/* Writes the finished blob into a malloc'd buffer (release with kiln_free). */
KILN_API kiln_status kiln_builder_build(kiln_builder *b, const kiln_build_options *opts,
                                        void **blob, size_t *blob_size, kiln_error *err);
/* Arena bytes of the last successful build. */
KILN_API uint64_t kiln_builder_arena_size(const kiln_builder *b);

/* ---------------------------------------------------------------- engine */

typedef enum kiln_device_kind {
  KILN_DEVICE_AUTO = 0, /* KILN_DEVICE env (cpu|cuda), else CUDA */
  KILN_DEVICE_CPU = 1,  /* the CPU reference engine */
  KILN_DEVICE_CUDA = 2
} kiln_device_kind;

typedef struct kiln_engine_options {
  kiln_device_kind device;
  int32_t device_id; /* -1: the metadata's device_id */
} kiln_engine_options;

KILN_API void kiln_engine_options_default(kiln_engine_options *opts);

typedef struct kiln_engine kiln_engine;

/* Loads a blob: checks container, metadata and plan, chooses the device, allocates every
 * buffer the runs will need and copies what it keeps, so the blob may be freed after. */
KILN_API kiln_status kiln_engine_load(const void *blob, size_t blob_size,
                                      const kiln_engine_options *opts, kiln_engine **out,
                                      kiln_error *err);
/* Runs the plan synchronously: when it returns, outputs are written and every caller buffer
 * may be reused. Allocates nothing. Views are in binding order. No output may share a byte
 * with an input or another output, even a declared in-place alias (pass separate buffers: the
 * aliased output is copied into its input after the run); such views are refused with
 * KILN_ERR_INVALID_ARGUMENT naming both bindings. Inputs may share bytes with each other. */
KILN_API kiln_status kiln_engine_execute(kiln_engine *e, const kiln_tensor_view *inputs,
                                         uint32_t n_inputs, const kiln_tensor_view *outputs,
                                         uint32_t n_outputs, kiln_error *err);
KILN_API void kiln_engine_destroy(kiln_engine *e);
/* Sets every state tensor back to its initial value (one copy per state from the engine's own
 * memory, on the engine's device; nothing is allocated). Serialized with execute. */
KILN_API kiln_status kiln_engine_reset_state(kiln_engine *e, kiln_error *err);
/* The shape output k had in the last successful execute (before any, its upper bound). In a
 * dynamic plan an output's dynamic dims follow the inputs: execute accepts an output view whose
 * dynamic dims are at least this call's sizes (its bound always fits) and writes the output
 * contiguously in this call's shape. Call it from the thread that executes. */
KILN_API kiln_status kiln_engine_output_shape(const kiln_engine *e, uint32_t k, int32_t *rank,
                                              int64_t *dims, kiln_error *err);

KILN_API const kiln_metadata *kiln_engine_metadata(const kiln_engine *e);
KILN_API const kiln_plan *kiln_engine_plan(const kiln_engine *e);
/* "cpu" or "cuda:N". */
KILN_API const char *kiln_engine_device_name(const kiln_engine *e);

#ifdef __cplusplus
}
#endif

#endif /* KILN_KILN_H */
