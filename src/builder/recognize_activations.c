/* Written-out activations recognized by what they compute (see recognize_activations.h). */
#include "builder/recognize_activations.h"

#include "cpu/half.h"
#include "runtime/alloc.h"
#include "runtime/pointwise_steps.h"
#include "runtime/shape.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_MEMBERS 24 /* ops in one region */
#define WINDOW 64      /* ops after x's producer looked at for members */
#define N_PROBES 73    /* -8..8 by 1/4, then +-12, +-16, +-30, +-100 */

/* The kinds a region takes: those a pointwise step may be, and float casts. */
static int member_kind(kiln_op_kind kind) {
  return kiln_pw_step_kind_ok(kind) || kind == KILN_OP_CAST;
}

/* A one-element float constant's value into *v. */
static int scalar_value(const kiln_graph *g, uint32_t t, double *v) {
  const kiln_gtensor *x = &g->tensors[t];
  if (x->node != KILN_NODE_CONSTANT || !x->data || !kiln_dtype_is_float(x->desc.dtype) ||
      x->desc.nbytes != kiln_dtype_size(x->desc.dtype))
    return 0;
  if (x->desc.dtype == KILN_F32) {
    float f;
    memcpy(&f, x->data, sizeof f);
    *v = f;
  } else {
    uint16_t h;
    memcpy(&h, x->data, sizeof h);
    *v = x->desc.dtype == KILN_F16 ? kiln_f16_to_f32(h) : kiln_bf16_to_f32(h);
  }
  return 1;
}

static double gelu_erf(double x) { return 0.5 * x * (1.0 + erf(x / sqrt(2.0))); }
static double gelu_tanh(double x) {
  return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}
static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
static double silu(double x) { return x * sigmoid(x); }

/* One op of a region in double (a cast changes nothing there). */
static double apply(const kiln_op *op, double a, double b) {
  switch (op->kind) {
  case KILN_OP_ADD: return a + op->fattr[0] * b;
  case KILN_OP_SUB: return a - op->fattr[0] * b;
  case KILN_OP_MUL: return a * b;
  case KILN_OP_DIV: return a / b;
  case KILN_OP_RELU: return a > 0.0 ? a : 0.0;
  case KILN_OP_GELU: return op->iattr[0] ? gelu_tanh(a) : gelu_erf(a);
  case KILN_OP_SILU: return silu(a);
  case KILN_OP_SIGMOID: return sigmoid(a);
  case KILN_OP_TANH: return tanh(a);
  case KILN_OP_EXP: return exp(a);
  case KILN_OP_SQRT: return sqrt(a);
  case KILN_OP_RSQRT: return 1.0 / sqrt(a);
  case KILN_OP_NEG: return -a;
  case KILN_OP_POW: return pow(a, op->fattr[0]);
  case KILN_OP_ERF: return erf(a);
  case KILN_OP_ABS: return fabs(a);
  case KILN_OP_MINIMUM: return a < b ? a : b;
  case KILN_OP_MAXIMUM: return a > b ? a : b;
  case KILN_OP_LOG: return log(a);
  case KILN_OP_COS: return cos(a);
  case KILN_OP_SIN: return sin(a);
  case KILN_OP_HARDSIGMOID: return fmin(fmax(a + 3.0, 0.0), 6.0) / 6.0;
  case KILN_OP_HARDSWISH: return a * fmin(fmax(a + 3.0, 0.0), 6.0) / 6.0;
  default: return a; /* CAST */
  }
}

/* The ops a region may become. */
typedef struct target {
  kiln_op_kind kind;
  int64_t tanh;
  double (*f)(double);
} target;

static const target targets[] = {{KILN_OP_GELU, 0, gelu_erf},
                                 {KILN_OP_GELU, 1, gelu_tanh},
                                 {KILN_OP_SILU, 0, silu},
                                 {KILN_OP_SIGMOID, 0, sigmoid}};

