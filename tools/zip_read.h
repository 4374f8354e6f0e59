/* zip_read.h - reads members of an untrusted zip archive (a wheel) held in memory. */
#ifndef KILN_TOOLS_ZIP_READ_H
#define KILN_TOOLS_ZIP_READ_H

#include "kiln/kiln.h"

#include <stddef.h>
#include <stdint.h>

typedef struct kiln_zip_entry {
  char *name; /* NUL-terminated copy; directories end in '/' */
  uint16_t method; /* 0 stored, 8 deflated */
  uint32_t crc32;
  uint64_t compressed_size;
  uint64_t size;
  uint64_t data_offset; /* where the member's bytes start, checked against the archive */
} kiln_zip_entry;

typedef struct kiln_zip {
  const uint8_t *data;
  size_t size;
  const char *what; /* the archive's name in messages */
  kiln_zip_entry *entries;
  uint32_t n_entries;
} kiln_zip;

/* Parses the central directory and every local header; refuses zip64, encryption,
 * multi-disk archives, unsafe or duplicate names and anything out of bounds. */
kiln_status kiln_zip_open(const uint8_t *data, size_t size, const char *what, kiln_zip *out,
                          kiln_error *err);
void kiln_zip_release(kiln_zip *zip);

const kiln_zip_entry *kiln_zip_find(const kiln_zip *zip, const char *name);
/* Inflates one member into a malloc'd buffer with a NUL after its size bytes (free it),
 * checking its size and CRC-32. */
kiln_status kiln_zip_extract(const kiln_zip *zip, const kiln_zip_entry *entry, uint8_t **out,
                             size_t *out_size, kiln_error *err);

#endif
