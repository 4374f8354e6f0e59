/* Host threads that copy staged transfers between caller buffers and a pinned ring. Created at
 * engine init, joined at destroy; nothing is allocated per transfer. A transfer is a job of
 * pieces that every thread, the caller included, claims one at a time, so a worker that wakes
 * late costs nothing; pieces become claimable chunk by chunk as the caller opens them. No CUDA
 * here: the CPU tests run it with a fake device (tests/c/test_stage.c). */
#ifndef KILN_STAGE_POOL_H
#define KILN_STAGE_POOL_H

#include "kiln/kiln.h"

#include <stddef.h>

#define KILN_STAGE_MAX_THREADS 64
#define KILN_STAGE_MAX_SLOTS 16

typedef enum kiln_stage_dir {
  KILN_STAGE_TO_RING = 0,  /* caller buffer -> ring (an upload) */
  KILN_STAGE_FROM_RING = 1 /* ring -> caller buffer (a download) */
} kiln_stage_dir;

/* One transfer of n bytes between the caller's buffer `user` and a ring of `slots` slots of
 * slot_bytes: chunk c (chunk_bytes each, the last one shorter) lies in slot
 * (first_slot + c) % slots. grain divides chunk_bytes and chunk_bytes <= slot_bytes. */
typedef struct kiln_stage_job {
  kiln_stage_dir dir;
  unsigned char *user;
  unsigned char *ring;
  size_t slot_bytes;
  unsigned slots, first_slot;
  size_t n, chunk_bytes, grain;
  int write_back; /* after a piece is copied into the ring, its cache lines go back to memory */
} kiln_stage_job;

typedef struct kiln_stage_pool kiln_stage_pool;

/* Test hook: after `n` more successful thread starts every start fails; n < 0 turns it off. */
void kiln_stage_fail_threads_after(long n);

/* Starts threads - 1 workers (0 or 1: the caller copies alone), with every signal blocked in
 * them. A failure is reported here, never at a transfer, and leaves no thread behind. */
kiln_status kiln_stage_pool_create(int threads, kiln_stage_pool **out, kiln_error *err);
/* Stops and joins the workers; no job may be running. NULL is allowed. */
void kiln_stage_pool_destroy(kiln_stage_pool *p);
/* Threads that copy, the caller included. */
int kiln_stage_pool_threads(const kiln_stage_pool *p);

/* Starts `job` with no chunk open. share = 0 tells no worker of it (a small transfer: waking
 * one costs more than it saves; one still awake may help). One job at a time, from one caller
 * thread. */
void kiln_stage_begin(kiln_stage_pool *p, const kiln_stage_job *job, int share);
/* Chunks 0 .. chunks-1 may be copied (the count only grows within a job). */
void kiln_stage_open(kiln_stage_pool *p, size_t chunks);
/* The caller copies one open piece: 1, or 0 when no open piece is left unclaimed. */
int kiln_stage_help(kiln_stage_pool *p);
/* Whether every byte of open chunk c has been copied (valid until its slot is reopened). */
int kiln_stage_chunk_copied(kiln_stage_pool *p, size_t c);
/* Closes the job: no piece is claimed any more; returns once the pieces in copy are done. */
void kiln_stage_end(kiln_stage_pool *p);

/* Copies n bytes from src to dst with the pool's threads when n >= parallel_min, else on the
 * calling thread; pieces of `grain` bytes. */
void kiln_stage_copy(kiln_stage_pool *p, void *dst, const void *src, size_t n, size_t grain,
                     size_t parallel_min);

/* Writes the cache lines of n bytes at p back to memory, keeping them cached (x86 CLWB, where the
 * CPU has it; elsewhere nothing). A DMA read of lines the CPU holds modified is slow: on the
 * H200's host a 2 MiB host-to-device copy of a ring 8 threads had just written took 97 us, 49
 * after the lines were written back. Ring uploads write back each piece they copy (not the small
 * copies a graph's kernel reads: there it cost more than it saved). Returns whether the CPU
 * could. */
int kiln_stage_write_back(const void *p, size_t n);

/* For tests: pieces the pool's workers (not the caller) have copied since it was created, and
 * how many times the workers were told of new work. */
unsigned long long kiln_stage_pool_worker_pieces(kiln_stage_pool *p);
unsigned long long kiln_stage_pool_signals(kiln_stage_pool *p);
/* For tests: bytes of the ring written back after copies into it (kiln_stage_write_back). */
unsigned long long kiln_stage_pool_written_back(kiln_stage_pool *p);

#endif
