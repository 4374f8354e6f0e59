/* The staging pipeline over a ring of slots: see stage_ring.h. The calling thread drives it:
 * it sends a chunk as soon as its copy is complete, opens a slot to the copiers as soon as the
 * device is done with it, and copies pieces itself in between. */
#include "runtime/stage_ring.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define KILN_STAGE_ALIGN ((size_t)256)

static size_t kiln_stage_round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

/* A decimal integer in lo..hi and nothing else; 0 when the text is not one. */
static int kiln_stage_parse(const char *text, long lo, long hi, long *out) {
  long v = 0;
  if (!text[0]) return 0;
  for (const char *c = text; *c; c++) {
    if (*c < '0' || *c > '9' || c - text > 9) return 0;
    v = v * 10 + (*c - '0');
  }
  if (v < lo || v > hi) return 0;
  *out = v;
  return 1;
}

/* text for a message: at most 24 bytes, control bytes as '?' */
static void kiln_stage_shown(const char *text, char *shown, size_t size) {
  size_t n = 0;
  for (; text[n] && n + 1 < size; n++)
    shown[n] = (unsigned char)text[n] < 0x20 || (unsigned char)text[n] >= 0x7f ? '?' : text[n];
  shown[n] = '\0';
}

static int kiln_stage_cores(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

kiln_status kiln_stage_settings_from_env(kiln_stage_settings *out, kiln_error *err) {
  char shown[25];
  long v = 0;
  int cores = kiln_stage_cores();
  out->threads = cores < KILN_STAGE_DEFAULT_THREADS ? cores : KILN_STAGE_DEFAULT_THREADS;
  out->chunk_bytes = KILN_STAGE_DEFAULT_CHUNK;
  const char *threads = getenv("KILN_STAGE_THREADS");
  if (threads) {
    if (!kiln_stage_parse(threads, 0, KILN_STAGE_MAX_THREADS, &v)) {
      kiln_stage_shown(threads, shown, sizeof shown);
      return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                       "KILN_STAGE_THREADS=\"%.24s\" is not a thread count from 0 to %d; set a "
                       "number (0 or 1: the calling thread alone) or unset it for min(cores, %d)",
                       shown, KILN_STAGE_MAX_THREADS, KILN_STAGE_DEFAULT_THREADS);
    }
    out->threads = v < 1 ? 1 : (int)v;
  }
  const char *chunk = getenv("KILN_STAGE_CHUNK_KIB");
  if (chunk) {
    if (!kiln_stage_parse(chunk, KILN_STAGE_CHUNK_KIB_MIN, KILN_STAGE_CHUNK_KIB_MAX, &v)) {
      kiln_stage_shown(chunk, shown, sizeof shown);
      return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                       "KILN_STAGE_CHUNK_KIB=\"%.24s\" is not a chunk size from %d to %d KiB; set "
                       "a number of KiB or unset it for %d",
                       shown, KILN_STAGE_CHUNK_KIB_MIN, KILN_STAGE_CHUNK_KIB_MAX,
                       (int)(KILN_STAGE_DEFAULT_CHUNK >> 10));
    }
    out->chunk_bytes = (size_t)v << 10;
  }
  return KILN_OK;
}

size_t kiln_stage_slot_bytes(size_t largest, size_t chunk_bytes) {
  if (largest == 0) return 0;
  size_t slot = kiln_stage_round_up(largest < chunk_bytes ? largest : chunk_bytes, KILN_STAGE_ALIGN);
  return slot < KILN_STAGE_GRAIN ? slot : kiln_stage_round_up(slot, KILN_STAGE_GRAIN);
}

void kiln_stage_ring_init(kiln_stage_ring *r, void *base, size_t slot_bytes, unsigned slots,
                          size_t grain) {
  memset(r, 0, sizeof *r);
  if (grain == 0) grain = slot_bytes < KILN_STAGE_GRAIN ? slot_bytes : KILN_STAGE_GRAIN;
  r->base = (unsigned char *)base;
  r->grain = grain ? grain : 1;
  r->slot_bytes = slot_bytes / r->grain * r->grain;
  r->slots = slots < 1 ? 1 : slots > KILN_STAGE_MAX_SLOTS ? KILN_STAGE_MAX_SLOTS : slots;
  r->parallel_min = KILN_STAGE_PARALLEL_MIN;
}

size_t kiln_stage_chunk_bytes(const kiln_stage_ring *r, size_t n) {
  size_t c = kiln_stage_round_up((n + KILN_STAGE_MIN_CHUNKS - 1) / KILN_STAGE_MIN_CHUNKS, r->grain);
  if (c < r->grain) c = r->grain;
  return c < r->slot_bytes ? c : r->slot_bytes;
}

static unsigned kiln_stage_slot(const kiln_stage_job *j, size_t c) {
  return (unsigned)((j->first_slot + c) % j->slots);
}

