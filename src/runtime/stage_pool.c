/* The staging threads: see stage_pool.h. A claim is lock-free: one atomic word holds the job's
 * number and its next piece, another the number and its open count, and a thread counts itself
 * in `copying` before it looks, so a job cannot end (and its fields change) under a claim. The
 * mutex serves only sleeping: idle workers spin on `news` for a while before they sleep. */
#include "runtime/stage_pool.h"

#include "runtime/alloc.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* How long an idle worker spins before it sleeps: longer than the gaps inside one execute. */
#define KILN_STAGE_SPIN_NS 100000L
/* Claim and open words: the job number above, a piece index or count below. */
#define KILN_STAGE_GEN_SHIFT 40
#define KILN_STAGE_INDEX_MASK ((UINT64_C(1) << KILN_STAGE_GEN_SHIFT) - 1)

struct kiln_stage_pool {
  int threads;
  int n_workers;
  pthread_t *workers;
  pthread_mutex_t lock;
  pthread_cond_t wake;
  kiln_stage_job job; /* written by begin while no thread can claim from it */
  uint64_t gen;       /* the caller's job number */
  int shared;         /* the caller's: whether opens tell the workers */
  atomic_ullong claim; /* gen << 40 | next piece */
  atomic_ullong open;  /* gen << 40 | pieces that may be claimed */
  atomic_size_t copying; /* threads inside a claim or a copy */
  atomic_size_t done[KILN_STAGE_MAX_SLOTS]; /* bytes copied of the chunk each slot holds */
  atomic_ullong news;    /* bumped whenever the workers are told of new work */
  atomic_int sleeping, stop;
  atomic_ullong worker_pieces;
  atomic_ullong written_back; /* bytes of the ring written back after a copy into it */
};

typedef struct kiln_stage_piece {
  unsigned char *user, *ring;
  size_t len;
  unsigned slot;
  kiln_stage_dir dir;
  int write_back;
} kiln_stage_piece;

static long kiln_stage_thread_fail_after = -1;

void kiln_stage_fail_threads_after(long n) { kiln_stage_thread_fail_after = n; }

static int kiln_stage_thread_injected(void) {
  if (kiln_stage_thread_fail_after < 0) return 0;
  if (kiln_stage_thread_fail_after == 0) return 1;
  kiln_stage_thread_fail_after--;
  return 0;
}

static void kiln_stage_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static long long kiln_stage_now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* Tells the workers that something changed; a sleeping one is woken. */
static void kiln_stage_announce(kiln_stage_pool *p) {
  atomic_fetch_add(&p->news, 1);
  if (atomic_load(&p->sleeping) > 0) {
    pthread_mutex_lock(&p->lock);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
  }
}

/* Takes the next open piece of the current job; 1 and the piece, with `copying` held until
 * kiln_stage_copy_piece, or 0. */
static int kiln_stage_claim(kiln_stage_pool *p, kiln_stage_piece *out) {
  atomic_fetch_add(&p->copying, 1);
  for (;;) {
    unsigned long long open = atomic_load(&p->open);
    unsigned long long c = atomic_load(&p->claim);
    if (c >> KILN_STAGE_GEN_SHIFT != open >> KILN_STAGE_GEN_SHIFT ||
        (c & KILN_STAGE_INDEX_MASK) >= (open & KILN_STAGE_INDEX_MASK))
      break;
    if (!atomic_compare_exchange_weak(&p->claim, &c, c + 1)) continue;
    const kiln_stage_job *j = &p->job;
    size_t off = (size_t)(c & KILN_STAGE_INDEX_MASK) * j->grain;
    size_t chunk = off / j->chunk_bytes;
    out->slot = (unsigned)((j->first_slot + chunk) % j->slots);
    out->user = j->user + off;
    out->ring = j->ring + (size_t)out->slot * j->slot_bytes + off % j->chunk_bytes;
    out->len = j->n - off < j->grain ? j->n - off : j->grain;
    out->dir = j->dir;
    out->write_back = j->write_back;
    return 1;
  }
  atomic_fetch_sub(&p->copying, 1);
  return 0;
}

#define KILN_STAGE_LINE 64

static int kiln_stage_has_clwb(void) {
#if defined(__x86_64__) || defined(__i386__)
  static atomic_int known = -1; /* the staging threads ask at once: atomic, each finds the same */
  int k = atomic_load_explicit(&known, memory_order_relaxed);
  if (k < 0) {
    unsigned a, b, c, d;
    k = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & (1u << 24)) != 0;
    atomic_store_explicit(&known, k, memory_order_relaxed);
  }
  return k;
#else
  return 0;
#endif
}

int kiln_stage_write_back(const void *p, size_t n) {
#if defined(__x86_64__) || defined(__i386__)
  if (!kiln_stage_has_clwb()) return 0;
  const char *c = (const char *)((uintptr_t)p & ~(uintptr_t)(KILN_STAGE_LINE - 1));
  for (const char *end = (const char *)p + n; c < end; c += KILN_STAGE_LINE)
    __asm__ __volatile__("clwb %0" : "+m"(*(volatile char *)c));
  __asm__ __volatile__("sfence" ::: "memory");
  return 1;
#else
  (void)p;
  (void)n;
  return 0;
#endif
}

