/* The blob container: a fixed little-endian header and three sections (metadata, plan,
 * weights), read from untrusted bytes and written by the builder. */
#include "kiln/kiln.h"
#include "runtime/alloc.h"
#include "runtime/internal.h"

#include <stdlib.h>
#include <string.h>

enum { SECTION_METADATA, SECTION_PLAN, SECTION_WEIGHTS, SECTION_COUNT };

static const char *const section_names[SECTION_COUNT] = {"metadata", "plan", "weights"};
static const uint64_t section_align[SECTION_COUNT] = {1, 8, KILN_WEIGHTS_ALIGN};

typedef struct section {
  uint64_t offset;
  uint64_t size;
} section;

static kiln_status check_section(int s, const section *sec, uint64_t total, kiln_error *err) {
  const char *name = section_names[s];
  uint64_t end;
  if (kiln_add_u64(sec->offset, sec->size, &end) != 0 || end > total)
    return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                     "blob %.8s section (offset %llu, size %llu) ends past the blob end (%llu "
                     "bytes): the blob is corrupt; re-export the program",
                     name, (unsigned long long)sec->offset, (unsigned long long)sec->size,
                     (unsigned long long)total);
  if (sec->size == 0) return KILN_OK; /* an empty section has nothing to misplace */
  if (sec->offset < KILN_BLOB_HEADER_SIZE)
    return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                     "blob %.8s section offset %llu lies inside the %u-byte header: the blob is "
                     "corrupt; re-export the program",
                     name, (unsigned long long)sec->offset, (unsigned)KILN_BLOB_HEADER_SIZE);
  if (sec->offset % section_align[s] != 0)
    return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                     "blob %.8s section offset %llu is not %llu-byte aligned: the blob is "
                     "corrupt; re-export the program",
                     name, (unsigned long long)sec->offset, (unsigned long long)section_align[s]);
  return KILN_OK;
}

static int sections_overlap(const section *a, const section *b) {
  if (a->size == 0 || b->size == 0) return 0;
  /* Both ends were checked against the blob size, so the sums cannot overflow. */
  return a->offset < b->offset + b->size && b->offset < a->offset + a->size;
}

kiln_status kiln_blob_parse(const void *data, size_t size, kiln_blob_view *out, kiln_error *err) {
  if (!out)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "kiln_blob_parse needs an output view: pass a kiln_blob_view to fill");
  memset(out, 0, sizeof *out);
  if (!data && size != 0)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "blob pointer is NULL but its size is %llu: pass the blob bytes",
                     (unsigned long long)size);
  const uint8_t *p = data;
  if (size < KILN_BLOB_HEADER_SIZE)
    return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                     "blob is truncated: %llu bytes is shorter than the %u-byte header; "
                     "re-export the program or pass the whole blob",
                     (unsigned long long)size, (unsigned)KILN_BLOB_HEADER_SIZE);
  if (memcmp(p, KILN_BLOB_MAGIC, 8) != 0)
    return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                     "blob magic is not \"KILNBLOB\": these bytes are not a Kiln blob; "
                     "re-export the program with the Kiln backend");
  uint32_t version = kiln_rd_u32(p + 8);
  if (version == 0)
    return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                     "blob container version 0 is invalid: the header is corrupt; re-export the "
                     "program");
  if (version > KILN_CONTAINER_VERSION)
    return kiln_fail(err, KILN_ERR_INCOMPATIBLE,
                     "blob container version %u is newer than this runtime understands (%u): "
                     "re-export the program with this Kiln release or upgrade the Kiln runtime",
                     (unsigned)version, (unsigned)KILN_CONTAINER_VERSION);
  uint32_t header_size = kiln_rd_u32(p + 12);
  if (header_size != KILN_BLOB_HEADER_SIZE)
    return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                     "blob header size %u is not %u: the header is corrupt; re-export the program",
                     (unsigned)header_size, (unsigned)KILN_BLOB_HEADER_SIZE);
  uint64_t total = kiln_rd_u64(p + 64);
  if (total > size)
    return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                     "blob is truncated: its header says %llu bytes but only %llu were given; "
                     "re-export the program or pass the whole blob",
                     (unsigned long long)total, (unsigned long long)size);
  if (total < size)
    return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                     "blob has trailing bytes: its header says %llu bytes but %llu were given; "
                     "pass exactly the blob's bytes",
                     (unsigned long long)total, (unsigned long long)size);

  section sec[SECTION_COUNT];
  for (int s = 0; s < SECTION_COUNT; s++) {
    sec[s].offset = kiln_rd_u64(p + 16 + 16 * s);
    sec[s].size = kiln_rd_u64(p + 24 + 16 * s);
    kiln_status st = check_section(s, &sec[s], total, err);
    if (st != KILN_OK) return st;
  }
  for (int a = 0; a < SECTION_COUNT; a++) {
    for (int b = a + 1; b < SECTION_COUNT; b++) {
      if (sections_overlap(&sec[a], &sec[b]))
        return kiln_fail(err, KILN_ERR_INVALID_PROGRAM,
                         "blob %.8s section (offset %llu, size %llu) overlaps the %.8s section "
                         "(offset %llu, size %llu): the blob is corrupt; re-export the program",
                         section_names[a], (unsigned long long)sec[a].offset,
                         (unsigned long long)sec[a].size, section_names[b],
                         (unsigned long long)sec[b].offset, (unsigned long long)sec[b].size);
    }
  }

  out->version = version;
  out->metadata = p + sec[SECTION_METADATA].offset;
  out->metadata_size = (size_t)sec[SECTION_METADATA].size;
  out->plan = p + sec[SECTION_PLAN].offset;
  out->plan_size = (size_t)sec[SECTION_PLAN].size;
  out->weights = p + sec[SECTION_WEIGHTS].offset;
  out->weights_size = (size_t)sec[SECTION_WEIGHTS].size;
  return KILN_OK;
}

