/* Memory planning: tensors live at the same time never share bytes, offsets are aligned,
 * and tensors that are never live together reuse memory. */
#include "check.h"
#include "builder/memplan.h"
#include "kiln/kiln.h"

#include <stdlib.h>
#include <string.h>

static uint32_t rng_state;

static uint32_t rnd(uint32_t n) {
  rng_state = rng_state * 1664525u + 1013904223u;
  return (rng_state >> 8) % n;
}

/* Counts pairs of blocks live together whose bytes overlap, and misaligned offsets. */
static int conflicts(const kiln_mem_block *b, uint32_t n, uint64_t arena) {
  int bad = 0;
  for (uint32_t i = 0; i < n; i++) {
    if (b[i].offset % KILN_ARENA_ALIGN || b[i].offset + b[i].size > arena) bad++;
    for (uint32_t j = i + 1; j < n; j++) {
      int live = b[i].first <= b[j].last && b[j].first <= b[i].last;
      int overlap = b[i].offset < b[j].offset + b[j].size && b[j].offset < b[i].offset + b[i].size;
      if (live && overlap && b[i].size && b[j].size) bad++;
    }
  }
  return bad;
}

static void test_random_blocks(void) {
  kiln_mem_block blocks[300];
  kiln_error err = {KILN_OK, ""};
  for (uint32_t seed = 1; seed <= 40; seed++) {
    uint32_t n = 1 + seed * 7 % 300;
    uint64_t arena = 0, total = 0;
    rng_state = seed;
    for (uint32_t i = 0; i < n; i++) {
      uint32_t first = rnd(100);
      blocks[i] = (kiln_mem_block){rnd(5) ? rnd(100000) : 0, first, first + rnd(20), 7};
      total += blocks[i].size;
    }
    CHECK(kiln_memplan(blocks, n, KILN_ARENA_ALIGN, &arena, &err) == KILN_OK);
    CHECK(conflicts(blocks, n, arena) == 0);
    CHECK(arena <= total + (uint64_t)n * KILN_ARENA_ALIGN);
  }
}

/* A chain a -> b -> c ...: only neighbours are live together, so two slots suffice. */
static void test_chain_reuses(void) {
  kiln_mem_block blocks[20];
  kiln_error err = {KILN_OK, ""};
  uint64_t arena = 0;
  for (uint32_t i = 0; i < 20; i++) blocks[i] = (kiln_mem_block){1000 + i, i, i + 1, 0};
  CHECK(kiln_memplan(blocks, 20, KILN_ARENA_ALIGN, &arena, &err) == KILN_OK);
  CHECK(conflicts(blocks, 20, arena) == 0);
  CHECK(arena == 1024 + 1018);
  /* Best fit: a small block goes into the smallest gap that holds it. */
  {
    kiln_mem_block g[4] = {{1024, 0, 9, 0}, {512, 0, 0, 0}, {256, 0, 9, 0}, {256, 5, 9, 0}};
    CHECK(kiln_memplan(g, 4, KILN_ARENA_ALIGN, &arena, &err) == KILN_OK);
    CHECK(conflicts(g, 4, arena) == 0);
    CHECK(g[3].offset == g[1].offset);
    CHECK(arena == 1024 + 512 + 256);
  }
  /* Two gaps live with the last block, of 768 and 512 bytes: it takes the smaller. */
  {
    kiln_mem_block g[6] = {{1024, 0, 9, 0}, {768, 0, 0, 0}, {512, 0, 9, 0},
                           {300, 0, 0, 0},  {256, 0, 9, 0}, {256, 5, 9, 0}};
    CHECK(kiln_memplan(g, 6, KILN_ARENA_ALIGN, &arena, &err) == KILN_OK);
    CHECK(conflicts(g, 6, arena) == 0);
    CHECK(g[1].offset == 1024 && g[2].offset == 1792 && g[3].offset == 2304);
    CHECK(g[5].offset == 2304);
  }
}

static void test_overflow_refused(void) {
  kiln_mem_block blocks[2] = {{UINT64_MAX / 2, 0, 1, 0}, {UINT64_MAX / 2 + 300, 0, 1, 0}};
  kiln_error err = {KILN_OK, ""};
  uint64_t arena = 0;
  CHECK(kiln_memplan(blocks, 2, KILN_ARENA_ALIGN, &arena, &err) == KILN_ERR_UNSUPPORTED);
  CHECK_STR(err.message, "builder: the arena for 2 tensors exceeds 2^64 bytes; split the graph");
}

/* Liveness of each arena tensor of a parsed plan: [writing op, last reading op]. */
static void plan_blocks(const kiln_plan *p, kiln_mem_block *blocks, uint32_t *n) {
  *n = 0;
  for (uint32_t t = 0; t < p->n_tensors; t++) {
    uint32_t first = UINT32_MAX, last = 0;
    if (p->tensors[t].storage != KILN_STORE_ARENA) continue;
    for (uint32_t i = 0; i < p->n_ops; i++) {
      if (p->ops[i].output == t && first == UINT32_MAX) first = last = i;
      for (uint32_t k = 0; k < p->ops[i].n_inputs; k++)
        if (p->ops[i].inputs[k] == t && i > last) last = i;
    }
    CHECK(first != UINT32_MAX);
    blocks[(*n)++] = (kiln_mem_block){p->tensors[t].nbytes, first, last, p->tensors[t].offset};
  }
}

