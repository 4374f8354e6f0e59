/* Staged host buffers on the CUDA engine: copies of odd sizes (1 byte, a chunk +-1, several
 * MiB), from and to unaligned pageable buffers and pinned ones, with 1, 2, 4 and 8 staging
 * threads and two chunk sizes, byte for byte; eleven small buffers each way through the
 * graph's copy kernels; the threads started at load and joined at
 * unload; no allocation and no thread started by execute; a thread that cannot start and a
 * malformed setting refused at load. Run on a GPU machine by scripts/gpu_test.sh; `--rate`
 * times a 64 MiB round trip for every thread count and chunk size instead. */
#include "gpu_harness.h"

#include "runtime/stage_pool.h"
#include "runtime/stage_ring.h"

#include <dirent.h>
#include <errno.h>
#include <time.h>

#include "counting_malloc.h"

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

/* out0 = copy(x) of n bytes, out1 = copy(y) of 7 bytes: two transfers each way. */
static prog *copy_prog(size_t n) {
  prog *p = p_new();
  const int64_t dn[1] = {(int64_t)n}, d7[1] = {7};
  uint32_t x = p_tensor(p, KILN_STORE_INPUT, KILN_BOOL, 1, dn);
  uint32_t y = p_tensor(p, KILN_STORE_INPUT, KILN_BOOL, 1, d7);
  p_op(p, KILN_OP_COPY, 1, (const uint32_t[]){x}, p_tensor(p, KILN_STORE_OUTPUT, KILN_BOOL, 1, dn), 0,
       NULL, 0);
  p_op(p, KILN_OP_COPY, 1, (const uint32_t[]){y}, p_tensor(p, KILN_STORE_OUTPUT, KILN_BOOL, 1, d7), 0,
       NULL, 0);
  return p;
}

static void set_stage_env(int threads, int chunk_kib) {
  char t[16], c[16];
  snprintf(t, sizeof t, "%d", threads);
  snprintf(c, sizeof c, "%d", chunk_kib);
  setenv("KILN_STAGE_THREADS", t, 1);
  setenv("KILN_STAGE_CHUNK_KIB", c, 1);
}

/* Expected ring chunks of one transfer of n bytes through slots of slot_bytes. */
static unsigned long long chunks_of(size_t n, size_t slot_bytes) {
  kiln_stage_ring r;
  kiln_stage_ring_init(&r, NULL, slot_bytes, KILN_STAGE_SLOTS, 0);
  size_t c = kiln_stage_chunk_bytes(&r, n);
  return (n + c - 1) / c;
}

/* Every size with every thread count and two chunk sizes, through pageable buffers offset by
 * 0-7 bytes from their allocation, and through pinned buffers. */
