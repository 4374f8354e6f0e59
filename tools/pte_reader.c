/* A minimal FlatBuffers reader for ExecuTorch programs: it walks Program -> execution_plan ->
 * delegates and resolves each delegate's payload (inline data or a segment). Field indices
 * follow ExecuTorch's schema/program.fbs. The walk has a fixed depth and every read is bounded. */
#include "pte_reader.h"

#include "runtime/internal.h"

#include <string.h>

/* Field indices in program.fbs. */
enum { PROGRAM_VERSION = 0, PROGRAM_PLANS = 1, PROGRAM_INLINE = 3, PROGRAM_SEGMENTS = 4 };
enum { PLAN_NAME = 0, PLAN_CHAINS = 5, PLAN_DELEGATES = 7 };
enum { CHAIN_INSTRUCTIONS = 2 };
enum { INSTRUCTION_ARGS_TYPE = 0 };
enum { CALL_KERNEL = 1, CALL_DELEGATE = 2 }; /* InstructionArguments union tags */
enum { DELEGATE_ID = 0, DELEGATE_PROCESSED = 1, DELEGATE_SPECS = 2 };
enum { REF_LOCATION = 0, REF_INDEX = 1 };
enum { INLINE_DATA = 0 };
enum { SEGMENT_OFFSET = 0, SEGMENT_SIZE = 1 };

#define EXTENDED_HEADER_AT 8
#define EXTENDED_HEADER_MIN 24

typedef struct fb {
  const uint8_t *p;
  uint64_t size; /* the FlatBuffers region: offsets past it are refused */
  kiln_error *err;
} fb;

typedef struct fb_table {
  uint64_t pos;
  uint64_t vtable;
  uint32_t vtable_size;
  uint32_t table_size;
} fb_table;

static uint32_t rd16(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8; }

static kiln_status outside(fb *f, const char *what, uint64_t pos) {
  return kiln_fail(f->err, KILN_ERR_INVALID_PROGRAM,
                   "ExecuTorch program is malformed: the %.32s at byte %llu lies outside the "
                   "%llu-byte program; the file is corrupt or truncated",
                   what, (unsigned long long)pos, (unsigned long long)f->size);
}

/* True when [pos, pos + n) lies inside the region. */
static int inside(const fb *f, uint64_t pos, uint64_t n) {
  uint64_t end;
  return kiln_add_u64(pos, n, &end) == 0 && end <= f->size;
}

static kiln_status table_at(fb *f, uint64_t pos, const char *what, fb_table *t) {
  if (!inside(f, pos, 4)) return outside(f, what, pos);
  int64_t vt = (int64_t)pos - (int64_t)(int32_t)kiln_rd_u32(f->p + pos);
  if (vt < 0 || !inside(f, (uint64_t)vt, 4)) return outside(f, what, pos);
  t->pos = pos;
  t->vtable = (uint64_t)vt;
  t->vtable_size = rd16(f->p + vt);
  t->table_size = rd16(f->p + vt + 2);
  if (t->vtable_size < 4 || t->vtable_size % 2 != 0 || !inside(f, t->vtable, t->vtable_size) ||
      t->table_size < 4 || !inside(f, pos, t->table_size))
    return kiln_fail(f->err, KILN_ERR_INVALID_PROGRAM,
                     "ExecuTorch program is malformed: the %.32s at byte %llu has a bad vtable "
                     "(size %u, table size %u); the file is corrupt",
                     what, (unsigned long long)pos, (unsigned)t->vtable_size,
                     (unsigned)t->table_size);
  return KILN_OK;
}

/* Finds field `index` of width bytes: *pos = 0 when absent (the schema default applies). */
static kiln_status field(fb *f, const fb_table *t, unsigned index, uint32_t width,
                         const char *what, uint64_t *pos) {
  *pos = 0;
  uint32_t slot = 4 + 2 * index;
  if (slot + 2 > t->vtable_size) return KILN_OK;
  uint32_t off = rd16(f->p + t->vtable + slot);
  if (off == 0) return KILN_OK;
  if (off < 4 || off + width > t->table_size)
    return kiln_fail(f->err, KILN_ERR_INVALID_PROGRAM,
                     "ExecuTorch program is malformed: the %.32s field at table byte %llu is past "
                     "its table (offset %u, table size %u); the file is corrupt",
                     what, (unsigned long long)t->pos, (unsigned)off, (unsigned)t->table_size);
  *pos = t->pos + off;
  return KILN_OK;
}

static kiln_status read_u32(fb *f, const fb_table *t, unsigned index, const char *what,
                            uint32_t *out) {
  uint64_t pos;
  kiln_status st = field(f, t, index, 4, what, &pos);
  *out = st == KILN_OK && pos ? kiln_rd_u32(f->p + pos) : 0;
  return st;
}

