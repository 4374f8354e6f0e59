/* kiln inspect FILE: prints a Kiln blob (header, metadata, plan) or an ExecuTorch program's
 * delegates, inspecting each KilnBackend blob inside it. Everything is checked before anything
 * is printed, so a refused file gives exit status 1 and one line on stderr. */
#include "commands.h"
#include "mapped_file.h"
#include "pte_reader.h"

#include "runtime/fused_program.h"
#include "runtime/linear_inputs.h"
#include "runtime/load_checks.h"
#include "runtime/pointwise_steps.h"
#include "kiln/kiln.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ a Kiln blob */

typedef struct blob_contents {
  kiln_blob_view view;
  kiln_metadata *md;
  kiln_plan plan;
} blob_contents;

static void release_blob(blob_contents *b) {
  free(b->md);
  kiln_plan_release(&b->plan);
  memset(b, 0, sizeof *b);
}

/* Reads all three sections and runs on them every check the loader makes before it touches a
 * device, so what inspect passes a delegate would load. */
static kiln_status load_blob(const uint8_t *data, size_t size, blob_contents *b, kiln_error *err) {
  memset(b, 0, sizeof *b);
  b->md = malloc(sizeof *b->md);
  if (!b->md)
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "out of host memory reading blob metadata: free memory and retry");
  kiln_status st = kiln_check_blob(data, size, &b->view, b->md, &b->plan, err);
  if (st != KILN_OK) release_blob(b);
  return st;
}

static void print_dims(const int64_t *dims, int32_t rank) {
  if (rank < 0 || rank > KILN_MAX_RANK) rank = 0;
  printf("[");
  for (int32_t d = 0; d < rank; d++) printf(d ? ", %lld" : "%lld", (long long)dims[d]);
  printf("]");
}

static void print_header(const uint8_t *data, size_t size, const blob_contents *b, const char *in) {
  const kiln_blob_view *v = &b->view;
  printf("%sKiln blob: %llu bytes, container version %u, header %u bytes, magic KILNBLOB\n", in,
         (unsigned long long)size, (unsigned)v->version, (unsigned)KILN_BLOB_HEADER_SIZE);
  printf("%s  metadata section: offset %llu, size %llu\n", in,
         (unsigned long long)(v->metadata - data), (unsigned long long)v->metadata_size);
  printf("%s  plan section:     offset %llu, size %llu\n", in, (unsigned long long)(v->plan - data),
         (unsigned long long)v->plan_size);
  printf("%s  weights section:  offset %llu, size %llu\n", in,
         (unsigned long long)(v->weights - data), (unsigned long long)v->weights_size);
}

static void print_metadata(const kiln_metadata *md, const char *in) {
  printf("%smetadata:\n", in);
  printf("%s  producer: %s\n", in, md->producer);
  printf("%s  device_id: %d\n", in, (int)md->device_id);
  printf("%s  min_compute_capability: %d\n", in, (int)md->min_compute_capability);
  printf("%s  allow_tf32: %s\n", in, md->allow_tf32 ? "true" : "false");
  printf("%s  io: %u bindings\n", in, (unsigned)md->n_bindings);
  uint32_t counts[2] = {0, 0};
  for (uint32_t i = 0; i < md->n_bindings; i++) {
    const kiln_binding *bd = &md->bindings[i];
    int is_output = bd->kind == KILN_IO_OUTPUT;
    printf("%s    %s %u \"%s\": %s ", in, is_output ? "output" : "input", (unsigned)counts[is_output]++,
           bd->name, kiln_dtype_name(bd->dtype));
    print_dims(bd->shape, bd->rank);
    if (memcmp(bd->shape, bd->max_shape, sizeof bd->shape[0] * (size_t)bd->rank) != 0) {
      printf(" (max ");
      print_dims(bd->max_shape, bd->rank);
      printf(")");
    }
    printf("\n");
  }
  if (md->n_aliases == 0) printf("%s  aliases: none\n", in);
  else printf("%s  aliases:\n", in);
  for (uint32_t i = 0; i < md->n_aliases; i++)
    printf("%s    output %u -> input %u (%s)\n", in, (unsigned)md->aliases[i].output,
           (unsigned)md->aliases[i].input, md->aliases[i].kind);
}

static const char *const storage_names[] = {"arena", "weight", "input", "output", "state"};

static void print_tensor_ref(const kiln_plan *plan, uint32_t t) {
  printf("t%u ", (unsigned)t);
  if (t < plan->n_tensors) print_dims(plan->tensors[t].dims, plan->tensors[t].rank);
  else printf("[?]");
}

