/* Reads DT_NEEDED, RUNPATH/RPATH, the symbol tables and the version needs of an ELF64
 * little-endian shared object from untrusted bytes: every offset, size and string is
 * checked before use. */
#include "elf_read.h"

#include "runtime/internal.h"

#include <elf.h>
#include <stdlib.h>
#include <string.h>

typedef struct section {
  uint32_t type, link, info;
  uint64_t offset, size, entsize;
} section;

typedef struct reader {
  const uint8_t *data;
  size_t size;
  const char *what;
  section *sections;
  uint32_t n_sections;
} reader;

static uint16_t rd_u16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

/* The string at offset off of string-table section index strtab, or NULL when the index,
 * the offset or the terminating NUL is outside the section. */
static const char *section_string(const reader *r, uint32_t strtab, uint64_t off) {
  if (strtab >= r->n_sections) return NULL;
  const section *s = &r->sections[strtab];
  if (s->type != SHT_STRTAB || off >= s->size) return NULL;
  const char *start = (const char *)r->data + s->offset + off;
  if (!memchr(start, '\0', (size_t)(s->size - off))) return NULL;
  return start;
}

static kiln_status read_sections(reader *r, kiln_error *err) {
  const uint8_t *h = r->data;
  uint64_t shoff = kiln_rd_u64(h + 40);
  uint16_t shentsize = rd_u16(h + 58), shnum = rd_u16(h + 60);
  if (shnum == 0 || shentsize != sizeof(Elf64_Shdr))
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "%.64s has no usable section headers (count %u, entry size %u); pass an "
                     "unstripped-section shared library as the linker wrote it",
                     r->what, (unsigned)shnum, (unsigned)shentsize);
  uint64_t table_bytes = 0, table_end = UINT64_MAX;
  if (kiln_mul_u64(shnum, shentsize, &table_bytes) || kiln_add_u64(shoff, table_bytes, &table_end) ||
      table_end > r->size)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "%.64s is truncated: its section header table ends at byte %llu of %llu; "
                     "pass an intact shared library",
                     r->what, (unsigned long long)table_end, (unsigned long long)r->size);
  r->sections = calloc(shnum, sizeof *r->sections);
  if (!r->sections)
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY, "out of memory reading %.64s's %u section headers",
                     r->what, (unsigned)shnum);
  r->n_sections = shnum;
  for (uint32_t i = 0; i < shnum; i++) {
    const uint8_t *p = h + shoff + (uint64_t)i * shentsize;
    section *s = &r->sections[i];
    s->type = kiln_rd_u32(p + 4);
    s->offset = kiln_rd_u64(p + 24);
    s->size = kiln_rd_u64(p + 32);
    s->link = kiln_rd_u32(p + 40);
    s->info = kiln_rd_u32(p + 44);
    s->entsize = kiln_rd_u64(p + 56);
    if (s->type == SHT_NOBITS || s->type == SHT_NULL) continue;
    uint64_t end;
    if (kiln_add_u64(s->offset, s->size, &end) || end > r->size)
      return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                       "%.64s is truncated or corrupt: section %u (bytes %llu+%llu) lies outside "
                       "the %llu-byte file; pass an intact shared library",
                       r->what, (unsigned)i, (unsigned long long)s->offset,
                       (unsigned long long)s->size, (unsigned long long)r->size);
  }
  return KILN_OK;
}

static const section *find_section(const reader *r, uint32_t type, uint32_t *index) {
  for (uint32_t i = 0; i < r->n_sections; i++)
    if (r->sections[i].type == type) {
      if (index) *index = i;
      return &r->sections[i];
    }
  return NULL;
}

