/* The CPU backend as an engine: plans of several ops through arena and weight storage,
 * repeated runs, aliased outputs copied into inputs, init refusals with their exact messages,
 * injected allocation failures, and no allocation during execute. */
#include "runtime/alloc.h"
#include "test_cpu_harness.h"

static kiln_error err;

#define DIMS(...) ((const int64_t[]){__VA_ARGS__})
#define IDS(...) ((const uint32_t[]){__VA_ARGS__})
#define BUFS(...) ((void *const[]){__VA_ARGS__})

/* x[2,4] -> linear(w, b, gelu) -> softmax(dim 1) -> * y[3] -> out0 [2,3];
 * the linear result summed over dim 1 -> out1 [2]. Weights live in the weights section and
 * the intermediates in the arena. */
static graph *chain_graph(const float *w, const float *b) {
  graph *g = g_new();
  uint32_t x = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 2, DIMS(2, 4));
  uint32_t y = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 1, DIMS(3));
  uint32_t tw = g_weight(g, KILN_F32, 2, DIMS(3, 4), w);
  uint32_t tb = g_weight(g, KILN_F32, 1, DIMS(3), b);
  uint32_t t1 = g_tensor(g, KILN_STORE_ARENA, KILN_F32, 2, DIMS(2, 3));
  uint32_t t2 = g_tensor(g, KILN_STORE_ARENA, KILN_F32, 2, DIMS(2, 3));
  uint32_t o0 = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 2, DIMS(2, 3));
  uint32_t o1 = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 1, DIMS(2));
  g_op(g, KILN_OP_LINEAR, 3, IDS(x, tw, tb), t1, 1, DIMS(KILN_ACT_GELU_ERF), 0);
  g_op(g, KILN_OP_SOFTMAX, 1, IDS(t1), t2, 1, DIMS(1), 0);
  g_op(g, KILN_OP_MUL, 2, IDS(t2, y), o0, 0, NULL, 0);
  g_op(g, KILN_OP_SUM, 1, IDS(t1), o1, 2, DIMS(2, 0), 0);
  return g;
}

static void chain_reference(const float *x, const float *y, const float *w, const float *b,
                            double *out0, double *out1) {
  for (int i = 0; i < 2; i++) {
    double h[3], sum = 0;
    out1[i] = 0;
    for (int j = 0; j < 3; j++) {
      double acc = b[j];
      for (int k = 0; k < 4; k++) acc += (double)x[i * 4 + k] * w[j * 4 + k];
      h[j] = 0.5 * acc * (1 + erf(acc / sqrt(2.0)));
      out1[i] += h[j];
      sum += exp(h[j]);
    }
    for (int j = 0; j < 3; j++) out0[i * 3 + j] = exp(h[j]) / sum * y[j];
  }
}

static void test_chain(void) {
  float w[12], b[3] = {0.1f, -0.2f, 0.3f}, x[8], y[3] = {1, -2, 0.5f}, o0[6], o1[2];
  double want0[6], want1[2];
  uint32_t seed = 3;
  for (int i = 0; i < 12; i++) w[i] = (float)next_random(&seed);
  for (int i = 0; i < 8; i++) x[i] = (float)(2 * next_random(&seed));
  graph *g = chain_graph(w, b);
  kiln_engine *e = g_engine(g);
  CHECK(kiln_cpu_backend.init(e, &err) == KILN_OK);
  for (int run = 0; run < 3; run++) { /* the arena and scratch are reused run after run */
    for (int i = 0; i < 8; i++) x[i] += 0.25f * (float)run;
    CHECK(g_execute(e, g, BUFS(x, y), BUFS(o0, o1), &err) == KILN_OK);
    chain_reference(x, y, w, b, want0, want1);
    CHECK_VALUES("chain out0", o0, KILN_F32, want0, 6);
    CHECK_VALUES("chain out1", o1, KILN_F32, want1, 2);
  }
  kiln_cpu_backend.destroy(e);
  CHECK(e->impl == NULL);
  free(e);
  free(g);
}