static const char *activation_name(int64_t a) {
  switch (a) {
  case KILN_ACT_NONE: return "none";
  case KILN_ACT_RELU: return "relu";
  case KILN_ACT_GELU_ERF: return "gelu (erf)";
  case KILN_ACT_GELU_TANH: return "gelu (tanh)";
  case KILN_ACT_SWIGLU: return "swiglu (silu(gate) * up)";
  }
  return "unknown";
}

/* Fused steps as "; fused [mul(in1) -> add(in2) -> gelu_tanh]"; a norm's own place among its
 * steps is shown by its name: "; fused [add(in3) -> layer_norm -> gelu_erf]". */
static void print_fused_steps(const kiln_op *op) {
  char step[48];
  kiln_pw_span span;
  int norm = op->kind != KILN_OP_POINTWISE;
  if (!kiln_pw_span_of(op, &span)) return;
  printf("; fused [");
  for (uint32_t k = 0; k <= span.n_steps; k++) {
    if (norm && k == span.n_before) printf("%s%s", k ? " -> " : "", kiln_op_name(op->kind));
    if (k < span.n_steps)
      printf("%s%s", k || (norm && span.n_before == 0) ? " -> " : "",
             kiln_pointwise_step_str(span.steps[k], span.exponent, step, sizeof step));
  }
  printf("]");
}

/* A FUSED op's program: "; group [r0=in0[0;4,1] -> r1=neg(r0) -> store r1]". Loads show the
 * offset and the stride per output dim, "boxed" when they read only part of the output. */
static void print_group(const kiln_plan *plan, const kiln_op *op) {
  const kiln_tensor_desc *in[KILN_MAX_OP_INPUTS];
  kiln_fx_prog prog;
  char text[160];
  for (uint32_t k = 0; k < op->n_inputs; k++) in[k] = &plan->tensors[op->inputs[k]];
  if (kiln_fx_decode(plan->words, plan->n_words, op, 0, in, &plan->tensors[op->output], &prog,
                     NULL) != KILN_OK)
    return; /* the load checks passed it, so this does not happen */
  printf("; group [");
  for (uint32_t i = 0; i < prog.n_instrs; i++)
    printf("%s%s", i ? " -> " : "", kiln_fx_instr_str(&prog, i, text, sizeof text));
  printf("]");
}

/* A dynamic tensor's dims as expressions of the plan's symbols: " as [2,seq,2*seq-1]". */
static void print_sym_dims(const kiln_plan *plan, const kiln_tensor_desc *t) {
  int dynamic = 0;
  for (int32_t d = 0; d < t->rank; d++) dynamic |= t->sym[d].symbol != 0;
  if (!dynamic) return;
  printf(" as [");
  for (int32_t d = 0; d < t->rank; d++) {
    const kiln_sym_size *s = &t->sym[d];
    if (d) printf(",");
    if (!s->symbol) {
      printf("%lld", (long long)t->dims[d]);
      continue;
    }
    if (s->coeff != 1) printf("%lld*", (long long)s->coeff);
    printf("%s", plan->symbols[s->symbol - 1].name);
    if (s->offset) printf("%+lld", (long long)s->offset);
  }
  printf("]");
}

