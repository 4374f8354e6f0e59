/* FUSED programs: decoding with every check the engines rely on, and display. */
#include "runtime/fused_program.h"

#include "runtime/pointwise_steps.h"
#include "runtime/shape.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define FX_BAD(...) kiln_fail(err, KILN_ERR_INVALID_PROGRAM, __VA_ARGS__)

static double word_double(int64_t w) {
  double d;
  memcpy(&d, &w, sizeof d);
  return d;
}

static int64_t numel_of(const kiln_tensor_desc *t) {
  int64_t n = 1;
  for (int32_t d = 0; d < t->rank; d++) n *= t->dims[d];
  return n;
}

/* Decodes map m and checks that every address its box reaches lies in its input. With clip (a
 * call's sizes), the box is first cut to the output's dims. */
static kiln_status decode_map(const int64_t *w, uint32_t m, const kiln_op *op, uint32_t index,
                              const kiln_tensor_desc *const *in, const kiln_tensor_desc *out,
                              int clip, kiln_fx_map *map, kiln_error *err) {
  int32_t r = out->rank;
  __int128 lo = 0, hi = 0;
  int empty = 0;
  if (w[0] < 0 || w[0] >= (int64_t)op->n_inputs)
    return FX_BAD("plan op %u (fused): map %u reads input slot %lld of its %u inputs; re-export "
                  "the program",
                  (unsigned)index, (unsigned)m, (long long)w[0], (unsigned)op->n_inputs);
  map->slot = (uint32_t)w[0];
  map->offset = w[1];
  map->full = 1;
  lo = hi = w[1];
  for (int32_t d = 0; d < r; d++) {
    map->stride[d] = w[2 + d];
    map->lo[d] = w[2 + r + d];
    map->hi[d] = w[2 + 2 * r + d];
    if (map->lo[d] < 0 || map->lo[d] > map->hi[d] ||
        map->hi[d] > (clip ? KILN_DIM_MAX : out->dims[d]) || map->stride[d] < -KILN_DIM_MAX ||
        map->stride[d] > KILN_DIM_MAX)
      return FX_BAD("plan op %u (fused): map %u dim %d has box %lld..%lld (output dim %lld) or "
                    "stride %lld out of range; re-export the program",
                    (unsigned)index, (unsigned)m, (int)d, (long long)map->lo[d],
                    (long long)map->hi[d], (long long)out->dims[d], (long long)map->stride[d]);
    if (clip && map->hi[d] > out->dims[d]) map->hi[d] = out->dims[d];
    if (clip && map->lo[d] > map->hi[d]) map->lo[d] = map->hi[d];
    if (map->lo[d] == map->hi[d]) empty = 1;
    if (map->lo[d] != 0 || map->hi[d] != out->dims[d]) map->full = 0;
    if (empty) continue;
    if (map->stride[d] > 0) {
      lo += (__int128)map->stride[d] * map->lo[d];
      hi += (__int128)map->stride[d] * (map->hi[d] - 1);
    } else {
      lo += (__int128)map->stride[d] * (map->hi[d] - 1);
      hi += (__int128)map->stride[d] * map->lo[d];
    }
  }
  if (!empty && (lo < 0 || hi >= numel_of(in[map->slot])))
    return FX_BAD("plan op %u (fused): map %u reaches elements %lld..%lld of input %u, which has "
                  "%lld%.26s; re-export the program",
                  (unsigned)index, (unsigned)m, (long long)lo, (long long)hi,
                  (unsigned)map->slot, (long long)numel_of(in[map->slot]),
                  clip ? " at these dynamic sizes" : "");
  return KILN_OK;
}

