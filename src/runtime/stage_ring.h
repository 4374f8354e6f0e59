/* Chunked staging of host buffers through a ring of slots: while the device side (a transport:
 * the CUDA engine's copy engine, or a fake one in tests) moves one chunk, the pool's threads copy
 * the next. The engine sizes everything at init; a transfer allocates nothing. No CUDA here. */
#ifndef KILN_STAGE_RING_H
#define KILN_STAGE_RING_H

#include "runtime/stage_pool.h"

#include <stddef.h>

#define KILN_STAGE_SLOTS 4u
#define KILN_STAGE_GRAIN ((size_t)64 << 10)           /* bytes one thread copies at a time */
#define KILN_STAGE_PARALLEL_MIN ((size_t)256 << 10)   /* smaller transfers: the caller alone */
#define KILN_STAGE_MIN_CHUNKS 4u                      /* a transfer splits in at least this many */
#define KILN_STAGE_DEFAULT_CHUNK ((size_t)8 << 20)
#define KILN_STAGE_DEFAULT_THREADS 8
#define KILN_STAGE_CHUNK_KIB_MIN 64
#define KILN_STAGE_CHUNK_KIB_MAX (256 * 1024)

typedef struct kiln_stage_settings {
  int threads;        /* threads that copy, the caller included */
  size_t chunk_bytes; /* the largest chunk: one ring slot */
} kiln_stage_settings;

/* KILN_STAGE_THREADS (0..64; 0 or 1: the calling thread alone; unset: min(cores, 8)) and
 * KILN_STAGE_CHUNK_KIB (64..262144; unset: 8192). A malformed value is refused. */
kiln_status kiln_stage_settings_from_env(kiln_stage_settings *out, kiln_error *err);

/* The device side of a transfer, for chunk moves between a ring slot and the device. */
typedef struct kiln_stage_transport {
  void *ctx;
  /* Enqueues the move of `len` bytes at `offset` of the transfer: from the slot to the device
   * (upload) or from the device into the slot (download). 0, or an error code. */
  int (*send)(void *ctx, unsigned slot, size_t offset, size_t len);
  /* Whether the last move that used `slot` has finished: 1 yes (or there was none), 0 not
   * yet, negative on error. */
  int (*poll)(void *ctx, unsigned slot);
  /* Blocks until it has: 0, or an error code. */
  int (*wait)(void *ctx, unsigned slot);
} kiln_stage_transport;

typedef struct kiln_stage_ring {
  unsigned char *base; /* slots * slot_bytes */
  size_t slot_bytes, grain;
  size_t parallel_min; /* transfers below this leave the workers asleep */
  unsigned slots;
  unsigned next;            /* the slot the next chunk takes */
  unsigned long long chunks; /* chunks moved, for tests */
} kiln_stage_ring;

/* Slot bytes for transfers of at most `largest` bytes in chunks of at most chunk_bytes: a
 * multiple of the grain it will be split by, 0 when largest is 0. */
size_t kiln_stage_slot_bytes(size_t largest, size_t chunk_bytes);
/* A ring over base (slots * slot_bytes, slot_bytes a multiple of grain); slots <=
 * KILN_STAGE_MAX_SLOTS. grain 0: KILN_STAGE_GRAIN, or the slot when smaller. */
void kiln_stage_ring_init(kiln_stage_ring *r, void *base, size_t slot_bytes, unsigned slots,
                          size_t grain);
/* The chunk a transfer of n bytes moves in: n / KILN_STAGE_MIN_CHUNKS rounded up to the grain,
 * at most one slot. */
size_t kiln_stage_chunk_bytes(const kiln_stage_ring *r, size_t n);

/* Copies n bytes at src into the ring chunk by chunk and sends each; returns once every chunk
 * is sent (the device side may still be moving the last ones). 0, or the transport's error. */
int kiln_stage_upload(kiln_stage_ring *r, kiln_stage_pool *p, const kiln_stage_transport *t,
                      const void *src, size_t n);
/* Sends every chunk of n bytes into the ring and copies each out into dst as it lands; returns
 * once dst holds them all. 0, or the transport's error. */
int kiln_stage_download(kiln_stage_ring *r, kiln_stage_pool *p, const kiln_stage_transport *t,
                        void *dst, size_t n);

#endif
