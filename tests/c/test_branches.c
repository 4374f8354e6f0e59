/* Which ops go on a branch beside the chain (runtime/branches.h): plans written op by op with
 * what an engine would know of them, and where each op must land. */
#include "check.h"
#include "runtime/branches.h"

#include <string.h>

#define MAX_OPS 12
#define MAX_TENSORS 24

/* A plan under construction and the engine's facts about it. */
typedef struct case_plan {
  kiln_plan plan;
  kiln_op ops[MAX_OPS];
  kiln_tensor_desc tensors[MAX_TENSORS];
  uint8_t candidate[MAX_OPS], launches[MAX_OPS], view[MAX_OPS], derived[MAX_TENSORS];
  uint64_t bytes[MAX_TENSORS][2];
  int32_t beside[MAX_OPS], join[MAX_OPS];
} case_plan;

static void start(case_plan *c) {
  memset(c, 0, sizeof *c);
  c->plan.ops = c->ops;
  c->plan.tensors = c->tensors;
}

/* A tensor of its own 256 bytes. */
static uint32_t tensor(case_plan *c) {
  uint32_t t = c->plan.n_tensors++;
  c->bytes[t][0] = 4096 + 256 * (uint64_t)t;
  c->bytes[t][1] = c->bytes[t][0] + 256;
  return t;
}

/* A tensor on the bytes of tensor `of` (a view of it, or memory the plan reuses). */
static uint32_t tensor_on(case_plan *c, uint32_t of) {
  uint32_t t = c->plan.n_tensors++;
  memcpy(c->bytes[t], c->bytes[of], sizeof c->bytes[t]);
  return t;
}

/* kind: 'c' a candidate kernel, 'k' a kernel of the chain, 'v' a view, 'n' an op that
 * launches nothing (a norm a GEMV computes). */
static void op(case_plan *c, char kind, uint32_t out, uint32_t n_in, const uint32_t *in) {
  uint32_t i = c->plan.n_ops++;
  c->ops[i].n_inputs = n_in;
  memcpy(c->ops[i].inputs, in, n_in * sizeof *in);
  c->ops[i].output = out;
  c->candidate[i] = kind == 'c';
  c->launches[i] = kind == 'c' || kind == 'k';
  c->view[i] = kind == 'v';
}

#define IN(...)                                                                             \
  (uint32_t)(sizeof((const uint32_t[]){__VA_ARGS__}) / sizeof(uint32_t)),                  \
      (const uint32_t[]) { __VA_ARGS__ }

static uint32_t place(case_plan *c) {
  kiln_branch_facts f = {c->candidate, c->launches, c->view, (const uint64_t(*)[2])c->bytes};
  return kiln_plan_branches(&c->plan, &f, c->derived, c->beside);
}

/* A decode step's front: the position's copy is read by the rotary group after the QKV GEMV
 * (and by the mask compare, itself beside), the mask by the attention; the embedding by the
 * norm just after it, with no kernel of the chain between once the compare is beside. */
static void test_decode_front(void) {
  case_plan c;
  start(&c);
  uint32_t ids = tensor(&c), pos_in = tensor(&c), table = tensor(&c), range = tensor(&c);
  uint32_t pos = tensor(&c), h = tensor(&c), pos4 = tensor_on(&c, pos), mask = tensor(&c);
  uint32_t hn = tensor(&c), qkv = tensor(&c), rot = tensor(&c), att = tensor(&c);
  uint32_t out = tensor(&c);
  op(&c, 'c', pos, IN(pos_in));         /* 0 select */
  op(&c, 'c', h, IN(table, ids));       /* 1 embedding */
  op(&c, 'v', pos4, IN(pos));           /* 2 reshape */
  op(&c, 'c', mask, IN(range, pos4));   /* 3 compare */
  op(&c, 'n', hn, IN(h));               /* 4 rms norm, computed by the GEMV */
  op(&c, 'k', qkv, IN(hn));             /* 5 linear */
  op(&c, 'c', rot, IN(qkv, pos));       /* 6 rotary group */
  op(&c, 'k', att, IN(rot, mask));      /* 7 attention */
  op(&c, 'k', out, IN(att));            /* 8 linear */
  CHECK(place(&c) == 2);
  CHECK(c.beside[0] == 1 + 6); /* joined at the rotary group, past the compare beside it */
  CHECK(c.beside[3] == 1 + 7);
  CHECK(c.beside[1] == 0); /* nothing of the chain runs before its reader */
  CHECK(c.beside[6] == 0); /* read by the very next kernel */
  kiln_branch_joins(c.beside, c.plan.n_ops, c.join);
  for (uint32_t i = 0; i < c.plan.n_ops; i++) /* one join, at the rotary group, for both */
    CHECK(c.join[i] == (i == 6 ? 1 + 3 : 0));
}