/* Checks one instruction's fields; *written has a bit per register written so far. */
static kiln_status decode_instr(const int64_t *w, uint32_t i, const kiln_fx_prog *prog,
                                uint32_t index, const kiln_tensor_desc *out, int clip,
                                uint32_t *written, kiln_fx_instr *ins, kiln_error *err) {
  uint32_t code = KILN_FX_CODE(w[0]), arg = KILN_FX_ARG(w[0]);
  int reads_a = code != KILN_FX_LOAD, reads_b = code == KILN_FX_BINARY || code == KILN_FX_SELECT;
  int ok = (w[0] & ~KILN_FX_KNOWN_BITS) == 0 && code >= KILN_FX_LOAD && code <= KILN_FX_STORE;
  kiln_op_kind kind = (kiln_op_kind)arg;
  memset(ins, 0, sizeof *ins);
  ins->code = code;
  ins->dst = KILN_FX_DST(w[0]);
  ins->a = KILN_FX_A(w[0]);
  ins->b = KILN_FX_B(w[0]);
  ins->arg = arg;
  ins->gelu_tanh = (w[0] & KILN_FX_GELU_TANH) != 0;
  ok = ok && (code != KILN_FX_STORE ? ins->dst < KILN_FX_MAX_REGS : ins->dst == 0) &&
       (reads_a ? ins->a < KILN_FX_MAX_REGS && ((*written >> ins->a) & 1u) : ins->a == 0) &&
       (reads_b ? ins->b < KILN_FX_MAX_REGS && ((*written >> ins->b) & 1u) : ins->b == 0) &&
       (!ins->gelu_tanh || (code == KILN_FX_UNARY && kind == KILN_OP_GELU));
  switch (code) {
  case KILN_FX_LOAD: ok = ok && arg < prog->n_maps && w[1] == 0; break;
  case KILN_FX_UNARY:
    ins->imm = word_double(w[1]);
    ok = ok && kiln_pw_step_kind_ok(kind) && !kiln_pw_is_binary(kind) &&
         (kind == KILN_OP_POW ? isfinite(ins->imm) : w[1] == 0);
    break;
  case KILN_FX_BINARY:
    ins->imm = word_double(w[1]);
    ok = ok && kiln_pw_is_binary(kind) &&
         (kind == KILN_OP_ADD || kind == KILN_OP_SUB ? isfinite(ins->imm) : w[1] == 0);
    break;
  case KILN_FX_ROUND: ok = ok && (arg == KILN_F16 || arg == KILN_BF16) && w[1] == 0; break;
  case KILN_FX_SELECT: /* at a call's sizes (clip), a bound past the dim selects a alone */
    ok = ok && (int32_t)arg < out->rank && w[1] >= 0 &&
         w[1] <= (clip ? KILN_DIM_MAX : out->dims[arg]);
    ins->bound = ok && w[1] > out->dims[arg] ? out->dims[arg] : w[1];
    break;
  default: ok = ok && arg == 0 && w[1] == 0 && i + 1 == prog->n_instrs; break; /* STORE */
  }
  if (!ok)
    return FX_BAD("plan op %u (fused): instruction %u (code %u, r%u = r%u, r%u, arg %u) is "
                  "malformed or reads a register not yet written; re-export the program",
                  (unsigned)index, (unsigned)i, (unsigned)code, (unsigned)ins->dst,
                  (unsigned)ins->a, (unsigned)ins->b, (unsigned)arg);
  if (code != KILN_FX_STORE) *written |= 1u << ins->dst;
  return KILN_OK;
}

static kiln_status decode(const int64_t *words, uint32_t n_words, const kiln_op *op,
                          uint32_t index, const kiln_tensor_desc *const *in,
                          const kiln_tensor_desc *out, int clip, kiln_fx_prog *prog,
                          kiln_error *err) {
  const int64_t *w;
  uint32_t written = 0, used = 0;
  kiln_status s;
  if (op->n_iattr != 2 || op->iattr[0] < 0 || op->iattr[1] < 2 ||
      op->iattr[0] > (int64_t)n_words - op->iattr[1] || op->n_inputs == 0)
    return FX_BAD("plan op %u (fused): program at word %lld (+%lld) is outside the plan's %u "
                  "words, or the op has no input; re-export the program",
                  (unsigned)index, (long long)op->iattr[0], (long long)op->iattr[1],
                  (unsigned)n_words);
  w = words + op->iattr[0];
  if (!kiln_dtype_is_float(out->dtype))
    return FX_BAD("plan op %u (fused): output dtype %.4s is not a float; re-export the program",
                  (unsigned)index, kiln_dtype_name(out->dtype));
  /* inputs of every dtype load: an integer or bool one as its cast to f32 gives it */
  memset(prog, 0, sizeof *prog);
  prog->rank = out->rank;
  if (w[0] < 0 || w[0] > KILN_FX_MAX_MAPS || w[1] < 1 || w[1] > KILN_FX_MAX_INSTRS ||
      kiln_fx_words((uint32_t)w[0], (uint32_t)w[1], out->rank) != (uint64_t)op->iattr[1])
    return FX_BAD("plan op %u (fused): %lld maps and %lld instructions (at most %d and %d) do "
                  "not fill its %lld words; re-export the program",
                  (unsigned)index, (long long)w[0], (long long)w[1], KILN_FX_MAX_MAPS,
                  KILN_FX_MAX_INSTRS, (long long)op->iattr[1]);
  prog->n_maps = (uint32_t)w[0];
  prog->n_instrs = (uint32_t)w[1];
  w += 2;
  for (uint32_t m = 0; m < prog->n_maps; m++, w += 2 + 3 * out->rank) {
    if ((s = decode_map(w, m, op, index, in, out, clip, &prog->maps[m], err))) return s;
    used |= 1u << prog->maps[m].slot;
  }
  if (used != (1u << op->n_inputs) - 1u)
    return FX_BAD("plan op %u (fused): some of its %u inputs are read by no map; re-export the "
                  "program",
                  (unsigned)index, (unsigned)op->n_inputs);
  for (uint32_t i = 0; i < prog->n_instrs; i++, w += 2)
    if ((s = decode_instr(w, i, prog, index, out, clip, &written, &prog->instrs[i], err)))
      return s;
  if (prog->instrs[prog->n_instrs - 1].code != KILN_FX_STORE)
    return FX_BAD("plan op %u (fused): the last of its %u instructions is not its store; "
                  "re-export the program",
                  (unsigned)index, (unsigned)prog->n_instrs);
  return KILN_OK;
}