static void test_sizes_and_threads(void) {
  const int threads[4] = {1, 2, 4, 8};
  const int chunk_kib[2] = {64, 2048};
  int all_ok = 1, runs = 0;
  for (int ci = 0; ci < 2; ci++) {
    size_t chunk = (size_t)chunk_kib[ci] << 10;
    const size_t sizes[] = {1, 255, KILN_STAGE_GRAIN - 1, chunk - 1, chunk, chunk + 1,
                            4 * chunk + 7, 12000037};
    for (int ti = 0; ti < 4; ti++) {
      set_stage_env(threads[ti], chunk_kib[ci]);
      for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t n = sizes[k], skew = k % 8;
        prog *p = copy_prog(n);
        kiln_error err;
        kiln_engine *e = p_load(p, &kiln_cuda_backend, 0, &err);
        if (!e) fprintf(stderr, "staging load, n %zu: %s\n", n, err.message);
        CHECK(e != NULL);
        unsigned char *src = malloc(n + 8), *dst = malloc(n + 9), y[7], y_out[7];
        unsigned char *pin_src = NULL, *pin_dst = NULL;
        int pinned = cudaMallocHost((void **)&pin_src, n) == cudaSuccess &&
                     cudaMallocHost((void **)&pin_dst, n) == cudaSuccess;
        CHECK(src && dst && pinned);
        if (!e || !src || !dst || !pinned) {
          p_unload(e);
          free(src);
          free(dst);
          cudaFreeHost(pin_src);
          cudaFreeHost(pin_dst);
          p_free(p);
          continue;
        }
        kiln_cuda_stats s0, s1, s2;
        kiln_cuda_engine_stats(e, &s0, &err);
        int want_threads = n >= KILN_STAGE_PARALLEL_MIN ? threads[ti] : 1;
        CHECK(s0.stage_threads == (uint64_t)want_threads);
        fill_bytes(src + skew, n, (uint32_t)(n + 1));
        fill_bytes(y, 7, 77);
        int ok = 1;
        for (int rep = 0; rep < 2; rep++) { /* twice: the ring's slots turn over */
          memset(dst, 0xee, n + 9);
          memset(y_out, 0xee, 7);
          void *in[2] = {src + skew, y}, *out[2] = {dst + skew + 1, y_out};
          kiln_status st = p_execute(e, p, in, out, &err);
          if (st != KILN_OK) fprintf(stderr, "staging run, n %zu: %s\n", n, err.message);
          ok &= st == KILN_OK && memcmp(dst + skew + 1, src + skew, n) == 0 &&
                memcmp(y_out, y, 7) == 0 && dst[skew] == 0xee && dst[n + skew + 1] == 0xee;
        }
        kiln_cuda_engine_stats(e, &s1, &err);
        /* Host I/O of at most 512 KiB each way (256-byte aligned) rides inside one replay. */
        int whole = (n + 255) / 256 * 256 + 256 <= ((size_t)512 << 10);
        unsigned long long want = whole ? 0 : 2 * 2 * (chunks_of(n, s0.stage_slot_bytes) + 1);
        if (s1.stage_chunks - s0.stage_chunks != want) {
          fprintf(stderr, "n %zu: %llu chunks, expected %llu\n", n,
                  (unsigned long long)(s1.stage_chunks - s0.stage_chunks), want);
          ok = 0;
        }
        /* Pinned caller memory: one DMA each way, not bound (every kernel would read it across
         * the link), none through the ring. */
        memcpy(pin_src, src + skew, n);
        memset(pin_dst, 0xee, n);
        void *pin_in[2] = {pin_src, y}, *pin_out[2] = {pin_dst, y_out};
        ok &= p_execute(e, p, pin_in, pin_out, &err) == KILN_OK && memcmp(pin_dst, src + skew, n) == 0;
        kiln_cuda_engine_stats(e, &s2, &err);
        ok &= s2.bound == s1.bound && s2.staged - s1.staged == 4;
        ok &= s2.stage_chunks - s1.stage_chunks == 2; /* y alone, in and out */
        if (!ok)
          fprintf(stderr, "staging FAILED: %d threads, chunk %d KiB, %zu bytes, skew %zu\n",
                  threads[ti], chunk_kib[ci], n, skew);
        all_ok &= ok;
        runs++;
        p_unload(e);
        free(src);
        free(dst);
        cudaFreeHost(pin_src);
        cudaFreeHost(pin_dst);
        p_free(p);
      }
    }
  }
  unsetenv("KILN_STAGE_THREADS");
  unsetenv("KILN_STAGE_CHUNK_KIB");
  printf("staged copies: %d engines (1, 2, 4, 8 threads; chunks of 64 and 2048 KiB; 1 byte to "
         "12000037 bytes, unaligned and pinned): %s\n", runs, all_ok ? "all bytes equal" : "SOME DIFFER");
  CHECK(all_ok && runs == 64);
}

/* Allocations of raw CUDA calls like those execute makes: if CUDA itself allocates, a count
 * of zero cannot be asked of execute. */
static long cuda_baseline(void) {
  void *dev = NULL, *pin = NULL;
  cudaStream_t s;
  cudaEvent_t ev;
  cudaMalloc(&dev, (size_t)1 << 20);
  cudaMallocHost(&pin, (size_t)1 << 20);
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  struct cudaPointerAttributes a;
  counting = 1;
  allocations = 0;
  for (int i = 0; i < 10; i++) {
    cudaPointerGetAttributes(&a, pin);
    cudaMemcpyAsync(dev, pin, (size_t)1 << 20, cudaMemcpyHostToDevice, s);
    cudaEventRecord(ev, s);
    cudaEventQuery(ev);
    cudaEventSynchronize(ev);
    cudaMemcpyAsync(pin, dev, (size_t)1 << 20, cudaMemcpyDeviceToHost, s);
    cudaStreamSynchronize(s);
  }
  counting = 0;
  long n = allocations;
  cudaEventDestroy(ev);
  cudaStreamDestroy(s);
  cudaFree(dev);
  cudaFreeHost(pin);
  return n;
}

