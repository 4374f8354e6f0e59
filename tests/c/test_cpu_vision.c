/* The vision ops of the CPU reference engine (convolution, batch norm, pooling, resize)
 * against hand-computed values and against references written here from the definitions:
 * a transposed convolution as the scatter it is defined by, the others as plain sums over
 * their windows. Plus the builder's batch-norm fold, checked against the unfolded plan. */
#include "test_cpu_harness.h"

#include "kiln/kiln.h"

static kiln_error err;

#define DIMS(...) ((const int64_t[]){__VA_ARGS__})
#define IDS(...) ((const uint32_t[]){__VA_ARGS__})
#define BUFS(...) ((void *const[]){__VA_ARGS__})
#define ATTRS(...) ((const int64_t[]){__VA_ARGS__})
#define P KILN_PAIR

static const kiln_dtype float_dtypes[3] = {KILN_F32, KILN_F16, KILN_BF16};

static int64_t count(int32_t rank, const int64_t *dims) {
  int64_t n = 1;
  for (int32_t d = 0; d < rank; d++) n *= dims[d];
  return n;
}

static void *buf(int64_t n, kiln_dtype dt) {
  void *p = calloc((size_t)(n > 0 ? n : 1), kiln_dtype_size(dt));
  if (!p) {
    fprintf(stderr, "out of memory\n");
    exit(2);
  }
  return p;
}

static void *floats(kiln_dtype dt, int64_t n, const double *values) {
  void *p = buf(n, dt);
  for (int64_t i = 0; i < n; i++) fill_value(p, dt, i, values[i]);
  return p;
}

/* Runs one op on inputs given as buffers (all graph inputs) and checks its output. */
static void run_one(const char *what, kiln_op_kind kind, kiln_dtype dt, uint32_t n_in,
                    const int32_t *ranks, const int64_t *const *dims, void *const *inputs,
                    int32_t out_rank, const int64_t *out_dims, uint32_t n_iattr,
                    const int64_t *iattr, double f0, double f1, const double *want) {
  graph *g = g_new();
  uint32_t ids[KILN_MAX_OP_INPUTS];
  for (uint32_t k = 0; k < n_in; k++) ids[k] = g_tensor(g, KILN_STORE_INPUT, dt, ranks[k], dims[k]);
  uint32_t out = g_tensor(g, KILN_STORE_OUTPUT, dt, out_rank, out_dims);
  kiln_op *op = g_op(g, kind, n_in, ids, out, n_iattr, iattr, f0);
  op->fattr[1] = f1;
  int64_t n = count(out_rank, out_dims);
  void *o = buf(n, dt);
  kiln_status st = g_run(g, inputs, BUFS(o), &err);
  if (st != KILN_OK) fprintf(stderr, "%s: %s\n", what, err.message);
  CHECK(st == KILN_OK);
  if (st == KILN_OK) CHECK_VALUES(what, o, dt, want, n);
  free(o);
  free(g);
}

/* ---------------------------------------------------------------- convolution */

typedef struct conv_case {
  const char *what;
  int spatial, transposed;
  int64_t n, c, h, w, o, kh, kw;
  int64_t sh, sw, ph, pw, dh, dw, oph, opw, groups;
  int bias;
} conv_case;

static int64_t conv_out(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d, int64_t op, int t) {
  return t ? (in - 1) * s - 2 * p + d * (k - 1) + op + 1 : (in + 2 * p - d * (k - 1) - 1) / s + 1;
}

/* want[] from the definitions: a gather for CONV, a scatter for CONV_TRANSPOSE. */
static void conv_reference(const conv_case *c, const void *x, const void *w, const void *b,
                           kiln_dtype dt, int64_t oh, int64_t ow, double *want) {
  int64_t cpg = c->c / c->groups, opg = c->o / c->groups;
  int64_t total = c->n * c->o * oh * ow;
  for (int64_t i = 0; i < total; i++) want[i] = c->bias ? value_at(b, dt, (i / (oh * ow)) % c->o) : 0;
  for (int64_t n = 0; n < c->n; n++)
    for (int64_t g = 0; g < c->groups; g++)
      for (int64_t oc = 0; oc < opg; oc++)
        for (int64_t ic = 0; ic < cpg; ic++)
          for (int64_t kh = 0; kh < c->kh; kh++)
            for (int64_t kw = 0; kw < c->kw; kw++) {
              int64_t o = g * opg + oc, ci = g * cpg + ic;
              double wv = c->transposed
                              ? value_at(w, dt, ((ci * opg + oc) * c->kh + kh) * c->kw + kw)
                              : value_at(w, dt, ((o * cpg + ic) * c->kh + kh) * c->kw + kw);
              if (!c->transposed) {
                for (int64_t y = 0; y < oh; y++)
                  for (int64_t z = 0; z < ow; z++) {
                    int64_t iy = y * c->sh - c->ph + kh * c->dh, iz = z * c->sw - c->pw + kw * c->dw;
                    if (iy < 0 || iy >= c->h || iz < 0 || iz >= c->w) continue;
                    want[((n * c->o + o) * oh + y) * ow + z] +=
                        wv * value_at(x, dt, ((n * c->c + ci) * c->h + iy) * c->w + iz);
                  }
              } else {
                for (int64_t iy = 0; iy < c->h; iy++)
                  for (int64_t iz = 0; iz < c->w; iz++) {
                    int64_t y = iy * c->sh - c->ph + kh * c->dh, z = iz * c->sw - c->pw + kw * c->dw;
                    if (y < 0 || y >= oh || z < 0 || z >= ow) continue;
                    want[((n * c->o + o) * oh + y) * ow + z] +=
                        wv * value_at(x, dt, ((n * c->c + ci) * c->h + iy) * c->w + iz);
                  }
              }
            }
}

static void conv_run(const conv_case *c, kiln_dtype dt) {
  int32_t r = c->spatial + 2;
  int64_t oh = conv_out(c->h, c->kh, c->sh, c->ph, c->dh, c->oph, c->transposed);
  int64_t ow = conv_out(c->w, c->kw, c->sw, c->pw, c->dw, c->opw, c->transposed);
  int64_t xd[4] = {c->n, c->c, c->h, c->w}, od[4] = {c->n, c->o, oh, ow};
  int64_t wd[4] = {c->transposed ? c->c : c->o, c->transposed ? c->o / c->groups : c->c / c->groups,
                   c->kh, c->kw};
  int64_t bd[1] = {c->o};
  if (c->spatial == 1) xd[2] = xd[3], od[2] = od[3], wd[2] = wd[3];
  int64_t nx = count(r, xd), nw = count(r, wd), no = count(r, od);
  void *x = buf(nx, dt), *w = buf(nw, dt), *b = buf(c->o, dt);
  double *want = calloc((size_t)no, sizeof *want);
  fill_random(x, dt, nx, 3, 2.0);
  fill_random(w, dt, nw, 5, 1.0);
  fill_random(b, dt, c->o, 7, 1.0);
  conv_reference(c, x, w, b, dt, oh, ow, want);
  const int64_t iattr[6] = {P(c->sh, c->sw), P(c->ph, c->pw), P(c->dh, c->dw), c->groups, c->bias,
                            P(c->oph, c->opw)};
  const int32_t ranks[3] = {r, r, 1};
  const int64_t *dims[3] = {xd, wd, bd};
  char what[96];
  snprintf(what, sizeof what, "%s %s", c->what, kiln_dtype_name(dt));
  run_one(what, c->transposed ? KILN_OP_CONV_TRANSPOSE : KILN_OP_CONV, dt, 2u + (uint32_t)c->bias,
          ranks, dims, BUFS(x, w, b), r, od, c->transposed ? 6 : 5, iattr, 0, 0, want);
  free(x), free(w), free(b), free(want);
}