/* A region: its ops in order, and where each input of each comes from (-1: x, -2: a constant,
 * its value in `constant`, else the index of the member writing it). */
typedef struct region {
  uint32_t ops[MAX_MEMBERS];
  int32_t from[MAX_MEMBERS][2];
  double constant[MAX_MEMBERS][2];
  uint32_t n;
} region;

/* The members of the region reading x: each op within WINDOW after x's producer whose inputs are
 * all x, outputs of earlier members or one-element float constants (at least one not a
 * constant). */
static void collect(const kiln_graph *g, uint32_t x, region *r) {
  const kiln_tensor_desc *xd = &g->tensors[x].desc;
  uint32_t first = g->tensors[x].node == KILN_NODE_OP ? (uint32_t)g->tensors[x].producer + 1 : 0;
  r->n = 0;
  for (uint32_t i = first; i < g->n_ops && i < first + WINDOW && r->n < MAX_MEMBERS; i++) {
    const kiln_op *op = &g->ops[i];
    const kiln_tensor_desc *od = &g->tensors[op->output].desc;
    if (g->dead[i] || !member_kind(op->kind) || op->n_inputs < 1 || op->n_inputs > 2 ||
        !kiln_dtype_is_float(od->dtype) || !kiln_same_dims(od, xd))
      continue;
    int inside = 0, ok = 1;
    for (uint32_t k = 0; k < op->n_inputs && ok; k++) {
      uint32_t t = op->inputs[k];
      int32_t from = t == x ? -1 : -3;
      for (uint32_t m = 0; m < r->n && from == -3; m++)
        if (g->ops[r->ops[m]].output == t) from = (int32_t)m;
      if (from == -3 && !scalar_value(g, t, &r->constant[r->n][k])) ok = 0;
      inside |= from != -3;
      r->from[r->n][k] = from == -3 ? -2 : from;
    }
    if (ok && inside) r->ops[r->n++] = i;
  }
}

/* The member whose output leaves the region, when it is the only one (every other member's
 * output read by members alone, x by members alone) and every member feeds it; else -1. */
static int32_t sink_of(const kiln_graph *g, uint32_t x, const region *r, const uint32_t *uses) {
  uint32_t inner[MAX_MEMBERS + 1] = {0}; /* reads by members: of each member's output, of x */
  uint8_t feeds[MAX_MEMBERS] = {0};
  int32_t sink = -1;
  for (uint32_t m = 0; m < r->n; m++) {
    const kiln_op *op = &g->ops[r->ops[m]];
    for (uint32_t k = 0; k < op->n_inputs; k++)
      if (r->from[m][k] >= 0) inner[r->from[m][k]]++;
      else if (r->from[m][k] == -1) inner[MAX_MEMBERS]++;
  }
  if (inner[MAX_MEMBERS] != uses[x]) return -1;
  for (uint32_t m = 0; m < r->n; m++) {
    uint32_t out = g->ops[r->ops[m]].output;
    if (inner[m] == uses[out]) continue;
    if (sink >= 0 || inner[m] != 0) return -1;
    sink = (int32_t)m;
  }
  if (sink < 0) return -1;
  feeds[sink] = 1;
  for (int32_t m = sink; m >= 0; m--)
    for (uint32_t k = 0; feeds[m] && k < g->ops[r->ops[m]].n_inputs; k++)
      if (r->from[m][k] >= 0) feeds[r->from[m][k]] = 1;
  for (int32_t m = 0; m <= sink; m++)
    if (!feeds[m]) return -1;
  return (uint32_t)sink + 1 == r->n ? sink : -1; /* members after the sink would be dropped */
}

/* The region's value at x = v, in double. */
static double evaluate(const kiln_graph *g, const region *r, double v) {
  double value[MAX_MEMBERS];
  for (uint32_t m = 0; m < r->n; m++) {
    const kiln_op *op = &g->ops[r->ops[m]];
    double in[2] = {0.0, 0.0};
    for (uint32_t k = 0; k < op->n_inputs; k++) {
      int32_t from = r->from[m][k];
      in[k] = from == -1 ? v : from >= 0 ? value[from] : r->constant[m][k];
    }
    value[m] = apply(op, in[0], in[1]);
  }
  return value[r->n - 1];
}

