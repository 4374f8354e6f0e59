/* The host side of staging without a GPU: the thread pool and the chunked ring pipeline run
 * against a fake device whose moves finish late and in order, as a CUDA stream's do, and do
 * their copying only when they finish, so a slot overwritten or read too early shows up as
 * wrong bytes. Odd sizes, unaligned buffers, several thread counts, slot counts and grains;
 * the settings read from the environment; thread start and allocation failures at init;
 * no allocation and no thread started per transfer. Under a sanitizer, which owns malloc,
 * the allocation count is not taken. */
#include "check.h"

#include "runtime/alloc.h"
#include "runtime/stage_pool.h"
#include "runtime/stage_ring.h"

#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "counting_malloc.h"

/* ---------------------------------------------------------------- a fake device */

#define FAKE_QUEUE 64

typedef struct fake_move {
  unsigned slot;
  size_t offset, len;
} fake_move;

typedef struct fake_device {
  kiln_stage_ring *ring;
  int upload; /* direction of the transfer in progress */
  unsigned char *mem;
  fake_move queue[FAKE_QUEUE]; /* moves sent and not finished, oldest first */
  unsigned head, count;
  unsigned long long last[KILN_STAGE_MAX_SLOTS], finished_upto; /* move numbers */
  unsigned long long sent;
  unsigned polls, every; /* a move finishes on every `every`-th poll */
  int fail_send_at;      /* the send that fails (1-based), 0: none */
  int early_reads;       /* a slot written while its move was pending */
} fake_device;

static void fake_finish_one(fake_device *d) {
  fake_move *m = &d->queue[d->head];
  unsigned char *slot = d->ring->base + (size_t)m->slot * d->ring->slot_bytes;
  if (d->upload) memcpy(d->mem + m->offset, slot, m->len);
  else memcpy(slot, d->mem + m->offset, m->len);
  d->head = (d->head + 1) % FAKE_QUEUE;
  d->count--;
  d->finished_upto++;
}

static int fake_send(void *ctx, unsigned slot, size_t offset, size_t len) {
  fake_device *d = (fake_device *)ctx;
  if (d->fail_send_at && (int)d->sent + 1 == d->fail_send_at) return 7;
  if (d->count == FAKE_QUEUE) fake_finish_one(d);
  d->queue[(d->head + d->count) % FAKE_QUEUE] = (fake_move){slot, offset, len};
  d->count++;
  d->last[slot] = ++d->sent;
  return 0;
}

static int fake_poll(void *ctx, unsigned slot) {
  fake_device *d = (fake_device *)ctx;
  if (d->count && ++d->polls % d->every == 0) fake_finish_one(d);
  return d->last[slot] <= d->finished_upto;
}

static int fake_wait(void *ctx, unsigned slot) {
  fake_device *d = (fake_device *)ctx;
  while (d->last[slot] > d->finished_upto) fake_finish_one(d);
  return 0;
}

static void fake_sync(fake_device *d) {
  while (d->count) fake_finish_one(d);
}

static kiln_stage_transport fake_transport(fake_device *d) {
  kiln_stage_transport t = {d, fake_send, fake_poll, fake_wait};
  return t;
}

/* ---------------------------------------------------------------- helpers */

static int thread_count(void) {
  DIR *dir = opendir("/proc/self/task");
  int n = 0;
  if (!dir) return -1;
  for (struct dirent *e; (e = readdir(dir)) != NULL;)
    if (e->d_name[0] != '.') n++;
  closedir(dir);
  return n;
}

static void fill_bytes(unsigned char *p, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    p[i] = (unsigned char)(seed >> 24);
  }
}

/* One upload and one download of n bytes through a ring, from and to buffers offset by
 * `skew` bytes from their allocation; 1 when both arrive whole. */
