/* General fusion into FUSED ops (see fuse_group.h). A value of the group is wanted at
 * coordinates given by an affine frame of the output coordinate: value coord j = base[j] +
 * sum_d m[j][d] * out[d]. Views transform the frame on the way from the output to the inputs;
 * at an input the frame becomes the load's strides and offset. In a dynamic graph the group is
 * also compiled at the shapes of other symbol values (probes) and kept only where each probe's
 * program is the bounds' program cut to the probe's sizes. */
#include "builder/fuse_group.h"

#include "builder/derive_symbols.h"
#include "runtime/alloc.h"
#include "runtime/fused_program.h"
#include "runtime/pointwise_steps.h"
#include "runtime/shape.h"
#include "runtime/symbolic.h"
#include "runtime/view.h"

#include <stdlib.h>
#include <string.h>

#define MAX_VALUES 96 /* distinct (value, frame, box) a program may compute */
#define MAP_WORDS (2 + 3 * KILN_MAX_RANK)
#define FAIL_GIVE_UP (-2)
#define MAX_PROBES 12

typedef struct frame {
  int32_t rank;
  int64_t base[KILN_MAX_RANK];
  int64_t m[KILN_MAX_RANK][KILN_MAX_RANK];
} frame;

typedef struct box {
  int64_t lo[KILN_MAX_RANK], hi[KILN_MAX_RANK];
} box;

typedef struct vinstr { /* an instruction on virtual registers */
  uint32_t code, dst, a, b, arg;
  uint32_t via; /* the member whose value emitted it (a load: the member reading the input) */
  int gelu_tanh;
  int64_t imm;
} vinstr;

/* A dynamic graph at other symbol values: its tensors (by graph id) and live ops (by index in
 * the probe plan, op_at giving it for a graph op), from kiln_plan_shapes_at. */
typedef struct probe {
  kiln_tensor_desc *tensors;
  kiln_op *ops;
} probe;

typedef struct probes {
  uint32_t n;
  probe at[MAX_PROBES];
  kiln_tensor_desc *derived; /* each tensor at the bounds with the sym derive_symbols found */
  uint32_t *op_at;
} probes;

typedef struct memo {
  uint32_t tensor;
  frame f;
  box bx;
  uint32_t value;
} memo;

typedef struct compiler {
  const kiln_graph *g;
  const probes *pr; /* with at: the sizes to compile at (else the graph's own, the bounds) */
  const probe *at;
  const uint8_t *member;
  uint32_t root_out;
  int32_t rank;
  const int64_t *dims;
  uint32_t inputs[KILN_MAX_OP_INPUTS], n_inputs;
  int64_t maps[KILN_FX_MAX_MAPS][MAP_WORDS];
  uint32_t n_maps;
  vinstr code[KILN_FX_MAX_INSTRS];
  uint32_t n_code;
  memo memos[MAX_VALUES];
  uint32_t n_memos;
  uint32_t cur; /* the member whose value is being emitted */
  int64_t cut; /* on failure: the tensor to leave to a group of its own, or FAIL_GIVE_UP */
} compiler;

static const kiln_tensor_desc *desc_of(const compiler *c, uint32_t t) {
  return c->at ? &c->at->tensors[t] : &c->g->tensors[t].desc;
}

static const kiln_op *op_of(const compiler *c, uint32_t i) {
  return c->at ? &c->at->ops[c->pr->op_at[i]] : &c->g->ops[i];
}

static int internal(const compiler *c, uint32_t t) {
  const kiln_gtensor *x = &c->g->tensors[t];
  return x->node == KILN_NODE_OP && c->member[x->producer];
}

static int64_t emit_instr(compiler *c, uint32_t code, int64_t a, int64_t b, uint32_t arg,
                          int64_t imm, int gelu_tanh, uint32_t at) {
  vinstr *v;
  if (c->n_code >= KILN_FX_MAX_INSTRS - 1) { /* one left for the store */
    c->cut = at == c->root_out ? FAIL_GIVE_UP : (int64_t)at;
    return -1;
  }
  v = &c->code[c->n_code];
  v->code = code;
  v->dst = c->n_code;
  v->a = a < 0 ? 0 : (uint32_t)a;
  v->b = b < 0 ? 0 : (uint32_t)b;
  v->arg = arg;
  v->via = code == KILN_FX_LOAD ? c->cur : at;
  v->imm = imm;
  v->gelu_tanh = gelu_tanh;
  return c->n_code++;
}

static int64_t double_word(double d) {
  int64_t w;
  memcpy(&w, &d, sizeof w);
  return w;
}

/* 1 when op's result is exactly one of its inputs' values or its negation: of values of its
 * dtype, already rounded, it needs no rounding of its own. */
static int exact_op(const kiln_graph *g, const kiln_op *op) {
  kiln_dtype dt = g->tensors[op->output].desc.dtype;
  if (op->kind != KILN_OP_NEG && op->kind != KILN_OP_ABS && op->kind != KILN_OP_RELU &&
      op->kind != KILN_OP_MINIMUM && op->kind != KILN_OP_MAXIMUM)
    return 0;
  for (uint32_t k = 0; k < op->n_inputs; k++)
    if (g->tensors[op->inputs[k]].desc.dtype != dt) return 0;
  return 1;
}

