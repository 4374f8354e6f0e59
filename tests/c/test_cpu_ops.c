/* Every op of the CPU reference engine against expectations computed here, independently:
 * hand-computed small cases and double-precision reference formulas. Tolerances, relative to
 * max(1, |expected|): f32 1e-5, f16 1e-3, bf16 1e-2. */
#include "test_cpu_harness.h"

static kiln_error err;

#define DIMS(...) ((const int64_t[]){__VA_ARGS__})
#define IDS(...) ((const uint32_t[]){__VA_ARGS__})
#define BUFS(...) ((void *const[]){__VA_ARGS__})

static const kiln_dtype float_dtypes[3] = {KILN_F32, KILN_F16, KILN_BF16};

static int64_t count(int32_t rank, const int64_t *dims) {
  int64_t n = 1;
  for (int32_t d = 0; d < rank; d++) n *= dims[d];
  return n;
}

/* Element of an input of dims in_dims read by output element i under broadcasting,
 * by division (the engine walks an odometer instead). */
static int64_t ref_bcast(int64_t i, int32_t out_rank, const int64_t *out_dims, int32_t in_rank,
                         const int64_t *in_dims) {
  int64_t idx = 0, stride = 1;
  for (int32_t d = out_rank - 1; d >= 0; d--) {
    int64_t c = i % out_dims[d];
    i /= out_dims[d];
    int32_t id = d - (out_rank - in_rank);
    if (id < 0) continue;
    if (in_dims[id] != 1) idx += c * stride;
    stride *= in_dims[id];
  }
  return idx;
}

static void *alloc_buf(int64_t n, kiln_dtype dt) {
  void *p = calloc((size_t)(n > 0 ? n : 1), kiln_dtype_size(dt));
  if (!p) {
    fprintf(stderr, "out of memory\n");
    exit(2);
  }
  return p;
}

/* ---------------------------------------------------------------- binary arithmetic */

static double ref_binary(kiln_op_kind kind, double a, double b, double alpha) {
  switch (kind) {
  case KILN_OP_ADD: return a + alpha * b;
  case KILN_OP_SUB: return a - alpha * b;
  case KILN_OP_MUL: return a * b;
  case KILN_OP_MINIMUM: return isnan(a) || isnan(b) ? NAN : fmin(a, b);
  case KILN_OP_MAXIMUM: return isnan(a) || isnan(b) ? NAN : fmax(a, b);
  default: return a / b;
  }
}

static void binary_case(const char *what, kiln_op_kind kind, kiln_dtype dt, int32_t ra,
                        const int64_t *da, int32_t rb, const int64_t *db, int32_t ro,
                        const int64_t *dout, double alpha) {
  int64_t na = count(ra, da), nb = count(rb, db), no = count(ro, dout);
  void *a = alloc_buf(na, dt), *b = alloc_buf(nb, dt), *o = alloc_buf(no, dt);
  double *want = calloc((size_t)no + 1, sizeof(double));
  fill_random(a, dt, na, 11, 4.0);
  fill_random(b, dt, nb, 29, 4.0);
  if (kind == KILN_OP_DIV)
    for (int64_t i = 0; i < nb; i++) fill_value(b, dt, i, 0.5 + fabs(value_at(b, dt, i)));
  graph *g = g_new();
  uint32_t ta = g_tensor(g, KILN_STORE_INPUT, dt, ra, da);
  uint32_t tb = g_tensor(g, KILN_STORE_INPUT, dt, rb, db);
  uint32_t to = g_tensor(g, KILN_STORE_OUTPUT, dt, ro, dout);
  g_op(g, kind, 2, IDS(ta, tb), to, 0, NULL, alpha);
  kiln_status st = g_run(g, BUFS(a, b), BUFS(o), &err);
  if (st != KILN_OK) fprintf(stderr, "%s: %s\n", what, err.message);
  CHECK(st == KILN_OK);
  for (int64_t i = 0; i < no; i++)
    want[i] = ref_binary(kind, value_at(a, dt, ref_bcast(i, ro, dout, ra, da)),
                         value_at(b, dt, ref_bcast(i, ro, dout, rb, db)), alpha);
  CHECK_VALUES(what, o, dt, want, no);
  free(a), free(b), free(o), free(want), free(g);
}

static void test_binary_broadcasting(void) {
  for (int k = 0; k < 3; k++) {
    kiln_dtype dt = float_dtypes[k];
    binary_case("add scalar", KILN_OP_ADD, dt, 0, NULL, 2, DIMS(2, 3), 2, DIMS(2, 3), 1.0);
    binary_case("add row alpha", KILN_OP_ADD, dt, 2, DIMS(2, 3), 1, DIMS(3), 2, DIMS(2, 3), 2.0);
    binary_case("sub both sides", KILN_OP_SUB, dt, 2, DIMS(2, 1), 2, DIMS(1, 3), 2, DIMS(2, 3),
                0.5);
    binary_case("mul column", KILN_OP_MUL, dt, 3, DIMS(2, 3, 4), 3, DIMS(2, 3, 1), 3, DIMS(2, 3, 4),
                1.0);
    binary_case("div rank up", KILN_OP_DIV, dt, 1, DIMS(4), 3, DIMS(3, 1, 4), 3, DIMS(3, 1, 4),
                1.0);
    binary_case("mul rank 0", KILN_OP_MUL, dt, 0, NULL, 0, NULL, 0, NULL, 1.0);
    binary_case("add empty", KILN_OP_ADD, dt, 2, DIMS(0, 3), 1, DIMS(3), 2, DIMS(0, 3), 1.0);
    binary_case("minimum both sides", KILN_OP_MINIMUM, dt, 2, DIMS(2, 1), 2, DIMS(1, 3), 2,
                DIMS(2, 3), 0.0);
    binary_case("maximum rank up", KILN_OP_MAXIMUM, dt, 1, DIMS(4), 3, DIMS(3, 1, 4), 3,
                DIMS(3, 1, 4), 0.0);
  }
}

static void test_binary_hand(void) {
  /* [1,2] + 3 * [[10],[20]] = [[31,32],[61,62]] */
  float a[2] = {1, 2}, b[2] = {10, 20}, o[4] = {0};
  graph *g = g_new();
  uint32_t ta = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 1, DIMS(2));
  uint32_t tb = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 2, DIMS(2, 1));
  uint32_t to = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 2, DIMS(2, 2));
  g_op(g, KILN_OP_ADD, 2, IDS(ta, tb), to, 0, NULL, 3.0);
  CHECK(g_run(g, BUFS(a, b), BUFS(o), &err) == KILN_OK);
  CHECK(o[0] == 31 && o[1] == 32 && o[2] == 61 && o[3] == 62);
  free(g);
}

static void test_binary_integers(void) {
  /* i32 wraps like PyTorch: INT32_MAX + 1 = INT32_MIN; alpha applies to integers too. */
  int32_t a[3] = {INT32_MAX, -5, 7}, b[3] = {1, 2, -3}, o[3] = {0};
  graph *g = g_new();
  uint32_t ta = g_tensor(g, KILN_STORE_INPUT, KILN_I32, 1, DIMS(3));
  uint32_t tb = g_tensor(g, KILN_STORE_INPUT, KILN_I32, 1, DIMS(3));
  uint32_t to = g_tensor(g, KILN_STORE_OUTPUT, KILN_I32, 1, DIMS(3));
  g_op(g, KILN_OP_ADD, 2, IDS(ta, tb), to, 0, NULL, 1.0);
  CHECK(g_run(g, BUFS(a, b), BUFS(o), &err) == KILN_OK);
  CHECK(o[0] == INT32_MIN && o[1] == -3 && o[2] == 4);
  free(g);

  int64_t x[2] = {10, 1LL << 40}, y = 3, z[2] = {0};
  g = g_new();
  uint32_t tx = g_tensor(g, KILN_STORE_INPUT, KILN_I64, 1, DIMS(2));
  uint32_t ty = g_tensor(g, KILN_STORE_INPUT, KILN_I64, 0, NULL);
  uint32_t tz = g_tensor(g, KILN_STORE_OUTPUT, KILN_I64, 1, DIMS(2));
  g_op(g, KILN_OP_SUB, 2, IDS(tx, ty), tz, 0, NULL, 2.0);
  CHECK(g_run(g, BUFS(x, &y), BUFS(z), &err) == KILN_OK);
  CHECK(z[0] == 4 && z[1] == (1LL << 40) - 6);
  g->ops[0].kind = KILN_OP_MUL;
  CHECK(g_run(g, BUFS(x, &y), BUFS(z), &err) == KILN_OK);
  CHECK(z[0] == 30 && z[1] == 3 * (1LL << 40));
  free(g);

  /* bool + bool is a logical or, bool * bool a logical and */
  uint8_t p[4] = {0, 0, 1, 1}, q[4] = {0, 1, 0, 1}, r[4] = {9, 9, 9, 9};
  g = g_new();
  uint32_t tp = g_tensor(g, KILN_STORE_INPUT, KILN_BOOL, 1, DIMS(4));
  uint32_t tq = g_tensor(g, KILN_STORE_INPUT, KILN_BOOL, 1, DIMS(4));
  uint32_t tr = g_tensor(g, KILN_STORE_OUTPUT, KILN_BOOL, 1, DIMS(4));
  g_op(g, KILN_OP_ADD, 2, IDS(tp, tq), tr, 0, NULL, 1.0);
  CHECK(g_run(g, BUFS(p, q), BUFS(r), &err) == KILN_OK);
  CHECK(r[0] == 0 && r[1] == 1 && r[2] == 1 && r[3] == 1);
  g->ops[0].kind = KILN_OP_MUL;
  CHECK(g_run(g, BUFS(p, q), BUFS(r), &err) == KILN_OK);
  CHECK(r[0] == 0 && r[1] == 0 && r[2] == 0 && r[3] == 1);
  free(g);

  /* an integer and a float operand into a float output */
  int64_t i[2] = {3, -4};
  float f[2] = {0.5f, 0.25f}, h[2] = {0};
  g = g_new();
  uint32_t ti = g_tensor(g, KILN_STORE_INPUT, KILN_I64, 1, DIMS(2));
  uint32_t tf = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 1, DIMS(2));
  uint32_t th = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 1, DIMS(2));
  g_op(g, KILN_OP_DIV, 2, IDS(ti, tf), th, 0, NULL, 0.0);
  CHECK(g_run(g, BUFS(i, f), BUFS(h), &err) == KILN_OK);
  CHECK(h[0] == 6.0f && h[1] == -16.0f);
  free(g);
}

/* ---------------------------------------------------------------- unary */