static int round_trip(kiln_stage_pool *pool, kiln_stage_ring *ring, fake_device *dev, size_t n,
                      size_t skew, uint32_t seed) {
  unsigned char *src = malloc(n + skew + 1), *dst = malloc(n + skew + 2);
  if (!src || !dst) {
    free(src);
    free(dst);
    return 0;
  }
  fill_bytes(src + skew, n, seed);
  memset(dev->mem, 0xa5, n + 1);
  memset(dst, 0x5a, n + skew + 2);
  kiln_stage_transport t = fake_transport(dev);
  dev->upload = 1;
  int rc = kiln_stage_upload(ring, pool, &t, src + skew, n);
  fake_sync(dev);
  int ok = rc == 0 && memcmp(dev->mem, src + skew, n) == 0 && dev->mem[n] == 0xa5;
  dev->upload = 0;
  rc = kiln_stage_download(ring, pool, &t, dst + skew + 1, n);
  fake_sync(dev);
  ok &= rc == 0 && memcmp(dst + skew + 1, src + skew, n) == 0 && dst[skew] == 0x5a &&
        dst[n + skew + 1] == 0x5a;
  free(src);
  free(dst);
  return ok;
}

/* ---------------------------------------------------------------- the tests */

static void test_pipeline_sizes(void) {
  const int threads[4] = {1, 2, 4, 8};
  const size_t grains[3] = {16, 4096, KILN_STAGE_GRAIN};
  const unsigned slots[3] = {1, 2, 4};
  int all_ok = 1, cases = 0;
  unsigned long long workers_copied = 0;
  size_t largest = (size_t)5 << 20;
  unsigned char *mem = malloc(largest + 64);
  for (int ti = 0; ti < 4; ti++) {
    kiln_error err;
    kiln_stage_pool *pool = NULL;
    CHECK(kiln_stage_pool_create(threads[ti], &pool, &err) == KILN_OK);
    if (!pool) continue;
    CHECK(kiln_stage_pool_threads(pool) == threads[ti]);
    for (int gi = 0; gi < 3; gi++) {
      for (int si = 0; si < 3; si++) {
        size_t grain = grains[gi];
        size_t slot = grain * (gi == 2 ? 4 : 37); /* a 256 KiB slot, or 37 grains */
        unsigned char *base = malloc(slot * slots[si]);
        kiln_stage_ring ring;
        kiln_stage_ring_init(&ring, base, slot, slots[si], grain);
        ring.parallel_min = si == 1 ? (size_t)1 << 30 : 0; /* the caller alone, or shared */
        const size_t chunk = slot;
        const size_t sizes[] = {1, 3, grain - 1, grain, grain + 1, chunk - 1, chunk, chunk + 1,
                                4 * chunk + 7, (size_t)(5.7 * (double)chunk), largest - 3};
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
          if (sizes[k] == 0 || sizes[k] > largest) continue;
          fake_device dev;
          memset(&dev, 0, sizeof dev);
          dev.ring = &ring;
          dev.mem = mem;
          dev.every = 1 + (unsigned)(k % 3);
          int ok = round_trip(pool, &ring, &dev, sizes[k], k % 8, (uint32_t)(k + 1));
          if (!ok)
            fprintf(stderr, "round trip failed: threads %d grain %zu slots %u size %zu\n",
                    threads[ti], grain, slots[si], sizes[k]);
          all_ok &= ok;
          cases++;
        }
        free(base);
      }
    }
    workers_copied += kiln_stage_pool_worker_pieces(pool);
    kiln_stage_pool_destroy(pool);
  }
  free(mem);
  printf("staging round trips: %d cases, %s; pieces copied by workers: %llu\n", cases,
         all_ok ? "all bytes equal" : "SOME DIFFER", workers_copied);
  CHECK(all_ok && cases > 300);
  CHECK(workers_copied > 0);
}

