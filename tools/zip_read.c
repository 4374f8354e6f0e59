/* A strict reader of zip archives for auditing wheels: the end record, the central
 * directory and each local header are bounds-checked; members are inflated with zlib and
 * checked against their recorded size and CRC-32. */
#include "zip_read.h"

#include "runtime/internal.h"

#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define EOCD_SIG 0x06054b50u
#define CENTRAL_SIG 0x02014b50u
#define LOCAL_SIG 0x04034b50u
#define EOCD_SIZE 22u
#define CENTRAL_SIZE 46u
#define LOCAL_SIZE 30u
/* No member of a Kiln wheel comes near this; a larger claim is refused before allocating. */
#define MAX_MEMBER_SIZE (1ull << 30)

static uint16_t rd_u16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

/* The end record sits in the last 22 + 65535 bytes, and its comment must end the file. */
static int find_end_record(const uint8_t *data, size_t size, size_t *at) {
  if (size < EOCD_SIZE) return -1;
  size_t lowest = size - EOCD_SIZE > 0xffff ? size - EOCD_SIZE - 0xffff : 0;
  for (size_t i = size - EOCD_SIZE + 1; i-- > lowest;) {
    if (kiln_rd_u32(data + i) == EOCD_SIG && i + EOCD_SIZE + rd_u16(data + i + 20) == size) {
      *at = i;
      return 0;
    }
  }
  return -1;
}

static int name_is_safe(const char *name, size_t len) {
  if (len == 0 || name[0] == '/' || memchr(name, '\\', len) || memchr(name, '\0', len)) return 0;
  const char *part = name, *end = name + len;
  while (part < end) {
    const char *slash = memchr(part, '/', (size_t)(end - part));
    size_t n = slash ? (size_t)(slash - part) : (size_t)(end - part);
    if ((n == 1 && part[0] == '.') || (n == 2 && part[0] == '.' && part[1] == '.')) return 0;
    if (n == 0 && slash && slash + 1 != end) return 0; /* "a//b" */
    part += n + 1;
  }
  return 1;
}

static int compare_names(const void *a, const void *b) {
  return strcmp((*(const kiln_zip_entry *const *)a)->name, (*(const kiln_zip_entry *const *)b)->name);
}

static kiln_status check_duplicates(const kiln_zip *zip, kiln_error *err) {
  if (zip->n_entries < 2) return KILN_OK;
  const kiln_zip_entry **sorted = malloc(zip->n_entries * sizeof *sorted);
  if (!sorted)
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY, "out of memory indexing %.64s's %u members",
                     zip->what, (unsigned)zip->n_entries);
  for (uint32_t i = 0; i < zip->n_entries; i++) sorted[i] = &zip->entries[i];
  qsort(sorted, zip->n_entries, sizeof *sorted, compare_names);
  kiln_status st = KILN_OK;
  for (uint32_t i = 1; i < zip->n_entries && st == KILN_OK; i++)
    if (strcmp(sorted[i - 1]->name, sorted[i]->name) == 0)
      st = kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "%.64s holds two members named '%.96s', so what installs is ambiguous; "
                     "rebuild the archive",
                     zip->what, sorted[i]->name);
  free(sorted);
  return st;
}