/* cache[4] += new[4], with output 0 aliased to input 0 (a KV cache update in place). */
static graph *alias_graph(void) {
  graph *g = g_new();
  uint32_t cache = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 1, DIMS(4));
  uint32_t fresh = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 1, DIMS(4));
  uint32_t out = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 1, DIMS(4));
  g_op(g, KILN_OP_ADD, 2, IDS(cache, fresh), out, 0, NULL, 1.0);
  g->aliases[0] = (kiln_alias){.output = 0, .input = 0, .kind = "inplace"};
  g->n_aliases = 1;
  return g;
}

static void test_alias(void) {
  float cache[4] = {1, 2, 3, 4}, fresh[4] = {10, 20, 30, 40}, out[4] = {0};
  graph *g = alias_graph();
  kiln_engine *e = g_engine(g);
  CHECK(kiln_cpu_backend.init(e, &err) == KILN_OK);
  CHECK(g_execute(e, g, BUFS(cache, fresh), BUFS(out), &err) == KILN_OK);
  CHECK(out[0] == 11 && out[3] == 44);
  CHECK(cache[0] == 11 && cache[1] == 22 && cache[2] == 33 && cache[3] == 44);
  CHECK(g_execute(e, g, BUFS(cache, fresh), BUFS(out), &err) == KILN_OK); /* accumulates */
  CHECK(cache[0] == 21 && cache[3] == 84 && out[1] == 42);
  /* the output bound to the input's own buffer: nothing left to copy */
  CHECK(g_execute(e, g, BUFS(cache, fresh), BUFS(cache), &err) == KILN_OK);
  CHECK(cache[0] == 31 && cache[3] == 124);
  kiln_cpu_backend.destroy(e);
  free(e);
  free(g);
}

static void test_null_buffer(void) {
  float x[2] = {1, 2}, o[2];
  graph *g = g_new();
  uint32_t tx = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 1, DIMS(2));
  uint32_t to = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 1, DIMS(2));
  g_op(g, KILN_OP_NEG, 1, IDS(tx), to, 0, NULL, 0);
  CHECK(g_run(g, BUFS(NULL), BUFS(o), &err) == KILN_ERR_INVALID_ARGUMENT);
  CHECK_STR(err.message, "tensor 0: input 0 has no data for its 8 bytes; pass a buffer");
  CHECK(g_run(g, BUFS(x), BUFS(NULL), &err) == KILN_ERR_INVALID_ARGUMENT);
  CHECK_STR(err.message, "tensor 1: output 0 has no data for its 8 bytes; pass a buffer");
  free(g);
}

/* Attention over zero keys with values of 2^62 columns: every tensor is empty, but the row
 * of scratch it would need is refused before anything is allocated. */
static void test_scratch_beyond_address_space(void) {
  const int64_t huge = (int64_t)1 << 62;
  graph *g = g_new();
  uint32_t q = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 4, DIMS(1, 1, 0, 4));
  uint32_t k = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 4, DIMS(1, 1, 0, 4));
  uint32_t v = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 4, DIMS(1, 1, 0, huge));
  uint32_t o = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 4, DIMS(1, 1, 0, huge));
  g_op(g, KILN_OP_SDPA, 3, IDS(q, k, v), o, 2, DIMS(0, 0), 0);
  CHECK(g_run(g, BUFS(NULL, NULL, NULL), BUFS(NULL), &err) == KILN_ERR_OUT_OF_MEMORY);
  CHECK_STR(err.message, "CPU engine: arena of 0 bytes or scratch of 4611686018427387904 values "
                         "exceeds the address space; use a smaller program");
  free(g);
}

static void test_empty_plan(void) {
  graph *g = g_new();
  CHECK(g_run(g, NULL, NULL, &err) == KILN_OK);
  free(g);
}

/* ---------------------------------------------------------------- init refusals */

typedef void (*breaker)(graph *g);

/* Builds relu(x[2,3]) -> out, lets `brk` spoil it, and expects init to refuse with `want`. */
static void expect_refusal(int line, breaker brk, kiln_status status, const char *want) {
  graph *g = g_new();
  uint32_t x = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 2, DIMS(2, 3));
  uint32_t o = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 2, DIMS(2, 3));
  g_op(g, KILN_OP_RELU, 1, IDS(x), o, 0, NULL, 0);
  brk(g);
  kiln_engine *e = g_engine(g);
  memset(&err, 0, sizeof err);
  kiln_status st = kiln_cpu_backend.init(e, &err);
  if (st != status || strcmp(err.message, want) != 0)
    fprintf(stderr, "line %d: status %d, message:\n  %s\n", line, (int)st, err.message);
  CHECK(st == status);
  CHECK_STR(err.message, want);
  CHECK((st == KILN_OK) == (e->impl != NULL));
  if (st == KILN_OK) kiln_cpu_backend.destroy(e);
  free(e);
  free(g);
}

