/* Host buffers to and from the device at the link's rate: a ring of pinned slots allocated at
 * init, through which a transfer moves in chunks, the CPU copying one chunk while the copy
 * engine moves the one before. Nothing is allocated per transfer. */
#ifndef KILN_CUDA_STAGING_H
#define KILN_CUDA_STAGING_H

#include <cuda_runtime_api.h>
#include <stddef.h>

#define KCU_STAGE_SLOTS 4
#define KCU_STAGE_CHUNK ((size_t)2 << 20)

typedef struct kcu_staging {
  unsigned char *ring;     /* pinned host memory: KCU_STAGE_SLOTS slots of slot_bytes */
  size_t slot_bytes;
  cudaEvent_t done[KCU_STAGE_SLOTS]; /* recorded after the DMA that last used each slot */
  int busy[KCU_STAGE_SLOTS];         /* an event was recorded and not yet waited for */
  unsigned next;                     /* the slot the next chunk takes */
  unsigned long long chunks;         /* chunks moved, for tests */
} kcu_staging;

/* Bytes of pinned memory a ring needs for transfers of at most `largest` bytes each. */
size_t kcu_staging_bytes(size_t largest);

/* Takes `ring` (ring_bytes of pinned memory, at least kcu_staging_bytes of the largest
 * transfer, owned by the caller) and creates the slot events; on failure none is left. */
cudaError_t kcu_staging_init(kcu_staging *st, void *ring, size_t ring_bytes);

void kcu_staging_release(kcu_staging *st);

/* Enqueues on `stream` the copy of n host bytes at src to device memory dst; returns once every
 * chunk is in pinned memory (the DMA may still run: the stream orders what follows). */
cudaError_t kcu_stage_upload(kcu_staging *st, cudaStream_t stream, void *dst, const void *src,
                             size_t n);

/* Copies n device bytes at src (written by work already on `stream`) into host memory dst;
 * returns once dst holds them. */
cudaError_t kcu_stage_download(kcu_staging *st, cudaStream_t stream, void *dst, const void *src,
                               size_t n);

/* After the stream was synchronized: every slot is free again. */
void kcu_staging_idle(kcu_staging *st);

#endif