static void test_conv_hand(void) {
  /* 1..9 in 3x3 with kernel [[1,2],[3,4]] and bias 0.5 */
  void *x = floats(KILN_F32, 9, (const double[]){1, 2, 3, 4, 5, 6, 7, 8, 9});
  void *w = floats(KILN_F32, 4, (const double[]){1, 2, 3, 4});
  void *b = floats(KILN_F32, 1, (const double[]){0.5});
  const int32_t ranks[3] = {4, 4, 1};
  const int64_t *dims[3] = {DIMS(1, 1, 3, 3), DIMS(1, 1, 2, 2), DIMS(1)};
  run_one("conv hand", KILN_OP_CONV, KILN_F32, 3, ranks, dims, BUFS(x, w, b), 4, DIMS(1, 1, 2, 2),
          5, ATTRS(P(1, 1), P(0, 0), P(1, 1), 1, 1), 0, 0, (const double[]){37.5, 47.5, 67.5, 77.5});
  /* transposed, stride 2: each input scatters the kernel times itself into its own 2x2 block */
  void *t = floats(KILN_F32, 4, (const double[]){1, 2, 3, 4});
  const int64_t *tdims[2] = {DIMS(1, 1, 2, 2), DIMS(1, 1, 2, 2)};
  run_one("conv_transpose hand", KILN_OP_CONV_TRANSPOSE, KILN_F32, 2, ranks, tdims, BUFS(t, w), 4,
          DIMS(1, 1, 4, 4), 6, ATTRS(P(2, 2), P(0, 0), P(1, 1), 1, 0, P(0, 0)), 0, 0,
          (const double[]){1, 2, 2, 4, 3, 4, 6, 8, 3, 6, 4, 8, 9, 12, 12, 16});
  free(x), free(w), free(b), free(t);
}