static kiln_status read_entry(kiln_zip *zip, uint64_t *pos, uint64_t cd_end, uint32_t index,
                              kiln_error *err) {
  const uint8_t *d = zip->data;
  kiln_zip_entry *e = &zip->entries[index];
  if (cd_end - *pos < CENTRAL_SIZE || kiln_rd_u32(d + *pos) != CENTRAL_SIG)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "%.64s is corrupt: central directory entry %u is truncated or has no "
                     "signature; rebuild the archive",
                     zip->what, (unsigned)index);
  const uint8_t *c = d + *pos;
  uint16_t flags = rd_u16(c + 8), name_len = rd_u16(c + 28);
  uint64_t record = (uint64_t)CENTRAL_SIZE + name_len + rd_u16(c + 30) + rd_u16(c + 32);
  if (cd_end - *pos < record)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "%.64s is corrupt: central directory entry %u runs past the directory; "
                     "rebuild the archive",
                     zip->what, (unsigned)index);
  e->method = rd_u16(c + 10);
  e->crc32 = kiln_rd_u32(c + 16);
  e->compressed_size = kiln_rd_u32(c + 20);
  e->size = kiln_rd_u32(c + 24);
  uint64_t local = kiln_rd_u32(c + 42);
  e->name = malloc((size_t)name_len + 1);
  if (!e->name)
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY, "out of memory reading %.64s's member names",
                     zip->what);
  memcpy(e->name, c + CENTRAL_SIZE, name_len);
  e->name[name_len] = '\0';
  *pos += record;
  if (!name_is_safe((const char *)c + CENTRAL_SIZE, name_len))
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "%.56s has member %u with an unsafe name ('%.80s': empty, absolute, '..' or "
                     "backslash); rebuild the archive",
                     zip->what, (unsigned)index, e->name);
  if (flags & 1u)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "%.64s: member '%.96s' is encrypted, which a wheel never is; rebuild the "
                     "archive",
                     zip->what, e->name);
  if (e->method != 0 && e->method != 8)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "%.64s: member '%.96s' uses compression method %u; write it stored (0) or "
                     "deflated (8)",
                     zip->what, e->name, (unsigned)e->method);
  if (e->compressed_size == 0xffffffffu || e->size == 0xffffffffu || local == 0xffffffffu)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "%.64s: member '%.96s' needs zip64 fields, which the audit does not read; "
                     "keep wheel members under 4 GiB",
                     zip->what, e->name);
  uint64_t data_start, data_end;
  if (local > zip->size || zip->size - local < LOCAL_SIZE || kiln_rd_u32(d + local) != LOCAL_SIG ||
      kiln_add_u64(local, (uint64_t)LOCAL_SIZE + rd_u16(d + local + 26) + rd_u16(d + local + 28),
                   &data_start) ||
      kiln_add_u64(data_start, e->compressed_size, &data_end) || data_end > zip->size ||
      rd_u16(d + local + 26) != name_len || memcmp(d + local + LOCAL_SIZE, e->name, name_len) != 0)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "%.56s is corrupt: the local header or data of member '%.80s' is missing, "
                     "mismatched or outside the file; rebuild the archive",
                     zip->what, e->name);
  e->data_offset = data_start;
  return KILN_OK;
}

kiln_status kiln_zip_open(const uint8_t *data, size_t size, const char *what, kiln_zip *out,
                          kiln_error *err) {
  memset(out, 0, sizeof *out);
  out->data = data;
  out->size = size;
  out->what = what;
  size_t eocd;
  if (find_end_record(data, size, &eocd) != 0)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "%.64s is not a zip archive (no end-of-central-directory record in its %llu "
                     "bytes); pass a wheel (.whl) file",
                     what, (unsigned long long)size);
  const uint8_t *e = data + eocd;
  uint16_t entries = rd_u16(e + 10);
  uint64_t cd_size = kiln_rd_u32(e + 12), cd_offset = kiln_rd_u32(e + 16), cd_end;
  if (rd_u16(e + 4) != 0 || rd_u16(e + 6) != 0 || rd_u16(e + 8) != entries)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "%.64s is a multi-disk zip archive, which a wheel never is; rebuild it as one "
                     "file",
                     what);
  if (entries == 0xffff || cd_size == 0xffffffffu || cd_offset == 0xffffffffu)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "%.64s is a zip64 archive, which the audit does not read; a Kiln wheel is "
                     "small enough for a plain zip",
                     what);
  if (kiln_add_u64(cd_offset, cd_size, &cd_end) || cd_end > eocd)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "%.64s is truncated or corrupt: its central directory (%llu bytes at %llu) "
                     "lies outside the file; rebuild the archive",
                     what, (unsigned long long)cd_size, (unsigned long long)cd_offset);
  out->entries = calloc(entries ? entries : 1, sizeof *out->entries);
  if (!out->entries)
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY, "out of memory reading %.64s's %u members", what,
                     (unsigned)entries);
  uint64_t pos = cd_offset;
  kiln_status st = KILN_OK;
  for (uint32_t i = 0; i < entries && st == KILN_OK; i++) {
    out->n_entries = i + 1; /* so a failure releases the names read so far */
    st = read_entry(out, &pos, cd_end, i, err);
  }
  if (st == KILN_OK) st = check_duplicates(out, err);
  if (st != KILN_OK) kiln_zip_release(out);
  return st;
}