static kiln_status read_u64(fb *f, const fb_table *t, unsigned index, const char *what,
                            uint64_t *out) {
  uint64_t pos;
  kiln_status st = field(f, t, index, 8, what, &pos);
  *out = st == KILN_OK && pos ? kiln_rd_u64(f->p + pos) : 0;
  return st;
}

/* Follows the offset stored at field `index`; *target = 0 when the field is absent. */
static kiln_status follow(fb *f, const fb_table *t, unsigned index, const char *what,
                          uint64_t *target) {
  uint64_t pos;
  kiln_status st = field(f, t, index, 4, what, &pos);
  *target = 0;
  if (st != KILN_OK || !pos) return st;
  *target = pos + kiln_rd_u32(f->p + pos);
  if (!inside(f, *target, 4)) return outside(f, what, *target);
  return KILN_OK;
}

/* A vector of elem_size-byte elements at pos (its length word is already known to be inside). */
static kiln_status vector_at(fb *f, uint64_t pos, uint32_t elem_size, const char *what,
                             uint32_t *count) {
  *count = kiln_rd_u32(f->p + pos);
  if (!inside(f, pos + 4, (uint64_t)*count * elem_size)) return outside(f, what, pos);
  return KILN_OK;
}

/* An optional vector field: count 0 when absent. *elems is the first element's position. */
static kiln_status vector_field(fb *f, const fb_table *t, unsigned index, uint32_t elem_size,
                                const char *what, uint64_t *elems, uint32_t *count) {
  uint64_t pos;
  kiln_status st = follow(f, t, index, what, &pos);
  *elems = 0;
  *count = 0;
  if (st != KILN_OK || !pos) return st;
  *elems = pos + 4;
  return vector_at(f, pos, elem_size, what, count);
}

/* Element i of a vector of tables. */
static kiln_status table_element(fb *f, uint64_t elems, uint32_t i, const char *what,
                                 fb_table *t) {
  uint64_t slot = elems + 4ull * i;
  return table_at(f, slot + kiln_rd_u32(f->p + slot), what, t);
}

/* A string field: NUL-terminated in the file; *s = NULL when absent. */
static kiln_status string_field(fb *f, const fb_table *t, unsigned index, const char *what,
                                const char **s) {
  uint64_t pos;
  uint32_t len;
  kiln_status st = follow(f, t, index, what, &pos);
  *s = NULL;
  if (st != KILN_OK || !pos) return st;
  if ((st = vector_at(f, pos, 1, what, &len)) != KILN_OK) return st;
  if (!inside(f, pos + 4 + len, 1) || f->p[pos + 4 + len] != '\0')
    return kiln_fail(f->err, KILN_ERR_INVALID_PROGRAM,
                     "ExecuTorch program is malformed: the %.32s string at byte %llu is not "
                     "terminated; the file is corrupt",
                     what, (unsigned long long)pos);
  *s = (const char *)f->p + pos + 4;
  return KILN_OK;
}

static kiln_status read_extended_header(const uint8_t *file, size_t size, kiln_pte_info *info,
                                        kiln_error *err) {
  info->program_size = size;
  if (size < EXTENDED_HEADER_AT + 4 || memcmp(file + EXTENDED_HEADER_AT, "eh00", 4) != 0)
    return KILN_OK;
  info->has_extended_header = 1;
  uint32_t length = size >= EXTENDED_HEADER_AT + 8 ? kiln_rd_u32(file + EXTENDED_HEADER_AT + 4) : 0;
  if (length < EXTENDED_HEADER_MIN || size - EXTENDED_HEADER_AT < length)
    return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                     "ExecuTorch program extended header is malformed or truncated (length %u, "
                     "file %llu bytes): the file is corrupt",
                     (unsigned)length, (unsigned long long)size);
  const uint8_t *h = file + EXTENDED_HEADER_AT;
  uint64_t program_size = kiln_rd_u64(h + 8), segment_end;
  info->segment_base = kiln_rd_u64(h + 16);
  uint64_t segment_data = length >= EXTENDED_HEADER_MIN + 8 ? kiln_rd_u64(h + 24) : 0;
  if (program_size < EXTENDED_HEADER_AT + (uint64_t)length || program_size > size ||
      kiln_add_u64(info->segment_base, segment_data, &segment_end) != 0 || segment_end > size)
    return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                     "ExecuTorch program header says %llu program bytes and %llu segment bytes "
                     "from byte %llu, but the file has %llu: the file is truncated or corrupt",
                     (unsigned long long)program_size, (unsigned long long)segment_data,
                     (unsigned long long)info->segment_base, (unsigned long long)size);
  info->program_size = program_size;
  return KILN_OK;
}