static void test_conv_reference(void) {
  static const conv_case cases[] = {
      {"conv 2-d strided padded dilated grouped", 2, 0, 2, 4, 7, 6, 6, 3, 2, 2, 1, 1, 2, 2, 1, 0, 0, 2, 1},
      {"conv 2-d depthwise", 2, 0, 1, 3, 5, 5, 3, 3, 3, 1, 1, 1, 1, 1, 1, 0, 0, 3, 0},
      {"conv 2-d pointwise", 2, 0, 2, 5, 3, 4, 6, 1, 1, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1},
      {"conv 1-d", 1, 0, 2, 3, 1, 9, 4, 1, 3, 1, 2, 0, 1, 1, 2, 0, 0, 1, 1},
      {"conv_transpose 2-d", 2, 1, 1, 4, 3, 4, 6, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 2, 1},
      {"conv_transpose dilated", 2, 1, 2, 2, 4, 3, 2, 2, 3, 1, 2, 0, 1, 2, 1, 0, 1, 1, 0},
      {"conv_transpose 1-d", 1, 1, 1, 2, 1, 5, 3, 1, 4, 1, 3, 0, 1, 1, 1, 0, 2, 1, 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    for (int d = 0; d < 3; d++) conv_run(&cases[i], float_dtypes[d]);
}

/* dst = src with dim 1 moved last: NCHW to NHWC (NCW to NWC), in doubles. */
static void to_channels_last(const double *src, double *dst, int32_t rank, const int64_t *dims) {
  int64_t n = dims[0], c = dims[1], inner = 1;
  for (int32_t d = 2; d < rank; d++) inner *= dims[d];
  for (int64_t a = 0; a < n; a++)
    for (int64_t k = 0; k < c; k++)
      for (int64_t i = 0; i < inner; i++) dst[(a * inner + i) * c + k] = src[(a * c + k) * inner + i];
}

static void channels_last_dims(int32_t rank, const int64_t *dims, int64_t *out) {
  out[0] = dims[0];
  for (int32_t d = 2; d < rank; d++) out[d - 1] = dims[d];
  out[rank - 1] = dims[1];
}

/* A buffer of dtype dt holding values, with dim 1 moved last when channels_last. */
static void *laid_out(kiln_dtype dt, int32_t rank, const int64_t *dims, const void *nchw,
                      int channels_last) {
  int64_t n = count(rank, dims);
  double *v = calloc((size_t)n, sizeof *v), *t = calloc((size_t)n, sizeof *t);
  for (int64_t i = 0; i < n; i++) v[i] = value_at(nchw, dt, i);
  if (channels_last) to_channels_last(v, t, rank, dims);
  void *p = floats(dt, n, channels_last ? t : v);
  free(v), free(t);
  return p;
}

/* The optional attributes: the case in NHWC and with the residual and ReLU epilogue, against
 * the NCHW reference permuted, residual added and clamped here. */
static void conv_run_variant(const conv_case *c, kiln_dtype dt, int channels_last, int relu,
                             int residual) {
  int32_t r = c->spatial + 2;
  int64_t oh = conv_out(c->h, c->kh, c->sh, c->ph, c->dh, c->oph, c->transposed);
  int64_t ow = conv_out(c->w, c->kw, c->sw, c->pw, c->dw, c->opw, c->transposed);
  int64_t xd[4] = {c->n, c->c, c->h, c->w}, od[4] = {c->n, c->o, oh, ow};
  int64_t wd[4] = {c->transposed ? c->c : c->o, c->transposed ? c->o / c->groups : c->c / c->groups,
                   c->kh, c->kw};
  int64_t bd[1] = {c->o}, xl[4], wl[4], ol[4];
  if (c->spatial == 1) xd[2] = xd[3], od[2] = od[3], wd[2] = wd[3];
  int64_t nx = count(r, xd), nw = count(r, wd), no = count(r, od);
  void *x = buf(nx, dt), *w = buf(nw, dt), *b = buf(c->o, dt), *res = buf(no, dt);
  double *want = calloc((size_t)no, sizeof *want), *perm = calloc((size_t)no, sizeof *perm);
  fill_random(x, dt, nx, 3, 2.0);
  fill_random(w, dt, nw, 5, 1.0);
  fill_random(b, dt, c->o, 7, 1.0);
  fill_random(res, dt, no, 11, 2.0);
  conv_reference(c, x, w, b, dt, oh, ow, want);
  for (int64_t i = 0; i < no; i++) {
    if (residual) want[i] += value_at(res, dt, i);
    if (relu && want[i] < 0) want[i] = 0;
  }
  if (channels_last) {
    to_channels_last(want, perm, r, od);
    memcpy(want, perm, (size_t)no * sizeof *want);
  }
  channels_last_dims(r, xd, xl), channels_last_dims(r, wd, wl), channels_last_dims(r, od, ol);
  void *xin = laid_out(dt, r, xd, x, channels_last), *win = laid_out(dt, r, wd, w, channels_last);
  void *rin = laid_out(dt, r, od, res, channels_last);
  int64_t iattr[9] = {P(c->sh, c->sw), P(c->ph, c->pw), P(c->dh, c->dw), c->groups, c->bias};
  uint32_t at = 5;
  if (c->transposed) iattr[at++] = P(c->oph, c->opw);
  iattr[at++] = channels_last, iattr[at++] = relu ? KILN_ACT_RELU : KILN_ACT_NONE;
  iattr[at++] = residual;
  int32_t ranks[4] = {r, r, 1, r};
  const int64_t *dims[4] = {channels_last ? xl : xd, channels_last ? wl : wd, bd,
                            channels_last ? ol : od};
  void *ins[4] = {xin, win, b, rin};
  uint32_t n_in = 2;
  if (c->bias) n_in++;
  else ranks[2] = r, dims[2] = dims[3], ins[2] = rin;
  if (residual) n_in++;
  char what[128];
  snprintf(what, sizeof what, "%s %s%s%s%s", c->what, kiln_dtype_name(dt),
           channels_last ? " channels_last" : "", relu ? " relu" : "", residual ? " residual" : "");
  run_one(what, c->transposed ? KILN_OP_CONV_TRANSPOSE : KILN_OP_CONV, dt, n_in, ranks, dims, ins,
          r, channels_last ? ol : od, at, iattr, 0, 0, want);
  free(x), free(w), free(b), free(res), free(want), free(perm), free(xin), free(win), free(rin);
}

static void test_conv_layout_and_epilogue(void) {
  static const conv_case cases[] = {
      {"conv 2-d strided padded dilated grouped", 2, 0, 2, 4, 7, 6, 6, 3, 2, 2, 1, 1, 2, 2, 1, 0, 0, 2, 1},
      {"conv 2-d depthwise", 2, 0, 1, 3, 5, 5, 3, 3, 3, 1, 1, 1, 1, 1, 1, 0, 0, 3, 0},
      {"conv 1-d", 1, 0, 2, 3, 1, 9, 4, 1, 3, 1, 2, 0, 1, 1, 2, 0, 0, 1, 1},
      {"conv_transpose 2-d", 2, 1, 1, 4, 3, 4, 6, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 2, 1},
      {"conv_transpose 1-d", 1, 1, 1, 2, 1, 5, 3, 1, 4, 1, 3, 0, 1, 1, 1, 0, 2, 1, 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    for (int d = 0; d < 3; d++)
      for (int v = 0; v < 8; v++) conv_run_variant(&cases[i], float_dtypes[d], v & 1, v >> 1 & 1, v >> 2);
}

/* Bad layout and epilogue attributes are refused with a message naming the attribute. */
static void test_conv_attribute_refusals(void) {
  static const struct {
    kiln_op_kind kind;
    uint32_t slot;
    int64_t value;
    const char *msg;
  } bad[] = {
      {KILN_OP_CONV, 5, 2, "iattr5 (channels_last) is 2 but must be 0 or 1"},
      {KILN_OP_CONV, 6, KILN_ACT_GELU_ERF, "iattr6 (activation) is 2 but a convolution fuses only"},
      {KILN_OP_CONV, 6, -1, "iattr6 (activation) is -1 but a convolution fuses only"},
      {KILN_OP_CONV, 7, 3, "iattr7 (residual) is 3 but must be 0 or 1"},
      {KILN_OP_CONV_TRANSPOSE, 6, 5, "iattr6 (channels_last) is 5 but must be 0 or 1"},
      {KILN_OP_CONV_TRANSPOSE, 7, KILN_ACT_SWIGLU, "iattr7 (activation) is 4 but a convolution"},
      {KILN_OP_CONV_TRANSPOSE, 8, 2, "iattr8 (residual) is 2 but must be 0 or 1"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int t = bad[i].kind == KILN_OP_CONV_TRANSPOSE;
    int64_t iattr[9] = {P(1, 1), P(0, 0), P(1, 1), 1, 0, 0, 0, 0, 0};
    iattr[bad[i].slot] = bad[i].value;
    graph *g = g_new();
    uint32_t x = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 4, DIMS(1, 2, 3, 3));
    uint32_t w = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 4, DIMS(t ? 2 : 1, t ? 1 : 2, 1, 1));
    uint32_t o = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 4, DIMS(1, 1, 3, 3));
    g_op(g, bad[i].kind, 2, IDS(x, w), o, bad[i].slot + 1, iattr, 0);
    kiln_engine *e = g_engine(g);
    void *bytes = NULL;
    size_t size = 0;
    kiln_plan parsed;
    /* the plan parser, through the same checks every loaded blob passes */
    CHECK(kiln_plan_serialize(&e->plan, &bytes, &size, &err) == KILN_OK);
    kiln_status st = kiln_plan_parse(bytes, size, 0, &parsed, &err);
    CHECK(st == KILN_ERR_INVALID_PROGRAM);
    if (!strstr(err.message, bad[i].msg)) fprintf(stderr, "got: %s\nwant: %s\n", err.message, bad[i].msg);
    CHECK(strstr(err.message, bad[i].msg) != NULL);
    CHECK(strlen(err.message) < KILN_ERROR_MAX);
    if (st == KILN_OK) kiln_plan_release(&parsed);
    free(bytes);
    free(e);
    free(g);
  }
}

/* ---------------------------------------------------------------- batch norm */

static void test_batch_norm(void) {
  void *x = floats(KILN_F32, 4, (const double[]){1, 3, -2, 0.5});
  void *mean = floats(KILN_F32, 2, (const double[]){1, -1});
  void *var = floats(KILN_F32, 2, (const double[]){4, 0.25});
  void *weight = floats(KILN_F32, 2, (const double[]){2, 1});
  void *bias = floats(KILN_F32, 2, (const double[]){0, 3});
  const int32_t ranks[5] = {4, 1, 1, 1, 1};
  const int64_t *dims[5] = {DIMS(1, 2, 1, 2), DIMS(2), DIMS(2), DIMS(2), DIMS(2)};
  /* channel 0: (x - 1) / 2 * 2; channel 1: (x + 1) / 0.5 + 3 */
  run_one("batch_norm", KILN_OP_BATCH_NORM, KILN_F32, 5, ranks, dims,
          BUFS(x, mean, var, weight, bias), 4, DIMS(1, 2, 1, 2), 1, ATTRS(3), 0, 0,
          (const double[]){0, 2, 1, 6});
  /* no weight, bias only (flags 2), eps 1: channel 0 (x - 1) / sqrt(5), channel 1 (x + 1) / sqrt(1.25) */
  const double s0 = 1 / sqrt(5.0), s1 = 1 / sqrt(1.25);
  run_one("batch_norm bias only", KILN_OP_BATCH_NORM, KILN_F32, 4, ranks, dims,
          BUFS(x, mean, var, bias), 4, DIMS(1, 2, 1, 2), 1, ATTRS(2), 1.0, 0,
          (const double[]){0, 2 * s0, -1 * s1 + 3, 1.5 * s1 + 3});
  free(x), free(mean), free(var), free(weight), free(bias);
}

/* ---------------------------------------------------------------- pooling */

static void pool_run(const char *what, kiln_op_kind kind, const int64_t *in_dims, const double *in,
                     const int64_t *out_dims, uint32_t n_iattr, const int64_t *iattr,
                     const double *want) {
  for (int d = 0; d < 3; d++) {
    kiln_dtype dt = float_dtypes[d];
    void *x = floats(dt, count(4, in_dims), in);
    const int32_t ranks[1] = {4};
    const int64_t *dims[1] = {in_dims};
    char name[96];
    snprintf(name, sizeof name, "%s %s", what, kiln_dtype_name(dt));
    run_one(name, kind, dt, 1, ranks, dims, BUFS(x), 4, out_dims, n_iattr, iattr, 0, 0, want);
    free(x);
  }
}

static const double ramp16[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};

static void test_max_pool(void) {
  pool_run("max_pool2d 2x2", KILN_OP_MAX_POOL2D, DIMS(1, 1, 4, 4), ramp16, DIMS(1, 1, 2, 2), 5,
           ATTRS(P(2, 2), P(2, 2), P(0, 0), P(1, 1), 0), (const double[]){6, 8, 14, 16});
  /* 3x3 stride 2 padding 1 (ResNet's stem): windows clipped to the input */
  pool_run("max_pool2d padded", KILN_OP_MAX_POOL2D, DIMS(1, 1, 4, 4), ramp16, DIMS(1, 1, 2, 2), 5,
           ATTRS(P(3, 3), P(2, 2), P(1, 1), P(1, 1), 0), (const double[]){6, 8, 14, 16});
  /* ceil_mode on 4 wide with kernel 3 stride 2: a second, partial window */
  pool_run("max_pool2d ceil", KILN_OP_MAX_POOL2D, DIMS(1, 1, 4, 4), ramp16, DIMS(1, 1, 2, 2), 5,
           ATTRS(P(3, 3), P(2, 2), P(0, 0), P(1, 1), 1), (const double[]){11, 12, 15, 16});
  /* dilation 2: taps two apart */
  pool_run("max_pool2d dilated", KILN_OP_MAX_POOL2D, DIMS(1, 1, 4, 4), ramp16, DIMS(1, 1, 2, 2), 5,
           ATTRS(P(2, 2), P(1, 1), P(0, 0), P(2, 2), 0), (const double[]){11, 12, 15, 16});
  /* all-negative input under padding: padding never wins */
  const double neg[4] = {-4, -3, -2, -1};
  pool_run("max_pool2d negative", KILN_OP_MAX_POOL2D, DIMS(1, 1, 2, 2), neg, DIMS(1, 1, 3, 3), 5,
           ATTRS(P(2, 2), P(1, 1), P(1, 1), P(1, 1), 0),
           (const double[]){-4, -3, -3, -2, -1, -1, -2, -1, -1});
  const double with_nan[4] = {1, NAN, 3, 4};
  pool_run("max_pool2d NaN", KILN_OP_MAX_POOL2D, DIMS(1, 1, 2, 2), with_nan, DIMS(1, 1, 1, 1), 5,
           ATTRS(P(2, 2), P(2, 2), P(0, 0), P(1, 1), 0), (const double[]){NAN});
}

static void test_avg_pool(void) {
  pool_run("avg_pool2d 2x2", KILN_OP_AVG_POOL2D, DIMS(1, 1, 4, 4), ramp16, DIMS(1, 1, 2, 2), 6,
           ATTRS(P(2, 2), P(2, 2), P(0, 0), 0, 1, 0), (const double[]){3.5, 5.5, 11.5, 13.5});
  /* 3x3 stride 2 padding 1: the corner window holds 1,2,5,6: 4 real taps of 9 */
  pool_run("avg_pool2d padded counts padding", KILN_OP_AVG_POOL2D, DIMS(1, 1, 4, 4), ramp16,
           DIMS(1, 1, 2, 2), 6, ATTRS(P(3, 3), P(2, 2), P(1, 1), 0, 1, 0),
           (const double[]){14.0 / 9, 30.0 / 9, 57.0 / 9, 99.0 / 9});
  pool_run("avg_pool2d padded skips padding", KILN_OP_AVG_POOL2D, DIMS(1, 1, 4, 4), ramp16,
           DIMS(1, 1, 2, 2), 6, ATTRS(P(3, 3), P(2, 2), P(1, 1), 0, 0, 0),
           (const double[]){14.0 / 4, 30.0 / 6, 57.0 / 6, 99.0 / 9});
  /* ceil_mode: the last windows hang past the input; the divisor counts only what they cover */
  pool_run("avg_pool2d ceil", KILN_OP_AVG_POOL2D, DIMS(1, 1, 4, 4), ramp16, DIMS(1, 1, 2, 2), 6,
           ATTRS(P(3, 3), P(2, 2), P(0, 0), 1, 1, 0),
           (const double[]){54.0 / 9, 45.0 / 6, 72.0 / 6, 54.0 / 4});
  pool_run("avg_pool2d divisor override", KILN_OP_AVG_POOL2D, DIMS(1, 1, 4, 4), ramp16,
           DIMS(1, 1, 2, 2), 6, ATTRS(P(2, 2), P(2, 2), P(0, 0), 0, 1, 2),
           (const double[]){7, 11, 23, 27});
}

static void test_adaptive_avg_pool(void) {
  /* 4 -> 3 windows [0,2) [1,3) [2,4) on each axis */
  double want[9];
  static const int64_t lo[3] = {0, 1, 2};
  for (int y = 0; y < 3; y++)
    for (int z = 0; z < 3; z++) {
      double s = 0;
      for (int64_t a = lo[y]; a < lo[y] + 2; a++)
        for (int64_t b = lo[z]; b < lo[z] + 2; b++) s += ramp16[a * 4 + b];
      want[y * 3 + z] = s / 4;
    }
  pool_run("adaptive_avg_pool2d 4->3", KILN_OP_ADAPTIVE_AVG_POOL2D, DIMS(1, 1, 4, 4), ramp16,
           DIMS(1, 1, 3, 3), 1, ATTRS(P(3, 3)), want);
  pool_run("adaptive_avg_pool2d global", KILN_OP_ADAPTIVE_AVG_POOL2D, DIMS(1, 1, 4, 4), ramp16,
           DIMS(1, 1, 1, 1), 1, ATTRS(P(1, 1)), (const double[]){8.5});
  /* 4 -> 6 (larger): windows of one or two rows, [0,1) [0,2) [1,2) [2,3) [2,4) [3,4) */
  double up[6];
  static const int64_t a0[6] = {0, 0, 1, 2, 2, 3}, a1[6] = {1, 2, 2, 3, 4, 4};
  for (int z = 0; z < 6; z++) {
    double s = 0;
    for (int64_t b = a0[z]; b < a1[z]; b++) s += ramp16[b];
    up[z] = s / (double)(a1[z] - a0[z]);
  }
  pool_run("adaptive_avg_pool2d 4->6", KILN_OP_ADAPTIVE_AVG_POOL2D, DIMS(1, 1, 1, 4), ramp16,
           DIMS(1, 1, 1, 6), 1, ATTRS(P(1, 6)), up);
}

/* ---------------------------------------------------------------- resize */

static void resize_run(const char *what, kiln_op_kind kind, const int64_t *in_dims,
                       const double *in, const int64_t *out_dims, uint32_t n_iattr,
                       const int64_t *iattr, double sh, double sw, const double *want) {
  void *x = floats(KILN_F32, count(4, in_dims), in);
  const int32_t ranks[1] = {4};
  const int64_t *dims[1] = {in_dims};
  run_one(what, kind, KILN_F32, 1, ranks, dims, BUFS(x), 4, out_dims, n_iattr, iattr, sh, sw, want);
  free(x);
}

static void test_upsample(void) {
  const double two[2] = {0, 1}, three[3] = {10, 20, 30};
  resize_run("upsample_nearest2d doubled", KILN_OP_UPSAMPLE_NEAREST2D, DIMS(1, 1, 1, 2), two,
             DIMS(1, 1, 1, 4), 1, ATTRS(P(1, 4)), 0, 0, (const double[]){0, 0, 1, 1});
  /* 3 -> 5: floor(d * 0.6) = 0 0 1 1 2 */
  resize_run("upsample_nearest2d 3->5", KILN_OP_UPSAMPLE_NEAREST2D, DIMS(1, 1, 1, 3), three,
             DIMS(1, 1, 1, 5), 1, ATTRS(P(1, 5)), 0, 0, (const double[]){10, 10, 20, 20, 30});
  /* scale factor 1.7 given: floor(d / 1.7) = 0 0 1 1 2, not the sizes' ratio 3/5 */
  resize_run("upsample_nearest2d scale", KILN_OP_UPSAMPLE_NEAREST2D, DIMS(1, 1, 1, 3), three,
             DIMS(1, 1, 1, 5), 1, ATTRS(P(1, 5)), 0, 1.7, (const double[]){10, 10, 20, 20, 30});
  resize_run("upsample_nearest2d scale 2.5", KILN_OP_UPSAMPLE_NEAREST2D, DIMS(1, 1, 1, 3), three,
             DIMS(1, 1, 1, 5), 1, ATTRS(P(1, 5)), 0, 2.5, (const double[]){10, 10, 10, 20, 20});
  resize_run("upsample_bilinear2d align_corners", KILN_OP_UPSAMPLE_BILINEAR2D, DIMS(1, 1, 1, 2),
             two, DIMS(1, 1, 1, 4), 2, ATTRS(P(1, 4), 1), 0, 0,
             (const double[]){0, 1.0 / 3, 2.0 / 3, 1});
  resize_run("upsample_bilinear2d half pixel", KILN_OP_UPSAMPLE_BILINEAR2D, DIMS(1, 1, 1, 2),
             two, DIMS(1, 1, 1, 4), 2, ATTRS(P(1, 4), 0), 0, 0, (const double[]){0, 0.25, 0.75, 1});
  /* 2x2 -> 3x3 with corners aligned: the centre is the mean of all four */
  const double sq[4] = {0, 2, 4, 6};
  resize_run("upsample_bilinear2d 2-d", KILN_OP_UPSAMPLE_BILINEAR2D, DIMS(1, 1, 2, 2), sq,
             DIMS(1, 1, 3, 3), 2, ATTRS(P(3, 3), 1), 0, 0,
             (const double[]){0, 1, 2, 2, 3, 4, 4, 5, 6});
}

/* ---------------------------------------------------------------- channels_last */

/* Runs op on x [N,C,H,W] as NCHW, then with channels_last on x permuted to [N,H,W,C], and
 * checks the second result is the first permuted, bit for bit (the same sums in the same order). */
static void layout_run(const char *what, kiln_op_kind kind, kiln_dtype dt, const int64_t *xd,
                       int64_t oh, int64_t ow, uint32_t n_iattr, const int64_t *iattr, double f0,
                       double f1) {
  const int64_t n = xd[0], c = xd[1], h = xd[2], w = xd[3];
  const int64_t od[4] = {n, c, oh, ow}, xl[4] = {n, h, w, c}, ol[4] = {n, oh, ow, c};
  int64_t attrs[KILN_MAX_IATTR];
  size_t es = kiln_dtype_size(dt);
  void *x = buf(n * c * h * w, dt), *xt = buf(n * c * h * w, dt);
  void *y = buf(n * c * oh * ow, dt), *yt = buf(n * c * oh * ow, dt);
  char name[128];
  fill_random(x, dt, n * c * h * w, 7, 2.0);
  for (int64_t b = 0; b < n; b++)
    for (int64_t k = 0; k < c; k++)
      for (int64_t i = 0; i < h * w; i++)
        memcpy((char *)xt + (size_t)((b * h * w + i) * c + k) * es,
               (char *)x + (size_t)((b * c + k) * h * w + i) * es, es);
  for (int layout = 0; layout < 2; layout++) {
    graph *g = g_new();
    uint32_t ti = g_tensor(g, KILN_STORE_INPUT, dt, 4, layout ? xl : xd);
    uint32_t to = g_tensor(g, KILN_STORE_OUTPUT, dt, 4, layout ? ol : od);
    memcpy(attrs, iattr, n_iattr * sizeof *attrs);
    attrs[n_iattr] = layout; /* NCHW also spelled out as channels_last 0 */
    kiln_op *op = g_op(g, kind, 1, IDS(ti), to, n_iattr + 1, attrs, f0);
    op->fattr[1] = f1;
    kiln_status st = g_run(g, BUFS(layout ? xt : x), BUFS(layout ? yt : y), &err);
    if (st != KILN_OK) fprintf(stderr, "%s layout %d: %s\n", what, layout, err.message);
    CHECK(st == KILN_OK);
    free(g);
  }
  int64_t mismatched = 0;
  for (int64_t b = 0; b < n; b++)
    for (int64_t k = 0; k < c; k++)
      for (int64_t i = 0; i < oh * ow; i++)
        mismatched += memcmp((char *)yt + (size_t)((b * oh * ow + i) * c + k) * es,
                             (char *)y + (size_t)((b * c + k) * oh * ow + i) * es, es) != 0;
  snprintf(name, sizeof name, "%s %s: channels_last is NCHW permuted", what, kiln_dtype_name(dt));
  if (mismatched) fprintf(stderr, "%s: %lld elements differ\n", name, (long long)mismatched);
  CHECK(mismatched == 0);
  free(x), free(xt), free(y), free(yt);
}

static void test_channels_last(void) {
  const int64_t xd[4] = {2, 3, 7, 6};
  for (int d = 0; d < 3; d++) {
    kiln_dtype dt = float_dtypes[d];
    layout_run("max_pool2d", KILN_OP_MAX_POOL2D, dt, xd, 4, 3, 5,
               ATTRS(P(3, 3), P(2, 2), P(1, 1), P(1, 1), 0), 0, 0);
    layout_run("max_pool2d dilated ceil", KILN_OP_MAX_POOL2D, dt, xd, 3, 3, 5,
               ATTRS(P(2, 2), P(2, 2), P(0, 0), P(2, 2), 1), 0, 0);
    layout_run("avg_pool2d", KILN_OP_AVG_POOL2D, dt, xd, 4, 4, 6,
               ATTRS(P(3, 3), P(2, 2), P(1, 1), 1, 0, 0), 0, 0);
    layout_run("avg_pool2d divisor", KILN_OP_AVG_POOL2D, dt, xd, 3, 3, 6,
               ATTRS(P(2, 3), P(2, 2), P(0, 1), 0, 1, 5), 0, 0);
    layout_run("adaptive_avg_pool2d", KILN_OP_ADAPTIVE_AVG_POOL2D, dt, xd, 3, 4, 1, ATTRS(P(3, 4)),
               0, 0);
    layout_run("adaptive_avg_pool2d global", KILN_OP_ADAPTIVE_AVG_POOL2D, dt, xd, 1, 1, 1,
               ATTRS(P(1, 1)), 0, 0);
    layout_run("upsample_nearest2d", KILN_OP_UPSAMPLE_NEAREST2D, dt, xd, 14, 9, 1, ATTRS(P(14, 9)),
               0, 0);
    layout_run("upsample_bilinear2d", KILN_OP_UPSAMPLE_BILINEAR2D, dt, xd, 11, 12, 2,
               ATTRS(P(11, 12), 0), 0, 0);
    layout_run("upsample_bilinear2d aligned", KILN_OP_UPSAMPLE_BILINEAR2D, dt, xd, 14, 15, 2,
               ATTRS(P(14, 15), 1), 0, 2.5);
  }
}

/* ---------------------------------------------------------------- refusals at init */

static void expect_refused(const char *what, kiln_op_kind kind, int32_t rank, const int64_t *in_dims,
                           const int64_t *out_dims, uint32_t n_iattr, const int64_t *iattr) {
  graph *g = g_new();
  uint32_t x = g_tensor(g, KILN_STORE_INPUT, KILN_F32, rank, in_dims);
  uint32_t o = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, rank, out_dims);
  g_op(g, kind, 1, IDS(x), o, n_iattr, iattr, 0);
  kiln_engine *e = g_engine(g);
  kiln_status st = kiln_cpu_backend.init(e, &err);
  if (st == KILN_OK) kiln_cpu_backend.destroy(e);
  if (st != KILN_ERR_INVALID_PROGRAM) fprintf(stderr, "%s: not refused\n", what);
  CHECK(st == KILN_ERR_INVALID_PROGRAM);
  free(e);
  free(g);
}

static void test_refusals(void) {
  expect_refused("pool output of the wrong size", KILN_OP_MAX_POOL2D, 4, DIMS(1, 1, 4, 4),
                 DIMS(1, 1, 3, 3), 5, ATTRS(P(2, 2), P(2, 2), P(0, 0), P(1, 1), 0));
  expect_refused("pool stride 0", KILN_OP_MAX_POOL2D, 4, DIMS(1, 1, 4, 4), DIMS(1, 1, 2, 2), 5,
                 ATTRS(P(2, 2), P(0, 2), P(0, 0), P(1, 1), 0));
  expect_refused("pool padding over half the kernel", KILN_OP_AVG_POOL2D, 4, DIMS(1, 1, 4, 4),
                 DIMS(1, 1, 5, 5), 6, ATTRS(P(2, 2), P(1, 1), P(2, 2), 0, 1, 0));
  expect_refused("negative pair", KILN_OP_ADAPTIVE_AVG_POOL2D, 4, DIMS(1, 1, 4, 4),
                 DIMS(1, 1, 2, 2), 1, ATTRS(-1));
  expect_refused("too few attributes", KILN_OP_AVG_POOL2D, 4, DIMS(1, 1, 4, 4), DIMS(1, 1, 2, 2), 2,
                 ATTRS(P(2, 2), P(2, 2)));
  expect_refused("align_corners 2", KILN_OP_UPSAMPLE_BILINEAR2D, 4, DIMS(1, 1, 2, 2),
                 DIMS(1, 1, 4, 4), 2, ATTRS(P(4, 4), 2));
  /* outputs shaped as NCHW would make them: only the attribute's value is at fault */
  expect_refused("channels_last 2", KILN_OP_MAX_POOL2D, 4, DIMS(1, 4, 4, 2), DIMS(1, 4, 2, 1), 6,
                 ATTRS(P(2, 2), P(2, 2), P(0, 0), P(1, 1), 0, 2));
  expect_refused("channels_last -1", KILN_OP_UPSAMPLE_NEAREST2D, 4, DIMS(1, 2, 2, 3),
                 DIMS(1, 2, 4, 4), 2, ATTRS(P(4, 4), -1));
  expect_refused("channels_last of rank 3", KILN_OP_ADAPTIVE_AVG_POOL2D, 3, DIMS(4, 4, 2),
                 DIMS(1, 1, 2), 2, ATTRS(P(1, 1), 1));
  expect_refused("channels_last output shaped NCHW", KILN_OP_AVG_POOL2D, 4, DIMS(1, 4, 4, 2),
                 DIMS(1, 4, 2, 1), 7, ATTRS(P(2, 2), P(2, 2), P(0, 0), 0, 1, 0, 1));
  expect_refused("an attribute past channels_last", KILN_OP_UPSAMPLE_BILINEAR2D, 4,
                 DIMS(1, 2, 2, 3), DIMS(1, 4, 4, 3), 4, ATTRS(P(4, 4), 0, 1, 0));
  /* an output dtype other than the input's */
  graph *h = g_new();
  uint32_t hx = g_tensor(h, KILN_STORE_INPUT, KILN_F32, 4, DIMS(1, 1, 2, 2));
  uint32_t ho = g_tensor(h, KILN_STORE_OUTPUT, KILN_F16, 4, DIMS(1, 1, 1, 1));
  g_op(h, KILN_OP_ADAPTIVE_AVG_POOL2D, 1, IDS(hx), ho, 1, ATTRS(P(1, 1)), 0);
  kiln_engine *he = g_engine(h);
  CHECK(kiln_cpu_backend.init(he, &err) == KILN_ERR_INVALID_PROGRAM);
  free(he);
  free(h);
  /* a convolution whose weight has more input channels than the input */
  graph *g = g_new();
  uint32_t x = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 4, DIMS(1, 2, 3, 3));
  uint32_t w = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 4, DIMS(1, 3, 1, 1));
  uint32_t o = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 4, DIMS(1, 1, 3, 3));
  g_op(g, KILN_OP_CONV, 2, IDS(x, w), o, 5, ATTRS(P(1, 1), P(0, 0), P(1, 1), 1, 0), 0);
  kiln_engine *e = g_engine(g);
  CHECK(kiln_cpu_backend.init(e, &err) == KILN_ERR_INVALID_PROGRAM);
  free(e);
  free(g);
}