static kiln_status read_dynamic(const reader *r, kiln_elf *out, kiln_error *err) {
  uint32_t index;
  const section *dyn = find_section(r, SHT_DYNAMIC, &index);
  if (!dyn)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "%.64s has no dynamic section, so it is not a shared library; pass the .so "
                     "the linker produced",
                     r->what);
  if (dyn->entsize != sizeof(Elf64_Dyn) || dyn->size % sizeof(Elf64_Dyn))
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "%.64s has a corrupt dynamic section (%llu bytes, entry size %llu); pass an "
                     "intact shared library",
                     r->what, (unsigned long long)dyn->size, (unsigned long long)dyn->entsize);
  uint64_t count = dyn->size / sizeof(Elf64_Dyn);
  out->needed = calloc(count ? count : 1, sizeof *out->needed);
  if (!out->needed)
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY, "out of memory reading %.64s's dynamic section",
                     r->what);
  uint64_t init_array_size = 0;
  for (uint64_t i = 0; i < count; i++) {
    const uint8_t *p = r->data + dyn->offset + i * sizeof(Elf64_Dyn);
    uint64_t tag = kiln_rd_u64(p), val = kiln_rd_u64(p + 8);
    if (tag == DT_NULL) break;
    if (tag == DT_INIT_ARRAY) out->has_init_array = 1;
    if (tag == DT_INIT_ARRAYSZ) init_array_size = val;
    if (tag != DT_NEEDED && tag != DT_RUNPATH && tag != DT_RPATH) continue;
    const char *s = section_string(r, dyn->link, val);
    if (!s)
      return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                       "%.64s is corrupt: dynamic entry %llu (tag %llu) names a string outside "
                       "its string table; pass an intact shared library",
                       r->what, (unsigned long long)i, (unsigned long long)tag);
    if (tag == DT_NEEDED) out->needed[out->n_needed++] = s;
    else if (tag == DT_RUNPATH) out->runpath = s;
    else out->rpath = s;
  }
  if (init_array_size == 0) out->has_init_array = 0;
  return KILN_OK;
}

static kiln_status read_symbols(const reader *r, uint32_t type, kiln_elf_symbol **syms,
                                uint32_t *n_syms, uint32_t *index, kiln_error *err) {
  const section *s = find_section(r, type, index);
  if (!s) return KILN_OK;
  const char *table = type == SHT_DYNSYM ? ".dynsym" : ".symtab";
  if (s->entsize != sizeof(Elf64_Sym) || s->size % sizeof(Elf64_Sym) ||
      s->size / sizeof(Elf64_Sym) > UINT32_MAX)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "%.64s has a corrupt %.8s (%llu bytes, entry size %llu); pass an intact shared "
                     "library",
                     r->what, table, (unsigned long long)s->size, (unsigned long long)s->entsize);
  uint32_t count = (uint32_t)(s->size / sizeof(Elf64_Sym));
  *syms = calloc(count ? count : 1, sizeof **syms);
  if (!*syms)
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY, "out of memory reading %.64s's %u %.8s symbols",
                     r->what, (unsigned)count, table);
  for (uint32_t i = 0; i < count; i++) {
    const uint8_t *p = r->data + s->offset + (uint64_t)i * sizeof(Elf64_Sym);
    kiln_elf_symbol *sym = &(*syms)[i];
    sym->name = section_string(r, s->link, kiln_rd_u32(p));
    if (!sym->name)
      return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                       "%.64s is corrupt: %.8s symbol %u names a string outside its string table; "
                       "pass an intact shared library",
                       r->what, table, (unsigned)i);
    sym->bind = ELF64_ST_BIND(p[4]);
    sym->type = ELF64_ST_TYPE(p[4]);
    sym->visibility = ELF64_ST_VISIBILITY(p[5]);
    sym->defined = rd_u16(p + 6) != SHN_UNDEF;
  }
  *n_syms = count;
  return KILN_OK;
}

static kiln_status read_versym(const reader *r, uint32_t dynsym_index, kiln_elf *out,
                               kiln_error *err) {
  const section *s = find_section(r, SHT_GNU_versym, NULL);
  if (!s) return KILN_OK;
  if (s->link != dynsym_index || s->size != (uint64_t)out->n_dynsym * 2)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "%.64s is corrupt: .gnu.version has %llu entries for %u dynamic symbols; "
                     "pass an intact shared library",
                     r->what, (unsigned long long)(s->size / 2), (unsigned)out->n_dynsym);
  for (uint32_t i = 0; i < out->n_dynsym; i++)
    out->dynsym[i].version = rd_u16(r->data + s->offset + (uint64_t)i * 2) & 0x7fff;
  return KILN_OK;
}

/* .gnu.version_r: a chain of Verneed records, each with a chain of Vernaux records. Offsets
 * are relative to the record; every record must lie inside the section, and the number of
 * records is bounded by what the section can hold, so a cyclic chain cannot loop forever. */