/* Resolves a delegate's processed reference to its bytes. */
static kiln_status resolve_payload(fb *f, const uint8_t *file, size_t size, const kiln_pte_info *info,
                                   uint64_t inline_elems, uint64_t segment_elems,
                                   kiln_pte_delegate *d) {
  kiln_status st;
  if (d->location == KILN_PTE_INLINE) {
    if (d->data_index >= info->n_inline)
      return kiln_fail(f->err, KILN_ERR_INVALID_PROGRAM,
                       "ExecuTorch program delegate %u of plan %u refers to inline data %u but "
                       "the program has %u: the file is corrupt",
                       (unsigned)d->index, (unsigned)d->plan, (unsigned)d->data_index,
                       (unsigned)info->n_inline);
    fb_table t;
    uint64_t elems;
    uint32_t n;
    if ((st = table_element(f, inline_elems, d->data_index, "inline delegate data", &t)) != KILN_OK ||
        (st = vector_field(f, &t, INLINE_DATA, 1, "inline delegate data", &elems, &n)) != KILN_OK)
      return st;
    d->data = elems ? file + elems : file;
    d->size = n;
    return KILN_OK;
  }
  if (d->location != KILN_PTE_SEGMENT)
    return kiln_fail(f->err, KILN_ERR_INVALID_PROGRAM,
                     "ExecuTorch program delegate %u of plan %u stores its data in location %u, "
                     "which this kiln does not know: upgrade kiln",
                     (unsigned)d->index, (unsigned)d->plan, (unsigned)d->location);
  if (d->data_index >= info->n_segments)
    return kiln_fail(f->err, KILN_ERR_INVALID_PROGRAM,
                     "ExecuTorch program delegate %u of plan %u refers to segment %u but the "
                     "program has %u: the file is corrupt",
                     (unsigned)d->index, (unsigned)d->plan, (unsigned)d->data_index,
                     (unsigned)info->n_segments);
  if (!info->has_extended_header)
    return kiln_fail(f->err, KILN_ERR_INVALID_PROGRAM,
                     "ExecuTorch program delegate %u of plan %u is in a segment but the file has "
                     "no extended header locating segments: the file is corrupt",
                     (unsigned)d->index, (unsigned)d->plan);
  fb_table t;
  uint64_t offset, start, end;
  if ((st = table_element(f, segment_elems, d->data_index, "data segment", &t)) != KILN_OK ||
      (st = read_u64(f, &t, SEGMENT_OFFSET, "data segment offset", &offset)) != KILN_OK ||
      (st = read_u64(f, &t, SEGMENT_SIZE, "data segment size", &d->size)) != KILN_OK)
    return st;
  if (kiln_add_u64(info->segment_base, offset, &start) != 0 ||
      kiln_add_u64(start, d->size, &end) != 0 || end > size)
    return kiln_fail(f->err, KILN_ERR_INVALID_PROGRAM,
                     "ExecuTorch program segment %u (offset %llu, size %llu, base %llu) ends past "
                     "the file end (%llu bytes): the file is truncated or corrupt",
                     (unsigned)d->data_index, (unsigned long long)offset,
                     (unsigned long long)d->size, (unsigned long long)info->segment_base,
                     (unsigned long long)size);
  d->data = file + start;
  return KILN_OK;
}

static kiln_status read_delegate(fb *f, const uint8_t *file, size_t size, const kiln_pte_info *info,
                                 uint64_t inline_elems, uint64_t segment_elems, const fb_table *dt,
                                 kiln_pte_delegate *d) {
  kiln_status st;
  uint64_t processed, specs;
  uint32_t location = 0;
  if ((st = string_field(f, dt, DELEGATE_ID, "delegate id", &d->id)) != KILN_OK ||
      (st = follow(f, dt, DELEGATE_PROCESSED, "delegate reference", &processed)) != KILN_OK ||
      (st = vector_field(f, dt, DELEGATE_SPECS, 4, "compile specs", &specs,
                         &d->n_compile_specs)) != KILN_OK)
    return st;
  if (!d->id || !processed)
    return kiln_fail(f->err, KILN_ERR_INVALID_PROGRAM,
                     "ExecuTorch program is malformed: delegate %u of plan %u has no %.16s; the "
                     "file is corrupt",
                     (unsigned)d->index, (unsigned)d->plan, d->id ? "data reference" : "backend id");
  fb_table ref;
  uint64_t pos;
  if ((st = table_at(f, processed, "delegate reference", &ref)) != KILN_OK ||
      (st = field(f, &ref, REF_LOCATION, 1, "delegate data location", &pos)) != KILN_OK)
    return st;
  if (pos) location = f->p[pos];
  d->location = location;
  if ((st = read_u32(f, &ref, REF_INDEX, "delegate data index", &d->data_index)) != KILN_OK)
    return st;
  return resolve_payload(f, file, size, info, inline_elems, segment_elems, d);
}