/* ---------------------------------------------------------------- batch norm folding */

/* conv (constants) -> batch norm (constants) -> relu, built with and without fusion. */
static void *build_conv_bn(int fuse, int share, size_t *size, uint32_t *n_bn, uint32_t *n_conv) {
  kiln_builder *b = kiln_builder_create();
  double wv[2 * 3 * 3 * 3], stats[4][2] = {{0.5, -1}, {2, 0.3}, {1.5, -0.7}, {0.1, 0.2}};
  float w[54], bias[2] = {0.25f, -0.5f}, p[4][2];
  uint32_t seed = 9;
  for (int i = 0; i < 54; i++) wv[i] = next_random(&seed), w[i] = (float)wv[i];
  for (int k = 0; k < 4; k++) p[k][0] = (float)stats[k][0], p[k][1] = (float)stats[k][1];
  int32_t x = kiln_builder_add_input(b, "x", KILN_F32, 4, DIMS(1, 3, 5, 5), &err);
  int32_t cw = kiln_builder_add_constant(b, KILN_F32, 4, DIMS(2, 3, 3, 3), w, sizeof w, &err);
  int32_t cb = kiln_builder_add_constant(b, KILN_F32, 1, DIMS(2), bias, sizeof bias, &err);
  int32_t ids[4];
  for (int k = 0; k < 4; k++) ids[k] = kiln_builder_add_constant(b, KILN_F32, 1, DIMS(2), p[k], 8, &err);
  int32_t conv = kiln_builder_add_op(b, KILN_OP_CONV, (const int32_t[]){x, cw, cb}, 3,
                                     ATTRS(P(1, 1), P(1, 1), P(1, 1), 1, 1), 5, NULL, 0, &err);
  int32_t bn = kiln_builder_add_op(b, KILN_OP_BATCH_NORM,
                                   (const int32_t[]){conv, ids[0], ids[1], ids[2], ids[3]}, 5,
                                   ATTRS(3), 1, (const double[]){1e-5}, 1, &err);
  int32_t relu = kiln_builder_add_op(b, KILN_OP_RELU, &bn, 1, NULL, 0, NULL, 0, &err);
  CHECK(relu >= 0);
  CHECK(kiln_builder_mark_output(b, relu, "y", &err) == KILN_OK);
  if (share) CHECK(kiln_builder_mark_output(b, conv, "features", &err) == KILN_OK);
  kiln_build_options opts;
  kiln_build_options_default(&opts);
  opts.fuse = fuse;
  void *blob = NULL;
  CHECK(kiln_builder_build(b, &opts, &blob, size, &err) == KILN_OK);
  kiln_builder_destroy(b);
  kiln_engine_options eo;
  kiln_engine_options_default(&eo);
  eo.device = KILN_DEVICE_CPU;
  kiln_engine *e = NULL;
  *n_bn = *n_conv = 0;
  if (blob && kiln_engine_load(blob, *size, &eo, &e, &err) == KILN_OK) {
    const kiln_plan *plan = kiln_engine_plan(e);
    for (uint32_t i = 0; i < plan->n_ops; i++) {
      *n_bn += plan->ops[i].kind == KILN_OP_BATCH_NORM;
      *n_conv += plan->ops[i].kind == KILN_OP_CONV;
    }
    kiln_engine_destroy(e);
  }
  return blob;
}

