/* The blob container: the writer's layout, and every header or section fault refused with its
 * exact message. */
#include "kiln/kiln.h"
#include "check.h"
#include "runtime/alloc.h"

#include <stdint.h>
#include <stdlib.h>

/* The layout from kiln.h, written independently of the library's little-endian functions. */
static void put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> 8 * i);
}
static void put64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> 8 * i);
}
static uint64_t get64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

enum { META, PLAN, WEIGHTS };

/* A 512-byte blob: metadata at 72 (16 bytes), plan at 96 (24), weights at 128 (64). */
static uint8_t blob[512];

static void make_blob(void) {
  memset(blob, 0xAB, sizeof blob);
  memcpy(blob, "KILNBLOB", 8);
  put32(blob + 8, 1);
  put32(blob + 12, 72);
  put64(blob + 16, 72), put64(blob + 24, 16);
  put64(blob + 32, 96), put64(blob + 40, 24);
  put64(blob + 48, 128), put64(blob + 56, 64);
  put64(blob + 64, sizeof blob);
}

static void set_section(int s, uint64_t offset, uint64_t size) {
  put64(blob + 16 + 16 * s, offset);
  put64(blob + 24 + 16 * s, size);
}

static void refused(kiln_status status, const char *message) {
  kiln_blob_view v;
  kiln_error err = {0, ""};
  CHECK(kiln_blob_parse(blob, sizeof blob, &v, &err) == status);
  CHECK(err.status == status);
  CHECK_STR(err.message, message);
  CHECK(v.metadata == NULL && v.plan == NULL && v.weights == NULL);
}

static void test_handmade(void) {
  kiln_blob_view v;
  kiln_error err = {0, ""};
  make_blob();
  CHECK(kiln_blob_parse(blob, sizeof blob, &v, &err) == KILN_OK);
  CHECK(v.version == 1);
  CHECK(v.metadata == blob + 72 && v.metadata_size == 16);
  CHECK(v.plan == blob + 96 && v.plan_size == 24);
  CHECK(v.weights == blob + 128 && v.weights_size == 64);

  /* Empty sections may sit anywhere in range, even inside the header or unaligned. */
  set_section(PLAN, 3, 0);
  set_section(WEIGHTS, sizeof blob, 0);
  CHECK(kiln_blob_parse(blob, sizeof blob, &v, &err) == KILN_OK);
  CHECK(v.plan_size == 0 && v.weights_size == 0 && v.weights == blob + sizeof blob);
}

static void test_header(void) {
  make_blob();
  memcpy(blob, "KILNBLOC", 8);
  refused(KILN_ERR_INVALID_PROGRAM, "blob magic is not \"KILNBLOB\": these bytes are not a Kiln "
                                    "blob; re-export the program with the Kiln backend");
  make_blob();
  put32(blob + 8, 0);
  refused(KILN_ERR_INVALID_PROGRAM,
          "blob container version 0 is invalid: the header is corrupt; re-export the program");
  put32(blob + 8, 7);
  refused(KILN_ERR_INCOMPATIBLE,
          "blob container version 7 is newer than this runtime understands (1): re-export the "
          "program with this Kiln release or upgrade the Kiln runtime");
  put32(blob + 8, 2);
  refused(KILN_ERR_INCOMPATIBLE,
          "blob container version 2 is newer than this runtime understands (1): re-export the "
          "program with this Kiln release or upgrade the Kiln runtime");
  make_blob();
  put32(blob + 12, 80);
  refused(KILN_ERR_INVALID_PROGRAM,
          "blob header size 80 is not 72: the header is corrupt; re-export the program");
  make_blob();
  put64(blob + 64, sizeof blob + 1);
  refused(KILN_ERR_INVALID_PROGRAM,
          "blob is truncated: its header says 513 bytes but only 512 were given; re-export the "
          "program or pass the whole blob");
  put64(blob + 64, sizeof blob - 1);
  refused(KILN_ERR_INVALID_PROGRAM, "blob has trailing bytes: its header says 511 bytes but 512 "
                                    "were given; pass exactly the blob's bytes");
}

