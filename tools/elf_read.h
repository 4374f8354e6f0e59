/* elf_read.h - reads the dynamic-linking facts of an untrusted ELF64 shared object. */
#ifndef KILN_TOOLS_ELF_READ_H
#define KILN_TOOLS_ELF_READ_H

#include "kiln/kiln.h"

#include <stddef.h>
#include <stdint.h>

typedef struct kiln_elf_symbol {
  const char *name; /* points into the file's bytes, NUL-terminated inside its string table */
  uint8_t bind;     /* STB_* */
  uint8_t type;     /* STT_* */
  uint8_t visibility; /* STV_* */
  int defined;      /* st_shndx != SHN_UNDEF */
  uint16_t version; /* .gnu.version index (hidden bit cleared); 0 when absent */
} kiln_elf_symbol;

/* One version a library needs from another (.gnu.version_r): GLIBC_2.34 from libc.so.6. */
typedef struct kiln_elf_version_need {
  const char *file;
  const char *name;
  uint16_t index; /* what .gnu.version entries use to point here */
} kiln_elf_version_need;

typedef struct kiln_elf {
  uint16_t machine; /* EM_* */
  const char **needed; /* DT_NEEDED, in order */
  uint32_t n_needed;
  const char *runpath; /* DT_RUNPATH, or NULL */
  const char *rpath;   /* DT_RPATH, or NULL */
  int has_init_array;  /* DT_INIT_ARRAY with a non-zero DT_INIT_ARRAYSZ */
  kiln_elf_symbol *dynsym;
  uint32_t n_dynsym;
  kiln_elf_symbol *symtab; /* empty when the file is stripped */
  uint32_t n_symtab;
  kiln_elf_version_need *verneed;
  uint32_t n_verneed;
} kiln_elf;

/* Checks every offset, size, count and string of data (which must outlive out) and fills
 * out; refusals name the section or field at fault. what names the file in messages. */
kiln_status kiln_elf_read(const uint8_t *data, size_t size, const char *what, kiln_elf *out,
                          kiln_error *err);
void kiln_elf_release(kiln_elf *elf);

/* The versioned need a symbol points at, or NULL. */
const kiln_elf_version_need *kiln_elf_symbol_need(const kiln_elf *elf, const kiln_elf_symbol *sym);

#endif