static void run_blob(void *blob, size_t size, const float *x, float *y) {
  kiln_engine_options eo;
  kiln_engine_options_default(&eo);
  eo.device = KILN_DEVICE_CPU;
  kiln_engine *e = NULL;
  kiln_tensor_view in, out;
  CHECK(kiln_engine_load(blob, size, &eo, &e, &err) == KILN_OK);
  if (!e) return;
  memset(&in, 0, sizeof in);
  memset(&out, 0, sizeof out);
  in.data = (void *)x, in.nbytes = 75 * 4, in.dtype = KILN_F32, in.rank = 4;
  out.data = y, out.nbytes = 50 * 4, out.dtype = KILN_F32, out.rank = 4;
  const int64_t xs[4] = {1, 3, 5, 5}, ys[4] = {1, 2, 5, 5};
  for (int d = 0; d < 4; d++) in.sizes[d] = xs[d], out.sizes[d] = ys[d];
  for (int d = 3, s1 = 1, s2 = 1; d >= 0; d--) in.strides[d] = s1, out.strides[d] = s2, s1 *= (int)xs[d], s2 *= (int)ys[d];
  kiln_status st = kiln_engine_execute(e, &in, 1, &out, 1, &err);
  if (st) fprintf(stderr, "execute: %s\n", err.message);
  CHECK(st == KILN_OK);
  kiln_engine_destroy(e);
}

