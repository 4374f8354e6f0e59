/* elf_audit.h - Kiln's packaging rules for a built shared library, and the manylinux table. */
#ifndef KILN_TOOLS_ELF_AUDIT_H
#define KILN_TOOLS_ELF_AUDIT_H

#include "elf_read.h"

#include <stdio.h>

/* Collects refusals: each is one line of at most 255 bytes, cause first, then the remedy. */
typedef struct kiln_audit_report {
  FILE *out;
  unsigned n_problems;
  kiln_error err; /* the message being reported: kiln_audit_refuse(r, kiln_fail(&r->err, ...)) */
} kiln_audit_report;

void kiln_audit_refuse(kiln_audit_report *r, kiln_status status);

/* A manylinux platform tag with the newest symbol versions its policy allows (x86_64). */
typedef struct kiln_platform {
  const char *tag; /* "manylinux_2_28_x86_64" */
  uint32_t glibc[3];
  uint32_t glibcxx[3];
  uint32_t cxxabi[3];
} kiln_platform;

/* The supported tag spelled exactly by tag[0..len), or NULL. */
const kiln_platform *kiln_platform_find(const char *tag, size_t len);
/* The lowest supported tag whose policy allows every symbol version elf needs, or NULL. */
const kiln_platform *kiln_platform_lowest(const kiln_elf *elf);

typedef struct kiln_library_rules {
  const char *name;              /* the library's file name, as messages show it */
  const kiln_platform *platform; /* NULL: some supported tag must allow the library */
  const char *const *exports;    /* symbols that must be defined and default-visible */
  uint32_t n_exports;
} kiln_library_rules;

/* Reports every way elf breaks the packaging rules. */
void kiln_audit_library(const kiln_elf *elf, const kiln_library_rules *rules,
                        kiln_audit_report *r);

#endif
