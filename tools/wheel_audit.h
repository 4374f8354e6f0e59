/* wheel_audit.h - Kiln's packaging rules for a built wheel (kiln or kiln-runtime). */
#ifndef KILN_TOOLS_WHEEL_AUDIT_H
#define KILN_TOOLS_WHEEL_AUDIT_H

#include "elf_audit.h"

/* Audits the wheel in data[0..size), whose file name is file_name (its tags are read from
 * it): the tag, the dist-info files, the requirements, and every bundled library against
 * the wheel's own platform tag, including where its RUNPATH entries land once installed.
 * exports applies to every bundled library. Returns the number of problems reported. */
unsigned kiln_audit_wheel(const char *file_name, const uint8_t *data, size_t size,
                          const char *const *exports, uint32_t n_exports, kiln_audit_report *r);

#endif
