/* Replaces malloc and its relatives with wrappers around glibc's allocator that count calls
 * while `counting` is set, so a test can show that a call allocates nothing. Under
 * AddressSanitizer or ThreadSanitizer, which own malloc, nothing is replaced and SANITIZED is
 * defined: the count stays 0 and the tests skip that assertion. Include once per program. */
#ifndef KILN_TEST_COUNTING_MALLOC_H
#define KILN_TEST_COUNTING_MALLOC_H

#include <errno.h>
#include <stddef.h>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SANITIZED 1
#endif
#endif

/* volatile: the compiler assumes malloc touches no program memory */
static volatile int counting;
static volatile long allocations;

#ifndef SANITIZED
extern void *__libc_malloc(size_t size);
extern void *__libc_calloc(size_t count, size_t size);
extern void *__libc_realloc(void *p, size_t size);
extern void *__libc_memalign(size_t alignment, size_t size);

void *malloc(size_t size) {
  allocations += counting;
  return __libc_malloc(size);
}
void *calloc(size_t count, size_t size) {
  allocations += counting;
  return __libc_calloc(count, size);
}
void *realloc(void *p, size_t size) {
  allocations += counting;
  return __libc_realloc(p, size);
}
void *aligned_alloc(size_t alignment, size_t size) {
  allocations += counting;
  return __libc_memalign(alignment, size);
}
int posix_memalign(void **out, size_t alignment, size_t size) {
  allocations += counting;
  *out = __libc_memalign(alignment, size);
  return *out ? 0 : ENOMEM;
}
#endif

#endif
