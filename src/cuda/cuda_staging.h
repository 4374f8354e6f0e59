/* Host buffers to and from the device at the link's rate: a ring of pinned slots allocated at
 * init, through which a transfer moves in chunks, the pool's threads copying one chunk while
 * the copy engine moves the one before (core/stage_ring.h); this file is its CUDA side: each
 * slot's DMA on the engine's stream, and an event recorded after it. Nothing is allocated per
 * transfer. */
#ifndef KILN_CUDA_STAGING_H
#define KILN_CUDA_STAGING_H

#include "runtime/stage_ring.h"

#include <cuda_runtime_api.h>
#include <stddef.h>

#define KCU_STAGE_SLOTS KILN_STAGE_SLOTS

typedef struct kcu_staging {
  kiln_stage_ring ring;   /* over pinned host memory owned by the caller of init */
  kiln_stage_pool *pool;  /* owned by the caller of init */
  cudaEvent_t done[KCU_STAGE_SLOTS]; /* recorded after the DMA that last used each slot */
  int busy[KCU_STAGE_SLOTS];         /* an event was recorded and not yet seen complete */
  kiln_stage_transport transport;
  /* the transfer in progress */
  cudaStream_t stream;
  unsigned char *dev;
  int upload;
  cudaError_t error;
} kcu_staging;

/* Bytes of pinned memory a ring needs for transfers of at most `largest` bytes each, in
 * chunks of at most chunk_bytes. */
size_t kcu_staging_bytes(size_t largest, size_t chunk_bytes);

/* Takes `ring` (pinned memory of kcu_staging_bytes(largest, chunk_bytes) bytes) and the pool,
 * and creates the slot events; on failure none is left. */
cudaError_t kcu_staging_init(kcu_staging *st, void *ring, size_t largest, size_t chunk_bytes,
                             kiln_stage_pool *pool);

void kcu_staging_release(kcu_staging *st);

/* Enqueues on `stream` the copy of n host bytes at src to device memory dst; returns once every
 * chunk is in pinned memory (the DMA may still run: the stream orders what follows). */
cudaError_t kcu_stage_upload(kcu_staging *st, cudaStream_t stream, void *dst, const void *src,
                             size_t n);

/* Copies n device bytes at src (written by work already on `stream`) into host memory dst;
 * returns once dst holds them. */
cudaError_t kcu_stage_download(kcu_staging *st, cudaStream_t stream, void *dst, const void *src,
                               size_t n);

/* A host copy of n bytes (between a caller buffer and the ring), on the pool's threads when it
 * is large enough to pay for waking them. */
void kcu_stage_copy(kcu_staging *st, void *dst, const void *src, size_t n);

/* After the stream was synchronized: every slot is free again. */
void kcu_staging_idle(kcu_staging *st);

#endif