#define EXPECT_REFUSAL(brk, status, want) expect_refusal(__LINE__, brk, status, want)

static void retype(graph *g, uint32_t t, kiln_dtype dt) {
  g->tensors[t].dtype = dt;
  g->tensors[t].nbytes = 6 * kiln_dtype_size(dt);
}

static void softmax_to_i64(graph *g) {
  g->ops[0].kind = KILN_OP_SOFTMAX;
  retype(g, 1, KILN_I64);
}
static void write_weight(graph *g) {
  float zeros[6] = {0};
  g->ops[0].output = g_weight(g, KILN_F32, 2, DIMS(2, 3), zeros);
}
static void write_input(graph *g) { g->ops[0].output = 0; }
static void arena_overrun(graph *g) {
  g->ops[0].output = g_tensor(g, KILN_STORE_ARENA, KILN_F32, 2, DIMS(2, 3));
  g->arena_size = 16;
}
static void weight_overrun(graph *g) {
  float zeros[6] = {0};
  g->ops[0].inputs[0] = g_weight(g, KILN_F32, 2, DIMS(2, 3), zeros);
  g->tensors[g->ops[0].inputs[0]].offset = 60;
}
static void input_offset(graph *g) { g->tensors[0].offset = 4; }
static void bytes_mismatch(graph *g) { g->tensors[0].nbytes = 20; }
static void bad_dtype(graph *g) { g->tensors[1].dtype = (kiln_dtype)9; }
static void negative_dim(graph *g) {
  g->tensors[0].dims[0] = -2;
  g->tensors[0].dims[1] = -3;
}
static void io_index_past(graph *g) { g->tensors[0].io_index = 3; }
static void io_names_missing_tensor(graph *g) { g->outputs[0] = 40; }
static void unknown_kind(graph *g) { g->ops[0].kind = (kiln_op_kind)99; }
static void too_few_inputs(graph *g) { g->ops[0].kind = KILN_OP_ADD; }
static void input_index_past(graph *g) { g->ops[0].inputs[0] = 24; }
static void embedding_float_indices(graph *g) {
  float table[6] = {0};
  g->ops[0].kind = KILN_OP_EMBEDDING;
  g->ops[0].n_inputs = 2;
  g->ops[0].inputs[1] = 0;
  g->ops[0].inputs[0] = g_weight(g, KILN_F32, 2, DIMS(3, 2), table);
}
static void where_float_condition(graph *g) {
  g->ops[0].kind = KILN_OP_WHERE;
  g->ops[0].n_inputs = 3;
  g->ops[0].inputs[1] = g->ops[0].inputs[2] = 0;
}
static void permute_repeats(graph *g) {
  g->ops[0].kind = KILN_OP_PERMUTE;
  g->ops[0].n_iattr = 2;
  g->ops[0].iattr[0] = g->ops[0].iattr[1] = 1;
}
static void layout_changes_dtype(graph *g) {
  g->ops[0].kind = KILN_OP_COPY;
  retype(g, 1, KILN_F16);
}
static void softmax_dim_past(graph *g) {
  g->ops[0].kind = KILN_OP_SOFTMAX;
  g->ops[0].iattr[0] = 2;
}
static void slice_past_end(graph *g) { /* rows 1, 3 of a dim of 2 */
  g->ops[0].kind = KILN_OP_SLICE;
  g->ops[0].iattr[0] = 0, g->ops[0].iattr[1] = 1, g->ops[0].iattr[2] = 4, g->ops[0].iattr[3] = 2;
}
static void select_past_end(graph *g) {
  g->ops[0].kind = KILN_OP_SELECT;
  g->ops[0].iattr[0] = 1, g->ops[0].iattr[1] = 3;
  g->tensors[1].rank = 1, g->tensors[1].dims[0] = 2, g->tensors[1].nbytes = 8;
}
static void reduce_mask_past_rank(graph *g) {
  g->ops[0].kind = KILN_OP_SUM;
  g->ops[0].iattr[0] = 4;
}
static void norm_flags_without_inputs(graph *g) {
  g->ops[0].kind = KILN_OP_LAYER_NORM;
  g->ops[0].iattr[0] = 1, g->ops[0].iattr[1] = 3;
}
static void cast_target_differs(graph *g) {
  g->ops[0].kind = KILN_OP_CAST;
  g->ops[0].iattr[0] = KILN_F16;
}
static void gelu_mode_unknown(graph *g) {
  g->ops[0].kind = KILN_OP_GELU;
  g->ops[0].iattr[0] = 2;
}
static void sdpa_mask_flag_without_mask(graph *g) {
  g->ops[0].kind = KILN_OP_SDPA;
  g->ops[0].n_inputs = 3;
  g->ops[0].iattr[1] = 1;
}
static void alias_past_outputs(graph *g) {
  g->aliases[0] = (kiln_alias){.output = 1, .input = 0, .kind = "inplace"};
  g->n_aliases = 1;
}
static void alias_size_differs(graph *g) {
  g_tensor(g, KILN_STORE_INPUT, KILN_F32, 1, DIMS(5));
  g->aliases[0] = (kiln_alias){.output = 0, .input = 1, .kind = "inplace"};
  g->n_aliases = 1;
}
static void two_inputs(graph *g, kiln_op_kind kind, int64_t iattr0) {
  g->ops[0].kind = kind;
  g->ops[0].n_inputs = 2;
  g->ops[0].inputs[1] = 0;
  g->ops[0].n_iattr = 1;
  g->ops[0].iattr[0] = iattr0;
}
static void compare_to_float(graph *g) { two_inputs(g, KILN_OP_COMPARE, KILN_CMP_EQ); }
static void compare_unknown(graph *g) {
  two_inputs(g, KILN_OP_COMPARE, KILN_CMP_GE + 1);
  retype(g, 1, KILN_BOOL);
}
static void logical_not_of_two(graph *g) {
  two_inputs(g, KILN_OP_LOGICAL, KILN_BOOL_NOT);
  retype(g, 1, KILN_BOOL);
}
static void bitwise_on_float(graph *g) { two_inputs(g, KILN_OP_BITWISE, KILN_BOOL_AND); }
static void log_to_i64(graph *g) {
  g->ops[0].kind = KILN_OP_LOG;
  retype(g, 1, KILN_I64);
}
static void nothing(graph *g) { (void)g; }