static void print_plan(const kiln_plan *plan, const char *in) {
  printf("%splan: version %u, %u tensors, %u ops, %u inputs, %u outputs, %u states, arena %llu "
         "bytes\n", in, (unsigned)plan->version, (unsigned)plan->n_tensors, (unsigned)plan->n_ops,
         (unsigned)plan->n_inputs, (unsigned)plan->n_outputs, (unsigned)plan->n_states,
         (unsigned long long)plan->arena_size);
  for (uint32_t k = 0; k < plan->n_symbols; k++)
    printf("%s  dynamic size %s: %lld..%lld (dims shown at the upper bound)\n", in,
           plan->symbols[k].name, (long long)plan->symbols[k].min, (long long)plan->symbols[k].max);
  printf("%s  tensors:\n", in);
  for (uint32_t i = 0; i < plan->n_tensors; i++) {
    const kiln_tensor_desc *t = &plan->tensors[i];
    printf("%s    t%u: %s ", in, (unsigned)i, kiln_dtype_name(t->dtype));
    print_dims(t->dims, t->rank);
    print_sym_dims(plan, t);
    const char *where = (unsigned)t->storage < 5 ? storage_names[t->storage] : "unknown";
    if (t->storage == KILN_STORE_INPUT || t->storage == KILN_STORE_OUTPUT)
      printf(" %s %u, %llu bytes\n", where, (unsigned)t->io_index, (unsigned long long)t->nbytes);
    else if (t->storage == KILN_STORE_STATE)
      printf(" state %u (initial value at weights offset %llu), %llu bytes\n", (unsigned)t->io_index,
             (unsigned long long)t->offset, (unsigned long long)t->nbytes);
    else
      printf(" %s offset %llu, %llu bytes\n", where, (unsigned long long)t->offset,
             (unsigned long long)t->nbytes);
  }
  printf("%s  ops:\n", in);
  for (uint32_t i = 0; i < plan->n_ops; i++) {
    const kiln_op *op = &plan->ops[i];
    printf("%s    op %u: %s(", in, (unsigned)i, kiln_op_name(op->kind));
    uint32_t n = op->n_inputs < KILN_MAX_OP_INPUTS ? op->n_inputs : KILN_MAX_OP_INPUTS;
    for (uint32_t k = 0; k < n; k++) {
      if (k) printf(", ");
      print_tensor_ref(plan, op->inputs[k]);
    }
    printf(") -> ");
    print_tensor_ref(plan, op->output);
    if (op->kind == KILN_OP_LINEAR) {
      printf("; epilogue: %s, %s%s", kiln_linear_has_bias(op) ? "bias" : "no bias",
             activation_name(op->n_iattr ? op->iattr[0] : KILN_ACT_NONE),
             kiln_linear_has_residual(op) ? ", + residual" : "");
    } else if (op->kind == KILN_OP_POINTWISE) {
      print_fused_steps(op);
    } else if (op->kind == KILN_OP_FUSED) {
      print_group(plan, op);
    } else if (op->n_iattr) {
      kiln_pw_span span;
      uint32_t na = op->n_iattr < KILN_MAX_IATTR ? op->n_iattr : KILN_MAX_IATTR;
      if (kiln_pw_span_of(op, &span)) na = 2; /* a norm's own attributes, then its steps */
      printf("; iattr [");
      for (uint32_t k = 0; k < na; k++) printf(k ? ", %lld" : "%lld", (long long)op->iattr[k]);
      printf("]");
      print_fused_steps(op);
    }
    /* a pointwise pow step already shows fattr0 as its exponent */
    if (op->kind != KILN_OP_POINTWISE && (op->fattr[0] != 0.0 || op->fattr[1] != 0.0))
      printf("; fattr [%g, %g]", op->fattr[0], op->fattr[1]);
    printf("\n");
  }
}

static void print_blob(const uint8_t *data, size_t size, const blob_contents *b, const char *in) {
  print_header(data, size, b, in);
  print_metadata(b->md, in);
  print_plan(&b->plan, in);
}

/* ------------------------------------------------------------------ an ExecuTorch program */

static int is_kiln(const kiln_pte_delegate *d) { return strcmp(d->id, KILN_BACKEND_ID) == 0; }

/* First pass: counts the delegates; every Kiln blob inside the program must load. */
static kiln_status check_delegate(const kiln_pte_delegate *d, void *ctx, kiln_error *err) {
  (*(uint32_t *)ctx)++;
  if (!is_kiln(d)) return KILN_OK;
  blob_contents b;
  kiln_status st = load_blob(d->data, (size_t)d->size, &b, err);
  if (st == KILN_OK) {
    release_blob(&b);
    return KILN_OK;
  }
  char inner[KILN_ERROR_MAX];
  snprintf(inner, sizeof inner, "%s", err ? err->message : "");
  return kiln_fail(err, st, "ExecuTorch program delegate %u of plan %u (KilnBackend): %.180s",
                   (unsigned)d->index, (unsigned)d->plan, inner);
}

typedef struct print_state {
  const uint8_t *file;
  int64_t last_plan;
} print_state;

static kiln_status print_delegate(const kiln_pte_delegate *d, void *ctx, kiln_error *err) {
  print_state *ps = ctx;
  char name[72], id[72];
  if (ps->last_plan != d->plan) {
    printf("  plan %u \"%s\":\n", (unsigned)d->plan, kiln_clean_text(d->plan_name, name, sizeof name));
    ps->last_plan = d->plan;
  }
  printf("    delegate %u: backend %s, %s %u at byte %llu, %llu bytes, %u compile specs\n",
         (unsigned)d->index, kiln_clean_text(d->id, id, sizeof id),
         d->location == KILN_PTE_INLINE ? "inline data" : "segment", (unsigned)d->data_index,
         (unsigned long long)(d->data - ps->file), (unsigned long long)d->size,
         (unsigned)d->n_compile_specs);
  if (!is_kiln(d)) return KILN_OK;
  blob_contents b;
  kiln_status st = load_blob(d->data, (size_t)d->size, &b, err);
  if (st != KILN_OK) return st; /* checked by the first pass */
  print_blob(d->data, (size_t)d->size, &b, "      ");
  release_blob(&b);
  return KILN_OK;
}