/* Threads start at load, none at execute, all joined at unload; execute allocates nothing. */
static void test_threads_and_allocations(void) {
  kiln_error err;
  size_t n = (size_t)24 << 20;
  prog *p = copy_prog(n);
  set_stage_env(8, 2048);
  kiln_engine *warm = p_load(p, &kiln_cuda_backend, 0, &err); /* CUDA's own threads start here */
  p_unload(warm);
  int before = thread_count();
  kiln_engine *e = p_load(p, &kiln_cuda_backend, 0, &err);
  int loaded = thread_count();
  CHECK(e != NULL);
  unsigned char *src = malloc(n), *dst = malloc(n), y[7] = {1, 2, 3, 4, 5, 6, 7}, y_out[7];
  fill_bytes(src, n, 11);
  long base = cuda_baseline();
  int ok = e != NULL;
  size_t free0 = 0, free1 = 0, total = 0;
  cudaMemGetInfo(&free0, &total);
  kiln_cuda_stats s0, s1;
  if (e) kiln_cuda_engine_stats(e, &s0, &err);
  counting = 1;
  allocations = 0;
  for (int i = 0; ok && i < 10; i++) {
    void *in[2] = {src, y}, *out[2] = {dst, y_out};
    ok &= p_execute(e, p, in, out, &err) == KILN_OK;
  }
  counting = 0;
  long during = allocations;
  int running = thread_count();
  cudaMemGetInfo(&free1, &total);
  if (e) kiln_cuda_engine_stats(e, &s1, &err);
  ok &= memcmp(dst, src, n) == 0;
  p_unload(e);
  int after = thread_count();
  printf("24 MiB copy, 8 staging threads: threads %d before load, %d loaded, %d after 10 runs, %d "
         "after unload; allocations in 10 runs: %ld (raw CUDA calls alike: %ld); init allocations "
         "%llu then %llu; device free memory %s\n",
         before, loaded, running, after, during, base, (unsigned long long)s0.init_allocs,
         (unsigned long long)s1.init_allocs, free0 == free1 ? "unchanged" : "CHANGED");
  CHECK(ok);
  CHECK(loaded - before == 7 && running == loaded && after == before);
  CHECK(during == 0 || base > 0);
  CHECK(s1.init_allocs == s0.init_allocs && free0 == free1);

  /* A worker that cannot start: refused at load, nothing left running or allocated. */
  cudaMemGetInfo(&free0, &total);
  kiln_stage_fail_threads_after(2);
  e = p_load(p, &kiln_cuda_backend, 0, &err);
  kiln_stage_fail_threads_after(-1);
  cudaMemGetInfo(&free1, &total);
  printf("thread start failure at load: %s: %s\n", kiln_status_name(err.status), err.message);
  CHECK(e == NULL && err.status == KILN_ERR_OUT_OF_MEMORY &&
        strstr(err.message, "staging worker 3 of 7 could not be started") != NULL);
  CHECK(thread_count() == before && free0 == free1);
  p_unload(e);

  /* A malformed setting: refused at load, naming it. */
  setenv("KILN_STAGE_THREADS", "eight", 1);
  e = p_load(p, &kiln_cuda_backend, 0, &err);
  printf("KILN_STAGE_THREADS=eight at load: %s: %s\n", kiln_status_name(err.status), err.message);
  CHECK(e == NULL && err.status == KILN_ERR_INVALID_ARGUMENT &&
        strstr(err.message, "KILN_STAGE_THREADS=\"eight\"") != NULL);
  p_unload(e);
  unsetenv("KILN_STAGE_THREADS");
  unsetenv("KILN_STAGE_CHUNK_KIB");
  free(src);
  free(dst);
  p_free(p);
}

/* Eleven host inputs and outputs of odd sizes, small enough to ride inside the run's graph:
 * the copy kernels take at most KCU_IO_COPIES buffers a launch, so both directions split into
 * batches; every byte arrives, none past the end of a buffer is touched, nothing goes through
 * the ring's chunks; pinned buffers give the same bytes. */
