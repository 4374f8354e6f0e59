/* The builder's graph: what kiln_builder_add_* record, and what the build passes rewrite on
 * a copy. Tensors and ops keep the order they were added in, which is a topological order. */
#ifndef KILN_GRAPH_H
#define KILN_GRAPH_H

#include "kiln/kiln.h"

typedef enum kiln_node {
  KILN_NODE_INPUT = 0,
  KILN_NODE_CONSTANT = 1,
  KILN_NODE_OP = 2,   /* written by ops[producer] */
  KILN_NODE_STATE = 3 /* a state's value at the start of a run; data holds its initial value */
} kiln_node;

typedef struct kiln_gtensor {
  kiln_tensor_desc desc; /* dtype, rank, dims, nbytes */
  kiln_node node;
  int32_t producer;      /* the op writing it, for KILN_NODE_OP */
  const uint8_t *data;   /* a constant's bytes */
  uint8_t *owned;        /* bytes this graph frees (== data when it owns them) */
  int32_t transpose_of;  /* a 2-D constant that is this one transposed, or -1 */
  int32_t state;         /* the state (index into states) whose buffer this is, or -1 */
} kiln_gtensor;

typedef struct kiln_gbinding {
  int32_t tensor;
  char name[KILN_NAME_MAX];
} kiln_gbinding;

/* A state: its start-of-run tensor and the tensor holding its value after the run. */
typedef struct kiln_gstate {
  int32_t tensor;
  int32_t value; /* == tensor while no write is declared */
} kiln_gstate;

typedef struct kiln_graph {
  kiln_gtensor *tensors;
  uint32_t n_tensors, cap_tensors;
  kiln_op *ops;          /* inputs and output are graph tensor ids */
  uint8_t *dead;         /* per op: 1 once a pass removed it */
  uint32_t n_ops, cap_ops;
  kiln_gbinding inputs[KILN_MAX_BINDINGS];
  uint32_t n_inputs;
  kiln_gbinding outputs[KILN_MAX_BINDINGS];
  uint32_t n_outputs;
  kiln_gstate states[KILN_MAX_BINDINGS];
  uint32_t n_states;
} kiln_graph;

/* Appends a tensor (node, desc copied; no data) and returns its id, or -1 when out of memory. */
int32_t kiln_graph_add_tensor(kiln_graph *g, kiln_node node, const kiln_tensor_desc *desc);
/* Appends op, whose output tensor is created here from out; returns the op index or -1. */
int32_t kiln_graph_add_op(kiln_graph *g, const kiln_op *op, const kiln_tensor_desc *out);
/* Inserts ops[k] (each writing a tensor already in g) before the op at index at[k] (at ascending,
 * at most n_ops; ops with one at keep their order): later ops move up and every tensor's producer
 * follows, the inserted ops' outputs naming them. Returns 0, or -1 (out of memory, or at out of
 * order) with g as it was. */
int kiln_graph_insert_ops(kiln_graph *g, const uint32_t *at, const kiln_op *ops, uint32_t n);
/* Deep enough a copy for the passes: constants' bytes are borrowed from src. */
int kiln_graph_clone(const kiln_graph *src, kiln_graph *dst);
void kiln_graph_release(kiln_graph *g);

/* uses[t] = reads of t by live ops plus 1 for each output binding naming t and each state
 * write of t. */
void kiln_graph_count_uses(const kiln_graph *g, uint32_t *uses);
/* For a fusion pass: *uses as kiln_graph_count_uses fills it, and *reader with, per tensor, the
 * last live op reading it (-1 for none), in two arrays from malloc the caller frees; out of
 * memory is an error naming `pass`. */
kiln_status kiln_graph_readers(const kiln_graph *g, const char *pass, uint32_t **uses,
                               int32_t **reader, kiln_error *err);
/* The live op writing tensor t when uses[t] (as kiln_graph_count_uses counts) is `readers`,
 * or -1: what a fusion pass asks before it takes a producer into its reader. */
int32_t kiln_graph_producer(const kiln_graph *g, uint32_t t, const uint32_t *uses,
                            uint32_t readers);
/* 1 when tensor t is named by an output binding or is a state's value after the run. */
int kiln_graph_is_output(const kiln_graph *g, int32_t t);
/* Whether any of op's integer attributes follows a symbol (a size known at the bound only). */
int kiln_op_follows_symbol(const kiln_op *op);
/* from_state[t] = 1 for each state tensor (a state's value at the start of the run) and each
 * view of one through live views (reshape, copy, permute, select, slice: the ops the memory plan
 * may place on their input's bytes): bytes a state's write may change during the run, so two
 * reads of one such tensor at different places may differ. An op's other outputs have bytes of
 * their own, and a value written into a state is read only after its one write. */
void kiln_graph_mark_state_derived(const kiln_graph *g, uint8_t *from_state);
/* Marks dead every op whose output reaches no output binding and no live state's write; a
 * state no needed op reads (its value can reach no output, now or in a later run) is written no
 * more. */
kiln_status kiln_graph_remove_dead(kiln_graph *g, kiln_error *err);

#endif