/* The value rounded as an op writing dtype dt rounds it (the root's store rounds itself). */
static int64_t round_to(compiler *c, int64_t v, kiln_dtype dt, uint32_t t) {
  const kiln_gtensor *x = &c->g->tensors[t];
  if (v < 0 || dt == KILN_F32 || t == c->root_out) return v;
  if (x->node == KILN_NODE_OP && exact_op(c->g, &c->g->ops[x->producer])) return v;
  return emit_instr(c, KILN_FX_ROUND, v, -1, (uint32_t)dt, 0, 0, t);
}

/* A load of input tensor t, read as a contiguous tensor of `rank` dims `dims` at frame f. */
static int64_t emit_load(compiler *c, uint32_t t, int32_t rank, const int64_t *dims,
                         const frame *f, const box *bx) {
  int64_t w[MAP_WORDS], cs = 1, stride[KILN_MAX_RANK];
  uint32_t slot = 0, m = 0, n = 2 + 3 * (uint32_t)c->rank;
  for (int32_t j = rank - 1; j >= 0; j--) stride[j] = cs, cs *= dims[j];
  while (slot < c->n_inputs && c->inputs[slot] != t) slot++;
  if (slot == KILN_MAX_OP_INPUTS) {
    c->cut = FAIL_GIVE_UP;
    return -1;
  }
  memset(w, 0, sizeof w);
  w[0] = slot;
  for (int32_t j = 0; j < rank; j++) {
    w[1] += f->base[j] * stride[j];
    for (int32_t d = 0; d < c->rank; d++) w[2 + d] += f->m[j][d] * stride[j];
  }
  for (int32_t d = 0; d < c->rank; d++) w[2 + c->rank + d] = bx->lo[d], w[2 + 2 * c->rank + d] = bx->hi[d];
  while (m < c->n_maps && memcmp(c->maps[m], w, n * sizeof *w) != 0) m++;
  if (m == KILN_FX_MAX_MAPS) {
    c->cut = FAIL_GIVE_UP;
    return -1;
  }
  if (slot == c->n_inputs) c->inputs[c->n_inputs++] = t;
  if (m == c->n_maps) memcpy(c->maps[c->n_maps++], w, sizeof w);
  return emit_instr(c, KILN_FX_LOAD, -1, -1, m, 0, 0, t);
}

/* Frame of an operand t broadcast (right-aligned) to a value of frame f. */
static frame broadcast(const frame *f, const kiln_tensor_desc *t) {
  frame r;
  int32_t lead = f->rank - t->rank;
  memset(&r, 0, sizeof r);
  r.rank = t->rank;
  for (int32_t j = 0; j < t->rank; j++)
    if (t->dims[j] != 1) {
      r.base[j] = f->base[j + lead];
      memcpy(r.m[j], f->m[j + lead], sizeof r.m[j]);
    }
  return r;
}

/* Frame of a reshape's input t from its output u's frame f, when the coordinates stay affine:
 * each group of dims of equal product maps to one input dim, or to the same dims. */
static int reshape_frame(const frame *f, const kiln_tensor_desc *u, const kiln_tensor_desc *t,
                         frame *r) {
  int32_t i = 0, j = 0;
  memset(r, 0, sizeof *r);
  r->rank = t->rank;
  while (i < u->rank || j < t->rank) {
    int32_t i0, j0;
    int64_t pu = 1, pt = 1;
    while (i < u->rank && u->dims[i] == 1) i++;
    while (j < t->rank && t->dims[j] == 1) j++;
    if (i == u->rank || j == t->rank) return i == u->rank && j == t->rank;
    i0 = i, j0 = j;
    pu = u->dims[i++], pt = t->dims[j++];
    while (pu != pt) {
      if (pu < pt && i < u->rank) pu *= u->dims[i++];
      else if (pt < pu && j < t->rank) pt *= t->dims[j++];
      else return 0;
    }
    if (j - j0 == 1) { /* one input dim: the linear index within the group */
      int64_t scale = 1;
      for (int32_t k = i - 1; k >= i0; k--) {
        r->base[j0] += scale * f->base[k];
        for (int32_t d = 0; d < KILN_MAX_RANK; d++) r->m[j0][d] += scale * f->m[k][d];
        scale *= u->dims[k];
      }
    } else if (i - i0 == j - j0) {
      for (int32_t k = 0; k < i - i0; k++) {
        if (u->dims[i0 + k] != t->dims[j0 + k]) return 0;
        r->base[j0 + k] = f->base[i0 + k];
        memcpy(r->m[j0 + k], f->m[i0 + k], sizeof r->m[0]);
      }
    } else {
      return 0;
    }
  }
  return 1;
}

static int64_t emit_value(compiler *c, uint32_t t, const frame *f, const box *bx);

static int64_t ceil_div(int64_t a, int64_t s) { return a >= 0 ? (a + s - 1) / s : -((-a) / s); }