kiln_status kiln_fx_decode(const int64_t *words, uint32_t n_words, const kiln_op *op,
                           uint32_t index, const kiln_tensor_desc *const *in,
                           const kiln_tensor_desc *out, kiln_fx_prog *prog, kiln_error *err) {
  return decode(words, n_words, op, index, in, out, 0, prog, err);
}

kiln_status kiln_fx_decode_at(const int64_t *words, uint32_t n_words, const kiln_op *op,
                              uint32_t index, const kiln_tensor_desc *const *in,
                              const kiln_tensor_desc *out, kiln_fx_prog *prog, kiln_error *err) {
  return decode(words, n_words, op, index, in, out, 1, prog, err);
}

const char *kiln_fx_instr_str(const kiln_fx_prog *prog, uint32_t i, char *buf, size_t size) {
  const kiln_fx_instr *x = &prog->instrs[i];
  const char *name = kiln_op_name((kiln_op_kind)x->arg);
  if (size == 0) return buf;
  switch (x->code) {
  case KILN_FX_LOAD: {
    const kiln_fx_map *m = &prog->maps[x->arg];
    int n = snprintf(buf, size, "r%u=in%u[%lld", x->dst, m->slot, (long long)m->offset);
    for (int32_t d = 0; d < prog->rank && n > 0 && (size_t)n < size; d++)
      n += snprintf(buf + n, size - (size_t)n, "%s%lld", d ? "," : ";", (long long)m->stride[d]);
    if (n > 0 && (size_t)n < size) snprintf(buf + n, size - (size_t)n, "%s]", m->full ? "" : " boxed");
    break;
  }
  case KILN_FX_UNARY:
    if (x->arg == KILN_OP_POW)
      snprintf(buf, size, "r%u=pow(r%u,%g)", x->dst, x->a, x->imm);
    else
      snprintf(buf, size, "r%u=%s%s(r%u)", x->dst, name,
               x->arg == KILN_OP_GELU ? (x->gelu_tanh ? "_tanh" : "_erf") : "", x->a);
    break;
  case KILN_FX_BINARY:
    if ((x->arg == KILN_OP_ADD || x->arg == KILN_OP_SUB) && x->imm != 1.0)
      snprintf(buf, size, "r%u=%s(r%u,%g*r%u)", x->dst, name, x->a, x->imm, x->b);
    else
      snprintf(buf, size, "r%u=%s(r%u,r%u)", x->dst, name, x->a, x->b);
    break;
  case KILN_FX_ROUND:
    snprintf(buf, size, "r%u=round_%s(r%u)", x->dst, kiln_dtype_name((kiln_dtype)x->arg), x->a);
    break;
  case KILN_FX_SELECT:
    snprintf(buf, size, "r%u=d%u<%lld?r%u:r%u", x->dst, x->arg, (long long)x->bound, x->a, x->b);
    break;
  default: snprintf(buf, size, "store r%u", x->a); break;
  }
  return buf;
}