static void test_refusals(void) {
  EXPECT_REFUSAL(nothing, KILN_OK, "");
  EXPECT_REFUSAL(softmax_to_i64, KILN_ERR_UNSUPPORTED,
                 "plan op 0 (softmax): output dtype i64 is not supported, only f32, f16 and "
                 "bf16; cast to a float dtype before this op");
  EXPECT_REFUSAL(write_weight, KILN_ERR_INVALID_PROGRAM,
                 "plan op 0 (relu): writes into an input or weight tensor; re-export the program");
  EXPECT_REFUSAL(write_input, KILN_ERR_INVALID_PROGRAM,
                 "plan op 0 (relu): writes into an input or weight tensor; re-export the program");
  EXPECT_REFUSAL(arena_overrun, KILN_ERR_INVALID_PROGRAM,
                 "plan tensor 2: 24 bytes at offset 0 lie outside its arena of 16 bytes; "
                 "re-export the program");
  EXPECT_REFUSAL(weight_overrun, KILN_ERR_INVALID_PROGRAM,
                 "plan tensor 2: 24 bytes at offset 60 lie outside its weights of 64 bytes; "
                 "re-export the program");
  EXPECT_REFUSAL(input_offset, KILN_ERR_INVALID_PROGRAM,
                 "plan tensor 0: 24 bytes at offset 4 lie outside its input of 24 bytes; "
                 "re-export the program");
  EXPECT_REFUSAL(bytes_mismatch, KILN_ERR_INVALID_PROGRAM,
                 "plan tensor 0: dtype 0, rank 2, storage 2 or dims do not make its 20 bytes; "
                 "re-export the program");
  EXPECT_REFUSAL(bad_dtype, KILN_ERR_INVALID_PROGRAM,
                 "plan tensor 1: dtype 9, rank 2, storage 3 or dims do not make its 24 bytes; "
                 "re-export the program");
  EXPECT_REFUSAL(negative_dim, KILN_ERR_INVALID_PROGRAM,
                 "plan tensor 0: dtype 0, rank 2, storage 2 or dims do not make its 24 bytes; "
                 "re-export the program");
  EXPECT_REFUSAL(io_index_past, KILN_ERR_INVALID_PROGRAM,
                 "plan tensor 0: input index 3 is past the 1 inputs; re-export the program");
  EXPECT_REFUSAL(io_names_missing_tensor, KILN_ERR_INVALID_PROGRAM,
                 "plan I/O 1 names tensor 40 of 2; re-export the program");
  EXPECT_REFUSAL(unknown_kind, KILN_ERR_UNSUPPORTED,
                 "plan op 0: unknown op kind 99; update the runtime or re-export");
  EXPECT_REFUSAL(too_few_inputs, KILN_ERR_INVALID_PROGRAM,
                 "plan op 0 (add): 1 inputs (wants 2 to 2) or a tensor index out of range; "
                 "re-export the program");
  EXPECT_REFUSAL(input_index_past, KILN_ERR_INVALID_PROGRAM,
                 "plan op 0 (relu): 1 inputs (wants 1 to 1) or a tensor index out of range; "
                 "re-export the program");
  EXPECT_REFUSAL(embedding_float_indices, KILN_ERR_INVALID_PROGRAM,
                 "plan op 0 (embedding): input 1 has dtype f32, which this op does not take "
                 "with output dtype f32; re-export the program");
  EXPECT_REFUSAL(where_float_condition, KILN_ERR_INVALID_PROGRAM,
                 "plan op 0 (where): input 0 has dtype f32, which this op does not take with "
                 "output dtype f32; re-export the program");
  EXPECT_REFUSAL(layout_changes_dtype, KILN_ERR_INVALID_PROGRAM,
                 "plan op 0 (copy): input 0 has dtype f32, which this op does not take with "
                 "output dtype f16; re-export the program");
  EXPECT_REFUSAL(permute_repeats, KILN_ERR_INVALID_PROGRAM,
                 "plan op 0 (permute): attributes 1, 1, 0, 0 do not fit its 1 inputs of rank "
                 "2; re-export the program");
  EXPECT_REFUSAL(softmax_dim_past, KILN_ERR_INVALID_PROGRAM,
                 "plan op 0 (softmax): attributes 2, 0, 0, 0 do not fit its 1 inputs of rank "
                 "2; re-export the program");
  EXPECT_REFUSAL(slice_past_end, KILN_ERR_INVALID_PROGRAM,
                 "plan op 0 (slice): attributes 0, 1, 4, 2 do not fit its 1 inputs of rank 2; "
                 "re-export the program");
  EXPECT_REFUSAL(select_past_end, KILN_ERR_INVALID_PROGRAM,
                 "plan op 0 (select): attributes 1, 3, 0, 0 do not fit its 1 inputs of rank 2; "
                 "re-export the program");
  EXPECT_REFUSAL(reduce_mask_past_rank, KILN_ERR_INVALID_PROGRAM,
                 "plan op 0 (sum): attributes 4, 0, 0, 0 do not fit its 1 inputs of rank 2; "
                 "re-export the program");
  EXPECT_REFUSAL(norm_flags_without_inputs, KILN_ERR_INVALID_PROGRAM,
                 "plan op 0 (layer_norm): attributes 1, 3, 0, 0 do not fit its 1 inputs of "
                 "rank 2; re-export the program");
  EXPECT_REFUSAL(cast_target_differs, KILN_ERR_INVALID_PROGRAM,
                 "plan op 0 (cast): attributes 1, 0, 0, 0 do not fit its 1 inputs of rank 2; "
                 "re-export the program");
  EXPECT_REFUSAL(gelu_mode_unknown, KILN_ERR_INVALID_PROGRAM,
                 "plan op 0 (gelu): attributes 2, 0, 0, 0 do not fit its 1 inputs of rank 2; "
                 "re-export the program");
  EXPECT_REFUSAL(sdpa_mask_flag_without_mask, KILN_ERR_INVALID_PROGRAM,
                 "plan op 0 (sdpa): attributes 0, 1, 0, 0 do not fit its 3 inputs of rank 2; "
                 "re-export the program");
  EXPECT_REFUSAL(compare_to_float, KILN_ERR_INVALID_PROGRAM,
                 "plan op 0 (compare): input 0 has dtype f32, which this op does not take with "
                 "output dtype f32; re-export the program");
  EXPECT_REFUSAL(compare_unknown, KILN_ERR_INVALID_PROGRAM,
                 "plan op 0 (compare): attributes 6, 0, 0, 0 do not fit its 2 inputs of rank "
                 "2; re-export the program");
  EXPECT_REFUSAL(logical_not_of_two, KILN_ERR_INVALID_PROGRAM,
                 "plan op 0 (logical): attributes 3, 0, 0, 0 do not fit its 2 inputs of rank "
                 "2; re-export the program");
  EXPECT_REFUSAL(bitwise_on_float, KILN_ERR_INVALID_PROGRAM,
                 "plan op 0 (bitwise): input 0 has dtype f32, which this op does not take with "
                 "output dtype f32; re-export the program");
  EXPECT_REFUSAL(log_to_i64, KILN_ERR_UNSUPPORTED,
                 "plan op 0 (log): output dtype i64 is not supported, only f32, f16 and bf16; "
                 "cast to a float dtype before this op");
  EXPECT_REFUSAL(alias_past_outputs, KILN_ERR_INVALID_PROGRAM,
                 "alias 0: output 1 and input 0 are out of range or differ in size; re-export "
                 "the program");
  EXPECT_REFUSAL(alias_size_differs, KILN_ERR_INVALID_PROGRAM,
                 "alias 0: output 0 and input 1 are out of range or differ in size; re-export "
                 "the program");
}