/* CAT along dim cd: the piece the coordinate falls in, chosen by output coordinate. */
static int64_t emit_cat(compiler *c, const kiln_op *op, uint32_t t, const frame *f,
                        const box *bx) {
  int32_t cd = (int32_t)op->iattr[0], d = -1, nz = 0;
  int64_t result = -1, o = 0;
  for (int32_t k = 0; k < c->rank; k++)
    if (f->m[cd][k] != 0) d = k, nz++;
  if (nz > 1 || (nz == 1 && f->m[cd][d] < 0)) {
    c->cut = t == c->root_out ? FAIL_GIVE_UP : (int64_t)t;
    return -1;
  }
  for (uint32_t p = 0; p < op->n_inputs; o += desc_of(c, op->inputs[p])->dims[cd], p++) {
    int64_t n = desc_of(c, op->inputs[p])->dims[cd], v, lo, hi;
    frame pf = *f;
    box sub = *bx;
    pf.base[cd] -= o;
    if (nz == 0) {
      if (f->base[cd] < o || f->base[cd] >= o + n) continue;
      return emit_value(c, op->inputs[p], &pf, bx);
    }
    lo = ceil_div(o - f->base[cd], f->m[cd][d]);
    hi = ceil_div(o + n - f->base[cd], f->m[cd][d]);
    if (lo < bx->lo[d]) lo = bx->lo[d];
    if (hi > bx->hi[d]) hi = bx->hi[d];
    if (lo >= hi) continue;
    sub.lo[d] = lo, sub.hi[d] = hi;
    if ((v = emit_value(c, op->inputs[p], &pf, &sub)) < 0) return -1;
    result = result < 0 ? v : emit_instr(c, KILN_FX_SELECT, result, v, (uint32_t)d, lo, 0, t);
    if (result < 0) return -1;
  }
  if (result < 0) c->cut = FAIL_GIVE_UP; /* no piece in the box: nothing to compute */
  return result;
}

/* The steps of a POINTWISE chain, each rounded to the chain's dtype as its op alone rounds. */
static int64_t emit_chain(compiler *c, const kiln_op *op, uint32_t t, const frame *f,
                          const box *bx) {
  kiln_dtype dt = desc_of(c, t)->dtype;
  int64_t v = emit_value(c, op->inputs[0], f, bx);
  for (uint32_t s = 0; s < op->n_iattr && v >= 0; s++) {
    int64_t step = op->iattr[s], y, one = double_word(1.0);
    kiln_op_kind kind = KILN_PW_STEP_KIND(step);
    int alpha = kind == KILN_OP_ADD || kind == KILN_OP_SUB;
    frame of;
    if (!kiln_pw_is_binary(kind)) {
      v = emit_instr(c, KILN_FX_UNARY, v, -1, (uint32_t)kind,
                     kind == KILN_OP_POW ? double_word(op->fattr[0]) : 0,
                     (step & KILN_PW_GELU_TANH) != 0, t);
    } else {
      of = broadcast(f, desc_of(c, op->inputs[KILN_PW_STEP_INPUT(step)]));
      if ((y = emit_value(c, op->inputs[KILN_PW_STEP_INPUT(step)], &of, bx)) < 0) return -1;
      v = step & KILN_PW_REVERSED
              ? emit_instr(c, KILN_FX_BINARY, y, v, (uint32_t)kind, alpha ? one : 0, 0, t)
              : emit_instr(c, KILN_FX_BINARY, v, y, (uint32_t)kind, alpha ? one : 0, 0, t);
    }
    if (s + 1 < op->n_iattr && dt != KILN_F32 && v >= 0)
      v = emit_instr(c, KILN_FX_ROUND, v, -1, (uint32_t)dt, 0, 0, t);
  }
  return round_to(c, v, dt, t);
}