/* Chunks: a transfer splits in at least four, each at most a slot, counted in ring.chunks. */
static void test_chunk_sizes(void) {
  kiln_stage_ring ring;
  kiln_stage_ring_init(&ring, NULL, (size_t)2 << 20, 4, 0);
  CHECK(ring.grain == KILN_STAGE_GRAIN);
  CHECK(kiln_stage_chunk_bytes(&ring, 1) == KILN_STAGE_GRAIN);
  CHECK(kiln_stage_chunk_bytes(&ring, (size_t)1 << 20) == (size_t)256 << 10);
  CHECK(kiln_stage_chunk_bytes(&ring, (size_t)1 << 30) == (size_t)2 << 20);
  CHECK(kiln_stage_slot_bytes(0, KILN_STAGE_DEFAULT_CHUNK) == 0);
  CHECK(kiln_stage_slot_bytes(14, KILN_STAGE_DEFAULT_CHUNK) == 256);
  CHECK(kiln_stage_slot_bytes(12000036, (size_t)2 << 20) == (size_t)2 << 20);
  CHECK(kiln_stage_slot_bytes(12000036, (size_t)100 << 10) == (size_t)128 << 10);
  kiln_stage_ring_init(&ring, NULL, 256, 4, 0);
  CHECK(ring.grain == 256 && ring.slot_bytes == 256);

  kiln_error err;
  kiln_stage_pool *pool = NULL;
  CHECK(kiln_stage_pool_create(1, &pool, &err) == KILN_OK);
  size_t slot = 4096, n = 3 * slot + 5;
  unsigned char *base = malloc(slot * 4), *src = malloc(n), *mem = malloc(n + 1);
  kiln_stage_ring_init(&ring, base, slot, 4, 1024);
  fake_device dev;
  memset(&dev, 0, sizeof dev);
  dev.ring = &ring;
  dev.mem = mem;
  dev.every = 2;
  dev.upload = 1;
  fill_bytes(src, n, 9);
  kiln_stage_transport t = fake_transport(&dev);
  CHECK(kiln_stage_upload(&ring, pool, &t, src, n) == 0);
  fake_sync(&dev);
  CHECK(ring.chunks == 4 && ring.next == 0 && memcmp(mem, src, n) == 0);
  /* Every byte an upload copied into the ring is written back for the copy engine (where the
   * CPU can); a download writes back nothing. */
  int can_write_back = kiln_stage_write_back(src, 1);
  printf("upload of %zu bytes: %llu written back (CLWB %s)\n", n,
         kiln_stage_pool_written_back(pool), can_write_back ? "present" : "absent");
  CHECK(kiln_stage_pool_written_back(pool) == (can_write_back ? n : 0));
  /* A transport error stops the transfer and is returned, leaving the pool usable. */
  dev.fail_send_at = (int)dev.sent + 2;
  CHECK(kiln_stage_upload(&ring, pool, &t, src, n) == 7);
  fake_sync(&dev);
  dev.fail_send_at = 0;
  memset(mem, 0, n);
  CHECK(kiln_stage_upload(&ring, pool, &t, src, n) == 0);
  fake_sync(&dev);
  CHECK(memcmp(mem, src, n) == 0);
  free(base);
  free(src);
  free(mem);
  kiln_stage_pool_destroy(pool);
}