void kiln_zip_release(kiln_zip *zip) {
  for (uint32_t i = 0; i < zip->n_entries; i++) free(zip->entries[i].name);
  free(zip->entries);
  zip->entries = NULL;
  zip->n_entries = 0;
}

const kiln_zip_entry *kiln_zip_find(const kiln_zip *zip, const char *name) {
  for (uint32_t i = 0; i < zip->n_entries; i++)
    if (strcmp(zip->entries[i].name, name) == 0) return &zip->entries[i];
  return NULL;
}

static kiln_status inflate_member(const kiln_zip *zip, const kiln_zip_entry *entry, uint8_t *buf,
                                  kiln_error *err) {
  z_stream zs;
  memset(&zs, 0, sizeof zs);
  if (inflateInit2(&zs, -MAX_WBITS) != Z_OK)
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY, "zlib could not start inflating '%.96s' of %.64s",
                     entry->name, zip->what);
  zs.next_in = (Bytef *)(zip->data + entry->data_offset);
  zs.avail_in = (uInt)entry->compressed_size;
  zs.next_out = buf;
  zs.avail_out = (uInt)entry->size;
  int rc = inflate(&zs, Z_FINISH);
  uint64_t produced = zs.total_out;
  inflateEnd(&zs);
  if (rc != Z_STREAM_END || produced != entry->size)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "%.56s is corrupt: member '%.80s' does not inflate to its recorded %llu bytes "
                     "(zlib %d); rebuild it",
                     zip->what, entry->name, (unsigned long long)entry->size, rc);
  return KILN_OK;
}

kiln_status kiln_zip_extract(const kiln_zip *zip, const kiln_zip_entry *entry, uint8_t **out,
                             size_t *out_size, kiln_error *err) {
  *out = NULL;
  *out_size = 0;
  if (entry->size > MAX_MEMBER_SIZE || (entry->method == 0 && entry->compressed_size != entry->size))
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "%.56s: member '%.80s' claims %llu bytes (stored as %llu): too many or "
                     "inconsistent; rebuild it",
                     zip->what, entry->name, (unsigned long long)entry->size,
                     (unsigned long long)entry->compressed_size);
  uint8_t *buf = malloc((size_t)entry->size + 1);
  if (!buf)
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY, "out of memory extracting '%.96s' (%llu bytes)",
                     entry->name, (unsigned long long)entry->size);
  kiln_status st = KILN_OK;
  if (entry->method == 0) memcpy(buf, zip->data + entry->data_offset, (size_t)entry->size);
  else st = inflate_member(zip, entry, buf, err);
  if (st == KILN_OK && crc32(crc32(0L, Z_NULL, 0), buf, (uInt)entry->size) != entry->crc32)
    st = kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                   "%.64s is corrupt: member '%.96s' fails its CRC-32 check; rebuild the archive",
                   zip->what, entry->name);
  if (st != KILN_OK) {
    free(buf);
    return st;
  }
  buf[entry->size] = '\0';
  *out = buf;
  *out_size = (size_t)entry->size;
  return KILN_OK;
}