/* The value of tensor t at frame f, computed only where the output coordinate lies in bx. */
static int64_t emit_value(compiler *c, uint32_t t, const frame *f, const box *bx) {
  const kiln_tensor_desc *u = desc_of(c, t);
  const kiln_op *op;
  frame r;
  int64_t v, a, b;
  uint32_t outer = c->cur;
  memo *mm;
  for (uint32_t i = 0; i < c->n_memos; i++)
    if (c->memos[i].tensor == t && !memcmp(&c->memos[i].f, f, sizeof *f) &&
        !memcmp(&c->memos[i].bx, bx, sizeof *bx))
      return c->memos[i].value;
  if (!internal(c, t)) {
    v = emit_load(c, t, u->rank, u->dims, f, bx);
    goto done;
  }
  op = op_of(c, (uint32_t)c->g->tensors[t].producer);
  r = *f;
  c->cur = t;
  switch (op->kind) {
  case KILN_OP_POINTWISE: v = emit_chain(c, op, t, f, bx); break;
  case KILN_OP_CAST:
  case KILN_OP_COPY:
    v = emit_value(c, op->inputs[0], f, bx);
    if (u->dtype != desc_of(c, op->inputs[0])->dtype) v = round_to(c, v, u->dtype, t);
    break;
  case KILN_OP_PERMUTE:
    for (int32_t i = 0; i < u->rank; i++) {
      r.base[op->iattr[i]] = f->base[i];
      memcpy(r.m[op->iattr[i]], f->m[i], sizeof r.m[0]);
    }
    v = emit_value(c, op->inputs[0], &r, bx);
    break;
  case KILN_OP_SLICE: {
    int32_t d = (int32_t)op->iattr[0];
    r.base[d] = op->iattr[1] + op->iattr[3] * f->base[d];
    for (int32_t k = 0; k < c->rank; k++) r.m[d][k] = op->iattr[3] * f->m[d][k];
    v = emit_value(c, op->inputs[0], &r, bx);
    break;
  }
  case KILN_OP_SELECT: {
    int32_t d = (int32_t)op->iattr[0];
    memset(&r, 0, sizeof r);
    r.rank = u->rank + 1;
    for (int32_t j = 0; j < r.rank; j++) {
      if (j == d) {
        r.base[j] = op->iattr[1];
        continue;
      }
      r.base[j] = f->base[j < d ? j : j - 1];
      memcpy(r.m[j], f->m[j < d ? j : j - 1], sizeof r.m[0]);
    }
    v = emit_value(c, op->inputs[0], &r, bx);
    break;
  }
  case KILN_OP_EXPAND:
    r = broadcast(f, desc_of(c, op->inputs[0]));
    v = emit_value(c, op->inputs[0], &r, bx);
    break;
  case KILN_OP_RESHAPE:
    if (!internal(c, op->inputs[0])) { /* a contiguous input reads as any shape of its size */
      v = emit_load(c, op->inputs[0], u->rank, u->dims, f, bx);
      break;
    }
    if (!reshape_frame(f, u, desc_of(c, op->inputs[0]), &r)) {
      c->cut = op->inputs[0];
      return -1;
    }
    v = emit_value(c, op->inputs[0], &r, bx);
    break;
  case KILN_OP_CAT: v = emit_cat(c, op, t, f, bx); break;
  default:
    if (!kiln_pw_is_binary(op->kind)) {
      v = emit_value(c, op->inputs[0], f, bx);
      if (v >= 0)
        v = emit_instr(c, KILN_FX_UNARY, v, -1, (uint32_t)op->kind,
                       op->kind == KILN_OP_POW ? double_word(op->fattr[0]) : 0,
                       op->kind == KILN_OP_GELU && op->iattr[0], t);
    } else {
      frame fa = broadcast(f, desc_of(c, op->inputs[0]));
      frame fb = broadcast(f, desc_of(c, op->inputs[1]));
      int alpha = op->kind == KILN_OP_ADD || op->kind == KILN_OP_SUB;
      if ((a = emit_value(c, op->inputs[0], &fa, bx)) < 0 ||
          (b = emit_value(c, op->inputs[1], &fb, bx)) < 0)
        return -1;
      v = emit_instr(c, KILN_FX_BINARY, a, b, (uint32_t)op->kind,
                     alpha ? double_word(op->fattr[0]) : 0, 0, t);
    }
    v = round_to(c, v, u->dtype, t);
    break;
  }
  c->cur = outer;
done:
  if (v < 0) return -1;
  if (c->n_memos < MAX_VALUES) {
    mm = &c->memos[c->n_memos++];
    mm->tensor = t;
    mm->f = *f;
    mm->bx = *bx;
    mm->value = (uint32_t)v;
  }
  return v;
}

/* Physical registers for the virtual ones, each freed after its last read; the program words
 * into *words (malloc). 0 when more than KILN_FX_MAX_REGS are live at once. */
static int assemble(const compiler *c, uint32_t result, int64_t **words, uint32_t *n_words) {
  uint32_t last[KILN_FX_MAX_INSTRS], phys[KILN_FX_MAX_INSTRS], used = 0, n = c->n_code + 1;
  uint64_t total = kiln_fx_words(c->n_maps, n, c->rank);
  int64_t *w;
  for (uint32_t i = 0; i < c->n_code; i++) last[i] = i;
  for (uint32_t i = 0; i < c->n_code; i++) {
    const vinstr *v = &c->code[i];
    if (v->code != KILN_FX_LOAD) last[v->a] = i;
    if (v->code == KILN_FX_BINARY || v->code == KILN_FX_SELECT) last[v->b] = i;
  }
  last[result] = c->n_code;
  if (!(w = kiln_malloc(sizeof *w * total))) return -1;
  w[0] = c->n_maps;
  w[1] = n;
  for (uint32_t m = 0; m < c->n_maps; m++)
    memcpy(w + 2 + m * (2 + 3 * c->rank), c->maps[m], sizeof *w * (2 + 3 * (uint32_t)c->rank));
  for (uint32_t i = 0; i < c->n_code; i++) {
    const vinstr *v = &c->code[i];
    int64_t *out = w + 2 + c->n_maps * (2 + 3 * c->rank) + 2 * i;
    uint32_t a = v->code != KILN_FX_LOAD ? phys[v->a] : 0;
    uint32_t b = v->code == KILN_FX_BINARY || v->code == KILN_FX_SELECT ? phys[v->b] : 0;
    uint32_t r = 0;
    if (v->code != KILN_FX_LOAD && last[v->a] == i) used &= ~(1u << a);
    if ((v->code == KILN_FX_BINARY || v->code == KILN_FX_SELECT) && last[v->b] == i)
      used &= ~(1u << b);
    while (r < KILN_FX_MAX_REGS && ((used >> r) & 1u)) r++;
    if (r == KILN_FX_MAX_REGS) {
      free(w);
      return 0;
    }
    used |= 1u << r;
    phys[i] = r;
    out[0] = KILN_FX_INSTR(v->code, r, a, b, v->arg) | (v->gelu_tanh ? KILN_FX_GELU_TANH : 0);
    out[1] = v->imm;
  }
  w[total - 2] = KILN_FX_INSTR(KILN_FX_STORE, 0, phys[result], 0, 0);
  w[total - 1] = 0;
  *words = w;
  *n_words = (uint32_t)total;
  return 1;
}