/* Small transfers stay on the calling thread; large ones are shared with the workers. */
static void test_small_stays_on_caller(void) {
  kiln_error err;
  kiln_stage_pool *pool = NULL;
  CHECK(kiln_stage_pool_create(4, &pool, &err) == KILN_OK);
  if (!pool) return;
  size_t n = KILN_STAGE_PARALLEL_MIN - 1, big = (size_t)16 << 20;
  unsigned char *src = malloc(big), *dst = malloc(big);
  fill_bytes(src, big, 3);
  unsigned long long before = kiln_stage_pool_worker_pieces(pool);
  for (int i = 0; i < 20; i++) kiln_stage_copy(pool, dst, src, n, 4096, KILN_STAGE_PARALLEL_MIN);
  unsigned long long after_small = kiln_stage_pool_worker_pieces(pool);
  CHECK(memcmp(dst, src, n) == 0);
  CHECK(after_small == before);
  memset(dst, 0, big);
  /* A copy returns only once every piece is in: bytes cleared right after it stay clear. Four
   * pieces of 4 MiB: the workers' are still being copied when the caller runs out. */
  for (int i = 0; i < 20; i++) {
    kiln_stage_copy(pool, dst, src, big, big / 4, KILN_STAGE_PARALLEL_MIN);
    for (size_t k = big; k > 0; k -= 4096) memset(dst + k - 4096, 0, 4096); /* last pieces first */
  }
  usleep(2000);
  size_t late = 0;
  for (size_t k = 0; k < big; k++) late += dst[k] != 0;
  printf("bytes written after a copy returned: %zu\n", late);
  CHECK(late == 0);
  kiln_stage_copy(pool, dst, src, big, 4096, KILN_STAGE_PARALLEL_MIN);
  unsigned long long after_big = kiln_stage_pool_worker_pieces(pool);
  CHECK(memcmp(dst, src, big) == 0);
  /* Ring transfers too: below the ring's threshold no worker is told of them (one still awake
   * may help); at 0 the workers are told and copy. */
  size_t slot = 65536, m = (size_t)8 << 20;
  unsigned char *ring_mem = malloc(4 * slot), *mem = malloc(m);
  kiln_stage_ring ring;
  kiln_stage_ring_init(&ring, ring_mem, slot, 4, 4096);
  ring.parallel_min = m + 1;
  fake_device dev;
  memset(&dev, 0, sizeof dev);
  dev.ring = &ring;
  dev.mem = mem;
  dev.every = 2;
  kiln_stage_transport t = fake_transport(&dev);
  int ring_ok = 1;
  unsigned long long signals = kiln_stage_pool_signals(pool);
  for (int i = 0; i < 20; i++) {
    dev.upload = 1;
    ring_ok &= kiln_stage_upload(&ring, pool, &t, src, m) == 0;
    fake_sync(&dev);
    dev.upload = 0;
    ring_ok &= kiln_stage_download(&ring, pool, &t, dst, m) == 0;
  }
  unsigned long long signals_small = kiln_stage_pool_signals(pool);
  unsigned long long ring_small = kiln_stage_pool_worker_pieces(pool);
  ring.parallel_min = 0;
  for (int i = 0; i < 20; i++) {
    dev.upload = 1;
    ring_ok &= kiln_stage_upload(&ring, pool, &t, src, m) == 0;
    fake_sync(&dev);
    dev.upload = 0;
    ring_ok &= kiln_stage_download(&ring, pool, &t, dst, m) == 0;
  }
  unsigned long long ring_shared = kiln_stage_pool_worker_pieces(pool);
  unsigned long long signals_shared = kiln_stage_pool_signals(pool);
  CHECK(ring_ok && memcmp(dst, src, m) == 0);
  printf("pieces the workers copied: %llu of 20 small copies, %llu of 20 large ones, %llu of 40 "
         "ring transfers with the threshold at 0; workers told %llu times of 40 ring transfers "
         "below the threshold, %llu times at 0\n",
         after_small - before, after_big - after_small, ring_shared - ring_small,
         signals_small - signals, signals_shared - signals_small);
  CHECK(after_big > after_small);
  CHECK(signals_small == signals && signals_shared > signals_small && ring_shared > ring_small);
  free(ring_mem);
  free(mem);
  free(src);
  free(dst);
  kiln_stage_pool_destroy(pool);
}

/* Threads start at create and are joined at destroy; a transfer starts none and allocates
 * nothing. */
