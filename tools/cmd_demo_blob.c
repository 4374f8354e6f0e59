/* `kiln demo-blob PATH`: builds a small deterministic MLP and writes its blob to PATH. */
#include "commands.h"

#include "kiln/kiln.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define IN_FEATURES 16
#define HIDDEN 32
#define OUT_FEATURES 8

/* Small weights from a fixed pattern, so every build writes the same bytes. */
static void fill(float *v, int n, int salt) {
  for (int i = 0; i < n; i++) v[i] = (float)((i * 7 + salt * 3) % 17 - 8) / 64.0f;
}

/* x[2,16] -> linear 32 -> relu -> linear 8. */
static kiln_status build_mlp(void **blob, size_t *size, uint64_t *arena, kiln_error *err) {
  static float w1[HIDDEN * IN_FEATURES], b1[HIDDEN], w2[OUT_FEATURES * HIDDEN], b2[OUT_FEATURES];
  const int64_t x_dims[2] = {2, IN_FEATURES}, w1_dims[2] = {HIDDEN, IN_FEATURES},
                b1_dims[1] = {HIDDEN}, w2_dims[2] = {OUT_FEATURES, HIDDEN},
                b2_dims[1] = {OUT_FEATURES};
  kiln_builder *b = kiln_builder_create();
  int32_t t[8];
  kiln_status s = KILN_ERR_INVALID_ARGUMENT;
  if (!b) return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY, "demo-blob: out of memory for a builder");
  fill(w1, HIDDEN * IN_FEATURES, 1);
  fill(b1, HIDDEN, 2);
  fill(w2, OUT_FEATURES * HIDDEN, 3);
  fill(b2, OUT_FEATURES, 4);
  if ((t[0] = kiln_builder_add_input(b, "x", KILN_F32, 2, x_dims, err)) >= 0 &&
      (t[1] = kiln_builder_add_constant(b, KILN_F32, 2, w1_dims, w1, sizeof w1, err)) >= 0 &&
      (t[2] = kiln_builder_add_constant(b, KILN_F32, 1, b1_dims, b1, sizeof b1, err)) >= 0 &&
      (t[3] = kiln_builder_add_constant(b, KILN_F32, 2, w2_dims, w2, sizeof w2, err)) >= 0 &&
      (t[4] = kiln_builder_add_constant(b, KILN_F32, 1, b2_dims, b2, sizeof b2, err)) >= 0 &&
      (t[5] = kiln_builder_add_op(b, KILN_OP_LINEAR, (int32_t[]){t[0], t[1], t[2]}, 3, NULL, 0,
                                  NULL, 0, err)) >= 0 &&
      (t[6] = kiln_builder_add_op(b, KILN_OP_RELU, &t[5], 1, NULL, 0, NULL, 0, err)) >= 0 &&
      (t[7] = kiln_builder_add_op(b, KILN_OP_LINEAR, (int32_t[]){t[6], t[3], t[4]}, 3, NULL, 0,
                                  NULL, 0, err)) >= 0 &&
      (s = kiln_builder_mark_output(b, t[7], "y", err)) == KILN_OK &&
      (s = kiln_builder_build(b, NULL, blob, size, err)) == KILN_OK)
    *arena = kiln_builder_arena_size(b);
  kiln_builder_destroy(b);
  return s;
}

/* Writes data to path through path.tmp, so a failure never destroys an existing file. */
static int write_replacing(const char *path, const void *data, size_t size) {
  size_t len = strlen(path);
  char *tmp = malloc(len + 5);
  FILE *f;
  int ok;
  if (!tmp) {
    fprintf(stderr, "kiln demo-blob: out of memory\n");
    return -1;
  }
  memcpy(tmp, path, len);
  memcpy(tmp + len, ".tmp", 5);
  f = fopen(tmp, "wb");
  ok = f && fwrite(data, 1, size, f) == size;
  if (f && fclose(f) != 0) ok = 0;
  if (ok && rename(tmp, path) != 0) ok = 0;
  if (!ok) {
    fprintf(stderr, "kiln demo-blob: cannot write %.200s: check the directory exists and is "
                    "writable\n", path);
    remove(tmp);
  }
  free(tmp);
  return ok ? 0 : -1;
}

int kiln_cmd_demo_blob(int argc, char **argv) {
  kiln_error err = {KILN_OK, ""};
  void *blob = NULL;
  size_t size = 0;
  uint64_t arena = 0;
  int rc;
  if (argc != 2) {
    fprintf(stderr, "usage: kiln demo-blob PATH\n");
    return 2;
  }
  if (build_mlp(&blob, &size, &arena, &err) != KILN_OK) {
    fprintf(stderr, "kiln demo-blob: %s\n", err.message);
    return 1;
  }
  rc = write_replacing(argv[1], blob, size);
  if (rc == 0)
    printf("wrote %s: %llu bytes, MLP x f32 [2,%d] -> linear %d + relu -> linear %d -> y f32 "
           "[2,%d], arena %llu bytes\n",
           argv[1], (unsigned long long)size, IN_FEATURES, HIDDEN, OUT_FEATURES, OUT_FEATURES,
           (unsigned long long)arena);
  kiln_free(blob);
  return rc ? 1 : 0;
}
