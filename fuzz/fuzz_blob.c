/* libFuzzer target: arbitrary bytes as a blob, through container, metadata and plan parsing. */
#include "fuzz_chain.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_blob_chain(data, size);
  return 0;
}