typedef struct delegation_counts {
  uint32_t kiln_blobs;
  uint64_t kiln_ops;
} delegation_counts;

static kiln_status count_kiln_ops(const kiln_pte_delegate *d, void *ctx, kiln_error *err) {
  delegation_counts *counts = ctx;
  if (!is_kiln(d)) return KILN_OK;
  blob_contents b;
  kiln_status st = load_blob(d->data, (size_t)d->size, &b, err);
  if (st != KILN_OK) return st; /* checked by the first pass */
  counts->kiln_blobs++;
  counts->kiln_ops += b.plan.n_ops;
  release_blob(&b);
  return KILN_OK;
}

/* One line saying how much runs on Kiln: what kiln.export's delegation report counts. */
static kiln_status print_delegation(const mapped_file *f, kiln_error *err) {
  kiln_pte_info info;
  delegation_counts counts = {0, 0};
  kiln_status st = kiln_pte_read(f->data, f->size, &info, count_kiln_ops, &counts, err);
  if (st != KILN_OK) return st;
  printf("  delegation: %u Kiln blob%s with %llu ops; %u op%s on ExecuTorch; %u delegate calls\n",
         (unsigned)counts.kiln_blobs, counts.kiln_blobs == 1 ? "" : "s",
         (unsigned long long)counts.kiln_ops, (unsigned)info.n_kernel_calls,
         info.n_kernel_calls == 1 ? "" : "s", (unsigned)info.n_delegate_calls);
  return KILN_OK;
}

static int inspect_pte(const mapped_file *f, kiln_error *err) {
  kiln_pte_info info;
  uint32_t n_delegates = 0;
  if (kiln_pte_read(f->data, f->size, &info, check_delegate, &n_delegates, err) != KILN_OK) {
    fprintf(stderr, "%s\n", err->message);
    return 1;
  }
  printf("ExecuTorch program: %llu bytes, identifier ET12, schema version %u, %u execution plans, "
         "%u delegates\n",
         (unsigned long long)f->size, (unsigned)info.schema_version, (unsigned)info.n_plans,
         (unsigned)n_delegates);
  if (info.has_extended_header)
    printf("  extended header: program %llu bytes, segment base %llu, %u segments\n",
           (unsigned long long)info.program_size, (unsigned long long)info.segment_base,
           (unsigned)info.n_segments);
  if (print_delegation(f, err) != KILN_OK) {
    fprintf(stderr, "%s\n", err->message);
    return 1;
  }
  print_state ps = {f->data, -1};
  if (kiln_pte_read(f->data, f->size, &info, print_delegate, &ps, err) != KILN_OK) {
    fprintf(stderr, "%s\n", err->message);
    return 1;
  }
  return 0;
}

static int inspect_blob(const mapped_file *f, kiln_error *err) {
  blob_contents b;
  if (load_blob(f->data, f->size, &b, err) != KILN_OK) {
    fprintf(stderr, "%s\n", err->message);
    return 1;
  }
  print_blob(f->data, f->size, &b, "");
  release_blob(&b);
  return 0;
}

int kiln_cmd_inspect(int argc, char **argv) {
  if (argc != 2 || strcmp(argv[1], "--help") == 0) {
    fprintf(argc == 2 ? stdout : stderr,
            "usage: kiln inspect FILE\n"
            "  FILE is a Kiln blob (prints its header, metadata and plan) or an ExecuTorch .pte\n"
            "  (lists its delegates and inspects each " KILN_BACKEND_ID " blob)\n");
    return argc == 2 ? 0 : 2;
  }
  kiln_error err = {KILN_OK, ""};
  mapped_file f;
  if (kiln_map_file(argv[1], &f, &err) != KILN_OK) {
    fprintf(stderr, "%s\n", err.message);
    return 1;
  }
  int rc;
  if (f.size >= 8 && memcmp(f.data, KILN_BLOB_MAGIC, 8) == 0) {
    rc = inspect_blob(&f, &err);
  } else if (f.size >= 8 && memcmp(f.data + 4, "ET", 2) == 0) {
    rc = inspect_pte(&f, &err);
  } else {
    char shown[128];
    kiln_fail(&err, KILN_ERR_INVALID_PROGRAM,
              "%.120s is neither a Kiln blob (magic KILNBLOB) nor an ExecuTorch program "
              "(identifier ET12): pass a blob or a .pte file",
              kiln_clean_text(argv[1], shown, sizeof shown));
    fprintf(stderr, "%s\n", err.message);
    rc = 1;
  }
  kiln_unmap_file(&f);
  return rc;
}