static double ref_unary(kiln_op_kind kind, int64_t iattr0, double p, double x) {
  switch (kind) {
  case KILN_OP_RELU: return x > 0 ? x : 0;
  case KILN_OP_GELU:
    if (iattr0 == 0) return 0.5 * x * (1 + erf(x / sqrt(2.0)));
    return 0.5 * x * (1 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
  case KILN_OP_SILU: return x / (1 + exp(-x));
  case KILN_OP_SIGMOID: return 1 / (1 + exp(-x));
  case KILN_OP_TANH: return tanh(x);
  case KILN_OP_EXP: return exp(x);
  case KILN_OP_SQRT: return sqrt(x);
  case KILN_OP_RSQRT: return 1 / sqrt(x);
  case KILN_OP_NEG: return -x;
  case KILN_OP_ABS: return fabs(x);
  case KILN_OP_LOG: return log(x); /* -inf at 0, NaN below */
  case KILN_OP_COS: return cos(x);
  case KILN_OP_SIN: return sin(x);
  case KILN_OP_ERF: return erf(x);
  case KILN_OP_HARDSWISH: return x * fmin(fmax(x + 3, 0), 6) / 6;
  case KILN_OP_HARDSIGMOID: return fmin(fmax(x + 3, 0), 6) / 6;
  default: return pow(x, p);
  }
}

static void unary_case(kiln_op_kind kind, kiln_dtype dt, int64_t iattr0, double p) {
  static const double xs[12] = {-6, -3, -1.5, -0.5, -0.0, 0, 0.25, 1, 2.5, 4, 7.75, 10};
  void *x = alloc_buf(12, dt), *o = alloc_buf(12, dt);
  double want[12];
  for (int i = 0; i < 12; i++) fill_value(x, dt, i, xs[i]);
  graph *g = g_new();
  uint32_t tx = g_tensor(g, KILN_STORE_INPUT, dt, 2, DIMS(3, 4));
  uint32_t to = g_tensor(g, KILN_STORE_OUTPUT, dt, 2, DIMS(3, 4));
  g_op(g, kind, 1, IDS(tx), to, 1, (const int64_t[]){iattr0}, p);
  CHECK(g_run(g, BUFS(x), BUFS(o), &err) == KILN_OK);
  for (int i = 0; i < 12; i++) want[i] = ref_unary(kind, iattr0, p, value_at(x, dt, i));
  char what[64];
  snprintf(what, sizeof what, "%s %s", kiln_op_name(kind), kiln_dtype_name(dt));
  CHECK_VALUES(what, o, dt, want, 12);
  free(x), free(o), free(g);
}

static void test_unary(void) {
  for (int k = 0; k < 3; k++) {
    kiln_dtype dt = float_dtypes[k];
    unary_case(KILN_OP_RELU, dt, 0, 0);
    unary_case(KILN_OP_GELU, dt, 0, 0);
    unary_case(KILN_OP_GELU, dt, 1, 0);
    unary_case(KILN_OP_SILU, dt, 0, 0);
    unary_case(KILN_OP_SIGMOID, dt, 0, 0);
    unary_case(KILN_OP_TANH, dt, 0, 0);
    unary_case(KILN_OP_EXP, dt, 0, 0);
    unary_case(KILN_OP_SQRT, dt, 0, 0);  /* NaN below zero */
    unary_case(KILN_OP_RSQRT, dt, 0, 0); /* infinities at zero */
    unary_case(KILN_OP_NEG, dt, 0, 0);
    unary_case(KILN_OP_POW, dt, 0, 2.0);
    unary_case(KILN_OP_POW, dt, 0, 3.0);
    unary_case(KILN_OP_POW, dt, 0, 0.5);
    unary_case(KILN_OP_POW, dt, 0, -1.0);
    unary_case(KILN_OP_ABS, dt, 0, 0);
    unary_case(KILN_OP_LOG, dt, 0, 0);
    unary_case(KILN_OP_COS, dt, 0, 0);
    unary_case(KILN_OP_SIN, dt, 0, 0);
    unary_case(KILN_OP_ERF, dt, 0, 0);
    unary_case(KILN_OP_HARDSWISH, dt, 0, 0);
    unary_case(KILN_OP_HARDSIGMOID, dt, 0, 0);
  }
  /* relu and neg on integers */
  int64_t x[4] = {-7, 0, 5, INT64_MIN}, o[4] = {0};
  graph *g = g_new();
  uint32_t tx = g_tensor(g, KILN_STORE_INPUT, KILN_I64, 1, DIMS(4));
  uint32_t to = g_tensor(g, KILN_STORE_OUTPUT, KILN_I64, 1, DIMS(4));
  g_op(g, KILN_OP_RELU, 1, IDS(tx), to, 0, NULL, 0);
  CHECK(g_run(g, BUFS(x), BUFS(o), &err) == KILN_OK);
  CHECK(o[0] == 0 && o[1] == 0 && o[2] == 5 && o[3] == 0);
  g->ops[0].kind = KILN_OP_NEG;
  CHECK(g_run(g, BUFS(x), BUFS(o), &err) == KILN_OK);
  CHECK(o[0] == 7 && o[1] == 0 && o[2] == -5 && o[3] == INT64_MIN); /* wraps */
  g->ops[0].kind = KILN_OP_ABS;
  CHECK(g_run(g, BUFS(x), BUFS(o), &err) == KILN_OK);
  CHECK(o[0] == 7 && o[1] == 0 && o[2] == 5 && o[3] == INT64_MIN); /* wraps, as PyTorch's */
  free(g);
  int32_t y[3] = {-2, 3, 0}, z[3] = {0};
  g = g_new();
  tx = g_tensor(g, KILN_STORE_INPUT, KILN_I32, 1, DIMS(3));
  to = g_tensor(g, KILN_STORE_OUTPUT, KILN_I32, 1, DIMS(3));
  g_op(g, KILN_OP_NEG, 1, IDS(tx), to, 0, NULL, 0);
  CHECK(g_run(g, BUFS(y), BUFS(z), &err) == KILN_OK);
  CHECK(z[0] == 2 && z[1] == -3 && z[2] == 0);
  int32_t w[3] = {INT32_MIN, -4, 4};
  g->ops[0].kind = KILN_OP_ABS;
  CHECK(g_run(g, BUFS(w), BUFS(z), &err) == KILN_OK);
  CHECK(z[0] == INT32_MIN && z[1] == 4 && z[2] == 4);
  free(g);

  /* log at the edges of its domain; the activations at their kinks */
  float e[5] = {0.0f, -0.0f, -1.0f, 1.0f, INFINITY}, le[5] = {0};
  g = g_new();
  tx = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 1, DIMS(5));
  to = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 1, DIMS(5));
  g_op(g, KILN_OP_LOG, 1, IDS(tx), to, 0, NULL, 0);
  CHECK(g_run(g, BUFS(e), BUFS(le), &err) == KILN_OK);
  CHECK(le[0] == -INFINITY && le[1] == -INFINITY && isnan(le[2]) && le[3] == 0.0f &&
        le[4] == INFINITY);
  float k[6] = {-3.0f, 3.0f, -4.0f, 6.0f, 0.0f, NAN};
  g->tensors[tx].dims[0] = g->tensors[to].dims[0] = 6;
  g->tensors[tx].nbytes = g->tensors[to].nbytes = 24;
  float hs[6] = {0}, hg[6] = {0};
  g->ops[0].kind = KILN_OP_HARDSWISH;
  CHECK(g_run(g, BUFS(k), BUFS(hs), &err) == KILN_OK);
  CHECK(hs[0] == 0.0f && hs[1] == 3.0f && hs[2] == 0.0f && hs[3] == 6.0f && hs[4] == 0.0f &&
        isnan(hs[5]));
  g->ops[0].kind = KILN_OP_HARDSIGMOID;
  CHECK(g_run(g, BUFS(k), BUFS(hg), &err) == KILN_OK);
  CHECK(hg[0] == 0.0f && hg[1] == 1.0f && hg[2] == 0.0f && hg[3] == 1.0f && hg[4] == 0.5f &&
        isnan(hg[5]));
  free(g);
}

/* ---------------------------------------------------------------- minimum, maximum, clamp */

static void test_min_max(void) {
  /* NaN from either side propagates; of 0 and -0 the first operand wins, as in PyTorch. */
  float a[4] = {1.0f, NAN, -0.0f, 3.0f}, b[4] = {2.0f, 1.0f, 0.0f, NAN}, o[4] = {0};
  graph *g = g_new();
  uint32_t ta = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 1, DIMS(4));
  uint32_t tb = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 1, DIMS(4));
  uint32_t to = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 1, DIMS(4));
  g_op(g, KILN_OP_MINIMUM, 2, IDS(ta, tb), to, 0, NULL, 0);
  CHECK(g_run(g, BUFS(a, b), BUFS(o), &err) == KILN_OK);
  CHECK(o[0] == 1.0f && isnan(o[1]) && o[2] == 0.0f && signbit(o[2]) && isnan(o[3]));
  g->ops[0].kind = KILN_OP_MAXIMUM;
  CHECK(g_run(g, BUFS(a, b), BUFS(o), &err) == KILN_OK);
  CHECK(o[0] == 2.0f && isnan(o[1]) && o[2] == 0.0f && signbit(o[2]) && isnan(o[3]));
  CHECK(g_run(g, BUFS(b, a), BUFS(o), &err) == KILN_OK);
  CHECK(o[2] == 0.0f && !signbit(o[2]));
  free(g);

  /* integers exactly, past f32's precision; bool maximum is or */
  int64_t x[2] = {(1LL << 53) + 1, -7}, y = 1LL << 53, z[2] = {0};
  g = g_new();
  uint32_t tx = g_tensor(g, KILN_STORE_INPUT, KILN_I64, 1, DIMS(2));
  uint32_t ty = g_tensor(g, KILN_STORE_INPUT, KILN_I64, 0, NULL);
  uint32_t tz = g_tensor(g, KILN_STORE_OUTPUT, KILN_I64, 1, DIMS(2));
  g_op(g, KILN_OP_MINIMUM, 2, IDS(tx, ty), tz, 0, NULL, 0);
  CHECK(g_run(g, BUFS(x, &y), BUFS(z), &err) == KILN_OK);
  CHECK(z[0] == 1LL << 53 && z[1] == -7);
  g->ops[0].kind = KILN_OP_MAXIMUM;
  CHECK(g_run(g, BUFS(x, &y), BUFS(z), &err) == KILN_OK);
  CHECK(z[0] == (1LL << 53) + 1 && z[1] == 1LL << 53);
  free(g);
  uint8_t p[2] = {0, 1}, q[3] = {0, 1, 0}, r[6];
  memset(r, 9, sizeof r);
  g = g_new();
  uint32_t tp = g_tensor(g, KILN_STORE_INPUT, KILN_BOOL, 2, DIMS(2, 1));
  uint32_t tq = g_tensor(g, KILN_STORE_INPUT, KILN_BOOL, 1, DIMS(3));
  uint32_t tr = g_tensor(g, KILN_STORE_OUTPUT, KILN_BOOL, 2, DIMS(2, 3));
  g_op(g, KILN_OP_MAXIMUM, 2, IDS(tp, tq), tr, 0, NULL, 0);
  CHECK(g_run(g, BUFS(p, q), BUFS(r), &err) == KILN_OK);
  CHECK(r[0] == 0 && r[1] == 1 && r[2] == 0 && r[3] == 1 && r[4] == 1 && r[5] == 1);
  free(g);
}

/* clamp as the lowering writes it: MAXIMUM with the lower bound, then MINIMUM with the upper.
 * A lower bound above the upper gives the upper everywhere, and NaN stays NaN, as PyTorch's. */
static void test_clamp(void) {
  float x[5] = {-2.0f, -0.25f, 0.25f, 2.0f, NAN}, lo = 0.5f, hi = -0.5f, o[5] = {0};
  graph *g = g_new();
  uint32_t tx = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 1, DIMS(5));
  uint32_t tl = g_weight(g, KILN_F32, 0, NULL, &lo), th = g_weight(g, KILN_F32, 0, NULL, &hi);
  uint32_t tm = g_tensor(g, KILN_STORE_ARENA, KILN_F32, 1, DIMS(5));
  uint32_t to = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 1, DIMS(5));
  g_op(g, KILN_OP_MAXIMUM, 2, IDS(tx, tl), tm, 0, NULL, 0);
  g_op(g, KILN_OP_MINIMUM, 2, IDS(tm, th), to, 0, NULL, 0);
  CHECK(g_run(g, BUFS(x), BUFS(o), &err) == KILN_OK);
  CHECK(o[0] == -0.5f && o[1] == -0.5f && o[2] == -0.5f && o[3] == -0.5f && isnan(o[4]));
  memcpy(g->weights + g->tensors[tl].offset, &hi, 4); /* [-0.5, 0.5] the right way round */
  memcpy(g->weights + g->tensors[th].offset, &lo, 4);
  CHECK(g_run(g, BUFS(x), BUFS(o), &err) == KILN_OK);
  CHECK(o[0] == -0.5f && o[1] == -0.25f && o[2] == 0.25f && o[3] == 0.5f && isnan(o[4]));
  free(g);
}

/* ---------------------------------------------------------------- comparisons */

/* a cmp b for the six comparisons of NaN, equal and signed-zero pairs, in each float dtype. */
static void test_compare_floats(void) {
  static const double av[5] = {1.0, NAN, 2.0, -0.0, -3.5}, bv[5] = {1.0, 1.0, NAN, 0.0, 2.0};
  /* per comparison: the expected bools of the five pairs */
  static const uint8_t want[6][5] = {{1, 0, 0, 1, 0}, {0, 1, 1, 0, 1}, {0, 0, 0, 0, 1},
                                     {1, 0, 0, 1, 1}, {0, 0, 0, 0, 0}, {1, 0, 0, 1, 0}};
  for (int t = 0; t < 3; t++) {
    kiln_dtype dt = float_dtypes[t];
    void *a = alloc_buf(5, dt), *b = alloc_buf(5, dt);
    uint8_t o[5];
    for (int i = 0; i < 5; i++) fill_value(a, dt, i, av[i]), fill_value(b, dt, i, bv[i]);
    graph *g = g_new();
    uint32_t ta = g_tensor(g, KILN_STORE_INPUT, dt, 1, DIMS(5));
    uint32_t tb = g_tensor(g, KILN_STORE_INPUT, dt, 1, DIMS(5));
    uint32_t to = g_tensor(g, KILN_STORE_OUTPUT, KILN_BOOL, 1, DIMS(5));
    g_op(g, KILN_OP_COMPARE, 2, IDS(ta, tb), to, 1, DIMS(0), 0);
    for (int64_t cmp = KILN_CMP_EQ; cmp <= KILN_CMP_GE; cmp++) {
      g->ops[0].iattr[0] = cmp;
      memset(o, 9, sizeof o);
      CHECK(g_run(g, BUFS(a, b), BUFS(o), &err) == KILN_OK);
      int same = 1;
      for (int i = 0; i < 5; i++) same &= o[i] == want[cmp][i];
      if (!same) fprintf(stderr, "compare %lld %s differs\n", (long long)cmp, kiln_dtype_name(dt));
      CHECK(same);
    }
    free(a), free(b), free(g);
  }
}