static void test_threads_and_allocations(void) {
  kiln_error err;
  int base = thread_count();
  kiln_stage_pool *pool = NULL;
  CHECK(kiln_stage_pool_create(8, &pool, &err) == KILN_OK);
  int running = thread_count();
  size_t n = (size_t)3 << 20;
  unsigned char *src = malloc(n), *mem = malloc(n), *dst = malloc(n), *ring_mem = malloc(4 * 65536);
  fill_bytes(src, n, 5);
  kiln_stage_ring ring;
  kiln_stage_ring_init(&ring, ring_mem, 65536, 4, 8192);
  ring.parallel_min = 0;
  fake_device dev;
  memset(&dev, 0, sizeof dev);
  dev.ring = &ring;
  dev.mem = mem;
  dev.every = 1;
  kiln_stage_transport t = fake_transport(&dev);
  int ok = 1;
  counting = 1;
  allocations = 0;
  for (int i = 0; i < 10; i++) {
    dev.upload = 1;
    ok &= kiln_stage_upload(&ring, pool, &t, src, n) == 0;
    fake_sync(&dev);
    dev.upload = 0;
    ok &= kiln_stage_download(&ring, pool, &t, dst, n) == 0;
    kiln_stage_copy(pool, dst, src, n, 4096, 0);
  }
  counting = 0;
  int during = thread_count();
  kiln_stage_pool_destroy(pool);
  int after = thread_count();
  printf("threads: %d before, %d with a pool of 8, %d after 30 transfers, %d after destroy; "
         "allocations in the transfers: %ld\n", base, running, during, after, allocations);
  CHECK(ok && memcmp(dst, src, n) == 0);
  CHECK(running == base + 7 && during == running && after == base);
#ifndef SANITIZED
  CHECK(allocations == 0);
#endif
  free(src);
  free(mem);
  free(dst);
  free(ring_mem);

  /* One thread: no worker at all. */
  CHECK(kiln_stage_pool_create(1, &pool, &err) == KILN_OK);
  CHECK(thread_count() == base);
  kiln_stage_pool_destroy(pool);
  CHECK(kiln_stage_pool_create(0, &pool, &err) == KILN_OK && kiln_stage_pool_threads(pool) == 1);
  kiln_stage_pool_destroy(pool);
  CHECK(kiln_stage_pool_create(KILN_STAGE_MAX_THREADS + 1, &pool, &err) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(pool == NULL);
}

static void test_init_failures(void) {
  kiln_error err;
  int base = thread_count();
  kiln_stage_pool *pool = (kiln_stage_pool *)&err;
  kiln_stage_fail_threads_after(3);
  kiln_status st = kiln_stage_pool_create(8, &pool, &err);
  kiln_stage_fail_threads_after(-1);
  printf("thread start failure: %s: %s\n", kiln_status_name(st), err.message);
  CHECK(st == KILN_ERR_OUT_OF_MEMORY && pool == NULL);
  CHECK(strstr(err.message, "staging worker 4 of 7 could not be started") != NULL);
  CHECK(strstr(err.message, "KILN_STAGE_THREADS") != NULL);
  CHECK(thread_count() == base);
  for (int k = 1; k <= 2; k++) {
    kiln_test_fail_allocations = k;
    st = kiln_stage_pool_create(4, &pool, &err);
    CHECK(st == KILN_ERR_OUT_OF_MEMORY && pool == NULL);
    CHECK(strstr(err.message, "out of host memory for a pool of 4 staging threads") != NULL);
    kiln_test_fail_allocations = 0;
  }
  CHECK(thread_count() == base);
}

static void test_settings(void) {
  kiln_error err;
  kiln_stage_settings s;
  unsetenv("KILN_STAGE_THREADS");
  unsetenv("KILN_STAGE_CHUNK_KIB");
  CHECK(kiln_stage_settings_from_env(&s, &err) == KILN_OK);
  CHECK(s.threads >= 1 && s.threads <= KILN_STAGE_DEFAULT_THREADS);
  CHECK(s.chunk_bytes == KILN_STAGE_DEFAULT_CHUNK);
  const char *good[][2] = {{"8", "8"}, {"0", "1"}, {"1", "1"}, {"64", "64"}, {"3", "3"}};
  for (int i = 0; i < 5; i++) {
    setenv("KILN_STAGE_THREADS", good[i][0], 1);
    CHECK(kiln_stage_settings_from_env(&s, &err) == KILN_OK && s.threads == atoi(good[i][1]));
  }
  const char *bad[] = {"65", "-1", "abc", "", "4x", " 4", "99999999999"};
  for (int i = 0; i < 7; i++) {
    setenv("KILN_STAGE_THREADS", bad[i], 1);
    CHECK(kiln_stage_settings_from_env(&s, &err) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(strstr(err.message, "KILN_STAGE_THREADS=") == err.message);
  }
  unsetenv("KILN_STAGE_THREADS");
  setenv("KILN_STAGE_CHUNK_KIB", "64", 1);
  CHECK(kiln_stage_settings_from_env(&s, &err) == KILN_OK && s.chunk_bytes == (size_t)64 << 10);
  setenv("KILN_STAGE_CHUNK_KIB", "8192", 1);
  CHECK(kiln_stage_settings_from_env(&s, &err) == KILN_OK && s.chunk_bytes == (size_t)8 << 20);
  const char *bad_chunk[] = {"63", "262145", "2M", "0"};
  for (int i = 0; i < 4; i++) {
    setenv("KILN_STAGE_CHUNK_KIB", bad_chunk[i], 1);
    CHECK(kiln_stage_settings_from_env(&s, &err) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(strstr(err.message, "KILN_STAGE_CHUNK_KIB=") == err.message);
  }
  setenv("KILN_STAGE_CHUNK_KIB", "12\x01", 1);
  CHECK(kiln_stage_settings_from_env(&s, &err) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(strstr(err.message, "\"12?\"") != NULL);
  printf("settings refusal: %s\n", err.message);
  unsetenv("KILN_STAGE_CHUNK_KIB");
}

int main(void) {
  test_settings();
  test_chunk_sizes();
  test_small_stays_on_caller();
  test_threads_and_allocations();
  test_init_failures();
  test_pipeline_sizes();
  return check_report("test_stage");
}