static int float_desc(const kiln_tensor_desc *t) { return kiln_dtype_is_float(t->dtype); }

/* 1 when op may be a member of a group. A float CAST of an integer or bool (a decoder's
 * positions ahead of its rotary tables, an encoder's attention mask) loads that input as the
 * cast converts it, so the cast runs no kernel of its own. */
static int groupable(const kiln_graph *g, const kiln_op *op) {
  const kiln_tensor_desc *out = &g->tensors[op->output].desc;
  uint32_t n = op->n_inputs;
  if (!float_desc(out)) return 0;
  if (op->kind == KILN_OP_CAST) return 1;
  for (uint32_t k = 0; k < n; k++)
    if (!float_desc(&g->tensors[op->inputs[k]].desc)) return 0;
  switch (op->kind) {
  case KILN_OP_POINTWISE:
  case KILN_OP_COPY:
  case KILN_OP_RESHAPE:
  case KILN_OP_PERMUTE:
  case KILN_OP_EXPAND:
  case KILN_OP_SELECT:
  case KILN_OP_CAT: return 1;
  case KILN_OP_SLICE: return op->iattr[3] >= 1;
  default: return kiln_pw_step_kind_ok(op->kind);
  }
}

/* 1 when op costs a kernel of its own unfused (a view in place costs none). */
static int does_work(const kiln_graph *g, const kiln_op *op) {
  uint64_t at;
  return !kiln_op_is_view(op, &g->tensors[op->inputs[0]].desc, &at);
}

/* A shared value at most this many elements is recomputed by each group reading it (a decode
 * step's rotary tables, which every layer reads): a few instructions an element in place of a
 * kernel of its own. */
#define RECOMPUTE_MAX_ELEMS 4096

/* Gathers the group of root r into member (which must be all zero) and returns its count of
 * ops doing work; reads[t] counts member reads of t and is left zero. A member is 1 where only
 * the group reads its value (it dies with the group), 2 where it is recomputed (with `shared`,
 * a small value that others read too, or one that such a member reads: it stays for them);
 * kept[t] marks values a recomputed member reads and is left zero. */
static uint32_t gather(const kiln_graph *g, uint32_t r, const uint32_t *uses, const uint8_t *cut,
                       const uint8_t *done, int shared, uint32_t *reads, uint8_t *kept,
                       uint8_t *member) {
  uint32_t work = 0, n = 0;
  member[r] = 1;
  for (uint32_t k = 0; k < g->ops[r].n_inputs; k++) reads[g->ops[r].inputs[k]]++;
  for (uint32_t j = r; j-- > 0;) {
    uint32_t t = g->ops[j].output;
    const kiln_tensor_desc *d = &g->tensors[t].desc;
    int own = reads[t] == uses[t] && !kept[t];
    if (g->dead[j] || done[j] || cut[t] || !reads[t] || !groupable(g, &g->ops[j]) ||
        (!own && (!shared || d->nbytes / kiln_dtype_size(d->dtype) > RECOMPUTE_MAX_ELEMS)) ||
        ++n > 2 * KILN_FX_MAX_INSTRS)
      continue;
    member[j] = own ? 1 : 2;
    for (uint32_t k = 0; k < g->ops[j].n_inputs; k++) {
      reads[g->ops[j].inputs[k]]++;
      if (!own) kept[g->ops[j].inputs[k]] = 1;
    }
  }
  for (uint32_t j = 0; j <= r; j++) {
    if (!member[j]) continue;
    work += (uint32_t)(member[j] == 1 && does_work(g, &g->ops[j]));
    for (uint32_t k = 0; k < g->ops[j].n_inputs; k++)
      reads[g->ops[j].inputs[k]] = 0, kept[g->ops[j].inputs[k]] = 0;
  }
  return work;
}