static size_t kiln_stage_len(const kiln_stage_job *j, size_t c) {
  size_t off = c * j->chunk_bytes;
  return j->n - off < j->chunk_bytes ? j->n - off : j->chunk_bytes;
}

/* The job of a transfer; 0 chunks when the ring cannot hold one. */
static size_t kiln_stage_job_of(const kiln_stage_ring *r, kiln_stage_dir dir, const void *user,
                                size_t n, kiln_stage_job *j) {
  memset(j, 0, sizeof *j);
  j->dir = dir;
  j->user = (unsigned char *)(size_t)user;
  j->ring = r->base;
  j->slot_bytes = r->slot_bytes;
  j->slots = r->slots;
  j->first_slot = r->next;
  j->n = n;
  j->grain = r->grain;
  j->chunk_bytes = kiln_stage_chunk_bytes(r, n);
  j->write_back = dir == KILN_STAGE_TO_RING; /* the copy engine reads the slot next */
  return j->chunk_bytes ? (n + j->chunk_bytes - 1) / j->chunk_bytes : 0;
}

static void kiln_stage_finish(kiln_stage_ring *r, kiln_stage_pool *p, const kiln_stage_job *j,
                              size_t moved) {
  kiln_stage_end(p);
  r->next = kiln_stage_slot(j, moved);
  r->chunks += moved;
}

static void kiln_stage_idle(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

int kiln_stage_upload(kiln_stage_ring *r, kiln_stage_pool *p, const kiln_stage_transport *t,
                      const void *src, size_t n) {
  if (n == 0) return 0;
  kiln_stage_job j;
  size_t chunks = kiln_stage_job_of(r, KILN_STAGE_TO_RING, src, n, &j);
  if (chunks == 0) return -1;
  size_t opened = 0, sent = 0;
  int rc = 0;
  kiln_stage_begin(p, &j, n >= r->parallel_min);
  while (rc == 0 && sent < chunks) {
    int progress = 0;
    if (sent < opened && kiln_stage_chunk_copied(p, sent)) {
      rc = t->send(t->ctx, kiln_stage_slot(&j, sent), sent * j.chunk_bytes, kiln_stage_len(&j, sent));
      sent++;
      progress = 1;
    }
    /* A slot the device has read takes the next chunk, before the caller copies a piece. */
    if (rc == 0 && opened < chunks && opened < sent + j.slots) {
      int free_slot = t->poll(t->ctx, kiln_stage_slot(&j, opened));
      if (free_slot < 0) rc = free_slot;
      else if (free_slot) kiln_stage_open(p, ++opened);
      progress |= free_slot != 0;
    }
    if (rc == 0 && !progress && !kiln_stage_help(p)) kiln_stage_idle();
  }
  kiln_stage_finish(r, p, &j, sent);
  return rc;
}

int kiln_stage_download(kiln_stage_ring *r, kiln_stage_pool *p, const kiln_stage_transport *t,
                        void *dst, size_t n) {
  if (n == 0) return 0;
  kiln_stage_job j;
  size_t chunks = kiln_stage_job_of(r, KILN_STAGE_FROM_RING, dst, n, &j);
  if (chunks == 0) return -1;
  size_t sent = 0, opened = 0, copied = 0;
  int rc = 0;
  while (rc == 0 && sent < chunks && sent < j.slots) {
    rc = t->send(t->ctx, kiln_stage_slot(&j, sent), sent * j.chunk_bytes, kiln_stage_len(&j, sent));
    sent++;
  }
  /* The first chunk lands after the work before it: block there, not spin, then copy. */
  if (rc == 0) rc = t->wait(t->ctx, kiln_stage_slot(&j, 0));
  kiln_stage_begin(p, &j, n >= r->parallel_min);
  if (rc == 0) kiln_stage_open(p, opened = 1);
  while (rc == 0 && copied < chunks) {
    int progress = 0;
    if (copied < opened && kiln_stage_chunk_copied(p, copied)) {
      copied++;
      progress = 1;
    }
    /* A slot copied out takes the next chunk from the device. */
    if (sent < chunks && sent < copied + j.slots) {
      rc = t->send(t->ctx, kiln_stage_slot(&j, sent), sent * j.chunk_bytes, kiln_stage_len(&j, sent));
      sent++;
      progress = 1;
    }
    if (rc == 0 && opened < sent) {
      int landed = t->poll(t->ctx, kiln_stage_slot(&j, opened));
      if (landed < 0) rc = landed;
      else if (landed) kiln_stage_open(p, ++opened);
      progress |= landed != 0;
    }
    if (rc == 0 && !progress && !kiln_stage_help(p)) kiln_stage_idle();
  }
  kiln_stage_finish(r, p, &j, sent);
  return rc;
}