static void test_compare_integers(void) {
  /* i64 compares exactly past f32's precision: 2^53 + 1 > 2^53 */
  int64_t a[3] = {(1LL << 53) + 1, -1, 5}, b[3] = {1LL << 53, -1, 6};
  uint8_t o[3];
  graph *g = g_new();
  uint32_t ta = g_tensor(g, KILN_STORE_INPUT, KILN_I64, 1, DIMS(3));
  uint32_t tb = g_tensor(g, KILN_STORE_INPUT, KILN_I64, 1, DIMS(3));
  uint32_t to = g_tensor(g, KILN_STORE_OUTPUT, KILN_BOOL, 1, DIMS(3));
  g_op(g, KILN_OP_COMPARE, 2, IDS(ta, tb), to, 1, DIMS(KILN_CMP_GT), 0);
  CHECK(g_run(g, BUFS(a, b), BUFS(o), &err) == KILN_OK);
  CHECK(o[0] == 1 && o[1] == 0 && o[2] == 0);
  g->ops[0].iattr[0] = KILN_CMP_EQ;
  CHECK(g_run(g, BUFS(a, b), BUFS(o), &err) == KILN_OK);
  CHECK(o[0] == 0 && o[1] == 1 && o[2] == 0);
  free(g);

  /* a causal mask as transformers builds it: key position <= query position, [1,4] vs [4,1] */
  int32_t kv[4] = {0, 1, 2, 3}, qp[4] = {0, 1, 2, 3};
  uint8_t m[16];
  g = g_new();
  ta = g_tensor(g, KILN_STORE_INPUT, KILN_I32, 2, DIMS(1, 4));
  tb = g_tensor(g, KILN_STORE_INPUT, KILN_I32, 2, DIMS(4, 1));
  to = g_tensor(g, KILN_STORE_OUTPUT, KILN_BOOL, 2, DIMS(4, 4));
  g_op(g, KILN_OP_COMPARE, 2, IDS(ta, tb), to, 1, DIMS(KILN_CMP_LE), 0);
  CHECK(g_run(g, BUFS(kv, qp), BUFS(m), &err) == KILN_OK);
  int causal = 1;
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 4; j++) causal &= m[i * 4 + j] == (j <= i);
  CHECK(causal);
  free(g);

  /* bools broadcast: [2,1] ne [3] */
  uint8_t p[2] = {0, 1}, q[3] = {0, 1, 1}, r[6];
  g = g_new();
  ta = g_tensor(g, KILN_STORE_INPUT, KILN_BOOL, 2, DIMS(2, 1));
  tb = g_tensor(g, KILN_STORE_INPUT, KILN_BOOL, 1, DIMS(3));
  to = g_tensor(g, KILN_STORE_OUTPUT, KILN_BOOL, 2, DIMS(2, 3));
  g_op(g, KILN_OP_COMPARE, 2, IDS(ta, tb), to, 1, DIMS(KILN_CMP_NE), 0);
  CHECK(g_run(g, BUFS(p, q), BUFS(r), &err) == KILN_OK);
  CHECK(r[0] == 0 && r[1] == 1 && r[2] == 1 && r[3] == 1 && r[4] == 0 && r[5] == 0);
  free(g);
}

/* ---------------------------------------------------------------- boolean ops */

static void test_logical(void) {
  /* operands of different dtypes; nonzero (NaN included) is true */
  float a[4] = {0.0f, NAN, -0.0f, 2.5f};
  int64_t b[2] = {0, -3};
  uint8_t o[8];
  /* per op: the expected bools of [4,1]-vs-[2] broadcast pairs, a as a column */
  static const uint8_t want[3][8] = {{0, 0, 0, 1, 0, 0, 0, 1},
                                     {0, 1, 1, 1, 0, 1, 1, 1},
                                     {0, 1, 1, 0, 0, 1, 1, 0}};
  graph *g = g_new();
  uint32_t ta = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 2, DIMS(4, 1));
  uint32_t tb = g_tensor(g, KILN_STORE_INPUT, KILN_I64, 1, DIMS(2));
  uint32_t to = g_tensor(g, KILN_STORE_OUTPUT, KILN_BOOL, 2, DIMS(4, 2));
  g_op(g, KILN_OP_LOGICAL, 2, IDS(ta, tb), to, 1, DIMS(0), 0);
  for (int64_t which = KILN_BOOL_AND; which <= KILN_BOOL_XOR; which++) {
    g->ops[0].iattr[0] = which;
    memset(o, 9, sizeof o);
    CHECK(g_run(g, BUFS(a, b), BUFS(o), &err) == KILN_OK);
    CHECK(memcmp(o, want[which], 8) == 0);
  }
  free(g);
  uint8_t n[4];
  g = g_new();
  ta = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 1, DIMS(4));
  to = g_tensor(g, KILN_STORE_OUTPUT, KILN_BOOL, 1, DIMS(4));
  g_op(g, KILN_OP_LOGICAL, 1, IDS(ta), to, 1, DIMS(KILN_BOOL_NOT), 0);
  CHECK(g_run(g, BUFS(a), BUFS(n), &err) == KILN_OK);
  CHECK(n[0] == 1 && n[1] == 0 && n[2] == 1 && n[3] == 0);
  free(g);
}

static void test_bitwise(void) {
  /* on bool: and, or, xor broadcast, and not is a logical not (never the byte ~1) */
  uint8_t p[2] = {0, 1}, q[2] = {0, 1}, o[4], n[2];
  static const uint8_t want[3][4] = {{0, 0, 0, 1}, {0, 1, 1, 1}, {0, 1, 1, 0}};
  graph *g = g_new();
  uint32_t tp = g_tensor(g, KILN_STORE_INPUT, KILN_BOOL, 2, DIMS(2, 1));
  uint32_t tq = g_tensor(g, KILN_STORE_INPUT, KILN_BOOL, 1, DIMS(2));
  uint32_t to = g_tensor(g, KILN_STORE_OUTPUT, KILN_BOOL, 2, DIMS(2, 2));
  g_op(g, KILN_OP_BITWISE, 2, IDS(tp, tq), to, 1, DIMS(0), 0);
  for (int64_t which = KILN_BOOL_AND; which <= KILN_BOOL_XOR; which++) {
    g->ops[0].iattr[0] = which;
    memset(o, 9, sizeof o);
    CHECK(g_run(g, BUFS(p, q), BUFS(o), &err) == KILN_OK);
    CHECK(memcmp(o, want[which], 4) == 0);
  }
  free(g);
  g = g_new();
  tp = g_tensor(g, KILN_STORE_INPUT, KILN_BOOL, 1, DIMS(2));
  to = g_tensor(g, KILN_STORE_OUTPUT, KILN_BOOL, 1, DIMS(2));
  g_op(g, KILN_OP_BITWISE, 1, IDS(tp), to, 1, DIMS(KILN_BOOL_NOT), 0);
  CHECK(g_run(g, BUFS(p), BUFS(n), &err) == KILN_OK);
  CHECK(n[0] == 1 && n[1] == 0);
  free(g);

  /* on integers: two's complement bits */
  int64_t x[3] = {12, -1, INT64_MIN}, y = 10, z[3] = {0};
  g = g_new();
  uint32_t tx = g_tensor(g, KILN_STORE_INPUT, KILN_I64, 1, DIMS(3));
  uint32_t ty = g_tensor(g, KILN_STORE_INPUT, KILN_I64, 0, NULL);
  uint32_t tz = g_tensor(g, KILN_STORE_OUTPUT, KILN_I64, 1, DIMS(3));
  g_op(g, KILN_OP_BITWISE, 2, IDS(tx, ty), tz, 1, DIMS(KILN_BOOL_AND), 0);
  CHECK(g_run(g, BUFS(x, &y), BUFS(z), &err) == KILN_OK);
  CHECK(z[0] == 8 && z[1] == 10 && z[2] == 0);
  g->ops[0].iattr[0] = KILN_BOOL_OR;
  CHECK(g_run(g, BUFS(x, &y), BUFS(z), &err) == KILN_OK);
  CHECK(z[0] == 14 && z[1] == -1 && z[2] == (INT64_MIN | 10));
  g->ops[0].iattr[0] = KILN_BOOL_XOR;
  CHECK(g_run(g, BUFS(x, &y), BUFS(z), &err) == KILN_OK);
  CHECK(z[0] == 6 && z[1] == -11 && z[2] == (INT64_MIN | 10));
  free(g);
  int32_t w[3] = {0, -1, INT32_MAX}, v[3] = {0};
  g = g_new();
  tx = g_tensor(g, KILN_STORE_INPUT, KILN_I32, 1, DIMS(3));
  tz = g_tensor(g, KILN_STORE_OUTPUT, KILN_I32, 1, DIMS(3));
  g_op(g, KILN_OP_BITWISE, 1, IDS(tx), tz, 1, DIMS(KILN_BOOL_NOT), 0);
  CHECK(g_run(g, BUFS(w), BUFS(v), &err) == KILN_OK);
  CHECK(v[0] == -1 && v[1] == 0 && v[2] == INT32_MIN);
  free(g);
}

/* ---------------------------------------------------------------- cast */

static graph *cast_graph(kiln_dtype from, kiln_dtype to, int64_t n) {
  graph *g = g_new();
  uint32_t tx = g_tensor(g, KILN_STORE_INPUT, from, 1, DIMS(n));
  uint32_t tout = g_tensor(g, KILN_STORE_OUTPUT, to, 1, DIMS(n));
  g_op(g, KILN_OP_CAST, 1, IDS(tx), tout, 1, (const int64_t[]){to}, 0);
  return g;
}

static void test_cast(void) {
  float f[8] = {-2.7f, 2.7f, -0.5f, NAN, 1e20f, -1e20f, 3.0f, -0.0f};
  int64_t i64[8] = {0};
  graph *g = cast_graph(KILN_F32, KILN_I64, 8);
  CHECK(g_run(g, BUFS(f), BUFS(i64), &err) == KILN_OK);
  CHECK(i64[0] == -2 && i64[1] == 2 && i64[2] == 0 && i64[3] == 0); /* toward zero; NaN 0 */
  CHECK(i64[4] == INT64_MAX && i64[5] == INT64_MIN && i64[6] == 3 && i64[7] == 0); /* saturate */
  free(g);

  float big[3] = {3e9f, -3e9f, 2147483520.0f};
  int32_t i32[3] = {0};
  g = cast_graph(KILN_F32, KILN_I32, 3);
  CHECK(g_run(g, BUFS(big), BUFS(i32), &err) == KILN_OK);
  CHECK(i32[0] == INT32_MAX && i32[1] == INT32_MIN && i32[2] == 2147483520);
  free(g);

  float fb[5] = {0.0f, -0.0f, 0.5f, NAN, -3.0f};
  uint8_t b[5] = {7, 7, 7, 7, 7};
  g = cast_graph(KILN_F32, KILN_BOOL, 5);
  CHECK(g_run(g, BUFS(fb), BUFS(b), &err) == KILN_OK);
  CHECK(b[0] == 0 && b[1] == 0 && b[2] == 1 && b[3] == 1 && b[4] == 1); /* nonzero, not truncated */
  free(g);

  uint8_t bb[3] = {0, 1, 1};
  float bf[3] = {9, 9, 9};
  g = cast_graph(KILN_BOOL, KILN_F32, 3);
  CHECK(g_run(g, BUFS(bb), BUFS(bf), &err) == KILN_OK);
  CHECK(bf[0] == 0.0f && bf[1] == 1.0f && bf[2] == 1.0f);
  free(g);

  int64_t wide[3] = {0x100000005LL, -1, (int64_t)0x80000000LL};
  int32_t narrow[3] = {0};
  g = cast_graph(KILN_I64, KILN_I32, 3);
  CHECK(g_run(g, BUFS(wide), BUFS(narrow), &err) == KILN_OK);
  CHECK(narrow[0] == 5 && narrow[1] == -1 && narrow[2] == INT32_MIN); /* wraps */
  free(g);

  int64_t ib[3] = {0, -9, 2};
  uint8_t ob[3] = {7, 7, 7};
  g = cast_graph(KILN_I64, KILN_BOOL, 3);
  CHECK(g_run(g, BUFS(ib), BUFS(ob), &err) == KILN_OK);
  CHECK(ob[0] == 0 && ob[1] == 1 && ob[2] == 1);
  free(g);

  /* integers to f16 go through f32: 2049 ties to 2048 and 2051 to 2052 (spacing 2) */
  int32_t ih[3] = {2049, 2051, 70000};
  uint16_t h[3] = {0};
  g = cast_graph(KILN_I32, KILN_F16, 3);
  CHECK(g_run(g, BUFS(ih), BUFS(h), &err) == KILN_OK);
  CHECK(h[0] == 0x6800 && h[1] == 0x6802 && h[2] == 0x7c00);
  free(g);

  /* f32 -> bf16 rounds to nearest even; f16 -> bf16 and bf16 -> f32 are exact here */
  float fr[3] = {kiln_bits_f32(0x3f808000u), kiln_bits_f32(0x3f818000u), 1e-3f};
  uint16_t br[3] = {0};
  g = cast_graph(KILN_F32, KILN_BF16, 3);
  CHECK(g_run(g, BUFS(fr), BUFS(br), &err) == KILN_OK);
  CHECK(br[0] == 0x3f80 && br[1] == 0x3f82 && br[2] == kiln_f32_to_bf16(1e-3f));
  free(g);
  uint16_t hh[3] = {0x3c00 /* 1 */, 0x0001 /* 2^-24 */, 0xfc00 /* -inf */}, hb[3] = {0};
  g = cast_graph(KILN_F16, KILN_BF16, 3);
  CHECK(g_run(g, BUFS(hh), BUFS(hb), &err) == KILN_OK);
  CHECK(hb[0] == 0x3f80 && hb[1] == 0x3380 && hb[2] == 0xff80);
  free(g);
  uint16_t bsrc[2] = {0x4049, 0x8001};
  float bdst[2] = {0};
  g = cast_graph(KILN_BF16, KILN_F32, 2);
  CHECK(g_run(g, BUFS(bsrc), BUFS(bdst), &err) == KILN_OK);
  CHECK(kiln_f32_bits(bdst[0]) == 0x40490000u && kiln_f32_bits(bdst[1]) == 0x80010000u);
  free(g);
}

