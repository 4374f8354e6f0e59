/* Finds the delegate payloads inside an ExecuTorch program (.pte): a FlatBuffers file with
 * identifier "ET12", optionally followed by data segments. Every offset, vtable and vector is
 * checked against the file size, so any bytes are safe to read. */
#ifndef KILN_TOOLS_PTE_READER_H
#define KILN_TOOLS_PTE_READER_H

#include "kiln/kiln.h"

enum { KILN_PTE_INLINE = 0, KILN_PTE_SEGMENT = 1 };

typedef struct kiln_pte_info {
  uint32_t schema_version;   /* Program.version */
  int has_extended_header;   /* "eh00" at byte 8 */
  uint64_t program_size;     /* bytes of the FlatBuffers part (the whole file without a header) */
  uint64_t segment_base;     /* file offset that segment offsets are relative to */
  uint32_t n_plans;          /* execution plans (methods) */
  uint32_t n_segments;
  uint32_t n_inline;         /* entries of Program.backend_delegate_data */
  uint32_t n_kernel_calls;   /* instructions running an operator on ExecuTorch's kernels */
  uint32_t n_delegate_calls; /* instructions calling a delegate */
} kiln_pte_info;

typedef struct kiln_pte_delegate {
  uint32_t plan;          /* index of the execution plan holding the delegate */
  const char *plan_name;  /* NUL-terminated ("" when absent) */
  uint32_t index;         /* index among that plan's delegates */
  const char *id;         /* backend id, NUL-terminated, e.g. "XnnpackBackend" */
  uint32_t location;      /* KILN_PTE_INLINE or KILN_PTE_SEGMENT */
  uint32_t data_index;    /* index into the inline data or the segments */
  const uint8_t *data;    /* the payload the backend's init receives */
  uint64_t size;
  uint32_t n_compile_specs;
} kiln_pte_delegate;

/* Called for each delegate in file order; a non-OK status stops the walk and is returned. */
typedef kiln_status (*kiln_pte_visit)(const kiln_pte_delegate *d, void *ctx, kiln_error *err);

/* Checks the file and calls visit (may be NULL) for every delegate of every plan. */
kiln_status kiln_pte_read(const uint8_t *file, size_t size, kiln_pte_info *info,
                          kiln_pte_visit visit, void *ctx, kiln_error *err);

#endif