/* Compiles the group in member into c; 1 on success, else c->cut says what to do. */
static int compile(compiler *c) {
  const kiln_tensor_desc *out = desc_of(c, c->root_out);
  frame f;
  box bx;
  int64_t v;
  memset(&f, 0, sizeof f);
  f.rank = out->rank;
  for (int32_t d = 0; d < out->rank; d++) f.m[d][d] = 1, bx.lo[d] = 0, bx.hi[d] = out->dims[d];
  for (int32_t d = out->rank; d < KILN_MAX_RANK; d++) bx.lo[d] = bx.hi[d] = 0;
  c->rank = out->rank;
  c->dims = out->dims;
  c->cur = c->root_out;
  c->cut = FAIL_GIVE_UP;
  v = emit_value(c, c->root_out, &f, &bx);
  if (v >= 0) c->cut = (int64_t)v;
  return v >= 0;
}

/* Replaces the group with one FUSED op at root r holding the program in a new constant. */
static int replace(kiln_graph *g, uint32_t r, const uint8_t *member, const compiler *c,
                   int64_t *words, uint32_t n_words) {
  kiln_tensor_desc d;
  int32_t id;
  kiln_op op;
  memset(&d, 0, sizeof d);
  d.dtype = KILN_I64;
  d.rank = 1;
  d.dims[0] = n_words;
  d.nbytes = (uint64_t)n_words * 8u;
  if ((id = kiln_graph_add_tensor(g, KILN_NODE_CONSTANT, &d)) < 0) return 0;
  g->tensors[id].data = g->tensors[id].owned = (uint8_t *)words;
  memset(&op, 0, sizeof op);
  op.kind = KILN_OP_FUSED;
  op.n_inputs = c->n_inputs;
  memcpy(op.inputs, c->inputs, sizeof op.inputs);
  op.output = g->ops[r].output;
  op.n_iattr = 2;
  op.iattr[0] = id;
  op.iattr[1] = n_words;
  for (uint32_t j = 0; j < r; j++)
    if (member[j] == 1) g->dead[j] = 1; /* a recomputed member (2) stays for its other readers */
  g->ops[r] = op;
  return 1;
}

/* ---------------------------------------------------------------- dynamic graphs */

static const kiln_op_site probe_site = {"builder", 0, KILN_ERR_UNSUPPORTED,
                                        " (at a smaller size)"};

/* Adds values (n symbols) to v unless it is the bounds or v holds it already. */
static void add_values(int64_t (*v)[KILN_MAX_SYMBOLS], uint32_t *count, const int64_t *values,
                       const kiln_symbol *sym, uint32_t n) {
  int bounds = 1;
  for (uint32_t k = 0; k < n; k++) bounds &= values[k] == sym[k].max;
  for (uint32_t i = 0; i < *count; i++)
    if (!memcmp(v[i], values, sizeof *values * n)) return;
  if (!bounds && *count < MAX_PROBES) memcpy(v[(*count)++], values, sizeof *values * n);
}

/* The symbol values probed: the lower bounds first, then one above them, midway and one below
 * the upper bounds (five sizes with the bounds: a size polynomial of degree four or less in a
 * symbol cannot meet the bounds' value at all of them by chance), then each symbol alone at its
 * lower bound. */
static uint32_t probe_values(const kiln_symbol *sym, uint32_t n, int64_t (*v)[KILN_MAX_SYMBOLS]) {
  int64_t x[KILN_MAX_SYMBOLS];
  uint32_t count = 0;
  for (uint32_t k = 0; k < n; k++) x[k] = sym[k].min;
  memcpy(v[count++], x, sizeof *x * n); /* even where it is the bounds: derive fills it */
  for (int step = 1; step < 4; step++) {
    for (uint32_t k = 0; k < n; k++) {
      int64_t lo = sym[k].min, hi = sym[k].max;
      x[k] = step == 1 ? lo + 1 : step == 2 ? lo + (hi - lo) / 2 : hi - 1;
      if (x[k] < lo) x[k] = lo;
      if (x[k] > hi) x[k] = hi;
    }
    add_values(v, &count, x, sym, n);
  }
  for (uint32_t j = 0; n > 1 && j < n; j++) {
    for (uint32_t k = 0; k < n; k++) x[k] = k == j ? sym[k].min : sym[k].max;
    add_values(v, &count, x, sym, n);
  }
  return count;
}

static void release_probes(probes *pr) {
  for (uint32_t i = 0; i < MAX_PROBES; i++) {
    free(pr->at[i].tensors);
    free(pr->at[i].ops);
  }
  free(pr->derived);
  free(pr->op_at);
  memset(pr, 0, sizeof *pr);
}

/* The graph's shapes at the probed values: its tensors and live ops as a plan whose dims
 * derive_symbols relates to the symbols, then kiln_plan_shapes_at at each set of values. Leaves
 * pr->n 0 where the shapes cannot be probed (the build reports why when it derives them). */