/* ---------------------------------------------------------------- where */

static void test_where(void) {
  /* cond [2,1], a [3], b rank 0 -> [2,3] */
  uint8_t c[2] = {1, 0};
  float a[3] = {1, 2, 3}, b = -1, o[6] = {0};
  graph *g = g_new();
  uint32_t tc = g_tensor(g, KILN_STORE_INPUT, KILN_BOOL, 2, DIMS(2, 1));
  uint32_t ta = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 1, DIMS(3));
  uint32_t tb = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 0, NULL);
  uint32_t to = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 2, DIMS(2, 3));
  g_op(g, KILN_OP_WHERE, 3, IDS(tc, ta, tb), to, 0, NULL, 0);
  CHECK(g_run(g, BUFS(c, a, &b), BUFS(o), &err) == KILN_OK);
  CHECK(o[0] == 1 && o[1] == 2 && o[2] == 3 && o[3] == -1 && o[4] == -1 && o[5] == -1);
  free(g);

  /* per-element cond with i64 values, and bf16 values */
  uint8_t c2[4] = {0, 1, 1, 0};
  int64_t x[4] = {1, 2, 3, 4}, y[4] = {-1, -2, -3, INT64_MIN}, z[4] = {0};
  g = g_new();
  tc = g_tensor(g, KILN_STORE_INPUT, KILN_BOOL, 1, DIMS(4));
  ta = g_tensor(g, KILN_STORE_INPUT, KILN_I64, 1, DIMS(4));
  tb = g_tensor(g, KILN_STORE_INPUT, KILN_I64, 1, DIMS(4));
  to = g_tensor(g, KILN_STORE_OUTPUT, KILN_I64, 1, DIMS(4));
  g_op(g, KILN_OP_WHERE, 3, IDS(tc, ta, tb), to, 0, NULL, 0);
  CHECK(g_run(g, BUFS(c2, x, y), BUFS(z), &err) == KILN_OK);
  CHECK(z[0] == -1 && z[1] == 2 && z[2] == 3 && z[3] == INT64_MIN);
  for (uint32_t t = 1; t < 4; t++) {
    g->tensors[t].dtype = KILN_BF16;
    g->tensors[t].nbytes = 8;
  }
  uint16_t hx[4] = {0x3f80, 0x4000, 0x4040, 0x4080}, hy[4] = {0xbf80, 0xc000, 0xc040, 0x7fc0};
  uint16_t hz[4] = {0};
  CHECK(g_run(g, BUFS(c2, hx, hy), BUFS(hz), &err) == KILN_OK);
  CHECK(hz[0] == 0xbf80 && hz[1] == 0x4000 && hz[2] == 0x4040 && hz[3] == 0x7fc0);
  free(g);
}

/* ---------------------------------------------------------------- softmax */

static void softmax_case(kiln_dtype dt, int is_log, int32_t dim) {
  const int64_t dims[3] = {2, 3, 4};
  void *x = alloc_buf(24, dt), *o = alloc_buf(24, dt);
  double want[24];
  fill_random(x, dt, 24, 5, 6.0);
  fill_value(x, dt, 5, -INFINITY); /* a masked entry */
  graph *g = g_new();
  uint32_t tx = g_tensor(g, KILN_STORE_INPUT, dt, 3, dims);
  uint32_t to = g_tensor(g, KILN_STORE_OUTPUT, dt, 3, dims);
  g_op(g, is_log ? KILN_OP_LOG_SOFTMAX : KILN_OP_SOFTMAX, 1, IDS(tx), to, 1, (const int64_t[]){dim},
       0);
  CHECK(g_run(g, BUFS(x), BUFS(o), &err) == KILN_OK);
  int64_t stride = dim == 2 ? 1 : dim == 1 ? 4 : 12;
  for (int64_t i = 0; i < 24; i++) {
    int64_t c = (i / stride) % dims[dim], first = i - c * stride;
    double sum = 0;
    for (int64_t k = 0; k < dims[dim]; k++) sum += exp(value_at(x, dt, first + k * stride));
    double xi = value_at(x, dt, i);
    want[i] = is_log ? xi - log(sum) : exp(xi) / sum;
  }
  char what[64];
  snprintf(what, sizeof what, "%s dim %d %s", is_log ? "log_softmax" : "softmax", (int)dim,
           kiln_dtype_name(dt));
  CHECK_VALUES(what, o, dt, want, 24);
  free(x), free(o), free(g);
}

static void test_softmax(void) {
  for (int k = 0; k < 3; k++)
    for (int32_t dim = 0; dim < 3; dim++) {
      softmax_case(float_dtypes[k], 0, dim);
      softmax_case(float_dtypes[k], 1, dim);
    }
  /* large values stay finite (max subtracted); an all -inf row is NaN; rank 0 is 1 */
  float x[6] = {1000, 1001, 1002, -INFINITY, -INFINITY, -INFINITY}, o[6] = {0};
  graph *g = g_new();
  uint32_t tx = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 2, DIMS(2, 3));
  uint32_t to = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 2, DIMS(2, 3));
  g_op(g, KILN_OP_SOFTMAX, 1, IDS(tx), to, 1, (const int64_t[]){1}, 0);
  CHECK(g_run(g, BUFS(x), BUFS(o), &err) == KILN_OK);
  double e = exp(1.0), s = 1 + e + e * e;
  CHECK_VALUES("softmax large", o, KILN_F32, ((const double[]){1 / s, e / s, e * e / s}), 3);
  CHECK(isnan(o[3]) && isnan(o[4]) && isnan(o[5]));
  free(g);
  float r = 3.5f, ro = 0;
  g = g_new();
  tx = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 0, NULL);
  to = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 0, NULL);
  g_op(g, KILN_OP_SOFTMAX, 1, IDS(tx), to, 1, (const int64_t[]){0}, 0);
  CHECK(g_run(g, BUFS(&r), BUFS(&ro), &err) == KILN_OK);
  CHECK(ro == 1.0f);
  g->ops[0].kind = KILN_OP_LOG_SOFTMAX;
  CHECK(g_run(g, BUFS(&r), BUFS(&ro), &err) == KILN_OK);
  CHECK(ro == 0.0f);
  free(g);
}

/* ---------------------------------------------------------------- layer_norm, rms_norm */

/* x [2,3,4] normalized over its trailing nd dims; flags: 1 weight, 2 bias. */
static void norm_case(kiln_dtype dt, int rms, int32_t nd, int flags) {
  const int64_t dims[3] = {2, 3, 4};
  int64_t cols = nd == 1 ? 4 : 12, rows = 24 / cols;
  void *x = alloc_buf(24, dt), *w = alloc_buf(cols, dt), *b = alloc_buf(cols, dt);
  void *o = alloc_buf(24, dt);
  double want[24];
  fill_random(x, dt, 24, 17, 3.0);
  for (int64_t i = 0; i < 24; i++) fill_value(x, dt, i, value_at(x, dt, i) + 2.0); /* mean != 0 */
  fill_random(w, dt, cols, 19, 2.0);
  fill_random(b, dt, cols, 23, 1.0);
  graph *g = g_new();
  uint32_t ids[3], n = 0;
  void *bufs[3];
  ids[n] = g_tensor(g, KILN_STORE_INPUT, dt, 3, dims), bufs[n++] = x;
  if (flags & 1) ids[n] = g_tensor(g, KILN_STORE_INPUT, dt, nd, dims + 3 - nd), bufs[n++] = w;
  if (flags & 2) ids[n] = g_tensor(g, KILN_STORE_INPUT, dt, nd, dims + 3 - nd), bufs[n++] = b;
  uint32_t to = g_tensor(g, KILN_STORE_OUTPUT, dt, 3, dims);
  double eps = 1e-5;
  g_op(g, rms ? KILN_OP_RMS_NORM : KILN_OP_LAYER_NORM, n, ids, to, 2, (const int64_t[]){nd, flags},
       eps);
  kiln_status st = g_run(g, bufs, BUFS(o), &err);
  if (st != KILN_OK) fprintf(stderr, "norm: %s\n", err.message);
  CHECK(st == KILN_OK);
  for (int64_t r = 0; r < rows; r++) {
    double mean = 0, var = 0;
    for (int64_t j = 0; j < cols; j++) mean += value_at(x, dt, r * cols + j) / (double)cols;
    if (rms) mean = 0;
    for (int64_t j = 0; j < cols; j++) {
      double d = value_at(x, dt, r * cols + j) - mean;
      var += d * d / (double)cols;
    }
    for (int64_t j = 0; j < cols; j++) {
      double y = (value_at(x, dt, r * cols + j) - mean) / sqrt(var + eps);
      if (flags & 1) y *= value_at(w, dt, j);
      if (flags & 2) y += value_at(b, dt, j);
      want[r * cols + j] = y;
    }
  }
  char what[64];
  snprintf(what, sizeof what, "%s nd %d flags %d %s", rms ? "rms_norm" : "layer_norm", (int)nd,
           flags, kiln_dtype_name(dt));
  CHECK_VALUES(what, o, dt, want, 24);
  free(x), free(w), free(b), free(o), free(g);
}

static void test_norms(void) {
  for (int k = 0; k < 3; k++) {
    kiln_dtype dt = float_dtypes[k];
    for (int flags = 0; flags < 4; flags++) norm_case(dt, 0, 1, flags);
    norm_case(dt, 0, 2, 3);
    norm_case(dt, 1, 1, 0);
    norm_case(dt, 1, 1, 1);
    norm_case(dt, 1, 2, 1);
  }
  /* hand case: layer_norm([1,3]) = [-1,1] (eps 0); rms_norm([3,4]) = [3,4]/sqrt(12.5) */
  float x[2] = {1, 3}, o[2] = {0};
  graph *g = g_new();
  uint32_t tx = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 1, DIMS(2));
  uint32_t to = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 1, DIMS(2));
  g_op(g, KILN_OP_LAYER_NORM, 1, IDS(tx), to, 2, (const int64_t[]){1, 0}, 0.0);
  CHECK(g_run(g, BUFS(x), BUFS(o), &err) == KILN_OK);
  CHECK(o[0] == -1.0f && o[1] == 1.0f);
  x[0] = 3, x[1] = 4;
  g->ops[0].kind = KILN_OP_RMS_NORM;
  CHECK(g_run(g, BUFS(x), BUFS(o), &err) == KILN_OK);
  CHECK_VALUES("rms hand", o, KILN_F32, ((const double[]){3 / sqrt(12.5), 4 / sqrt(12.5)}), 2);
  free(g);
}

/* ---------------------------------------------------------------- reductions */

static void reduce_case(kiln_op_kind kind, kiln_dtype dt, uint32_t mask, int keepdim) {
  const int64_t dims[3] = {2, 3, 4};
  int64_t odims[3];
  int32_t orank = 0;
  for (int32_t d = 0; d < 3; d++)
    if (!((mask >> d) & 1))
      odims[orank++] = dims[d];
    else if (keepdim)
      odims[orank++] = 1;
  int64_t no = count(orank, odims);
  void *x = alloc_buf(24, dt), *o = alloc_buf(no, dt);
  double want[24];
  fill_random(x, dt, 24, 31, 5.0);
  if (kind == KILN_OP_AMAX) fill_value(x, dt, 6, NAN); /* at [0,1,2] */
  graph *g = g_new();
  uint32_t tx = g_tensor(g, KILN_STORE_INPUT, dt, 3, dims);
  uint32_t to = g_tensor(g, KILN_STORE_OUTPUT, dt, orank, odims);
  g_op(g, kind, 1, IDS(tx), to, 2, (const int64_t[]){mask, keepdim}, 0);
  CHECK(g_run(g, BUFS(x), BUFS(o), &err) == KILN_OK);
  for (int64_t i = 0; i < no; i++) want[i] = kind == KILN_OP_AMAX ? -INFINITY : 0.0;
  int64_t n_red = 1;
  for (int32_t d = 0; d < 3; d++) n_red *= (mask >> d) & 1 ? dims[d] : 1;
  for (int64_t a = 0; a < 2; a++)
    for (int64_t b = 0; b < 3; b++)
      for (int64_t c = 0; c < 4; c++) {
        int64_t k = 0; /* the output element: kept coordinates in row-major order */
        if (!(mask & 1)) k = k * 2 + a;
        if (!(mask & 2)) k = k * 3 + b;
        if (!(mask & 4)) k = k * 4 + c;
        double v = value_at(x, dt, (a * 3 + b) * 4 + c);
        if (kind == KILN_OP_AMAX)
          want[k] = isnan(want[k]) || isnan(v) ? NAN : fmax(want[k], v);
        else
          want[k] += kind == KILN_OP_MEAN ? v / (double)n_red : v;
      }
  char what[64];
  snprintf(what, sizeof what, "%s mask %u keepdim %d %s", kiln_op_name(kind), mask, keepdim,
           kiln_dtype_name(dt));
  CHECK_VALUES(what, o, dt, want, no);
  free(x), free(o), free(g);
}