static void test_batch_norm_folding(void) {
  size_t folded_size, plain_size;
  uint32_t bn_folded, conv_folded, bn_plain, conv_plain;
  void *folded = build_conv_bn(1, 0, &folded_size, &bn_folded, &conv_folded);
  void *plain = build_conv_bn(0, 0, &plain_size, &bn_plain, &conv_plain);
  size_t shared_size;
  uint32_t bn_shared, conv_shared;
  /* the convolution's own output is also read elsewhere: the norm must stay */
  void *shared = build_conv_bn(1, 1, &shared_size, &bn_shared, &conv_shared);
  CHECK(bn_shared == 1 && conv_shared == 1);
  kiln_free(shared);
  CHECK(bn_folded == 0 && conv_folded == 1);
  CHECK(bn_plain == 1 && conv_plain == 1);
  float x[75], y_folded[50], y_plain[50];
  double want[50];
  uint32_t seed = 4;
  for (int i = 0; i < 75; i++) x[i] = (float)next_random(&seed);
  run_blob(folded, folded_size, x, y_folded);
  run_blob(plain, plain_size, x, y_plain);
  int positive = 0;
  for (int i = 0; i < 50; i++) want[i] = y_plain[i], positive += y_plain[i] > 0;
  CHECK(positive > 5 && positive < 45); /* the relu cuts some, keeps some: not degenerate */
  CHECK_VALUES("folded batch norm", y_folded, KILN_F32, want, 50);
  kiln_free(folded);
  kiln_free(plain);
}