/* ---------------------------------------------------------------- allocation */

/* Every allocation init makes is failed in turn: each failure is reported, leaves no state
 * behind (the sanitizer build checks for leaks) and the next attempt succeeds. */
static void test_alloc_failures(void) {
  float w[12] = {0}, b[3] = {0};
  graph *g = chain_graph(w, b);
  uint32_t q = g_tensor(g, KILN_STORE_INPUT, KILN_F32, 2, DIMS(3, 8));
  uint32_t o = g_tensor(g, KILN_STORE_OUTPUT, KILN_F32, 2, DIMS(3, 8));
  g_op(g, KILN_OP_SDPA, 3, IDS(q, q, q), o, 2, DIMS(1, 0), 0); /* needs scratch */
  int failures = 0, n;
  for (n = 1; n < 20; n++) {
    kiln_engine *e = g_engine(g);
    kiln_test_fail_allocations = n;
    kiln_status st = kiln_cpu_backend.init(e, &err);
    int left = kiln_test_fail_allocations;
    kiln_test_fail_allocations = 0;
    if (st == KILN_OK) {
      CHECK(left > 0); /* fewer than n allocations were made */
      kiln_cpu_backend.destroy(e);
      free(e);
      break;
    }
    failures++;
    CHECK(st == KILN_ERR_OUT_OF_MEMORY);
    CHECK(strncmp(err.message, "CPU engine: out of host memory for ", 35) == 0);
    CHECK(e->impl == NULL);
    free(e);
  }
  CHECK(failures == 4); /* state, arena, pointer table, scratch */
  free(g);
}

/* Execute allocates nothing through libkiln's allocator (test_cpu_noalloc.c checks malloc
 * itself): an allocation would consume the armed failure. */
static void test_execute_allocates_nothing(void) {
  float w[12] = {0}, b[3] = {0}, x[8] = {0}, y[3] = {0}, o0[6], o1[2];
  graph *g = chain_graph(w, b);
  kiln_engine *e = g_engine(g);
  CHECK(kiln_cpu_backend.init(e, &err) == KILN_OK);
  kiln_test_fail_allocations = 1;
  CHECK(g_execute(e, g, BUFS(x, y), BUFS(o0, o1), &err) == KILN_OK);
  CHECK(kiln_test_fail_allocations == 1);
  kiln_test_fail_allocations = 0;
  kiln_cpu_backend.destroy(e);
  free(e);
  free(g);
}

int main(void) {
  test_chain();
  test_alias();
  test_null_buffer();
  test_empty_plan();
  test_scratch_beyond_address_space();
  test_refusals();
  test_alloc_failures();
  test_execute_allocates_nothing();
  return check_report("test_cpu_engine");
}