static kiln_status make_probes(const kiln_graph *g, const kiln_symbol *symbols,
                               uint32_t n_symbols, probes *pr, kiln_error *err) {
  int64_t values[MAX_PROBES][KILN_MAX_SYMBOLS];
  kiln_error quiet = {KILN_OK, ""};
  kiln_plan plan;
  uint32_t n_values = probe_values(symbols, n_symbols, values), n_live = 0;
  size_t nt = g->n_tensors ? g->n_tensors : 1;
  kiln_status s = KILN_OK;
  memset(pr, 0, sizeof *pr);
  memset(&plan, 0, sizeof plan);
  for (uint32_t i = 0; i < g->n_ops; i++) n_live += !g->dead[i];
  plan.n_tensors = g->n_tensors;
  plan.n_ops = n_live;
  plan.n_symbols = n_symbols;
  memcpy(plan.symbols, symbols, sizeof *symbols * n_symbols);
  plan.tensors = pr->derived = kiln_calloc(nt, sizeof *plan.tensors);
  plan.ops = kiln_calloc(n_live ? n_live : 1, sizeof *plan.ops);
  pr->op_at = kiln_calloc(g->n_ops ? g->n_ops : 1, sizeof *pr->op_at);
  for (uint32_t k = 0; k < n_values && plan.ops; k++) {
    pr->at[k].tensors = kiln_malloc(nt * sizeof *plan.tensors);
    pr->at[k].ops = kiln_malloc((n_live ? n_live : 1) * sizeof *plan.ops);
    if (!pr->at[k].tensors || !pr->at[k].ops) break;
    pr->n = k + 1;
  }
  if (!pr->derived || !plan.ops || !pr->op_at || pr->n != n_values) {
    s = kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                  "builder: out of memory for %u tensors at other sizes while fusing groups; "
                  "free memory and retry",
                  (unsigned)g->n_tensors);
    goto done;
  }
  for (uint32_t t = 0; t < g->n_tensors; t++) {
    plan.tensors[t] = g->tensors[t].desc;
    plan.tensors[t].storage = KILN_STORE_ARENA;
    plan.tensors[t].io_index = 0;
  }
  for (uint32_t i = 0; i < g->n_inputs; i++) {
    plan.tensors[g->inputs[i].tensor].storage = KILN_STORE_INPUT;
    plan.tensors[g->inputs[i].tensor].io_index = i;
  }
  for (uint32_t i = 0, j = 0; i < g->n_ops; i++)
    if (!g->dead[i]) pr->op_at[i] = j, plan.ops[j++] = g->ops[i];
  s = kiln_derive_symbols(&plan, pr->at[0].tensors, pr->at[0].ops, &quiet);
  for (uint32_t k = 1; s == KILN_OK && k < n_values; k++) {
    memcpy(pr->at[k].tensors, plan.tensors, sizeof *plan.tensors * g->n_tensors);
    memcpy(pr->at[k].ops, plan.ops, sizeof *plan.ops * n_live);
    s = kiln_plan_shapes_at(&plan, values[k], 0, &probe_site, pr->at[k].tensors, pr->at[k].ops,
                            &quiet);
  }
  if (s == KILN_ERR_OUT_OF_MEMORY) s = kiln_fail(err, s, "%.200s", quiet.message);
  else if (s) pr->n = 0, s = KILN_OK; /* unprobed: no groups */
done:
  free(plan.ops);
  return s;
}

/* 1 when map y (of the probe's program b) reads what map x (of the bounds' program a) reads at
 * the probe's output dims: the same input, and x's box cut to those dims is y's; an empty box
 * reads nothing, and a stride along a dim of size 1 meets only coordinate 0. */
static int same_map(const compiler *a, const int64_t *x, const compiler *b, const int64_t *y) {
  int32_t r = b->rank;
  int64_t lo[KILN_MAX_RANK], hi[KILN_MAX_RANK]; /* x's box cut to the probe's dims */
  int empty_x = 0, empty_y = 0;
  if (x[0] != y[0] || a->inputs[x[0]] != b->inputs[y[0]]) return 0;
  for (int32_t d = 0; d < r; d++) {
    int64_t n = b->dims[d];
    lo[d] = x[2 + r + d] < n ? x[2 + r + d] : n;
    hi[d] = x[2 + 2 * r + d] < n ? x[2 + 2 * r + d] : n;
    empty_x |= lo[d] >= hi[d];
    empty_y |= y[2 + r + d] >= y[2 + 2 * r + d];
  }
  if (empty_x || empty_y) return empty_x && empty_y;
  if (x[1] != y[1]) return 0;
  for (int32_t d = 0; d < r; d++)
    if (lo[d] != y[2 + r + d] || hi[d] != y[2 + 2 * r + d] ||
        (b->dims[d] > 1 && x[2 + d] != y[2 + d]))
      return 0;
  return 1;
}

/* 1 when program b, compiled at a probe's sizes, computes there what program a (the bounds')
 * does cut to them (kiln_fx_decode_at): the same instructions, each load through a map that
 * reads the same. Else b->cut names the member to leave out: the one whose value the first
 * differing instruction computes (a load's, the member reading it), FAIL_GIVE_UP the root's. */