/* A ResNet basic block, x [1,4,6,6]: relu(conv2(relu(conv1(x))) + x), with the builder;
 * `share` also marks conv2's own output as an output, so its add and relu must stay. Returns
 * the blob and counts the plan's ops: all, and those of a convolution carrying relu and
 * residual. */
static void *build_block(int fuse, int share, size_t *size, uint32_t *n_ops, uint32_t *n_relu,
                         uint32_t *n_residual) {
  kiln_builder *b = kiln_builder_create();
  float w1[144], w2[144], bias[4] = {0.1f, -0.2f, 0.3f, 0.05f};
  uint32_t seed = 21;
  for (int i = 0; i < 144; i++) w1[i] = (float)next_random(&seed) * 0.3f, w2[i] = (float)next_random(&seed) * 0.3f;
  const int64_t conv_attrs[5] = {P(1, 1), P(1, 1), P(1, 1), 1, 1};
  int32_t x = kiln_builder_add_input(b, "x", KILN_F32, 4, DIMS(1, 4, 6, 6), &err);
  int32_t cw1 = kiln_builder_add_constant(b, KILN_F32, 4, DIMS(4, 4, 3, 3), w1, sizeof w1, &err);
  int32_t cw2 = kiln_builder_add_constant(b, KILN_F32, 4, DIMS(4, 4, 3, 3), w2, sizeof w2, &err);
  int32_t cb = kiln_builder_add_constant(b, KILN_F32, 1, DIMS(4), bias, sizeof bias, &err);
  int32_t c1 = kiln_builder_add_op(b, KILN_OP_CONV, (const int32_t[]){x, cw1, cb}, 3, conv_attrs, 5,
                                   NULL, 0, &err);
  int32_t r1 = kiln_builder_add_op(b, KILN_OP_RELU, &c1, 1, NULL, 0, NULL, 0, &err);
  int32_t c2 = kiln_builder_add_op(b, KILN_OP_CONV, (const int32_t[]){r1, cw2, cb}, 3, conv_attrs, 5,
                                   NULL, 0, &err);
  int32_t sum = kiln_builder_add_op(b, KILN_OP_ADD, (const int32_t[]){c2, x}, 2, NULL, 0,
                                    (const double[]){1.0}, 1, &err);
  int32_t y = kiln_builder_add_op(b, KILN_OP_RELU, &sum, 1, NULL, 0, NULL, 0, &err);
  CHECK(y >= 0);
  CHECK(kiln_builder_mark_output(b, y, "y", &err) == KILN_OK);
  if (share) CHECK(kiln_builder_mark_output(b, c2, "features", &err) == KILN_OK);
  kiln_build_options opts;
  kiln_build_options_default(&opts);
  opts.fuse = fuse;
  void *blob = NULL;
  CHECK(kiln_builder_build(b, &opts, &blob, size, &err) == KILN_OK);
  kiln_builder_destroy(b);
  kiln_engine_options eo;
  kiln_engine_options_default(&eo);
  eo.device = KILN_DEVICE_CPU;
  kiln_engine *e = NULL;
  *n_ops = *n_relu = *n_residual = 0;
  if (blob && kiln_engine_load(blob, *size, &eo, &e, &err) == KILN_OK) {
    const kiln_plan *plan = kiln_engine_plan(e);
    *n_ops = plan->n_ops;
    for (uint32_t i = 0; i < plan->n_ops; i++) {
      const kiln_op *op = &plan->ops[i];
      if (op->kind != KILN_OP_CONV) continue;
      *n_relu += op->n_iattr > 6 && op->iattr[6] == KILN_ACT_RELU;
      *n_residual += op->n_iattr > 7 && op->iattr[7] == 1;
    }
    kiln_engine_destroy(e);
  }
  return blob;
}

/* Runs a one-input blob of x [1,4,6,6] and reads its first output, [1,4,6,6]. */
static void run_block(void *blob, size_t size, const float *x, float *y, uint32_t n_outputs) {
  kiln_engine_options eo;
  kiln_engine_options_default(&eo);
  eo.device = KILN_DEVICE_CPU;
  kiln_engine *e = NULL;
  kiln_tensor_view in, out[2];
  float spare[144];
  CHECK(kiln_engine_load(blob, size, &eo, &e, &err) == KILN_OK);
  if (!e) return;
  const int64_t dims[4] = {1, 4, 6, 6};
  memset(&in, 0, sizeof in);
  memset(out, 0, sizeof out);
  in.data = (void *)x, out[0].data = y, out[1].data = spare;
  for (int v = 0; v < 3; v++) {
    kiln_tensor_view *t = v == 0 ? &in : &out[v - 1];
    t->nbytes = 144 * 4, t->dtype = KILN_F32, t->rank = 4;
    for (int d = 3, st = 1; d >= 0; d--) t->sizes[d] = dims[d], t->strides[d] = st, st *= (int)dims[d];
  }
  kiln_status st = kiln_engine_execute(e, &in, 1, out, n_outputs, &err);
  if (st) fprintf(stderr, "execute: %s\n", err.message);
  CHECK(st == KILN_OK);
  kiln_engine_destroy(e);
}

static void test_conv_epilogue_fusion(void) {
  size_t fused_size, plain_size, shared_size;
  uint32_t fused_ops, fused_relu, fused_res, plain_ops, plain_relu, plain_res;
  uint32_t shared_ops, shared_relu, shared_res;
  void *fused = build_block(1, 0, &fused_size, &fused_ops, &fused_relu, &fused_res);
  void *plain = build_block(0, 0, &plain_size, &plain_ops, &plain_relu, &plain_res);
  void *shared = build_block(1, 1, &shared_size, &shared_ops, &shared_relu, &shared_res);
  /* conv, relu, conv, add, relu -> conv (relu), conv (residual, relu), channels-last between
   * the permute of x in and the permute of y out */
  CHECK(plain_ops == 5 && plain_relu == 0 && plain_res == 0);
  CHECK(fused_ops == 4 && fused_relu == 2 && fused_res == 1);
  /* the second convolution's output is read by the add and an output binding: only the first
   * relu fuses (the add and its relu may become one pointwise op) */
  CHECK(shared_relu == 1 && shared_res == 0 && shared_ops >= 3);
  float x[144], y_fused[144], y_plain[144], y_shared[144];
  double want[144];
  uint32_t seed = 8;
  for (int i = 0; i < 144; i++) x[i] = (float)next_random(&seed);
  run_block(fused, fused_size, x, y_fused, 1);
  run_block(plain, plain_size, x, y_plain, 1);
  run_block(shared, shared_size, x, y_shared, 2);
  int positive = 0;
  for (int i = 0; i < 144; i++) want[i] = y_plain[i], positive += y_plain[i] > 0;
  CHECK(positive > 10 && positive < 134); /* the relu cuts some, keeps some: not degenerate */
  CHECK_VALUES("fused conv epilogue", y_fused, KILN_F32, want, 144);
  CHECK_VALUES("conv epilogue with a shared output", y_shared, KILN_F32, want, 144);
  kiln_free(fused);
  kiln_free(plain);
  kiln_free(shared);
}

