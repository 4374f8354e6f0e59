/* What the CUDA engine exposes beyond the backend table: counters that tests read to see how
 * caller buffers were handled, and the allocation-failure hook that proves init cleans up
 * and execute allocates nothing. */
#ifndef KILN_CUDA_BACKEND_H
#define KILN_CUDA_BACKEND_H

#include "kiln/kiln.h"

#include <stdint.h>

typedef struct kiln_cuda_stats {
  uint64_t staged;        /* caller buffers copied through engine-owned buffers */
  uint64_t bound;         /* caller buffers the device addresses, used in place without a copy */
  uint64_t graph_replays; /* runs replayed from a captured CUDA graph */
  uint64_t graph_updates; /* graph updates for a new set of bound caller addresses */
  uint64_t direct_runs;   /* runs launched op by op (a graph update was refused) */
  uint64_t init_allocs;   /* allocations made by init */
  uint64_t stage_chunks;  /* pieces host buffers moved in through the pinned ring, in and out */
  uint64_t stage_threads; /* threads that copy a staged transfer, the caller included */
  uint64_t stage_slot_bytes; /* bytes of one ring slot: the largest chunk */
  uint64_t state_resets;  /* state buffers set back to their initial values (init does one) */
  uint64_t host_out_bytes; /* output bytes execute copied from the device to host memory */
  uint64_t shape_captures;  /* dynamic plans: graphs captured for a call shape seen before */
  uint64_t shape_evictions; /* of those, how many took the slot of another shape */
  uint64_t choices_measured; /* GEMM algorithm, convolution and attention plan choices init
                                timed here */
  uint64_t choices_reused;   /* ones it took from an earlier load in the process instead */
  uint64_t fused_compiled;    /* FUSED ops running a kernel compiled for them at load */
  uint64_t fused_interpreted; /* FUSED ops the interpreting kernel runs (a dynamic plan's, or
                                 every one where NVRTC is not installed) */
  uint64_t attention_cudnn;   /* SDPA ops init gave to cuDNN's fused attention */
  uint64_t norms_in_gemv;     /* norms whose one-row GEMVs compute them (no kernel of their own) */
  uint64_t cache_writes_in_attention; /* KV cache INDEX_COPYs the decoding attention reading the
                                         cache does (no kernel of their own) */
  uint64_t norms_after_gemv; /* norms the one-row GEMV writing their input computes, in its
                                last block (no kernel of their own) */
  uint64_t ops_beside; /* ops run on a branch beside the chain, joined before the first op
                          reading their result (kcu_plan_beside) */
} kiln_cuda_stats;

/* Counters of a CUDA engine; KILN_ERR_INVALID_ARGUMENT for an engine of another backend.
 * Exported from libkiln.so: the Python tests read it through ctypes. */
KILN_API kiln_status kiln_cuda_engine_stats(const kiln_engine *e, kiln_cuda_stats *out, kiln_error *err);

/* Test hook: after `n` more successful allocations every allocation the CUDA engine makes
 * fails; n < 0 turns failures off. Process-wide, for single-threaded tests only. */
void kiln_cuda_fail_allocations_after(long n);

/* Test hook: which path init gives an SDPA op cuDNN's fused attention could take. The default
 * times both and keeps the faster; the others force one, to test each against the CPU engine.
 * Process-wide, read at init. */
#define KILN_CUDA_ATTENTION_TIMED 0
#define KILN_CUDA_ATTENTION_OWN 1   /* Kiln's own kernels only */
#define KILN_CUDA_ATTENTION_CUDNN 2 /* cuDNN wherever a plan builds and runs */
void kiln_cuda_attention_choice(int path);

/* Times each op of the plan alone: one untimed launch, then `reps` timed ones, on the engine's
 * own device buffers (inputs hold whatever they last held). ms[i] (one entry per op) gets op
 * i's mean milliseconds; *graph_ms the mean of `reps` back-to-back replays of one graph of the
 * whole plan (what a run costs on the GPU, without the call's host work). It synchronizes the
 * engine's stream and takes no lock: call it only while no other thread executes the engine. */
kiln_status kiln_cuda_profile_ops(kiln_engine *e, int reps, double *ms, double *graph_ms,
                                  kiln_error *err);

/* Device address of the engine's arena (NULL when the plan needs none). */
const void *kiln_cuda_engine_arena(const kiln_engine *e);

#endif