static int same_program(const compiler *a, compiler *b) {
  uint32_t n = a->n_code < b->n_code ? a->n_code : b->n_code, i = 0, via;
  for (; i < n; i++) {
    const vinstr *x = &a->code[i], *y = &b->code[i];
    int same = x->code == y->code && x->a == y->a && x->b == y->b &&
               x->gelu_tanh == y->gelu_tanh && x->imm == y->imm;
    if (same && x->code == KILN_FX_LOAD) same = same_map(a, a->maps[x->arg], b, b->maps[y->arg]);
    else same = same && x->arg == y->arg;
    if (!same) break;
  }
  via = a->root_out; /* the results differ */
  if (i == n && a->n_code == b->n_code && a->cut == b->cut) return 1;
  if (i < a->n_code) via = a->code[i].via;
  else if (i < b->n_code) via = b->code[i].via;
  b->cut = via == a->root_out ? FAIL_GIVE_UP : (int64_t)via;
  return 0;
}

/* 1 when the group compiled in a (at the bounds) is valid at every probe, each compiled in b;
 * else b->cut says what to do as compile's failures do. */
static int valid_at_probes(const compiler *a, compiler *b, const probes *pr) {
  for (uint32_t k = 0; k < pr->n; k++) {
    const kiln_tensor_desc *out = &pr->at[k].tensors[a->root_out];
    int64_t numel = 1;
    for (int32_t d = 0; d < out->rank; d++) numel *= out->dims[d];
    if (numel == 0) continue; /* nothing to compute at these sizes */
    memset(b, 0, sizeof *b);
    b->g = a->g;
    b->pr = pr;
    b->at = &pr->at[k];
    b->member = a->member;
    b->root_out = a->root_out;
    if (!compile(b) || !same_program(a, b)) return 0;
  }
  return 1;
}

kiln_status kiln_fuse_groups(kiln_graph *g, const kiln_symbol *symbols, uint32_t n_symbols,
                             kiln_error *err) {
  size_t nt = g->n_tensors ? g->n_tensors : 1, no = g->n_ops ? g->n_ops : 1;
  uint32_t *uses = kiln_calloc(nt, sizeof *uses), *reads = kiln_calloc(nt, sizeof *reads);
  uint8_t *cut = kiln_calloc(nt, 1), *member = kiln_calloc(no, 1), *done = kiln_calloc(no, 1);
  uint8_t *kept = kiln_calloc(nt, 1);
  int recomputed = 0;
  compiler *c = kiln_malloc(sizeof *c), *at = n_symbols ? kiln_malloc(sizeof *at) : NULL;
  probes pr;
  kiln_status s = KILN_OK;
  memset(&pr, 0, sizeof pr);
  if (!uses || !reads || !cut || !member || !done || !kept || !c || (n_symbols && !at)) {
    s = kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                  "builder: out of memory for %u tensors while fusing groups; free memory and "
                  "retry",
                  (unsigned)g->n_tensors);
    goto out;
  }
  if (n_symbols && ((s = make_probes(g, symbols, n_symbols, &pr, err)) || !pr.n)) goto out;
  kiln_graph_count_uses(g, uses);
  for (uint32_t r = g->n_ops; r-- > 0;) {
    for (int attempt = 0; attempt < 16; attempt++) {
      int64_t *words = NULL;
      uint32_t n_words = 0, work;
      int ok, compiled;
      if (g->dead[r] || !groupable(g, &g->ops[r]) || g->tensors[g->ops[r].output].desc.nbytes == 0)
        break;
      memset(member, 0, g->n_ops);
      /* a static plan's groups recompute small shared values (a dynamic one's probes would
       * need each recomputed value's sizes too) */
      if ((work = gather(g, r, uses, cut, done, n_symbols == 0, reads, kept, member)) < 2) break;
      memset(c, 0, sizeof *c);
      c->g = g;
      c->member = member;
      c->root_out = g->ops[r].output;
      compiled = compile(c);
      if (!compiled || (n_symbols && !valid_at_probes(c, at, &pr))) {
        int64_t to_cut = compiled ? at->cut : c->cut; /* a probe's, or compile's */
        if (to_cut < 0) break;
        cut[to_cut] = 1;
        continue;
      }
      ok = assemble(c, (uint32_t)c->cut, &words, &n_words);
      if (ok < 0 || (ok && !replace(g, r, member, c, words, n_words))) {
        free(words);
        s = kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                      "builder: out of memory for a fused group of op %u; free memory and retry",
                      (unsigned)r);
        goto out;
      }
      if (ok && n_symbols) /* its output's dims follow the symbols as the ops' did */
        memcpy(g->tensors[c->root_out].desc.sym, pr.derived[c->root_out].sym,
               sizeof pr.derived[c->root_out].sym);
      for (uint32_t j = 0; ok && j < r; j++) recomputed |= member[j] == 2;
      break;
    }
    done[r] = 1;
  }
  /* a recomputed value every reader of which now recomputes it is computed for none */
  if (recomputed) s = kiln_graph_remove_dead(g, err);
out:
  release_probes(&pr);
  free(uses);
  free(reads);
  free(cut);
  free(member);
  free(done);
  free(kept);
  free(c);
  free(at);
  return s;
}