static int built_plan_with(kiln_builder *b, const kiln_build_options *opts, kiln_plan *plan) {
  kiln_error err = {KILN_OK, ""};
  kiln_blob_view view;
  void *blob = NULL;
  size_t size = 0;
  int ok = kiln_builder_build(b, opts, &blob, &size, &err) == KILN_OK &&
           kiln_blob_parse(blob, size, &view, &err) == KILN_OK &&
           kiln_plan_parse(view.plan, view.plan_size, view.weights_size, plan, &err) == KILN_OK;
  if (!ok) fprintf(stderr, "build: %s\n", err.message);
  CHECK(ok);
  kiln_free(blob);
  return ok;
}

static int built_plan(kiln_builder *b, kiln_plan *plan) { return built_plan_with(b, NULL, plan); }

/* Random graphs of pointwise ops, reductions and joins over a few shapes, random outputs. */
static void test_random_graphs(void) {
  static kiln_mem_block blocks[512];
  for (uint32_t seed = 1; seed <= 30; seed++) {
    kiln_builder *b = kiln_builder_create();
    kiln_error err = {KILN_OK, ""};
    kiln_plan plan;
    int32_t ids[200];
    int32_t rows[200];
    uint32_t n = 0, n_blocks = 0, outputs = 0;
    uint64_t sum = 0;
    char name[16];
    rng_state = seed * 7919u;
    for (int i = 0; i < 3; i++) {
      int64_t dims[2] = {1 + (int64_t)rnd(64), 16};
      snprintf(name, sizeof name, "in%d", i);
      rows[n] = (int32_t)dims[0];
      ids[n++] = kiln_builder_add_input(b, name, KILN_F32, 2, dims, &err);
    }
    while (n < 120) {
      uint32_t a = rnd(n), c = rnd(n), kind = rnd(4);
      int32_t id;
      if (kind == 0) {
        id = kiln_builder_add_op(b, KILN_OP_RELU, &ids[a], 1, NULL, 0, NULL, 0, &err);
        rows[n] = rows[a];
      } else if (kind == 1 && rows[a] == rows[c]) {
        id = kiln_builder_add_op(b, KILN_OP_ADD, (int32_t[]){ids[a], ids[c]}, 2, NULL, 0, NULL, 0,
                                 &err);
        rows[n] = rows[a];
      } else if (kind == 2 && rows[a] + rows[c] <= 256) {
        id = kiln_builder_add_op(b, KILN_OP_CAT, (int32_t[]){ids[a], ids[c]}, 2, (int64_t[]){0}, 1,
                                 NULL, 0, &err);
        rows[n] = rows[a] + rows[c];
      } else {
        id = kiln_builder_add_op(b, KILN_OP_SUM, &ids[a], 1, (int64_t[]){1, 1}, 2, NULL, 0, &err);
        id = kiln_builder_add_op(b, KILN_OP_EXPAND, &id, 1, (int64_t[]){rows[a], 16}, 2, NULL, 0,
                                 &err);
        rows[n] = rows[a];
      }
      CHECK(id >= 0);
      ids[n++] = id;
      if (rnd(10) == 0) {
        snprintf(name, sizeof name, "out%u", (unsigned)outputs++);
        CHECK(kiln_builder_mark_output(b, id, name, &err) == KILN_OK);
      }
    }
    snprintf(name, sizeof name, "out%u", (unsigned)outputs++);
    CHECK(kiln_builder_mark_output(b, ids[n - 1], name, &err) == KILN_OK);
    if (built_plan(b, &plan)) {
      plan_blocks(&plan, blocks, &n_blocks);
      CHECK(n_blocks > 10);
      CHECK(conflicts(blocks, n_blocks, plan.arena_size) == 0);
      for (uint32_t i = 0; i < n_blocks; i++) sum += blocks[i].size;
      CHECK(plan.arena_size < sum);
      CHECK(plan.arena_size == kiln_builder_arena_size(b));
      kiln_plan_release(&plan);
    }
    kiln_builder_destroy(b);
  }
}

/* relu applied 20 times to [64,64] f32, unfused: two 16 KiB slots, not twenty. */
static void test_builder_chain(void) {
  kiln_builder *b = kiln_builder_create();
  kiln_error err = {KILN_OK, ""};
  kiln_build_options opts;
  kiln_plan plan;
  kiln_build_options_default(&opts);
  opts.fuse = 0;
  int32_t t = kiln_builder_add_input(b, "x", KILN_F32, 2, (int64_t[]){64, 64}, &err);
  for (int i = 0; i < 20; i++) t = kiln_builder_add_op(b, KILN_OP_RELU, &t, 1, NULL, 0, NULL, 0, &err);
  CHECK(kiln_builder_mark_output(b, t, "y", &err) == KILN_OK);
  if (built_plan_with(b, &opts, &plan)) {
    CHECK(plan.arena_size == 2 * 16384);
    CHECK(kiln_builder_arena_size(b) == 2 * 16384);
    kiln_plan_release(&plan);
  }
  kiln_builder_destroy(b);
}

int main(void) {
  test_random_blocks();
  test_chain_reuses();
  test_overflow_refused();
  test_random_graphs();
  test_builder_chain();
  return check_report("test_memplan");
}