static void kiln_stage_copy_piece(kiln_stage_pool *p, const kiln_stage_piece *pc) {
  if (pc->dir == KILN_STAGE_TO_RING) {
    memcpy(pc->ring, pc->user, pc->len);
    if (pc->write_back && kiln_stage_write_back(pc->ring, pc->len))
      atomic_fetch_add_explicit(&p->written_back, pc->len, memory_order_relaxed);
  } else {
    memcpy(pc->user, pc->ring, pc->len);
  }
  atomic_fetch_add_explicit(&p->done[pc->slot], pc->len, memory_order_release);
  atomic_fetch_sub_explicit(&p->copying, 1, memory_order_release);
}

/* Spins until `news` moves past seen; 0 when the spin budget ran out first. */
static int kiln_stage_spin(kiln_stage_pool *p, unsigned long long seen) {
  long long start = kiln_stage_now_ns();
  for (unsigned i = 1;; i++) {
    if (atomic_load(&p->news) != seen) return 1;
    kiln_stage_relax();
    if (i % 64 == 0) {
      if (kiln_stage_now_ns() - start > KILN_STAGE_SPIN_NS) return 0;
      sched_yield(); /* let a descheduled copier run on a machine with fewer cores */
    }
  }
}

static void *kiln_stage_worker(void *arg) {
  kiln_stage_pool *p = (kiln_stage_pool *)arg;
  while (!atomic_load(&p->stop)) {
    kiln_stage_piece pc;
    if (kiln_stage_claim(p, &pc)) {
      kiln_stage_copy_piece(p, &pc);
      atomic_fetch_add_explicit(&p->worker_pieces, 1, memory_order_relaxed);
      continue;
    }
    unsigned long long seen = atomic_load(&p->news);
    if (kiln_stage_claim(p, &pc)) { /* opened between the first look and reading news */
      kiln_stage_copy_piece(p, &pc);
      atomic_fetch_add_explicit(&p->worker_pieces, 1, memory_order_relaxed);
      continue;
    }
    if (kiln_stage_spin(p, seen)) continue;
    pthread_mutex_lock(&p->lock);
    atomic_fetch_add(&p->sleeping, 1);
    while (!atomic_load(&p->stop) && atomic_load(&p->news) == seen)
      pthread_cond_wait(&p->wake, &p->lock);
    atomic_fetch_sub(&p->sleeping, 1);
    pthread_mutex_unlock(&p->lock);
  }
  return NULL;
}

static void kiln_stage_stop_workers(kiln_stage_pool *p) {
  atomic_store(&p->stop, 1);
  pthread_mutex_lock(&p->lock);
  atomic_fetch_add(&p->news, 1);
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->lock);
  for (int i = 0; i < p->n_workers; i++) pthread_join(p->workers[i], NULL);
  p->n_workers = 0;
}