static void test_reduce(void) {
  static const kiln_op_kind kinds[3] = {KILN_OP_SUM, KILN_OP_MEAN, KILN_OP_AMAX};
  for (int k = 0; k < 3; k++)
    for (int t = 0; t < 3; t++)
      for (uint32_t mask = 0; mask < 8; mask++) {
        reduce_case(kinds[k], float_dtypes[t], mask, 0);
        reduce_case(kinds[k], float_dtypes[t], mask, 1);
      }
  /* hand case: amax over rows of [[1,NaN],[3,2]] is [NaN,3]; sum of an empty dim is 0, its
   * mean NaN */
  float x[4] = {1, NAN, 3, 2}, o[2] = {0};
  graph *g = g_new();
  uint32_t tx = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 2, DIMS(2, 2));
  uint32_t to = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 1, DIMS(2));
  g_op(g, KILN_OP_AMAX, 1, IDS(tx), to, 2, (const int64_t[]){2, 0}, 0);
  CHECK(g_run(g, BUFS(x), BUFS(o), &err) == KILN_OK);
  CHECK(isnan(o[0]) && o[1] == 3.0f);
  free(g);
  g = g_new();
  tx = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 2, DIMS(2, 0));
  to = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 1, DIMS(2));
  g_op(g, KILN_OP_SUM, 1, IDS(tx), to, 2, (const int64_t[]){2, 0}, 0);
  o[0] = o[1] = 9;
  CHECK(g_run(g, BUFS(NULL), BUFS(o), &err) == KILN_OK);
  CHECK(o[0] == 0.0f && o[1] == 0.0f);
  g->ops[0].kind = KILN_OP_MEAN;
  CHECK(g_run(g, BUFS(NULL), BUFS(o), &err) == KILN_OK);
  CHECK(isnan(o[0]) && isnan(o[1]));
  free(g);
  /* integers: sum of i32 into i64, amax of i64, sum of bools counts */
  int32_t xi[6] = {1, 2, 3, 4, 5, INT32_MAX};
  int64_t oi[2] = {0};
  g = g_new();
  tx = g_tensor(g, KILN_STORE_INPUT, KILN_I32, 2, DIMS(2, 3));
  to = g_tensor(g, KILN_STORE_OUTPUT, KILN_I64, 2, DIMS(2, 1));
  g_op(g, KILN_OP_SUM, 1, IDS(tx), to, 2, (const int64_t[]){2, 1}, 0);
  CHECK(g_run(g, BUFS(xi), BUFS(oi), &err) == KILN_OK);
  CHECK(oi[0] == 6 && oi[1] == 9 + (int64_t)INT32_MAX);
  free(g);
  int64_t xl[4] = {-5, INT64_MIN, -7, -6}, ol = 0;
  g = g_new();
  tx = g_tensor(g, KILN_STORE_INPUT, KILN_I64, 1, DIMS(4));
  to = g_tensor(g, KILN_STORE_OUTPUT, KILN_I64, 0, NULL);
  g_op(g, KILN_OP_AMAX, 1, IDS(tx), to, 2, (const int64_t[]){1, 0}, 0);
  CHECK(g_run(g, BUFS(xl), BUFS(&ol), &err) == KILN_OK);
  CHECK(ol == -5);
  free(g);
  uint8_t xb[5] = {1, 0, 1, 1, 0};
  int64_t ob = 0;
  g = g_new();
  tx = g_tensor(g, KILN_STORE_INPUT, KILN_BOOL, 1, DIMS(5));
  to = g_tensor(g, KILN_STORE_OUTPUT, KILN_I64, 0, NULL);
  g_op(g, KILN_OP_SUM, 1, IDS(tx), to, 2, (const int64_t[]){1, 0}, 0);
  CHECK(g_run(g, BUFS(xb), BUFS(&ob), &err) == KILN_OK);
  CHECK(ob == 3);
  free(g);
}

/* ---------------------------------------------------------------- layout */

static void test_reshape_copy(void) {
  float x[6] = {1, 2, 3, 4, 5, 6}, o[6] = {0};
  graph *g = g_new();
  uint32_t tx = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 2, DIMS(2, 3));
  uint32_t to = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 3, DIMS(3, 1, 2));
  g_op(g, KILN_OP_RESHAPE, 1, IDS(tx), to, 3, DIMS(3, 1, 2), 0);
  CHECK(g_run(g, BUFS(x), BUFS(o), &err) == KILN_OK);
  CHECK(memcmp(x, o, sizeof x) == 0);
  free(g);
  uint8_t b[3] = {1, 0, 1}, ob[3] = {0};
  g = g_new();
  tx = g_tensor(g, KILN_STORE_INPUT, KILN_BOOL, 1, DIMS(3));
  to = g_tensor(g, KILN_STORE_OUTPUT, KILN_BOOL, 1, DIMS(3));
  g_op(g, KILN_OP_COPY, 1, IDS(tx), to, 0, NULL, 0);
  CHECK(g_run(g, BUFS(b), BUFS(ob), &err) == KILN_OK);
  CHECK(memcmp(b, ob, sizeof b) == 0);
  free(g);
}

static void test_permute(void) {
  /* x [2,3,4] permuted (2,0,1) -> [4,2,3]: out[i][j][k] = x[j][k][i] */
  int64_t x[24], o[24] = {0};
  for (int i = 0; i < 24; i++) x[i] = 100 + i;
  graph *g = g_new();
  uint32_t tx = g_tensor(g, KILN_STORE_INPUT, KILN_I64, 3, DIMS(2, 3, 4));
  uint32_t to = g_tensor(g, KILN_STORE_OUTPUT, KILN_I64, 3, DIMS(4, 2, 3));
  g_op(g, KILN_OP_PERMUTE, 1, IDS(tx), to, 3, DIMS(2, 0, 1), 0);
  CHECK(g_run(g, BUFS(x), BUFS(o), &err) == KILN_OK);
  int bad = 0;
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 2; j++)
      for (int k = 0; k < 3; k++) bad |= o[(i * 2 + j) * 3 + k] != x[(j * 3 + k) * 4 + i];
  CHECK(!bad);
  free(g);
  /* f16 transpose of [2,3] */
  uint16_t h[6] = {1, 2, 3, 4, 5, 6}, ho[6] = {0};
  g = g_new();
  tx = g_tensor(g, KILN_STORE_INPUT, KILN_F16, 2, DIMS(2, 3));
  to = g_tensor(g, KILN_STORE_OUTPUT, KILN_F16, 2, DIMS(3, 2));
  g_op(g, KILN_OP_PERMUTE, 1, IDS(tx), to, 2, DIMS(1, 0), 0);
  CHECK(g_run(g, BUFS(h), BUFS(ho), &err) == KILN_OK);
  CHECK(ho[0] == 1 && ho[1] == 4 && ho[2] == 2 && ho[3] == 5 && ho[4] == 3 && ho[5] == 6);
  free(g);
}

static void test_expand(void) {
  /* [3,1] -> [2,3,4]: a new leading dim and a broadcast trailing one */
  int32_t x[3] = {7, 8, 9}, o[24] = {0};
  graph *g = g_new();
  uint32_t tx = g_tensor(g, KILN_STORE_INPUT, KILN_I32, 2, DIMS(3, 1));
  uint32_t to = g_tensor(g, KILN_STORE_OUTPUT, KILN_I32, 3, DIMS(2, 3, 4));
  g_op(g, KILN_OP_EXPAND, 1, IDS(tx), to, 3, DIMS(2, 3, 4), 0);
  CHECK(g_run(g, BUFS(x), BUFS(o), &err) == KILN_OK);
  int bad = 0;
  for (int i = 0; i < 24; i++) bad |= o[i] != x[(i / 4) % 3];
  CHECK(!bad);
  free(g);
  float s = 2.5f, so[3] = {0};
  g = g_new();
  tx = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 0, NULL);
  to = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 1, DIMS(3));
  g_op(g, KILN_OP_EXPAND, 1, IDS(tx), to, 1, DIMS(3), 0);
  CHECK(g_run(g, BUFS(&s), BUFS(so), &err) == KILN_OK);
  CHECK(so[0] == 2.5f && so[1] == 2.5f && so[2] == 2.5f);
  free(g);
}

static void test_cat(void) {
  /* along dim 1: [2,1] ++ [2,0] ++ [2,2] -> [2,3] */
  float a[2] = {1, 4}, c[4] = {2, 3, 5, 6}, o[6] = {0};
  graph *g = g_new();
  uint32_t ta = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 2, DIMS(2, 1));
  uint32_t tb = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 2, DIMS(2, 0));
  uint32_t tc = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 2, DIMS(2, 2));
  uint32_t to = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 2, DIMS(2, 3));
  g_op(g, KILN_OP_CAT, 3, IDS(ta, tb, tc), to, 1, DIMS(1), 0);
  CHECK(g_run(g, BUFS(a, NULL, c), BUFS(o), &err) == KILN_OK);
  CHECK(o[0] == 1 && o[1] == 2 && o[2] == 3 && o[3] == 4 && o[4] == 5 && o[5] == 6);
  free(g);
  /* along dim 0 with i64 and a legacy 1-d empty operand */
  int64_t x[2] = {1, 2}, y[4] = {3, 4, 5, 6}, z[6] = {0};
  g = g_new();
  ta = g_tensor(g, KILN_STORE_INPUT, KILN_I64, 2, DIMS(1, 2));
  tb = g_tensor(g, KILN_STORE_INPUT, KILN_I64, 1, DIMS(0));
  tc = g_tensor(g, KILN_STORE_INPUT, KILN_I64, 2, DIMS(2, 2));
  to = g_tensor(g, KILN_STORE_OUTPUT, KILN_I64, 2, DIMS(3, 2));
  g_op(g, KILN_OP_CAT, 3, IDS(ta, tb, tc), to, 1, DIMS(0), 0);
  CHECK(g_run(g, BUFS(x, NULL, y), BUFS(z), &err) == KILN_OK);
  CHECK(z[0] == 1 && z[1] == 2 && z[2] == 3 && z[5] == 6);
  free(g);
  /* along dim 1 with a legacy 1-d empty operand, which has no dim 1 */
  float p[2] = {1, 4}, q[4] = {2, 3, 5, 6}, r[6] = {0};
  g = g_new();
  ta = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 2, DIMS(2, 1));
  tb = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 1, DIMS(0));
  tc = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 2, DIMS(2, 2));
  to = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 2, DIMS(2, 3));
  g_op(g, KILN_OP_CAT, 3, IDS(ta, tb, tc), to, 1, DIMS(1), 0);
  CHECK(g_run(g, BUFS(p, NULL, q), BUFS(r), &err) == KILN_OK);
  CHECK(r[0] == 1 && r[1] == 2 && r[2] == 3 && r[3] == 4 && r[4] == 5 && r[5] == 6);
  free(g);
}

static void test_slice_select(void) {
  /* x [5,4]: rows 1 and 3 (start 1, end 5, step 2) */
  float x[20], o[8] = {0};
  for (int i = 0; i < 20; i++) x[i] = (float)i;
  graph *g = g_new();
  uint32_t tx = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 2, DIMS(5, 4));
  uint32_t to = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 2, DIMS(2, 4));
  g_op(g, KILN_OP_SLICE, 1, IDS(tx), to, 4, DIMS(0, 1, 5, 2), 0);
  CHECK(g_run(g, BUFS(x), BUFS(o), &err) == KILN_OK);
  CHECK(o[0] == 4 && o[3] == 7 && o[4] == 12 && o[7] == 15);
  free(g);
  /* columns 1..3 of each row (dim 1, start 1, end 3, step 1), bf16 */
  uint16_t h[20], ho[10] = {0};
  for (int i = 0; i < 20; i++) h[i] = (uint16_t)i;
  g = g_new();
  tx = g_tensor(g, KILN_STORE_INPUT, KILN_BF16, 2, DIMS(5, 4));
  to = g_tensor(g, KILN_STORE_OUTPUT, KILN_BF16, 2, DIMS(5, 2));
  g_op(g, KILN_OP_SLICE, 1, IDS(tx), to, 4, DIMS(1, 1, 3, 1), 0);
  CHECK(g_run(g, BUFS(h), BUFS(ho), &err) == KILN_OK);
  CHECK(ho[0] == 1 && ho[1] == 2 && ho[2] == 5 && ho[9] == 18);
  free(g);
  /* an empty slice */
  g = g_new();
  tx = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 2, DIMS(5, 4));
  to = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 2, DIMS(0, 4));
  g_op(g, KILN_OP_SLICE, 1, IDS(tx), to, 4, DIMS(0, 5, 5, 1), 0);
  CHECK(g_run(g, BUFS(x), BUFS(NULL), &err) == KILN_OK);
  free(g);
  /* select column 2 of [5,4] -> [5]; select row 4 */
  g = g_new();
  tx = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 2, DIMS(5, 4));
  to = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 1, DIMS(5));
  g_op(g, KILN_OP_SELECT, 1, IDS(tx), to, 2, DIMS(1, 2), 0);
  CHECK(g_run(g, BUFS(x), BUFS(o), &err) == KILN_OK);
  CHECK(o[0] == 2 && o[1] == 6 && o[4] == 18);
  g->ops[0].iattr[0] = 0, g->ops[0].iattr[1] = 4;
  g->tensors[to].dims[0] = 4, g->tensors[to].nbytes = 16;
  CHECK(g_run(g, BUFS(x), BUFS(o), &err) == KILN_OK);
  CHECK(o[0] == 16 && o[3] == 19);
  free(g);
}

/* ---------------------------------------------------------------- embedding, index_select */

