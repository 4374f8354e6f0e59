/* Writes valid blobs from the current builder into a directory, so the fuzzers start from
 * plans in today's format: make_seeds DIR. */
#include "kiln/kiln.h"

#include <stdio.h>

static int save(const char *dir, const char *name, kiln_builder *b, kiln_error *err) {
  kiln_build_options opts;
  kiln_build_options_default(&opts);
  void *blob = NULL;
  size_t size = 0;
  if (kiln_builder_build(b, &opts, &blob, &size, err) != KILN_OK) return -1;
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  int ok = f && fwrite(blob, 1, size, f) == size;
  if (f && fclose(f) != 0) ok = 0;
  kiln_free(blob);
  if (!ok) snprintf(err->message, sizeof err->message, "cannot write %.200s", path);
  return ok ? 0 : -1;
}

/* x[2,4] -> linear(w[8,4], bias[8]) + relu -> softmax -> two outputs. */
static int linear_seed(const char *dir, kiln_error *err) {
  kiln_builder *b = kiln_builder_create();
  if (!b) return -1;
  int64_t xd[2] = {2, 4}, wd[2] = {8, 4}, bd[1] = {8}, relu[1] = {KILN_ACT_RELU}, dim[1] = {1};
  float w[32] = {0.5f, -1.0f, 2.0f}, bias[8] = {1.0f};
  int32_t in[3];
  in[0] = kiln_builder_add_input(b, "x", KILN_F32, 2, xd, err);
  in[1] = kiln_builder_add_constant(b, KILN_F32, 2, wd, w, sizeof w, err);
  in[2] = kiln_builder_add_constant(b, KILN_F32, 1, bd, bias, sizeof bias, err);
  int32_t y = kiln_builder_add_op(b, KILN_OP_LINEAR, in, 3, relu, 1, NULL, 0, err);
  int32_t s = kiln_builder_add_op(b, KILN_OP_SOFTMAX, &y, 1, dim, 1, NULL, 0, err);
  int rc = y < 0 || s < 0 || kiln_builder_mark_output(b, s, "probs", err) != KILN_OK ||
                   kiln_builder_mark_output(b, y, "hidden", err) != KILN_OK ||
                   save(dir, "linear.blob", b, err) != 0
               ? -1
               : 0;
  kiln_builder_destroy(b);
  return rc;
}

/* a[2,3] + b[3] broadcast, then matmul with c[3,2] and a cast to f16. */
static int elementwise_seed(const char *dir, kiln_error *err) {
  kiln_builder *b = kiln_builder_create();
  if (!b) return -1;
  int64_t ad[2] = {2, 3}, bd[1] = {3}, cd[2] = {3, 2}, to_f16[1] = {KILN_F16};
  double alpha[1] = {1.0};
  float c[6] = {1, 2, 3, 4, 5, 6};
  int32_t t[2], m[2];
  t[0] = kiln_builder_add_input(b, "a", KILN_F32, 2, ad, err);
  t[1] = kiln_builder_add_input(b, "b", KILN_F32, 1, bd, err);
  m[0] = kiln_builder_add_op(b, KILN_OP_ADD, t, 2, NULL, 0, alpha, 1, err);
  m[1] = kiln_builder_add_constant(b, KILN_F32, 2, cd, c, sizeof c, err);
  int32_t mm = kiln_builder_add_op(b, KILN_OP_MATMUL, m, 2, NULL, 0, NULL, 0, err);
  int32_t h = kiln_builder_add_op(b, KILN_OP_CAST, &mm, 1, to_f16, 1, NULL, 0, err);
  int rc = h < 0 || kiln_builder_mark_output(b, h, "out", err) != KILN_OK ||
                   save(dir, "elementwise.blob", b, err) != 0
               ? -1
               : 0;
  kiln_builder_destroy(b);
  return rc;
}

int main(int argc, char **argv) {
  kiln_error err = {KILN_OK, ""};
  if (argc != 2) {
    fprintf(stderr, "usage: make_seeds DIR\n");
    return 2;
  }
  if (linear_seed(argv[1], &err) != 0 || elementwise_seed(argv[1], &err) != 0) {
    fprintf(stderr, "make_seeds: %s\n", err.message);
    return 1;
  }
  return 0;
}
