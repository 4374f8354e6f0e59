/* Allocation with a test hook that makes a chosen allocation fail. */
#include "runtime/alloc.h"

#include <stdlib.h>

int kiln_test_fail_allocations;

/* 1 when this allocation must fail. */
static int injected_failure(void) {
  if (kiln_test_fail_allocations <= 0) return 0;
  return --kiln_test_fail_allocations == 0;
}

void *kiln_malloc(size_t size) { return injected_failure() ? NULL : malloc(size ? size : 1); }

void *kiln_calloc(size_t count, size_t size) {
  if (injected_failure()) return NULL;
  return count && size ? calloc(count, size) : calloc(1, 1);
}

void *kiln_realloc(void *p, size_t size) {
  return injected_failure() ? NULL : realloc(p, size ? size : 1);
}

void *kiln_aligned_alloc(size_t alignment, size_t size) {
  size_t rounded = (size + alignment - 1) & ~(alignment - 1);
  if (rounded < size || injected_failure()) return NULL;
  return aligned_alloc(alignment, rounded ? rounded : alignment);
}