static void test_embedding(void) {
  float table[15];
  for (int i = 0; i < 15; i++) table[i] = (float)i * 0.5f; /* row r = {1.5r, 1.5r+.5, 1.5r+1} */
  graph *g = g_new();
  uint32_t tw = g_weight(g, KILN_F32, 2, DIMS(5, 3), table);
  uint32_t ti = g_tensor(g, KILN_STORE_INPUT, KILN_I64, 2, DIMS(2, 2));
  uint32_t to = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 3, DIMS(2, 2, 3));
  g_op(g, KILN_OP_EMBEDDING, 2, IDS(tw, ti), to, 0, NULL, 0);
  int64_t idx[4] = {4, 0, 2, 4};
  float o[12] = {0};
  CHECK(g_run(g, BUFS(idx), BUFS(o), &err) == KILN_OK);
  CHECK(o[0] == 6.0f && o[2] == 7.0f && o[3] == 0.0f && o[6] == 3.0f && o[11] == 7.0f);

  /* an index past the table is refused, naming the op and the index; nothing is written */
  int64_t past[4] = {1, 2, 3, 5};
  float untouched[12];
  for (int i = 0; i < 12; i++) untouched[i] = -1.0f;
  CHECK(g_run(g, BUFS(past), BUFS(untouched), &err) == KILN_ERR_INVALID_ARGUMENT);
  CHECK_STR(err.message, "op 0 (embedding): index 5 at element 3 is outside the 5 rows; pass "
                         "indices from 0 to rows-1");
  CHECK(untouched[0] == -1.0f && untouched[11] == -1.0f);
  int64_t negative[4] = {0, -1, 0, 0};
  CHECK(g_run(g, BUFS(negative), BUFS(o), &err) == KILN_ERR_INVALID_ARGUMENT);
  CHECK_STR(err.message, "op 0 (embedding): index -1 at element 1 is outside the 5 rows; pass "
                         "indices from 0 to rows-1");
  free(g);

  /* i32 indices, bf16 table */
  uint16_t ht[6] = {1, 2, 3, 4, 5, 6}, ho[6] = {0};
  int32_t i32[3] = {2, 2, 0};
  g = g_new();
  tw = g_tensor(g, KILN_STORE_INPUT, KILN_BF16, 2, DIMS(3, 2));
  ti = g_tensor(g, KILN_STORE_INPUT, KILN_I32, 1, DIMS(3));
  to = g_tensor(g, KILN_STORE_OUTPUT, KILN_BF16, 2, DIMS(3, 2));
  g_op(g, KILN_OP_EMBEDDING, 2, IDS(tw, ti), to, 0, NULL, 0);
  CHECK(g_run(g, BUFS(ht, i32), BUFS(ho), &err) == KILN_OK);
  CHECK(ho[0] == 5 && ho[1] == 6 && ho[2] == 5 && ho[4] == 1 && ho[5] == 2);
  i32[1] = INT32_MIN;
  CHECK(g_run(g, BUFS(ht, i32), BUFS(ho), &err) == KILN_ERR_INVALID_ARGUMENT);
  CHECK_STR(err.message, "op 0 (embedding): index -2147483648 at element 1 is outside the 3 "
                         "rows; pass indices from 0 to rows-1");
  free(g);
}

static void test_index_select(void) {
  /* x [3,4], dim 1, idx [3,0,3] -> [3,3] */
  int32_t x[12], o[9] = {0};
  for (int i = 0; i < 12; i++) x[i] = i;
  int64_t idx[3] = {3, 0, 3};
  graph *g = g_new();
  uint32_t tx = g_tensor(g, KILN_STORE_INPUT, KILN_I32, 2, DIMS(3, 4));
  uint32_t ti = g_tensor(g, KILN_STORE_INPUT, KILN_I64, 1, DIMS(3));
  uint32_t to = g_tensor(g, KILN_STORE_OUTPUT, KILN_I32, 2, DIMS(3, 3));
  g_op(g, KILN_OP_INDEX_SELECT, 2, IDS(tx, ti), to, 1, DIMS(1), 0);
  CHECK(g_run(g, BUFS(x, idx), BUFS(o), &err) == KILN_OK);
  CHECK(o[0] == 3 && o[1] == 0 && o[2] == 3 && o[3] == 7 && o[8] == 11);
  idx[2] = 4;
  CHECK(g_run(g, BUFS(x, idx), BUFS(o), &err) == KILN_ERR_INVALID_ARGUMENT);
  CHECK_STR(err.message, "op 0 (index_select): index 4 at element 2 is outside the 4 rows; "
                         "pass indices from 0 to rows-1");
  free(g);
  /* dim 0 with i32 indices */
  int32_t rows[2] = {2, 1}, r[8] = {0};
  g = g_new();
  tx = g_tensor(g, KILN_STORE_INPUT, KILN_I32, 2, DIMS(3, 4));
  ti = g_tensor(g, KILN_STORE_INPUT, KILN_I32, 1, DIMS(2));
  to = g_tensor(g, KILN_STORE_OUTPUT, KILN_I32, 2, DIMS(2, 4));
  g_op(g, KILN_OP_INDEX_SELECT, 2, IDS(tx, ti), to, 1, DIMS(0), 0);
  CHECK(g_run(g, BUFS(x, rows), BUFS(r), &err) == KILN_OK);
  CHECK(r[0] == 8 && r[3] == 11 && r[4] == 4 && r[7] == 7);
  free(g);
}

/* ---------------------------------------------------------------- cumsum */

static void test_cumsum(void) {
  /* f32 [2,3] along dim 1 and dim 0 */
  float x[6] = {1, 2, 3, 4, 5, 6}, o[6] = {0};
  graph *g = g_new();
  uint32_t tx = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 2, DIMS(2, 3));
  uint32_t to = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 2, DIMS(2, 3));
  kiln_op *op = g_op(g, KILN_OP_CUMSUM, 1, IDS(tx), to, 2, DIMS(1, KILN_F32), 0);
  CHECK(g_run(g, BUFS(x), BUFS(o), &err) == KILN_OK);
  CHECK(o[0] == 1 && o[1] == 3 && o[2] == 6 && o[3] == 4 && o[4] == 9 && o[5] == 15);
  op->iattr[0] = 0;
  CHECK(g_run(g, BUFS(x), BUFS(o), &err) == KILN_OK);
  CHECK(o[0] == 1 && o[2] == 3 && o[3] == 5 && o[4] == 7 && o[5] == 9);
  op->iattr[1] = KILN_F16; /* the sum dtype must be the output's */
  CHECK(g_run(g, BUFS(x), BUFS(o), &err) == KILN_ERR_INVALID_PROGRAM);
  op->iattr[1] = KILN_F32;
  op->iattr[0] = 2;
  CHECK(g_run(g, BUFS(x), BUFS(o), &err) == KILN_ERR_INVALID_PROGRAM);
  free(g);

  /* bool attention mask to i64 positions, as transformers counts them */
  uint8_t keep[5] = {1, 0, 1, 1, 0};
  int64_t pos[5] = {0};
  g = g_new();
  tx = g_tensor(g, KILN_STORE_INPUT, KILN_BOOL, 2, DIMS(1, 5));
  to = g_tensor(g, KILN_STORE_OUTPUT, KILN_I64, 2, DIMS(1, 5));
  g_op(g, KILN_OP_CUMSUM, 1, IDS(tx), to, 2, DIMS(1, KILN_I64), 0);
  CHECK(g_run(g, BUFS(keep), BUFS(pos), &err) == KILN_OK);
  CHECK(pos[0] == 1 && pos[1] == 1 && pos[2] == 2 && pos[3] == 3 && pos[4] == 3);
  free(g);

  /* i32 wraps like PyTorch's; the middle dim of [2,2,2] */
  int32_t w[8] = {INT32_MAX, 5, 1, 7, -3, 0, 2, 1}, wo[8] = {0};
  g = g_new();
  tx = g_tensor(g, KILN_STORE_INPUT, KILN_I32, 3, DIMS(2, 2, 2));
  to = g_tensor(g, KILN_STORE_OUTPUT, KILN_I32, 3, DIMS(2, 2, 2));
  g_op(g, KILN_OP_CUMSUM, 1, IDS(tx), to, 2, DIMS(1, KILN_I32), 0);
  CHECK(g_run(g, BUFS(w), BUFS(wo), &err) == KILN_OK);
  CHECK(wo[0] == INT32_MAX && wo[1] == 5 && wo[2] == INT32_MIN && wo[3] == 12);
  CHECK(wo[4] == -3 && wo[5] == 0 && wo[6] == -1 && wo[7] == 1);
  free(g);

  /* i64 summed as f16, the input converted first */
  int64_t n[3] = {2049, 1, 1};
  uint16_t h[3] = {0};
  g = g_new();
  tx = g_tensor(g, KILN_STORE_INPUT, KILN_I64, 1, DIMS(3));
  to = g_tensor(g, KILN_STORE_OUTPUT, KILN_F16, 1, DIMS(3));
  g_op(g, KILN_OP_CUMSUM, 1, IDS(tx), to, 2, DIMS(0, KILN_F16), 0);
  CHECK(g_run(g, BUFS(n), BUFS(h), &err) == KILN_OK);
  /* 2049 is 2048 in f16, so the prefixes are 2048, 2049 (held as 2048) and 2050, as in
   * PyTorch; summing before converting would give 2048, 2050, 2052 */
  CHECK(kiln_f16_to_f32(h[0]) == 2048.0f && kiln_f16_to_f32(h[1]) == 2048.0f &&
        kiln_f16_to_f32(h[2]) == 2050.0f);
  free(g);
}

/* ---------------------------------------------------------------- gather, index */

static void test_gather(void) {
  /* x [2,3] = 0..5 along dim 1: out[i][j] = x[i][idx[i][j]] */
  float x[6] = {0, 1, 2, 3, 4, 5}, o[4] = {0};
  int64_t idx[4] = {2, 0, 1, 1};
  graph *g = g_new();
  uint32_t tx = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 2, DIMS(2, 3));
  uint32_t ti = g_tensor(g, KILN_STORE_INPUT, KILN_I64, 2, DIMS(2, 2));
  uint32_t to = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 2, DIMS(2, 2));
  g_op(g, KILN_OP_GATHER, 2, IDS(tx, ti), to, 1, DIMS(1), 0);
  CHECK(g_run(g, BUFS(x, idx), BUFS(o), &err) == KILN_OK);
  CHECK(o[0] == 2 && o[1] == 0 && o[2] == 4 && o[3] == 4);

  /* an index outside the dim is refused before anything is written; so is a negative one */
  int64_t past[4] = {0, 1, 3, 0}, negative[4] = {0, -1, 0, 0};
  float untouched[4] = {-7, -7, -7, -7};
  CHECK(g_run(g, BUFS(x, past), BUFS(untouched), &err) == KILN_ERR_INVALID_ARGUMENT);
  CHECK_STR(err.message, "op 0 (gather): index 3 at element 2 of input 1 is outside 0..2 of dim "
                         "1; pass indices in that range");
  CHECK(untouched[0] == -7 && untouched[3] == -7);
  CHECK(g_run(g, BUFS(x, negative), BUFS(untouched), &err) == KILN_ERR_INVALID_ARGUMENT);
  CHECK_STR(err.message, "op 0 (gather): index -1 at element 1 of input 1 is outside 0..2 of dim "
                         "1; pass indices in that range");
  free(g);

  /* dim 0, i32 indices, fewer columns than x: BERT's token type ids gathered from a buffer */
  int64_t buf[8] = {10, 11, 12, 13, 20, 21, 22, 23}, r[3] = {0};
  int32_t rows[3] = {1, 0, 1};
  g = g_new();
  tx = g_tensor(g, KILN_STORE_INPUT, KILN_I64, 2, DIMS(2, 4));
  ti = g_tensor(g, KILN_STORE_INPUT, KILN_I32, 2, DIMS(1, 3));
  to = g_tensor(g, KILN_STORE_OUTPUT, KILN_I64, 2, DIMS(1, 3));
  g_op(g, KILN_OP_GATHER, 2, IDS(tx, ti), to, 1, DIMS(0), 0);
  CHECK(g_run(g, BUFS(buf, rows), BUFS(r), &err) == KILN_OK);
  CHECK(r[0] == 20 && r[1] == 11 && r[2] == 22);
  g->tensors[ti].dims[1] = 5, g->tensors[to].dims[1] = 5; /* wider than x: refused at init */
  g->tensors[ti].nbytes = 20, g->tensors[to].nbytes = 40;
  CHECK(g_run(g, BUFS(buf, rows), BUFS(r), &err) == KILN_ERR_INVALID_PROGRAM);
  free(g);
}

