/* The CUDA side of chunked staging: see cuda_staging.h. The GPU side needs no waits (every
 * copy is on one stream, so a slot's DMAs run in the order they were enqueued); the host polls
 * or waits for a slot's event only before its threads write or read that slot. */
#include "cuda_staging.h"

#include <string.h>

static int kcu_stage_send(void *ctx, unsigned slot, size_t offset, size_t len) {
  kcu_staging *st = (kcu_staging *)ctx;
  unsigned char *pinned = st->ring.base + (size_t)slot * st->ring.slot_bytes;
  cudaError_t rc = st->upload ? cudaMemcpyAsync(st->dev + offset, pinned, len,
                                                cudaMemcpyHostToDevice, st->stream)
                              : cudaMemcpyAsync(pinned, st->dev + offset, len,
                                                cudaMemcpyDeviceToHost, st->stream);
  if (rc == cudaSuccess) rc = cudaEventRecord(st->done[slot], st->stream);
  if (rc != cudaSuccess) {
    st->error = rc;
    return 1;
  }
  st->busy[slot] = 1;
  return 0;
}

static int kcu_stage_poll(void *ctx, unsigned slot) {
  kcu_staging *st = (kcu_staging *)ctx;
  if (!st->busy[slot]) return 1;
  cudaError_t rc = cudaEventQuery(st->done[slot]);
  if (rc == cudaErrorNotReady) return 0;
  if (rc != cudaSuccess) {
    st->error = rc;
    return -1;
  }
  st->busy[slot] = 0;
  return 1;
}

static int kcu_stage_wait(void *ctx, unsigned slot) {
  kcu_staging *st = (kcu_staging *)ctx;
  if (!st->busy[slot]) return 0;
  cudaError_t rc = cudaEventSynchronize(st->done[slot]);
  if (rc != cudaSuccess) {
    st->error = rc;
    return 1;
  }
  st->busy[slot] = 0;
  return 0;
}

size_t kcu_staging_bytes(size_t largest, size_t chunk_bytes) {
  return kiln_stage_slot_bytes(largest, chunk_bytes) * KCU_STAGE_SLOTS;
}

cudaError_t kcu_staging_init(kcu_staging *st, void *ring, size_t largest, size_t chunk_bytes,
                             kiln_stage_pool *pool) {
  memset(st, 0, sizeof *st);
  kiln_stage_ring_init(&st->ring, ring, kiln_stage_slot_bytes(largest, chunk_bytes),
                       KCU_STAGE_SLOTS, 0);
  st->pool = pool;
  st->transport.ctx = st;
  st->transport.send = kcu_stage_send;
  st->transport.poll = kcu_stage_poll;
  st->transport.wait = kcu_stage_wait;
  for (unsigned i = 0; i < KCU_STAGE_SLOTS; i++) {
    cudaError_t rc = cudaEventCreateWithFlags(&st->done[i], cudaEventDisableTiming);
    if (rc != cudaSuccess) {
      st->done[i] = NULL;
      kcu_staging_release(st);
      return rc;
    }
  }
  return cudaSuccess;
}

void kcu_staging_release(kcu_staging *st) {
  for (unsigned i = 0; i < KCU_STAGE_SLOTS; i++) {
    if (st->done[i]) cudaEventDestroy(st->done[i]);
    st->done[i] = NULL;
  }
}

/* Runs one transfer through the ring; the first CUDA error it met, if any. */
static cudaError_t kcu_stage_run(kcu_staging *st, cudaStream_t stream, int upload, void *dev,
                                 void *host, size_t n) {
  if (n == 0) return cudaSuccess;
  if (st->ring.slot_bytes == 0) return cudaErrorInvalidValue;
  st->stream = stream;
  st->dev = (unsigned char *)dev;
  st->upload = upload;
  st->error = cudaSuccess;
  int rc = upload ? kiln_stage_upload(&st->ring, st->pool, &st->transport, host, n)
                  : kiln_stage_download(&st->ring, st->pool, &st->transport, host, n);
  if (rc != 0 && st->error == cudaSuccess) st->error = cudaErrorInvalidValue;
  return st->error;
}

cudaError_t kcu_stage_upload(kcu_staging *st, cudaStream_t stream, void *dst, const void *src,
                             size_t n) {
  return kcu_stage_run(st, stream, 1, dst, (void *)(size_t)src, n);
}

cudaError_t kcu_stage_download(kcu_staging *st, cudaStream_t stream, void *dst, const void *src,
                               size_t n) {
  return kcu_stage_run(st, stream, 0, (void *)(size_t)src, dst, n);
}

void kcu_stage_copy(kcu_staging *st, void *dst, const void *src, size_t n) {
  kiln_stage_copy(st->pool, dst, src, n, KILN_STAGE_GRAIN, st->ring.parallel_min);
}

void kcu_staging_idle(kcu_staging *st) {
  for (unsigned i = 0; i < KCU_STAGE_SLOTS; i++) st->busy[i] = 0;
}