kiln_status kiln_stage_pool_create(int threads, kiln_stage_pool **out, kiln_error *err) {
  *out = NULL;
  if (threads < 1) threads = 1;
  if (threads > KILN_STAGE_MAX_THREADS)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "%d staging threads asked for, above the limit of %d; ask for fewer", threads,
                     KILN_STAGE_MAX_THREADS);
  kiln_stage_pool *p = (kiln_stage_pool *)kiln_calloc(1, sizeof *p);
  pthread_t *workers = threads > 1 ? (pthread_t *)kiln_calloc((size_t)threads - 1, sizeof *workers) : NULL;
  if (!p || (threads > 1 && !workers)) {
    free(p);
    free(workers);
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "out of host memory for a pool of %d staging threads; free memory and load "
                     "again", threads);
  }
  p->threads = threads;
  p->workers = workers;
  if (pthread_mutex_init(&p->lock, NULL) != 0) {
    free(workers);
    free(p);
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "the staging pool's mutex could not be created; free resources and load again");
  }
  if (pthread_cond_init(&p->wake, NULL) != 0) {
    pthread_mutex_destroy(&p->lock);
    free(workers);
    free(p);
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "the staging pool's condition variable could not be created; free resources "
                     "and load again");
  }
  for (int s = 0; s < KILN_STAGE_MAX_SLOTS; s++) atomic_init(&p->done[s], 0);
  atomic_init(&p->claim, 0);
  atomic_init(&p->open, 0);
  atomic_init(&p->copying, 0);
  atomic_init(&p->news, 0);
  atomic_init(&p->sleeping, 0);
  atomic_init(&p->stop, 0);
  atomic_init(&p->worker_pieces, 0);
  atomic_init(&p->written_back, 0);
  /* Workers block every signal: a process's handlers run on the threads it made itself. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = 0;
  while (p->n_workers < threads - 1) {
    rc = kiln_stage_thread_injected() ? EAGAIN
                                      : pthread_create(&p->workers[p->n_workers], NULL,
                                                       kiln_stage_worker, p);
    if (rc != 0) break;
    p->n_workers++;
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc != 0) {
    int started = p->n_workers;
    kiln_stage_pool_destroy(p);
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "staging worker %d of %d could not be started (%.40s); set KILN_STAGE_THREADS "
                     "lower, or to 1 to copy on the calling thread",
                     started + 1, threads - 1, strerror(rc));
  }
  *out = p;
  return KILN_OK;
}

void kiln_stage_pool_destroy(kiln_stage_pool *p) {
  if (!p) return;
  kiln_stage_stop_workers(p);
  pthread_cond_destroy(&p->wake);
  pthread_mutex_destroy(&p->lock);
  free(p->workers);
  free(p);
}

int kiln_stage_pool_threads(const kiln_stage_pool *p) { return p ? p->threads : 1; }

unsigned long long kiln_stage_pool_worker_pieces(kiln_stage_pool *p) {
  return atomic_load(&p->worker_pieces);
}

unsigned long long kiln_stage_pool_signals(kiln_stage_pool *p) { return atomic_load(&p->news); }

unsigned long long kiln_stage_pool_written_back(kiln_stage_pool *p) {
  return atomic_load(&p->written_back);
}

void kiln_stage_begin(kiln_stage_pool *p, const kiln_stage_job *job, int share) {
  p->job = *job;
  p->gen = (p->gen + 1) & (KILN_STAGE_INDEX_MASK >> 16); /* 24 bits of job number */
  p->shared = share && p->n_workers > 0;
  /* The number goes into the claim word first: until the open word has it, nothing matches. */
  atomic_store(&p->claim, (unsigned long long)p->gen << KILN_STAGE_GEN_SHIFT);
  atomic_store(&p->open, (unsigned long long)p->gen << KILN_STAGE_GEN_SHIFT);
}

void kiln_stage_open(kiln_stage_pool *p, size_t chunks) {
  const kiln_stage_job *j = &p->job;
  size_t per_chunk = j->chunk_bytes / j->grain;
  size_t pieces = j->n ? (j->n + j->grain - 1) / j->grain : 0;
  size_t total = (pieces + per_chunk - 1) / per_chunk;
  size_t open = chunks >= total ? pieces : chunks * per_chunk;
  size_t was = (size_t)(atomic_load(&p->open) & KILN_STAGE_INDEX_MASK);
  if (open <= was) return;
  /* A newly opened chunk's slot starts its count again: its previous chunk is done with. */
  for (size_t c = was / per_chunk; c * per_chunk < open; c++)
    atomic_store(&p->done[(j->first_slot + c) % j->slots], 0);
  atomic_store(&p->open, ((unsigned long long)p->gen << KILN_STAGE_GEN_SHIFT) | open);
  if (p->shared) kiln_stage_announce(p);
}

int kiln_stage_help(kiln_stage_pool *p) {
  kiln_stage_piece pc;
  if (!kiln_stage_claim(p, &pc)) return 0;
  kiln_stage_copy_piece(p, &pc);
  return 1;
}

int kiln_stage_chunk_copied(kiln_stage_pool *p, size_t c) {
  const kiln_stage_job *j = &p->job; /* written by this thread's begin */
  size_t off = c * j->chunk_bytes;
  size_t len = j->n - off < j->chunk_bytes ? j->n - off : j->chunk_bytes;
  return atomic_load_explicit(&p->done[(j->first_slot + c) % j->slots], memory_order_acquire) == len;
}

void kiln_stage_end(kiln_stage_pool *p) {
  /* No claim can succeed once the open count is 0; then the claims in flight drain. */
  atomic_store(&p->open, (unsigned long long)p->gen << KILN_STAGE_GEN_SHIFT);
  for (unsigned i = 1; atomic_load(&p->copying) != 0; i++) {
    kiln_stage_relax();
    if (i % 64 == 0) sched_yield();
  }
}

void kiln_stage_copy(kiln_stage_pool *p, void *dst, const void *src, size_t n, size_t grain,
                     size_t parallel_min) {
  if (!p || p->n_workers == 0 || n < parallel_min || n <= grain) {
    memcpy(dst, src, n);
    return;
  }
  kiln_stage_job job;
  memset(&job, 0, sizeof job);
  job.dir = KILN_STAGE_TO_RING;
  job.user = (unsigned char *)(uintptr_t)src;
  job.ring = (unsigned char *)dst;
  job.slots = 1;
  job.n = n;
  job.grain = grain;
  job.chunk_bytes = job.slot_bytes = (n + grain - 1) / grain * grain;
  kiln_stage_begin(p, &job, 1);
  kiln_stage_open(p, 1);
  while (kiln_stage_help(p)) {
  }
  kiln_stage_end(p);
}
