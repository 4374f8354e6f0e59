/* KILN_OP_FUSED's register program (kiln.h, KILN_FX): decoded and checked in one place, so the
 * plan parser, both engines and `kiln inspect` read the same instructions, and a program that
 * could read outside an input, read an unwritten register or skip its store never loads. */
#ifndef KILN_FUSED_PROGRAM_H
#define KILN_FUSED_PROGRAM_H

#include "kiln/kiln.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_fx_map {
  uint32_t slot;
  int64_t offset;
  int64_t stride[KILN_MAX_RANK], lo[KILN_MAX_RANK], hi[KILN_MAX_RANK];
  int full; /* the box is the whole output: the load needs no test */
} kiln_fx_map;

typedef struct kiln_fx_instr {
  uint32_t code, dst, a, b, arg;
  int gelu_tanh;
  double imm;     /* POW's exponent, ADD/SUB's alpha */
  int64_t bound;  /* SELECT's */
} kiln_fx_instr;

typedef struct kiln_fx_prog {
  int32_t rank; /* the output's */
  uint32_t n_maps, n_instrs;
  kiln_fx_map maps[KILN_FX_MAX_MAPS];
  kiln_fx_instr instrs[KILN_FX_MAX_INSTRS];
} kiln_fx_prog;

/* Number of words a program of n_maps maps and n_instrs instructions over rank dims takes. */
static inline uint64_t kiln_fx_words(uint32_t n_maps, uint32_t n_instrs, int32_t rank) {
  return 2u + (uint64_t)n_maps * (2u + 3u * (uint64_t)rank) + 2u * (uint64_t)n_instrs;
}

/* Decodes op's program from words[0..n_words) and checks it against the op's inputs and output
 * (plan op `index`): every field, register, map box and address. */
kiln_status kiln_fx_decode(const int64_t *words, uint32_t n_words, const kiln_op *op,
                           uint32_t index, const kiln_tensor_desc *const *in,
                           const kiln_tensor_desc *out, kiln_fx_prog *prog, kiln_error *err);

/* The same at a call's sizes in a dynamic plan (in and out at those sizes; the plan's own were
 * checked by kiln_fx_decode): each box and SELECT bound is cut to out's dims, so a box that
 * covers a dim at the bounds covers it at every size, and every address is checked again at
 * these sizes. The engines run what this gives. */
kiln_status kiln_fx_decode_at(const int64_t *words, uint32_t n_words, const kiln_op *op,
                              uint32_t index, const kiln_tensor_desc *const *in,
                              const kiln_tensor_desc *out, kiln_fx_prog *prog, kiln_error *err);

/* Writes instruction i as text: "r3 = load in1[map 2]", "r2 = mul r0 r1"; returns buf. */
const char *kiln_fx_instr_str(const kiln_fx_prog *prog, uint32_t i, char *buf, size_t size);

#ifdef __cplusplus
}
#endif

#endif