static void test_index(void) {
  float x[24], o[24] = {0};
  for (int i = 0; i < 24; i++) x[i] = (float)i;

  /* rows of x [4,5] = 0..19, a negative index counting from the end */
  int64_t rows[3] = {3, -1, 0};
  graph *g = g_new();
  uint32_t tx = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 2, DIMS(4, 5));
  uint32_t ti = g_tensor(g, KILN_STORE_INPUT, KILN_I64, 1, DIMS(3));
  uint32_t to = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 2, DIMS(3, 5));
  g_op(g, KILN_OP_INDEX, 2, IDS(tx, ti), to, 1, DIMS(1), 0);
  CHECK(g_run(g, BUFS(x, rows), BUFS(o), &err) == KILN_OK);
  CHECK(o[0] == 15 && o[4] == 19 && o[5] == 15 && o[10] == 0 && o[14] == 4);
  int64_t past[3] = {0, 4, 0}, below[3] = {-5, 0, 0};
  float untouched[15];
  for (int i = 0; i < 15; i++) untouched[i] = -1.0f;
  CHECK(g_run(g, BUFS(x, past), BUFS(untouched), &err) == KILN_ERR_INVALID_ARGUMENT);
  CHECK_STR(err.message, "op 0 (index): index 4 at element 1 of input 1 is outside -4..3 of dim "
                         "0; pass indices in that range");
  CHECK(untouched[0] == -1.0f && untouched[14] == -1.0f);
  CHECK(g_run(g, BUFS(x, below), BUFS(untouched), &err) == KILN_ERR_INVALID_ARGUMENT);
  CHECK_STR(err.message, "op 0 (index): index -5 at element 0 of input 1 is outside -4..3 of dim "
                         "0; pass indices in that range");
  free(g);

  /* two index inputs broadcasting [2,1] with [1,3] over x [2,3]: out[i][j] = x[a[i]][b[j]] */
  int64_t a[2] = {0, 1};
  int32_t b[3] = {2, 0, 1};
  g = g_new();
  tx = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 2, DIMS(2, 3));
  ti = g_tensor(g, KILN_STORE_INPUT, KILN_I64, 2, DIMS(2, 1));
  uint32_t tj = g_tensor(g, KILN_STORE_INPUT, KILN_I32, 2, DIMS(1, 3));
  to = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 2, DIMS(2, 3));
  g_op(g, KILN_OP_INDEX, 3, IDS(tx, ti, tj), to, 1, DIMS(3), 0);
  CHECK(g_run(g, BUFS(x, a, b), BUFS(o), &err) == KILN_OK);
  CHECK(o[0] == 2 && o[1] == 0 && o[2] == 1 && o[3] == 5 && o[4] == 3 && o[5] == 4);
  b[2] = 3;
  CHECK(g_run(g, BUFS(x, a, b), BUFS(o), &err) == KILN_ERR_INVALID_ARGUMENT);
  CHECK_STR(err.message, "op 0 (index): index 3 at element 2 of input 2 is outside -3..2 of dim "
                         "1; pass indices in that range");
  free(g);

  /* dims 0 and 2 of x [2,3,4] are apart: B [2] leads, out[k][j] = x[p[k]][j][q[k]] */
  int64_t p[2] = {1, 0}, q[2] = {3, 0};
  g = g_new();
  tx = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 3, DIMS(2, 3, 4));
  ti = g_tensor(g, KILN_STORE_INPUT, KILN_I64, 1, DIMS(2));
  tj = g_tensor(g, KILN_STORE_INPUT, KILN_I64, 1, DIMS(2));
  to = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 2, DIMS(2, 3));
  g_op(g, KILN_OP_INDEX, 3, IDS(tx, ti, tj), to, 1, DIMS(5), 0);
  CHECK(g_run(g, BUFS(x, p, q), BUFS(o), &err) == KILN_OK);
  CHECK(o[0] == 15 && o[1] == 19 && o[2] == 23 && o[3] == 0 && o[4] == 4 && o[5] == 8);
  free(g);

  /* the middle dim of x [2,3,4] by a [2,2] index: B stays in place, out [2,2,2,4] */
  int64_t m[4] = {2, 0, 1, 1};
  g = g_new();
  tx = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 3, DIMS(2, 3, 4));
  ti = g_tensor(g, KILN_STORE_INPUT, KILN_I64, 2, DIMS(2, 2));
  to = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 4, DIMS(2, 2, 2, 4));
  kiln_op *op = g_op(g, KILN_OP_INDEX, 2, IDS(tx, ti), to, 1, DIMS(2), 0);
  float wide[32] = {0};
  CHECK(g_run(g, BUFS(x, m), BUFS(wide), &err) == KILN_OK);
  CHECK(wide[0] == 8 && wide[3] == 11 && wide[4] == 0 && wide[8] == 4 && wide[12] == 4);
  CHECK(wide[16] == 20 && wide[20] == 12 && wide[31] == 19);
  op->iattr[0] = 1; /* a mask that moves B changes the shape: refused at init */
  CHECK(g_run(g, BUFS(x, m), BUFS(wide), &err) == KILN_ERR_INVALID_PROGRAM);
  free(g);
}

/* ---------------------------------------------------------------- argmax */

static void test_argmax(void) {
  /* the first of equal maxima; NaN above every number */
  float x[8] = {1, 5, 5, 2, -1, -3, NAN, 0};
  int64_t o[2] = {-1, -1};
  graph *g = g_new();
  uint32_t tx = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 2, DIMS(2, 4));
  uint32_t to = g_tensor(g, KILN_STORE_OUTPUT, KILN_I64, 1, DIMS(2));
  g_op(g, KILN_OP_ARGMAX, 1, IDS(tx), to, 2, DIMS(1, 0), 0);
  CHECK(g_run(g, BUFS(x), BUFS(o), &err) == KILN_OK);
  CHECK(o[0] == 1 && o[1] == 2);
  free(g);

  /* dim 0 of i32 [3,2], keepdim */
  int32_t v[6] = {1, 9, 7, 9, 7, 2};
  g = g_new();
  tx = g_tensor(g, KILN_STORE_INPUT, KILN_I32, 2, DIMS(3, 2));
  to = g_tensor(g, KILN_STORE_OUTPUT, KILN_I64, 2, DIMS(1, 2));
  kiln_op *op = g_op(g, KILN_OP_ARGMAX, 1, IDS(tx), to, 2, DIMS(0, 1), 0);
  CHECK(g_run(g, BUFS(v), BUFS(o), &err) == KILN_OK);
  CHECK(o[0] == 1 && o[1] == 0);
  op->iattr[1] = 0; /* without keepdim the output would be [2] */
  CHECK(g_run(g, BUFS(v), BUFS(o), &err) == KILN_ERR_INVALID_PROGRAM);
  op->iattr[1] = 1;
  g->tensors[to].dtype = KILN_I32, g->tensors[to].nbytes = 8; /* indices are i64 */
  CHECK(g_run(g, BUFS(v), BUFS(o), &err) == KILN_ERR_INVALID_PROGRAM);
  free(g);
}

/* ---------------------------------------------------------------- linear, matmul */

static void linear_case(kiln_dtype dt, int has_bias, kiln_activation act, int64_t k_dim) {
  const int64_t n_dim = 4, rows = 6;
  void *x = alloc_buf(rows * k_dim, dt), *w = alloc_buf(n_dim * k_dim, dt);
  void *b = alloc_buf(n_dim, dt), *o = alloc_buf(rows * n_dim, dt);
  double want[24];
  fill_random(x, dt, rows * k_dim, 41, 1.0);
  fill_random(w, dt, n_dim * k_dim, 43, 1.0);
  fill_random(b, dt, n_dim, 47, 1.0);
  graph *g = g_new();
  uint32_t tx = g_tensor(g, KILN_STORE_INPUT, dt, 3, DIMS(2, 3, k_dim));
  uint32_t tw = g_tensor(g, KILN_STORE_INPUT, dt, 2, DIMS(n_dim, k_dim));
  uint32_t tb = g_tensor(g, KILN_STORE_INPUT, dt, 1, DIMS(n_dim));
  uint32_t to = g_tensor(g, KILN_STORE_OUTPUT, dt, 3, DIMS(2, 3, n_dim));
  g_op(g, KILN_OP_LINEAR, has_bias ? 3 : 2, IDS(tx, tw, tb), to, 1, (const int64_t[]){act}, 0);
  CHECK(g_run(g, BUFS(x, w, b), BUFS(o), &err) == KILN_OK);
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < n_dim; j++) {
      double acc = has_bias ? value_at(b, dt, j) : 0.0;
      for (int64_t k = 0; k < k_dim; k++)
        acc += value_at(x, dt, i * k_dim + k) * value_at(w, dt, j * k_dim + k);
      if (act == KILN_ACT_RELU) acc = acc > 0 ? acc : 0;
      if (act == KILN_ACT_GELU_ERF) acc = 0.5 * acc * (1 + erf(acc / sqrt(2.0)));
      if (act == KILN_ACT_GELU_TANH)
        acc = 0.5 * acc * (1 + tanh(sqrt(2.0 / M_PI) * (acc + 0.044715 * acc * acc * acc)));
      want[i * n_dim + j] = acc;
    }
  char what[64];
  snprintf(what, sizeof what, "linear K %d bias %d act %d %s", (int)k_dim, has_bias, (int)act,
           kiln_dtype_name(dt));
  CHECK_VALUES(what, o, dt, want, rows * n_dim);
  free(x), free(w), free(b), free(o), free(g);
}

/* SwiGLU: w [2N,K] is gate over up, out = silu(x gate^T) * (x up^T). */
static void linear_swiglu_case(kiln_dtype dt, int64_t k_dim) {
  const int64_t n_dim = 5, rows = 6;
  void *x = alloc_buf(rows * k_dim, dt), *w = alloc_buf(2 * n_dim * k_dim, dt);
  void *o = alloc_buf(rows * n_dim, dt);
  double want[30];
  fill_random(x, dt, rows * k_dim, 41, 1.0);
  fill_random(w, dt, 2 * n_dim * k_dim, 43, 1.0);
  graph *g = g_new();
  uint32_t tx = g_tensor(g, KILN_STORE_INPUT, dt, 3, DIMS(2, 3, k_dim));
  uint32_t tw = g_tensor(g, KILN_STORE_INPUT, dt, 2, DIMS(2 * n_dim, k_dim));
  uint32_t to = g_tensor(g, KILN_STORE_OUTPUT, dt, 3, DIMS(2, 3, n_dim));
  g_op(g, KILN_OP_LINEAR, 2, IDS(tx, tw), to, 1, (const int64_t[]){KILN_ACT_SWIGLU}, 0);
  CHECK(g_run(g, BUFS(x, w), BUFS(o), &err) == KILN_OK);
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < n_dim; j++) {
      double gate = 0.0, up = 0.0;
      for (int64_t k = 0; k < k_dim; k++) {
        gate += value_at(x, dt, i * k_dim + k) * value_at(w, dt, j * k_dim + k);
        up += value_at(x, dt, i * k_dim + k) * value_at(w, dt, (n_dim + j) * k_dim + k);
      }
      want[i * n_dim + j] = gate / (1.0 + exp(-gate)) * up;
    }
  char what[64];
  snprintf(what, sizeof what, "linear swiglu K %d %s", (int)k_dim, kiln_dtype_name(dt));
  CHECK_VALUES(what, o, dt, want, rows * n_dim);
  free(x), free(w), free(o), free(g);
}

static void test_linear(void) {
  for (int t = 0; t < 3; t++) {
    linear_swiglu_case(float_dtypes[t], 37);
    linear_swiglu_case(float_dtypes[t], 8);
  }
  for (int t = 0; t < 3; t++)
    for (int act = KILN_ACT_NONE; act <= KILN_ACT_GELU_TANH; act++) {
      linear_case(float_dtypes[t], 1, (kiln_activation)act, 37);
      linear_case(float_dtypes[t], 0, (kiln_activation)act, 5);
    }
  linear_case(KILN_F32, 1, KILN_ACT_GELU_ERF, 0); /* K = 0: the epilogue of the bias alone */
  /* hand case: [1,2] @ [[1,1],[2,-3]]^T + [0.5,0] -> [3.5,-4], relu -> [3.5,0] */
  float x[2] = {1, 2}, w[4] = {1, 1, 2, -3}, b[2] = {0.5f, 0}, o[2] = {0};
  graph *g = g_new();
  uint32_t tx = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 1, DIMS(2));
  uint32_t tw = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 2, DIMS(2, 2));
  uint32_t tb = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 1, DIMS(2));
  uint32_t to = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 1, DIMS(2));
  g_op(g, KILN_OP_LINEAR, 3, IDS(tx, tw, tb), to, 1, (const int64_t[]){KILN_ACT_NONE}, 0);
  CHECK(g_run(g, BUFS(x, w, b), BUFS(o), &err) == KILN_OK);
  CHECK(o[0] == 3.5f && o[1] == -4.0f);
  g->ops[0].iattr[0] = KILN_ACT_RELU;
  CHECK(g_run(g, BUFS(x, w, b), BUFS(o), &err) == KILN_OK);
  CHECK(o[0] == 3.5f && o[1] == 0.0f);
  free(g);
}

static void matmul_case(const char *what, kiln_dtype dt, int32_t ra, const int64_t *da, int32_t rb,
                        const int64_t *db, int32_t ro, const int64_t *dout) {
  int64_t na = count(ra, da), nb = count(rb, db), no = count(ro, dout);
  int64_t m = ra >= 2 ? da[ra - 2] : 1, k_dim = da[ra - 1], n = rb >= 2 ? db[rb - 1] : 1;
  int32_t brank = ro - (ra >= 2) - (rb >= 2);
  int64_t batches = count(brank, dout);
  void *a = alloc_buf(na, dt), *b = alloc_buf(nb, dt), *o = alloc_buf(no, dt);
  double *want = calloc((size_t)no + 1, sizeof(double));
  fill_random(a, dt, na, 53, 1.0);
  fill_random(b, dt, nb, 59, 1.0);
  graph *g = g_new();
  uint32_t ta = g_tensor(g, KILN_STORE_INPUT, dt, ra, da);
  uint32_t tb = g_tensor(g, KILN_STORE_INPUT, dt, rb, db);
  uint32_t to = g_tensor(g, KILN_STORE_OUTPUT, dt, ro, dout);
  g_op(g, KILN_OP_MATMUL, 2, IDS(ta, tb), to, 0, NULL, 0);
  CHECK(g_run(g, BUFS(a, b), BUFS(o), &err) == KILN_OK);
  int32_t rab = ra >= 2 ? ra - 2 : 0, rbb = rb >= 2 ? rb - 2 : 0;
  for (int64_t bi = 0; bi < batches; bi++) {
    int64_t abase = ref_bcast(bi, brank, dout, rab, da) * m * k_dim;
    int64_t bbase = ref_bcast(bi, brank, dout, rbb, db) * k_dim * n;
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) {
        double acc = 0;
        for (int64_t k = 0; k < k_dim; k++)
          acc += value_at(a, dt, abase + i * k_dim + k) * value_at(b, dt, bbase + k * n + j);
        want[(bi * m + i) * n + j] = acc;
      }
  }
  CHECK_VALUES(what, o, dt, want, no);
  free(a), free(b), free(o), free(want), free(g);
}