/* A result read through a view of it, with a candidate between that stays on the chain: the
 * op weighed first must see that it does. */
static void test_through_a_view(void) {
  case_plan c;
  start(&c);
  uint32_t a = tensor(&c), b = tensor(&c), scan = tensor(&c), flat = tensor_on(&c, scan);
  uint32_t neg = tensor(&c), out = tensor(&c);
  op(&c, 'c', scan, IN(a));      /* 0 cumsum */
  op(&c, 'v', flat, IN(scan));   /* 1 reshape */
  op(&c, 'c', neg, IN(b));       /* 2 neg */
  op(&c, 'k', out, IN(flat, neg)); /* 3 add */
  CHECK(place(&c) == 1);
  CHECK(c.beside[0] == 1 + 3);
  CHECK(c.beside[2] == 0);
}

/* An op of the chain between that writes the candidate's input or output keeps it on the
 * chain; with its own bytes, the same plan puts the candidate beside. */
static void test_overwritten_bytes(void) {
  for (int hazard = 0; hazard < 3; hazard++) {
    case_plan c;
    start(&c);
    uint32_t a = tensor(&c), b = tensor(&c), t = tensor(&c), scan = tensor(&c);
    uint32_t u = hazard == 1 ? tensor_on(&c, t) : hazard == 2 ? tensor_on(&c, scan) : tensor(&c);
    uint32_t out = tensor(&c);
    op(&c, 'k', t, IN(a));           /* 0 */
    op(&c, 'c', scan, IN(t));        /* 1 the candidate */
    op(&c, 'k', u, IN(b));           /* 2 the chain: over t, over the scan, or its own */
    op(&c, 'k', out, IN(scan, u));   /* 3 the reader */
    CHECK(place(&c) == (hazard ? 0u : 1u));
    CHECK(c.beside[1] == (hazard ? 0 : 1 + 3));
  }
}

/* No reader on the chain, or no kernel of the chain before it: nothing to gain. */
static void test_nothing_to_gain(void) {
  case_plan c;
  start(&c);
  uint32_t a = tensor(&c), b = tensor(&c), x = tensor(&c), y = tensor(&c), z = tensor(&c);
  op(&c, 'c', x, IN(a));      /* read by the next kernel */
  op(&c, 'k', y, IN(x));
  op(&c, 'c', z, IN(b));      /* read by nothing */
  CHECK(place(&c) == 0);
  CHECK(c.beside[0] == 0 && c.beside[2] == 0);
}

/* Joins straight from placements: a join covers every op launched beside before it, also one
 * whose reader comes later; an op beside after a join gets its own. */
static void test_joins(void) {
  const int32_t beside[7] = {1 + 2, 1 + 4, 0, 1 + 6, 0, 0, 0};
  int32_t join[7];
  kiln_branch_joins(beside, 7, join);
  const int32_t want[7] = {0, 0, 1 + 1, 0, 0, 0, 1 + 3};
  for (int i = 0; i < 7; i++) CHECK(join[i] == want[i]);
}

int main(void) {
  test_joins();
  test_decode_front();
  test_through_a_view();
  test_overwritten_bytes();
  test_nothing_to_gain();
  return check_report("test_branches");
}