/* Adds the plan's kernel and delegate calls (instructions of every chain) to info's counts. */
static kiln_status count_calls(fb *f, const fb_table *plan, kiln_pte_info *info) {
  uint64_t chains;
  uint32_t n_chains;
  kiln_status st = vector_field(f, plan, PLAN_CHAINS, 4, "chains list", &chains, &n_chains);
  for (uint32_t c = 0; st == KILN_OK && c < n_chains; c++) {
    fb_table chain;
    uint64_t instructions;
    uint32_t n_instructions;
    if ((st = table_element(f, chains, c, "chain", &chain)) != KILN_OK ||
        (st = vector_field(f, &chain, CHAIN_INSTRUCTIONS, 4, "instructions list", &instructions,
                           &n_instructions)) != KILN_OK)
      return st;
    for (uint32_t i = 0; i < n_instructions; i++) {
      fb_table instruction;
      uint64_t pos;
      if ((st = table_element(f, instructions, i, "instruction", &instruction)) != KILN_OK ||
          (st = field(f, &instruction, INSTRUCTION_ARGS_TYPE, 1, "instruction type", &pos)) !=
              KILN_OK)
        return st;
      uint8_t kind = pos ? f->p[pos] : 0;
      if (kind == CALL_KERNEL) info->n_kernel_calls++;
      if (kind == CALL_DELEGATE) info->n_delegate_calls++;
    }
  }
  return st;
}

kiln_status kiln_pte_read(const uint8_t *file, size_t size, kiln_pte_info *info,
                          kiln_pte_visit visit, void *ctx, kiln_error *err) {
  memset(info, 0, sizeof *info);
  if (size < 8)
    return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                     "ExecuTorch program is too short (%llu bytes) to hold a FlatBuffers header: "
                     "the file is truncated or not a .pte",
                     (unsigned long long)size);
  if (memcmp(file + 4, "ET12", 4) != 0) {
    char ident[5];
    for (int i = 0; i < 4; i++) {
      uint8_t c = file[4 + i];
      ident[i] = c >= 0x20 && c < 0x7F ? (char)c : '?';
    }
    ident[4] = '\0';
    return kiln_fail(err, KILN_ERR_INCOMPATIBLE,
                     "ExecuTorch program identifier is \"%.4s\", not \"ET12\": this kiln reads "
                     "ExecuTorch 1.x programs; re-export the program or use a matching kiln",
                     ident);
  }
  kiln_status st = read_extended_header(file, size, info, err);
  if (st != KILN_OK) return st;

  fb f = {file, info->program_size, err};
  fb_table program;
  uint64_t plans, inline_elems, segment_elems;
  if ((st = table_at(&f, kiln_rd_u32(file), "Program table", &program)) != KILN_OK ||
      (st = read_u32(&f, &program, PROGRAM_VERSION, "Program version", &info->schema_version)) !=
          KILN_OK ||
      (st = vector_field(&f, &program, PROGRAM_PLANS, 4, "execution_plan list", &plans,
                         &info->n_plans)) != KILN_OK ||
      (st = vector_field(&f, &program, PROGRAM_INLINE, 4, "backend_delegate_data list",
                         &inline_elems, &info->n_inline)) != KILN_OK ||
      (st = vector_field(&f, &program, PROGRAM_SEGMENTS, 4, "segments list", &segment_elems,
                         &info->n_segments)) != KILN_OK)
    return st;

  for (uint32_t p = 0; p < info->n_plans; p++) {
    fb_table plan;
    uint64_t delegates;
    uint32_t n_delegates;
    const char *name;
    if ((st = table_element(&f, plans, p, "execution plan", &plan)) != KILN_OK ||
        (st = string_field(&f, &plan, PLAN_NAME, "execution plan name", &name)) != KILN_OK ||
        (st = vector_field(&f, &plan, PLAN_DELEGATES, 4, "delegates list", &delegates,
                           &n_delegates)) != KILN_OK ||
        (st = count_calls(&f, &plan, info)) != KILN_OK)
      return st;
    for (uint32_t i = 0; i < n_delegates; i++) {
      kiln_pte_delegate d;
      memset(&d, 0, sizeof d);
      d.plan = p;
      d.plan_name = name ? name : "";
      d.index = i;
      fb_table dt;
      if ((st = table_element(&f, delegates, i, "delegate", &dt)) != KILN_OK ||
          (st = read_delegate(&f, file, size, info, inline_elems, segment_elems, &dt, &d)) !=
              KILN_OK)
        return st;
      if (visit && (st = visit(&d, ctx, err)) != KILN_OK) return st;
    }
  }
  return KILN_OK;
}