static void test_matmul(void) {
  for (int t = 0; t < 3; t++) {
    kiln_dtype dt = float_dtypes[t];
    matmul_case("matmul 2d", dt, 2, DIMS(3, 5), 2, DIMS(5, 4), 2, DIMS(3, 4));
    matmul_case("matmul batch broadcast", dt, 4, DIMS(2, 1, 3, 5), 3, DIMS(3, 5, 4), 4,
                DIMS(2, 3, 3, 4));
    matmul_case("matmul b batched", dt, 2, DIMS(3, 5), 3, DIMS(2, 5, 4), 3, DIMS(2, 3, 4));
    matmul_case("matmul vector a", dt, 1, DIMS(5), 3, DIMS(2, 5, 4), 2, DIMS(2, 4));
    matmul_case("matmul vector b", dt, 3, DIMS(2, 3, 5), 1, DIMS(5), 2, DIMS(2, 3));
    matmul_case("matmul dot", dt, 1, DIMS(64), 1, DIMS(64), 0, NULL);
    matmul_case("matmul K 0", dt, 2, DIMS(3, 0), 2, DIMS(0, 4), 2, DIMS(3, 4));
    matmul_case("matmul M 0", dt, 3, DIMS(2, 0, 5), 2, DIMS(5, 4), 3, DIMS(2, 0, 4));
  }
  /* hand case */
  float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8}, o[4] = {0};
  graph *g = g_new();
  uint32_t ta = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 2, DIMS(2, 2));
  uint32_t tb = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 2, DIMS(2, 2));
  uint32_t to = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 2, DIMS(2, 2));
  g_op(g, KILN_OP_MATMUL, 2, IDS(ta, tb), to, 0, NULL, 0);
  CHECK(g_run(g, BUFS(a, b), BUFS(o), &err) == KILN_OK);
  CHECK(o[0] == 19 && o[1] == 22 && o[2] == 43 && o[3] == 50);
  free(g);
}

/* ---------------------------------------------------------------- attention */

typedef struct attn_case {
  const char *what;
  kiln_dtype dt;
  int64_t qd[4], kd[4], vd[4]; /* [B,H,L,E], [B',H',S,E], [B',H',S,Ev] */
  int causal;
  double scale;
  kiln_dtype mask_dt; /* KILN_DTYPE_COUNT: no mask */
  int32_t mask_rank;
  int64_t md[4];
} attn_case;

static void sdpa_case(const attn_case *c) {
  kiln_dtype dt = c->dt;
  int64_t l_dim = c->qd[2], e_dim = c->qd[3], s_dim = c->kd[2], ev = c->vd[3];
  int64_t od[4] = {c->qd[0], c->qd[1], l_dim, ev};
  int64_t nq = count(4, c->qd), nk = count(4, c->kd), nv = count(4, c->vd), no = count(4, od);
  int has_mask = c->mask_dt != KILN_DTYPE_COUNT;
  int64_t nm = has_mask ? count(c->mask_rank, c->md) : 0;
  void *q = alloc_buf(nq, dt), *k = alloc_buf(nk, dt), *v = alloc_buf(nv, dt);
  void *o = alloc_buf(no, dt), *m = alloc_buf(nm, has_mask ? c->mask_dt : KILN_F32);
  double *want = calloc((size_t)no + 1, sizeof(double)),
         *p = calloc((size_t)s_dim + 1, sizeof(double));
  fill_random(q, dt, nq, 61, 2.0);
  fill_random(k, dt, nk, 67, 2.0);
  fill_random(v, dt, nv, 71, 2.0);
  uint32_t seed = 73;
  for (int64_t i = 0; has_mask && i < nm; i++) {
    double r = next_random(&seed);
    if (c->mask_dt == KILN_BOOL)
      ((uint8_t *)m)[i] = r > -0.4;
    else
      fill_value(m, c->mask_dt, i, r < -0.6 ? -INFINITY : 3.0 * r);
  }
  if (has_mask && c->mask_dt == KILN_BOOL)
    for (int64_t j = 0; j < c->md[c->mask_rank - 1] && c->mask_rank >= 2; j++)
      ((uint8_t *)m)[j] = 0; /* the mask's first row masks every key */
  graph *g = g_new();
  uint32_t ids[4] = {g_tensor(g, KILN_STORE_INPUT, dt, 4, c->qd),
                     g_tensor(g, KILN_STORE_INPUT, dt, 4, c->kd),
                     g_tensor(g, KILN_STORE_INPUT, dt, 4, c->vd), 0};
  if (has_mask) ids[3] = g_tensor(g, KILN_STORE_INPUT, c->mask_dt, c->mask_rank, c->md);
  uint32_t to = g_tensor(g, KILN_STORE_OUTPUT, dt, 4, od);
  g_op(g, KILN_OP_SDPA, has_mask ? 4 : 3, ids, to, 2, (const int64_t[]){c->causal, has_mask},
       c->scale);
  kiln_status st = g_run(g, BUFS(q, k, v, m), BUFS(o), &err);
  if (st != KILN_OK) fprintf(stderr, "%s: %s\n", c->what, err.message);
  CHECK(st == KILN_OK);
  double scale = c->scale != 0 ? c->scale : 1 / sqrt((double)e_dim);
  int64_t score_dims[4] = {od[0], od[1], l_dim, s_dim};
  for (int64_t b = 0; b < od[0] * od[1]; b++) {
    int64_t kb = ref_bcast(b, 2, od, 2, c->kd), vb = ref_bcast(b, 2, od, 2, c->vd);
    if (c->kd[1] > 1 && c->kd[1] < od[1]) /* grouped heads: query head h reads kv head h / g */
      kb = vb = (b / od[1]) * c->kd[1] + (b % od[1]) / (od[1] / c->kd[1]);
    for (int64_t i = 0; i < l_dim; i++) {
      double most = -INFINITY, sum = 0;
      for (int64_t j = 0; j < s_dim; j++) {
        double s = 0;
        for (int64_t e = 0; e < e_dim; e++)
          s += value_at(q, dt, (b * l_dim + i) * e_dim + e) *
               value_at(k, dt, (kb * s_dim + j) * e_dim + e);
        s *= scale;
        if (c->causal && j > i) s = -INFINITY;
        if (has_mask) {
          int64_t mi = ref_bcast((b * l_dim + i) * s_dim + j, 4, score_dims, c->mask_rank, c->md);
          if (c->mask_dt == KILN_BOOL)
            s = ((uint8_t *)m)[mi] ? s : -INFINITY;
          else
            s += value_at(m, c->mask_dt, mi);
        }
        p[j] = s;
        most = fmax(most, s);
      }
      for (int64_t j = 0; j < s_dim; j++) sum += p[j] = most == -INFINITY ? 0 : exp(p[j] - most);
      for (int64_t e = 0; e < ev; e++) {
        double acc = 0;
        for (int64_t j = 0; j < s_dim; j++)
          acc += p[j] * value_at(v, dt, (vb * s_dim + j) * ev + e);
        want[(b * l_dim + i) * ev + e] = sum > 0 ? acc / sum : 0.0;
      }
    }
  }
  CHECK_VALUES(c->what, o, dt, want, no);
  free(q), free(k), free(v), free(o), free(m), free(want), free(p), free(g);
}

static void test_sdpa(void) {
  const kiln_dtype none = KILN_DTYPE_COUNT;
  for (int t = 0; t < 3; t++) {
    kiln_dtype dt = float_dtypes[t];
    const attn_case cases[] = {
        {"sdpa plain", dt, {2, 2, 3, 8}, {2, 2, 5, 8}, {2, 2, 5, 6}, 0, 0.0, none, 0, {0}},
        {"sdpa scale", dt, {1, 2, 4, 8}, {1, 2, 4, 8}, {1, 2, 4, 8}, 0, 0.3, none, 0, {0}},
        {"sdpa causal L<S", dt, {2, 2, 3, 8}, {2, 2, 5, 8}, {2, 2, 5, 4}, 1, 0.0, none, 0, {0}},
        {"sdpa causal L>S", dt, {1, 2, 6, 4}, {1, 2, 3, 4}, {1, 2, 3, 4}, 1, 0.0, none, 0, {0}},
        {"sdpa kv broadcast", dt, {2, 3, 4, 8}, {2, 1, 6, 8}, {2, 1, 6, 8}, 0, 0.0, none, 0, {0}},
        {"sdpa grouped heads", dt, {2, 6, 3, 8}, {2, 2, 5, 8}, {2, 2, 5, 4}, 0, 0.0, none, 0, {0}},
        {"sdpa grouped causal", dt, {1, 4, 5, 8}, {1, 2, 5, 8}, {1, 2, 5, 8}, 1, 0.0, none, 0, {0}},
        {"sdpa grouped bool mask",
         dt,
         {2, 4, 3, 8},
         {2, 1, 5, 8},
         {2, 1, 5, 8},
         0,
         0.0,
         KILN_BOOL,
         4,
         {1, 1, 3, 5}},
        {"sdpa grouped float mask",
         dt,
         {1, 8, 2, 4},
         {1, 2, 6, 4},
         {1, 2, 6, 4},
         0,
         0.0,
         dt,
         4,
         {1, 8, 2, 6}},
        {"sdpa bool mask",
         dt,
         {2, 2, 3, 8},
         {2, 2, 5, 8},
         {2, 2, 5, 8},
         0,
         0.0,
         KILN_BOOL,
         2,
         {3, 5}},
        {"sdpa bool mask causal",
         dt,
         {1, 2, 4, 8},
         {1, 2, 4, 8},
         {1, 2, 4, 8},
         1,
         0.0,
         KILN_BOOL,
         4,
         {1, 2, 4, 4}},
        {"sdpa float mask",
         dt,
         {2, 2, 3, 8},
         {2, 2, 5, 8},
         {2, 2, 5, 8},
         0,
         0.0,
         dt,
         4,
         {2, 1, 3, 5}},
        {"sdpa float mask row",
         dt,
         {2, 2, 3, 8},
         {2, 2, 5, 8},
         {2, 2, 5, 8},
         0,
         0.0,
         KILN_F32,
         1,
         {5}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) sdpa_case(&cases[i]);
  }
  /* hand case: one query, two keys with equal scores -> the mean of the values; a fully masked
   * row -> zeros, as PyTorch's math attention gives */
  float q[2] = {1, 0}, k[4] = {1, 0, 1, 0}, v[4] = {2, 4, 6, 8}, o[2] = {9, 9};
  uint8_t keep[2] = {0, 0};
  graph *g = g_new();
  uint32_t tq = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 2, DIMS(1, 2));
  uint32_t tk = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 2, DIMS(2, 2));
  uint32_t tv = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 2, DIMS(2, 2));
  uint32_t tm = g_tensor(g, KILN_STORE_INPUT, KILN_BOOL, 2, DIMS(1, 2));
  uint32_t to = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 2, DIMS(1, 2));
  g_op(g, KILN_OP_SDPA, 3, IDS(tq, tk, tv, tm), to, 2, DIMS(0, 0), 0);
  CHECK(g_run(g, BUFS(q, k, v, keep), BUFS(o), &err) == KILN_OK);
  CHECK(o[0] == 4.0f && o[1] == 6.0f);
  g->ops[0].n_inputs = 4;
  g->ops[0].inputs[3] = tm;
  g->ops[0].iattr[1] = 1;
  CHECK(g_run(g, BUFS(q, k, v, keep), BUFS(o), &err) == KILN_OK);
  CHECK(o[0] == 0.0f && o[1] == 0.0f);
  keep[1] = 1;
  CHECK(g_run(g, BUFS(q, k, v, keep), BUFS(o), &err) == KILN_OK);
  CHECK(o[0] == 6.0f && o[1] == 8.0f);
  free(g);
}

int main(void) {
  test_binary_hand();
  test_binary_broadcasting();
  test_binary_integers();
  test_unary();
  test_min_max();
  test_clamp();
  test_compare_floats();
  test_compare_integers();
  test_logical();
  test_bitwise();
  test_cast();
  test_where();
  test_softmax();
  test_norms();
  test_reduce();
  test_reshape_copy();
  test_permute();
  test_expand();
  test_cat();
  test_slice_select();
  test_embedding();
  test_index_select();
  test_cumsum();
  test_gather();
  test_index();
  test_argmax();
  test_linear();
  test_matmul();
  test_sdpa();
  return check_report("test_cpu_ops");
}