static void test_many_small_buffers(void) {
  enum { N = 11 };
  const size_t sizes[N] = {1, 7, 16, 17, 255, 256, 4096, 4099, 65536, 1, 100003};
  prog *p = p_new();
  uint32_t ins[N];
  for (int i = 0; i < N; i++) ins[i] = p_tensor(p, KILN_STORE_INPUT, KILN_BOOL, 1, (const int64_t[]){(int64_t)sizes[i]});
  for (int i = 0; i < N; i++)
    p_op(p, KILN_OP_COPY, 1, (const uint32_t[]){ins[i]},
         p_tensor(p, KILN_STORE_OUTPUT, KILN_BOOL, 1, (const int64_t[]){(int64_t)sizes[i]}), 0, NULL, 0);
  kiln_error err;
  kiln_engine *e = p_load(p, &kiln_cuda_backend, 0, &err);
  if (!e) fprintf(stderr, "many buffers: load: %s\n", err.message);
  CHECK(e != NULL);
  unsigned char *src[N], *dst[N], *pin_dst[N];
  void *in[N], *out[N];
  int ok = e != NULL;
  for (int i = 0; i < N; i++) {
    src[i] = malloc(sizes[i]);
    dst[i] = malloc(sizes[i] + 1);
    if (!src[i] || !dst[i] || cudaMallocHost((void **)&pin_dst[i], sizes[i]) != cudaSuccess) {
      fprintf(stderr, "many buffers: out of host memory\n");
      exit(2);
    }
    fill_bytes(src[i], sizes[i], (uint32_t)(31 * i + 3));
    in[i] = src[i];
  }
  kiln_cuda_stats s0, s1;
  if (e) kiln_cuda_engine_stats(e, &s0, &err);
  for (int rep = 0; ok && rep < 2; rep++) {
    for (int i = 0; i < N; i++) {
      memset(dst[i], 0xee, sizes[i] + 1);
      out[i] = dst[i];
    }
    kiln_status st = p_execute(e, p, in, out, &err);
    if (st != KILN_OK) fprintf(stderr, "many buffers: run: %s\n", err.message);
    ok &= st == KILN_OK;
    for (int i = 0; i < N; i++)
      ok &= memcmp(dst[i], src[i], sizes[i]) == 0 && dst[i][sizes[i]] == 0xee;
  }
  if (e) kiln_cuda_engine_stats(e, &s1, &err);
  ok &= s1.stage_chunks == s0.stage_chunks && s1.graph_replays - s0.graph_replays == 2;
  for (int i = 0; i < N; i++) {
    memset(pin_dst[i], 0xee, sizes[i]);
    out[i] = pin_dst[i];
  }
  ok &= e && p_execute(e, p, in, out, &err) == KILN_OK;
  for (int i = 0; i < N; i++) ok &= memcmp(pin_dst[i], src[i], sizes[i]) == 0;
  printf("%d small host inputs and outputs through the graph's copy kernels: %s\n", N,
         ok ? "byte for byte" : "WRONG");
  CHECK(ok);
  p_unload(e);
  for (int i = 0; i < N; i++) {
    free(src[i]);
    free(dst[i]);
    cudaFreeHost(pin_dst[i]);
  }
  p_free(p);
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* --rate: median seconds of a 64 MiB host round trip (in and out) for each setting. */
static int rate_sweep(void) {
  const int threads[5] = {1, 2, 4, 8, 16};
  const int chunk_kib[5] = {256, 512, 1024, 2048, 8192};
  size_t n = (size_t)64 << 20;
  prog *p = copy_prog(n);
  unsigned char *src = malloc(n), *dst = malloc(n), y[7] = {0}, y_out[7];
  fill_bytes(src, n, 5);
  printf("threads chunk_kib in_out_GBps\n");
  for (int ci = 0; ci < 5; ci++) {
    for (int ti = 0; ti < 5; ti++) {
      set_stage_env(threads[ti], chunk_kib[ci]);
      kiln_error err;
      kiln_engine *e = p_load(p, &kiln_cuda_backend, 0, &err);
      if (!e) {
        fprintf(stderr, "load: %s\n", err.message);
        continue;
      }
      double times[12];
      void *in[2] = {src, y}, *out[2] = {dst, y_out};
      for (int r = 0; r < 12; r++) {
        double t0 = now_s();
        p_execute(e, p, in, out, &err);
        times[r] = now_s() - t0;
      }
      for (int a = 0; a < 12; a++) /* sort */
        for (int b = a + 1; b < 12; b++)
          if (times[b] < times[a]) {
            double t = times[a];
            times[a] = times[b];
            times[b] = t;
          }
      printf("%d %d %.1f\n", threads[ti], chunk_kib[ci], 2.0 * (double)n / times[6] / 1e9);
      CHECK(memcmp(dst, src, n) == 0);
      p_unload(e);
    }
  }
  unsetenv("KILN_STAGE_THREADS");
  unsetenv("KILN_STAGE_CHUNK_KIB");
  free(src);
  free(dst);
  p_free(p);
  return check_report("test_cuda_staging --rate");
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count < 1) {
    fprintf(stderr, "test_cuda_staging: no CUDA device; run it on a GPU machine\n");
    return 2;
  }
  if (argc > 1 && strcmp(argv[1], "--rate") == 0) return rate_sweep();
  test_sizes_and_threads();
  test_many_small_buffers();
  test_threads_and_allocations();
  return check_report("test_cuda_staging");
}