/* The target the region computes within tol (the closest), or -1. */
static int match(const kiln_graph *g, const region *r, double tol) {
  double worst[sizeof targets / sizeof targets[0]] = {0};
  for (int p = 0; p < N_PROBES; p++) {
    static const double far[8] = {-100, -30, -16, -12, 12, 16, 30, 100};
    double v = p < 65 ? (p - 32) / 4.0 : far[p - 65], y = evaluate(g, r, v);
    if (!isfinite(y)) return -1;
    for (size_t t = 0; t < sizeof targets / sizeof targets[0]; t++) {
      double want = targets[t].f(v), e = fabs(y - want) / (1.0 + fabs(want));
      if (e > worst[t]) worst[t] = e;
    }
  }
  int best = -1;
  for (size_t t = 0; t < sizeof targets / sizeof targets[0]; t++)
    if (worst[t] <= tol && (best < 0 || worst[t] < worst[best])) best = (int)t;
  return best;
}

/* How far a region in dtype may be from its target: about one rounding of dtype (its
 * constants are rounded to dtype; GPT-2's written-out GELU is 1.2e-5 from tanh GELU with f16
 * constants, 3.0e-4 with bf16 ones), well short of x * sigmoid(1.702 x), 2e-2 from either GELU
 * and no target. The two GELUs are 4.7e-4 apart: the closer one is taken. */
static double tolerance(kiln_dtype dt) {
  return dt == KILN_F16 ? 1e-3 : dt == KILN_BF16 ? 4e-3 : 1e-5;
}

/* Rewrites the region around x when it is a target; returns 1 when it did. */
static int recognize(kiln_graph *g, uint32_t x, uint32_t *uses) {
  region r;
  collect(g, x, &r);
  if (r.n < 2) return 0;
  int32_t sink = sink_of(g, x, &r, uses);
  if (sink < 0) return 0;
  uint32_t out = g->ops[r.ops[sink]].output;
  const kiln_tensor_desc *xd = &g->tensors[x].desc, *od = &g->tensors[out].desc;
  if (od->dtype != xd->dtype) return 0;
  int t = match(g, &r, tolerance(xd->dtype));
  if (t < 0) return 0;
  kiln_op act;
  memset(&act, 0, sizeof act);
  act.kind = targets[t].kind;
  act.n_inputs = 1;
  act.inputs[0] = x;
  act.output = out;
  if (act.kind == KILN_OP_GELU) act.n_iattr = 1, act.iattr[0] = targets[t].tanh;
  for (uint32_t m = 0; m < r.n; m++) g->dead[r.ops[m]] = 1;
  uses[x] = 1;
  g->dead[r.ops[sink]] = 0;
  g->ops[r.ops[sink]] = act;
  return 1;
}

kiln_status kiln_recognize_activations(kiln_graph *g, kiln_error *err) {
  uint32_t *uses = kiln_calloc((size_t)g->n_tensors + 1, sizeof *uses);
  if (!uses)
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "builder: out of memory for %u tensors while recognizing activations; free "
                     "memory and retry",
                     (unsigned)g->n_tensors);
  kiln_graph_count_uses(g, uses);
  uint32_t n_tensors = g->n_tensors;
  for (uint32_t t = 0; t < n_tensors; t++) {
    const kiln_gtensor *x = &g->tensors[t];
    if (x->node == KILN_NODE_OP && !g->dead[x->producer] && uses[t] > 0 &&
        kiln_dtype_is_float(x->desc.dtype) && !kiln_graph_is_output(g, (int32_t)t))
      recognize(g, t, uses);
  }
  free(uses);
  return KILN_OK;
}
