/* Allocation entry points of libkiln. Tests set kiln_test_fail_allocations to make one
 * allocation fail and prove that every failure path returns an error and leaks nothing. */
#ifndef KILN_ALLOC_H
#define KILN_ALLOC_H

#include <stddef.h>

/* Test-only. 0: allocations succeed. N > 0: the N-th allocation from now fails, after which
 * the counter is 0 again; a counter still above 0 afterwards means fewer than N were made. */
extern int kiln_test_fail_allocations;

void *kiln_malloc(size_t size);
void *kiln_calloc(size_t count, size_t size);
void *kiln_realloc(void *p, size_t size);
/* Memory aligned to `alignment` (a power of two); size is rounded up to it. Release with free. */
void *kiln_aligned_alloc(size_t alignment, size_t size);

#endif