static void test_sections(void) {
  make_blob();
  set_section(META, 72, sizeof blob);
  refused(KILN_ERR_INVALID_PROGRAM,
          "blob metadata section (offset 72, size 512) ends past the blob end (512 bytes): the "
          "blob is corrupt; re-export the program");
  make_blob();
  set_section(WEIGHTS, UINT64_MAX - 7, 64); /* offset + size wraps around */
  refused(KILN_ERR_INVALID_PROGRAM,
          "blob weights section (offset 18446744073709551608, size 64) ends past the blob end "
          "(512 bytes): the blob is corrupt; re-export the program");
  make_blob();
  set_section(PLAN, 96, UINT64_MAX);
  refused(KILN_ERR_INVALID_PROGRAM,
          "blob plan section (offset 96, size 18446744073709551615) ends past the blob end (512 "
          "bytes): the blob is corrupt; re-export the program");
  make_blob();
  set_section(PLAN, sizeof blob + 8, 0); /* empty, but out of range */
  refused(KILN_ERR_INVALID_PROGRAM,
          "blob plan section (offset 520, size 0) ends past the blob end (512 bytes): the blob is "
          "corrupt; re-export the program");
  make_blob();
  set_section(META, 64, 8);
  refused(KILN_ERR_INVALID_PROGRAM, "blob metadata section offset 64 lies inside the 72-byte "
                                    "header: the blob is corrupt; re-export the program");
  make_blob();
  set_section(PLAN, 100, 24);
  refused(KILN_ERR_INVALID_PROGRAM, "blob plan section offset 100 is not 8-byte aligned: the blob "
                                    "is corrupt; re-export the program");
  make_blob();
  set_section(WEIGHTS, 136, 64);
  refused(KILN_ERR_INVALID_PROGRAM, "blob weights section offset 136 is not 64-byte aligned: the "
                                    "blob is corrupt; re-export the program");
  make_blob();
  set_section(PLAN, 80, 24);
  refused(KILN_ERR_INVALID_PROGRAM,
          "blob metadata section (offset 72, size 16) overlaps the plan section (offset 80, size "
          "24): the blob is corrupt; re-export the program");
  make_blob();
  set_section(PLAN, 128, 8);
  refused(KILN_ERR_INVALID_PROGRAM,
          "blob plan section (offset 128, size 8) overlaps the weights section (offset 128, size "
          "64): the blob is corrupt; re-export the program");
  make_blob();
  set_section(META, 184, 16);
  refused(KILN_ERR_INVALID_PROGRAM,
          "blob metadata section (offset 184, size 16) overlaps the weights section (offset 128, "
          "size 64): the blob is corrupt; re-export the program");
  /* Touching sections do not overlap. */
  make_blob();
  set_section(META, 72, 24);
  set_section(PLAN, 96, 32);
  kiln_blob_view v;
  CHECK(kiln_blob_parse(blob, sizeof blob, &v, NULL) == KILN_OK);
}

static void test_truncated(void) {
  make_blob();
  kiln_blob_view v;
  kiln_error err = {0, ""};
  CHECK(kiln_blob_parse(blob, 71, &v, &err) == KILN_ERR_INVALID_PROGRAM);
  CHECK_STR(err.message, "blob is truncated: 71 bytes is shorter than the 72-byte header; "
                         "re-export the program or pass the whole blob");
  CHECK(kiln_blob_parse(blob, 0, &v, &err) == KILN_ERR_INVALID_PROGRAM);
  int every_prefix_refused = 1;
  for (size_t n = 0; n < sizeof blob; n++) {
    if (kiln_blob_parse(blob, n, &v, NULL) != KILN_ERR_INVALID_PROGRAM) every_prefix_refused = 0;
  }
  CHECK(every_prefix_refused);
  CHECK(kiln_blob_parse(NULL, 8, &v, &err) == KILN_ERR_INVALID_ARGUMENT);
  CHECK_STR(err.message, "blob pointer is NULL but its size is 8: pass the blob bytes");
  CHECK(kiln_blob_parse(blob, sizeof blob, NULL, &err) == KILN_ERR_INVALID_ARGUMENT);
  CHECK_STR(err.message, "kiln_blob_parse needs an output view: pass a kiln_blob_view to fill");
}

