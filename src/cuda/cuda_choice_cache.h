/* Choices an engine measures at init (a GEMM's algorithm, a convolution's), kept for the
 * process: a program loaded twice runs the same kernels, so two engines of it time alike, and
 * later loads skip the measuring. A key is the bytes that decide the choice (shape, dtypes,
 * alignments, device); a fixed table, filled until full, allocates nothing. */
#ifndef KILN_CUDA_CHOICE_CACHE_H
#define KILN_CUDA_CHOICE_CACHE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KCU_CHOICE_KEY_BYTES 256
#define KCU_CHOICE_VALUE_BYTES 96

/* Copies the value kept for key into value and returns 1, or returns 0 when none is kept. */
int kcu_choice_find(const void *key, size_t key_len, void *value, size_t value_len);
/* Keeps value for key (replacing an earlier one); a full table keeps what it has. */
void kcu_choice_keep(const void *key, size_t key_len, const void *value, size_t value_len);

#ifdef __cplusplus
}
#endif

#endif
