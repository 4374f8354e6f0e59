/* The parse chain a loaded blob goes through: container, metadata, plan. */
#include "fuzz_chain.h"

#include <string.h>

static kiln_metadata parsed, reparsed; /* large: keep them off the stack */

void fuzz_metadata_round_trip(const char *json, size_t len) {
  if (kiln_metadata_parse(json, len, &parsed, NULL) != KILN_OK) return;
  char *text = NULL;
  size_t text_len = 0;
  if (kiln_metadata_write(&parsed, &text, &text_len, NULL) != KILN_OK) __builtin_trap();
  if (kiln_metadata_parse(text, text_len, &reparsed, NULL) != KILN_OK) __builtin_trap();
  if (memcmp(&parsed, &reparsed, sizeof parsed) != 0) __builtin_trap();
  kiln_free(text);
}

void fuzz_blob_chain(const uint8_t *data, size_t size) {
  kiln_blob_view v;
  if (kiln_blob_parse(data, size, &v, NULL) != KILN_OK) return;
  fuzz_metadata_round_trip((const char *)v.metadata, v.metadata_size);
  kiln_plan plan;
  if (kiln_plan_parse(v.plan, v.plan_size, v.weights_size, &plan, NULL) == KILN_OK)
    kiln_plan_release(&plan);
}