static void test_writer(void) {
  kiln_error err = {0, ""};
  const char meta[] = "{\"m\": 1}"; /* 8 bytes: the plan then starts at 80 */
  uint8_t plan[13], weights[100];
  for (size_t i = 0; i < sizeof plan; i++) plan[i] = (uint8_t)(i + 1);
  for (size_t i = 0; i < sizeof weights; i++) weights[i] = (uint8_t)(200 - i);
  void *out = NULL;
  size_t size = 0;
  CHECK(kiln_blob_write(meta, 8, plan, sizeof plan, weights, sizeof weights, &out, &size, &err) ==
        KILN_OK);
  const uint8_t *b = out;
  CHECK(b != NULL && size == 128 + sizeof weights);
  if (!b) return;
  CHECK(memcmp(b, "KILNBLOB", 8) == 0);
  CHECK(b[8] == 1 && b[12] == 72);
  CHECK(get64(b + 16) == 72 && get64(b + 24) == 8);
  CHECK(get64(b + 32) == 80 && get64(b + 40) == sizeof plan);
  CHECK(get64(b + 48) == 128 && get64(b + 56) == sizeof weights);
  CHECK(get64(b + 64) == size);
  int padding_zero = 1;
  for (size_t i = 80 + sizeof plan; i < 128; i++) padding_zero &= b[i] == 0;
  CHECK(padding_zero);
  kiln_blob_view v;
  CHECK(kiln_blob_parse(b, size, &v, &err) == KILN_OK);
  CHECK(v.metadata_size == 8 && memcmp(v.metadata, meta, 8) == 0);
  CHECK(v.plan_size == sizeof plan && memcmp(v.plan, plan, sizeof plan) == 0);
  CHECK(v.weights_size == sizeof weights && memcmp(v.weights, weights, sizeof weights) == 0);
  kiln_free(out);

  /* An unaligned metadata size moves the plan to the next multiple of 8. */
  CHECK(kiln_blob_write(meta, 5, plan, sizeof plan, NULL, 0, &out, &size, &err) == KILN_OK);
  b = out;
  CHECK(b && get64(b + 32) == 80 && get64(b + 48) == 128 && get64(b + 56) == 0 && size == 128);
  CHECK(kiln_blob_parse(out, size, &v, &err) == KILN_OK);
  kiln_free(out);

  CHECK(kiln_blob_write(NULL, 0, NULL, 0, NULL, 0, &out, &size, &err) == KILN_OK);
  CHECK(size == 128 && kiln_blob_parse(out, size, &v, &err) == KILN_OK);
  kiln_free(out);

  CHECK(kiln_blob_write(meta, 8, NULL, 4, NULL, 0, &out, &size, &err) == KILN_ERR_INVALID_ARGUMENT);
  CHECK_STR(err.message, "blob plan section pointer is NULL but its size is 4: pass the bytes");
  CHECK(out == NULL && size == 0);
  CHECK(kiln_blob_write(meta, 8, plan, SIZE_MAX - 8, NULL, 0, &out, &size, &err) ==
        KILN_ERR_INVALID_ARGUMENT);
  CHECK_STR(err.message, "blob sections are too large to address: plan ends past the size limit");
  CHECK(kiln_blob_write(meta, 8, plan, 1, weights, SIZE_MAX - 100, &out, &size, &err) ==
        KILN_ERR_INVALID_ARGUMENT);
  CHECK_STR(err.message, "blob sections are too large to address: weights ends past the size limit");
  CHECK(kiln_blob_write(meta, 8, NULL, 0, NULL, 0, NULL, &size, &err) == KILN_ERR_INVALID_ARGUMENT);
  CHECK_STR(err.message, "kiln_blob_write needs out and out_size: pass where to store the blob");
}

/* Failing the n-th allocation of the writer, for every n: out of memory with a message and
 * nothing written, until n passes the writer's allocations and it succeeds. */
static void test_writer_allocation_failures(void) {
  const char meta[] = "{\"m\": 1}";
  uint8_t plan[16] = {1}, weights[64] = {2};
  int failures = 0, n;
  for (n = 1; n < 50; n++) {
    kiln_error err = {0, ""};
    void *out = NULL;
    size_t size = 0;
    kiln_test_fail_allocations = n;
    kiln_status s = kiln_blob_write(meta, 8, plan, sizeof plan, weights, sizeof weights, &out,
                                    &size, &err);
    if (kiln_test_fail_allocations > 0) { /* the n-th allocation never came */
      kiln_test_fail_allocations = 0;
      CHECK(s == KILN_OK && out != NULL);
      kiln_free(out);
      break;
    }
    CHECK(s == KILN_ERR_OUT_OF_MEMORY && out == NULL);
    CHECK_STR(err.message, "out of host memory writing a 192-byte blob: free memory and retry");
    failures++;
  }
  kiln_test_fail_allocations = 0;
  CHECK(failures == 1 && n == 2);
}

int main(void) {
  test_handmade();
  test_header();
  test_sections();
  test_truncated();
  test_writer();
  test_writer_allocation_failures();
  return check_report("test_blob");
}
