/* libFuzzer target: arbitrary bytes as metadata JSON; accepted documents must round-trip. */
#include "fuzz_chain.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_metadata_round_trip((const char *)data, size);
  return 0;
}