static kiln_status read_verneed(const reader *r, kiln_elf *out, kiln_error *err) {
  const section *s = find_section(r, SHT_GNU_verneed, NULL);
  if (!s) return KILN_OK;
  uint64_t capacity = s->size / sizeof(Elf64_Vernaux);
  out->verneed = calloc(capacity ? capacity : 1, sizeof *out->verneed);
  if (!out->verneed)
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY, "out of memory reading %.64s's version needs",
                     r->what);
  uint64_t off = 0, records = 0;
  for (uint32_t n = 0; n < s->info; n++) {
    if (++records > capacity || off > s->size || s->size - off < sizeof(Elf64_Verneed)) goto corrupt;
    const uint8_t *vn = r->data + s->offset + off;
    uint16_t cnt = rd_u16(vn + 2);
    const char *file = section_string(r, s->link, kiln_rd_u32(vn + 4));
    if (!file) goto corrupt;
    uint64_t aux = off;
    if (kiln_add_u64(aux, kiln_rd_u32(vn + 8), &aux)) goto corrupt;
    for (uint16_t a = 0; a < cnt; a++) {
      if (++records > capacity || aux > s->size || s->size - aux < sizeof(Elf64_Vernaux))
        goto corrupt;
      const uint8_t *vna = r->data + s->offset + aux;
      kiln_elf_version_need *need = &out->verneed[out->n_verneed++];
      need->file = file;
      need->index = rd_u16(vna + 6) & 0x7fff;
      need->name = section_string(r, s->link, kiln_rd_u32(vna + 8));
      if (!need->name) goto corrupt;
      uint32_t next = kiln_rd_u32(vna + 12);
      if (next == 0) break;
      if (kiln_add_u64(aux, next, &aux)) goto corrupt;
    }
    uint32_t next = kiln_rd_u32(vn + 12);
    if (next == 0) break;
    if (kiln_add_u64(off, next, &off)) goto corrupt;
  }
  return KILN_OK;
corrupt:
  return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                   "%.64s is corrupt: .gnu.version_r (%llu bytes, %u entries) has a record "
                   "outside the section; pass an intact shared library",
                   r->what, (unsigned long long)s->size, (unsigned)s->info);
}

kiln_status kiln_elf_read(const uint8_t *data, size_t size, const char *what, kiln_elf *out,
                          kiln_error *err) {
  memset(out, 0, sizeof *out);
  if (size < sizeof(Elf64_Ehdr) || memcmp(data, ELFMAG, SELFMAG) != 0)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "%.64s is not an ELF file (%llu bytes, no ELF magic); pass a built shared "
                     "library (.so)",
                     what, (unsigned long long)size);
  if (data[EI_CLASS] != ELFCLASS64 || data[EI_DATA] != ELFDATA2LSB)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "%.64s is not a 64-bit little-endian ELF file (class %u, data %u); pass an "
                     "x86_64 shared library",
                     what, (unsigned)data[EI_CLASS], (unsigned)data[EI_DATA]);
  uint16_t type = rd_u16(data + 16);
  if (type != ET_DYN)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "%.64s is an ELF file of type %u, not a shared library (type 3); pass the .so "
                     "the linker produced",
                     what, (unsigned)type);
  out->machine = rd_u16(data + 18);
  reader r = {.data = data, .size = size, .what = what};
  uint32_t dynsym_index = 0;
  kiln_status st = read_sections(&r, err);
  if (st == KILN_OK) st = read_dynamic(&r, out, err);
  if (st == KILN_OK)
    st = read_symbols(&r, SHT_DYNSYM, &out->dynsym, &out->n_dynsym, &dynsym_index, err);
  if (st == KILN_OK)
    st = read_symbols(&r, SHT_SYMTAB, &out->symtab, &out->n_symtab, NULL, err);
  if (st == KILN_OK) st = read_versym(&r, dynsym_index, out, err);
  if (st == KILN_OK) st = read_verneed(&r, out, err);
  free(r.sections);
  if (st != KILN_OK) kiln_elf_release(out);
  return st;
}

void kiln_elf_release(kiln_elf *elf) {
  free(elf->needed);
  free(elf->dynsym);
  free(elf->symtab);
  free(elf->verneed);
  memset(elf, 0, sizeof *elf);
}

const kiln_elf_version_need *kiln_elf_symbol_need(const kiln_elf *elf, const kiln_elf_symbol *sym) {
  if (sym->version < 2) return NULL; /* 0 local, 1 global: no named version */
  for (uint32_t i = 0; i < elf->n_verneed; i++)
    if (elf->verneed[i].index == sym->version) return &elf->verneed[i];
  return NULL;
}
