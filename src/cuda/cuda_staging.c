/* The chunked staging of host buffers: see cuda_staging.h. The GPU side needs no waits (every
 * copy is on one stream, so a slot's DMAs run in the order they were enqueued); the CPU waits
 * for a slot's event only before it writes or reads that slot. */
#include "cuda_staging.h"

#include <string.h>

#define KCU_STAGE_ALIGN ((size_t)256)

static size_t kcu_min(size_t a, size_t b) { return a < b ? a : b; }

size_t kcu_staging_bytes(size_t largest) {
  if (largest == 0) return 0;
  size_t slot = (kcu_min(largest, KCU_STAGE_CHUNK) + KCU_STAGE_ALIGN - 1) / KCU_STAGE_ALIGN *
                KCU_STAGE_ALIGN;
  return slot * KCU_STAGE_SLOTS;
}

cudaError_t kcu_staging_init(kcu_staging *st, void *ring, size_t ring_bytes) {
  memset(st, 0, sizeof *st);
  st->ring = (unsigned char *)ring;
  st->slot_bytes = ring_bytes / KCU_STAGE_SLOTS / KCU_STAGE_ALIGN * KCU_STAGE_ALIGN;
  for (int i = 0; i < KCU_STAGE_SLOTS; i++) {
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
  for (int i = 0; i < KCU_STAGE_SLOTS; i++) {
    if (st->done[i]) cudaEventDestroy(st->done[i]);
    st->done[i] = NULL;
  }
}

cudaError_t kcu_stage_upload(kcu_staging *st, cudaStream_t stream, void *dst, const void *src,
                             size_t n) {
  if (n > 0 && st->slot_bytes == 0) return cudaErrorInvalidValue;
  for (size_t off = 0; off < n; off += st->slot_bytes) {
    size_t len = kcu_min(st->slot_bytes, n - off);
    unsigned slot = st->next;
    unsigned char *pinned = st->ring + (size_t)slot * st->slot_bytes;
    st->next = (slot + 1) % KCU_STAGE_SLOTS;
    if (st->busy[slot]) {
      cudaError_t rc = cudaEventSynchronize(st->done[slot]); /* its last DMA has read it */
      if (rc != cudaSuccess) return rc;
    }
    memcpy(pinned, (const unsigned char *)src + off, len);
    cudaError_t rc = cudaMemcpyAsync((unsigned char *)dst + off, pinned, len,
                                     cudaMemcpyHostToDevice, stream);
    if (rc == cudaSuccess) rc = cudaEventRecord(st->done[slot], stream);
    if (rc != cudaSuccess) return rc;
    st->busy[slot] = 1;
    st->chunks++;
  }
  return cudaSuccess;
}

/* Enqueues chunk c of a download that started at slot `base`. */
static cudaError_t kcu_fetch_chunk(kcu_staging *st, cudaStream_t stream, const void *src,
                                   size_t n, unsigned base, size_t c) {
  unsigned slot = (unsigned)((base + c) % KCU_STAGE_SLOTS);
  size_t off = c * st->slot_bytes;
  cudaError_t rc = cudaMemcpyAsync(st->ring + (size_t)slot * st->slot_bytes,
                                   (const unsigned char *)src + off,
                                   kcu_min(st->slot_bytes, n - off), cudaMemcpyDeviceToHost, stream);
  if (rc == cudaSuccess) rc = cudaEventRecord(st->done[slot], stream);
  if (rc == cudaSuccess) st->busy[slot] = 1;
  return rc;
}

cudaError_t kcu_stage_download(kcu_staging *st, cudaStream_t stream, void *dst, const void *src,
                               size_t n) {
  if (n == 0) return cudaSuccess;
  if (st->slot_bytes == 0) return cudaErrorInvalidValue;
  size_t chunks = (n + st->slot_bytes - 1) / st->slot_bytes;
  unsigned base = st->next;
  cudaError_t rc = cudaSuccess;
  /* Every slot holds one chunk in flight; a slot takes its next chunk once the CPU emptied it. */
  for (size_t c = 0; rc == cudaSuccess && c < chunks && c < KCU_STAGE_SLOTS; c++)
    rc = kcu_fetch_chunk(st, stream, src, n, base, c);
  for (size_t c = 0; rc == cudaSuccess && c < chunks; c++) {
    unsigned slot = (unsigned)((base + c) % KCU_STAGE_SLOTS);
    size_t off = c * st->slot_bytes;
    rc = cudaEventSynchronize(st->done[slot]);
    if (rc != cudaSuccess) break;
    memcpy((unsigned char *)dst + off, st->ring + (size_t)slot * st->slot_bytes,
           kcu_min(st->slot_bytes, n - off));
    st->busy[slot] = 0;
    st->chunks++;
    if (c + KCU_STAGE_SLOTS < chunks) rc = kcu_fetch_chunk(st, stream, src, n, base, c + KCU_STAGE_SLOTS);
  }
  st->next = (unsigned)((base + chunks) % KCU_STAGE_SLOTS);
  return rc;
}

void kcu_staging_idle(kcu_staging *st) {
  for (int i = 0; i < KCU_STAGE_SLOTS; i++) st->busy[i] = 0;
}