/* A small ResNet, x [1,3,8,8]: conv, relu, max pool, conv + the pool's output, relu, global
 * average pool, flatten. With fusion it runs channels-last from the first convolution to the
 * global pool: one permute in, one out, and the same result as the plan built as written. */
static void *build_small_resnet(int fuse, size_t *size, uint32_t *n_permute, uint32_t *n_nhwc) {
  kiln_builder *b = kiln_builder_create();
  float w1[108], w2[144], bias[4] = {0.1f, -0.2f, 0.3f, 0.05f};
  uint32_t seed = 33;
  for (int i = 0; i < 108; i++) w1[i] = (float)next_random(&seed) * 0.4f;
  for (int i = 0; i < 144; i++) w2[i] = (float)next_random(&seed) * 0.3f;
  const int64_t conv_attrs[5] = {P(1, 1), P(1, 1), P(1, 1), 1, 1};
  int32_t x = kiln_builder_add_input(b, "x", KILN_F32, 4, DIMS(1, 3, 8, 8), &err);
  int32_t cw1 = kiln_builder_add_constant(b, KILN_F32, 4, DIMS(4, 3, 3, 3), w1, sizeof w1, &err);
  int32_t cw2 = kiln_builder_add_constant(b, KILN_F32, 4, DIMS(4, 4, 3, 3), w2, sizeof w2, &err);
  int32_t cb = kiln_builder_add_constant(b, KILN_F32, 1, DIMS(4), bias, sizeof bias, &err);
  int32_t c1 = kiln_builder_add_op(b, KILN_OP_CONV, (const int32_t[]){x, cw1, cb}, 3, conv_attrs, 5,
                                   NULL, 0, &err);
  int32_t r1 = kiln_builder_add_op(b, KILN_OP_RELU, &c1, 1, NULL, 0, NULL, 0, &err);
  int32_t mp = kiln_builder_add_op(b, KILN_OP_MAX_POOL2D, &r1, 1,
                                   ATTRS(P(2, 2), P(2, 2), P(0, 0), P(1, 1), 0), 5, NULL, 0, &err);
  int32_t c2 = kiln_builder_add_op(b, KILN_OP_CONV, (const int32_t[]){mp, cw2, cb}, 3, conv_attrs, 5,
                                   NULL, 0, &err);
  int32_t sum = kiln_builder_add_op(b, KILN_OP_ADD, (const int32_t[]){c2, mp}, 2, NULL, 0,
                                    (const double[]){1.0}, 1, &err);
  int32_t r2 = kiln_builder_add_op(b, KILN_OP_RELU, &sum, 1, NULL, 0, NULL, 0, &err);
  int32_t gp = kiln_builder_add_op(b, KILN_OP_ADAPTIVE_AVG_POOL2D, &r2, 1, ATTRS(P(1, 1)), 1,
                                   NULL, 0, &err);
  int32_t y = kiln_builder_add_op(b, KILN_OP_RESHAPE, &gp, 1, ATTRS(1, 4), 2, NULL, 0, &err);
  CHECK(y >= 0);
  CHECK(kiln_builder_mark_output(b, y, "y", &err) == KILN_OK);
  kiln_build_options opts;
  kiln_build_options_default(&opts);
  opts.fuse = fuse;
  void *blob = NULL;
  CHECK(kiln_builder_build(b, &opts, &blob, size, &err) == KILN_OK);
  kiln_builder_destroy(b);
  kiln_engine_options eo;
  kiln_engine_options_default(&eo);
  eo.device = KILN_DEVICE_CPU;
  kiln_engine *e = NULL;
  *n_permute = *n_nhwc = 0;
  if (blob && kiln_engine_load(blob, *size, &eo, &e, &err) == KILN_OK) {
    const kiln_plan *plan = kiln_engine_plan(e);
    for (uint32_t i = 0; i < plan->n_ops; i++) {
      const kiln_op *op = &plan->ops[i];
      *n_permute += op->kind == KILN_OP_PERMUTE;
      *n_nhwc += (op->kind == KILN_OP_CONV && op->n_iattr > 5 && op->iattr[5] == 1) ||
                 (op->kind == KILN_OP_MAX_POOL2D && op->n_iattr > 5 && op->iattr[5] == 1) ||
                 (op->kind == KILN_OP_ADAPTIVE_AVG_POOL2D && op->n_iattr > 1 && op->iattr[1] == 1);
    }
    kiln_engine_destroy(e);
  }
  return blob;
}

static void test_channels_last_layout(void) {
  size_t nhwc_size, plain_size;
  uint32_t nhwc_permutes, nhwc_ops, plain_permutes, plain_ops;
  void *nhwc = build_small_resnet(1, &nhwc_size, &nhwc_permutes, &nhwc_ops);
  void *plain = build_small_resnet(0, &plain_size, &plain_permutes, &plain_ops);
  CHECK(plain_permutes == 0 && plain_ops == 0);
  CHECK(nhwc_permutes == 2 && nhwc_ops == 4); /* both convs and both pools */
  float x[192], got[4], want_f[4];
  double want[4];
  uint32_t seed = 12;
  for (int i = 0; i < 192; i++) x[i] = (float)next_random(&seed);
  kiln_engine_options eo;
  kiln_engine_options_default(&eo);
  eo.device = KILN_DEVICE_CPU;
  for (int v = 0; v < 2; v++) {
    kiln_engine *e = NULL;
    kiln_tensor_view in, out;
    memset(&in, 0, sizeof in);
    memset(&out, 0, sizeof out);
    in.data = x, in.nbytes = sizeof x, in.dtype = KILN_F32, in.rank = 4;
    const int64_t xs[4] = {1, 3, 8, 8};
    for (int d = 3, st = 1; d >= 0; d--) in.sizes[d] = xs[d], in.strides[d] = st, st *= (int)xs[d];
    out.data = v ? got : want_f, out.nbytes = 16, out.dtype = KILN_F32, out.rank = 2;
    out.sizes[0] = 1, out.sizes[1] = 4, out.strides[0] = 4, out.strides[1] = 1;
    CHECK(kiln_engine_load(v ? nhwc : plain, v ? nhwc_size : plain_size, &eo, &e, &err) == KILN_OK);
    if (e) CHECK(kiln_engine_execute(e, &in, 1, &out, 1, &err) == KILN_OK);
    kiln_engine_destroy(e);
  }
  for (int i = 0; i < 4; i++) want[i] = want_f[i];
  CHECK(want[0] != 0 || want[1] != 0);
  CHECK_VALUES("channels-last small resnet", got, KILN_F32, want, 4);
  kiln_free(nhwc);
  kiln_free(plain);
}

int main(void) {
  test_conv_hand();
  test_conv_reference();
  test_conv_layout_and_epilogue();
  test_conv_attribute_refusals();
  test_batch_norm();
  test_max_pool();
  test_avg_pool();
  test_adaptive_avg_pool();
  test_upsample();
  test_channels_last();
  test_refusals();
  test_batch_norm_folding();
  test_conv_epilogue_fusion();
  test_channels_last_layout();
  return check_report("test_cpu_vision");
}
