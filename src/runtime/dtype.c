/* Element types: sizes and the names the metadata uses. */
#include "kiln/kiln.h"

#include <stdlib.h>
#include <string.h>

static const char *const dtype_names[KILN_DTYPE_COUNT] = {"f32", "f16", "bf16", "i64", "i32", "bool"};
static const size_t dtype_sizes[KILN_DTYPE_COUNT] = {4, 2, 2, 8, 4, 1};

size_t kiln_dtype_size(kiln_dtype dtype) {
  return (unsigned)dtype < KILN_DTYPE_COUNT ? dtype_sizes[dtype] : 0;
}

const char *kiln_dtype_name(kiln_dtype dtype) {
  return (unsigned)dtype < KILN_DTYPE_COUNT ? dtype_names[dtype] : "unknown";
}

int kiln_dtype_from_name(const char *name, size_t len, kiln_dtype *out) {
  for (int i = 0; i < KILN_DTYPE_COUNT; i++) {
    if (strlen(dtype_names[i]) == len && memcmp(dtype_names[i], name, len) == 0) {
      *out = (kiln_dtype)i;
      return 0;
    }
  }
  return -1;
}

void kiln_free(void *p) { free(p); }