static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

kiln_status kiln_blob_write(const void *metadata, size_t metadata_size, const void *plan,
                            size_t plan_size, const void *weights, size_t weights_size, void **out,
                            size_t *out_size, kiln_error *err) {
  if (!out || !out_size)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "kiln_blob_write needs out and out_size: pass where to store the blob");
  *out = NULL;
  *out_size = 0;
  const void *src[SECTION_COUNT] = {metadata, plan, weights};
  const uint64_t sizes[SECTION_COUNT] = {metadata_size, plan_size, weights_size};
  section sec[SECTION_COUNT];
  uint64_t cursor = KILN_BLOB_HEADER_SIZE;
  for (int s = 0; s < SECTION_COUNT; s++) {
    if (!src[s] && sizes[s] != 0)
      return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                       "blob %.8s section pointer is NULL but its size is %llu: pass the bytes",
                       section_names[s], (unsigned long long)sizes[s]);
    /* Every size fits in size_t, so the cursor stays far below 2^64 before each add. */
    sec[s].offset = align_up(cursor, section_align[s]);
    sec[s].size = sizes[s];
    if (kiln_add_u64(sec[s].offset, sec[s].size, &cursor) != 0 || cursor > SIZE_MAX)
      return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                       "blob sections are too large to address: %.8s ends past the size limit",
                       section_names[s]);
  }
  uint8_t *blob = kiln_calloc(1, (size_t)cursor); /* zero-filled padding */
  if (!blob)
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "out of host memory writing a %llu-byte blob: free memory and retry",
                     (unsigned long long)cursor);
  memcpy(blob, KILN_BLOB_MAGIC, 8);
  kiln_wr_u32(blob + 8, KILN_CONTAINER_VERSION);
  kiln_wr_u32(blob + 12, KILN_BLOB_HEADER_SIZE);
  for (int s = 0; s < SECTION_COUNT; s++) {
    kiln_wr_u64(blob + 16 + 16 * s, sec[s].offset);
    kiln_wr_u64(blob + 24 + 16 * s, sec[s].size);
    if (sec[s].size) memcpy(blob + sec[s].offset, src[s], (size_t)sec[s].size);
  }
  kiln_wr_u64(blob + 64, cursor);
  *out = blob;
  *out_size = (size_t)cursor;
  return KILN_OK;
}
