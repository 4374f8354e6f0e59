/* libFuzzer target: arbitrary bytes as an ExecuTorch program. Every payload the reader returns
 * is read in full (so the sanitizer sees any out-of-bounds claim) and Kiln blobs are parsed. */
#include "fuzz_chain.h"
#include "pte_reader.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static kiln_status visit(const kiln_pte_delegate *d, void *ctx, kiln_error *err) {
  uint8_t sum = 0;
  for (uint64_t i = 0; i < d->size; i++) sum ^= d->data[i];
  *(volatile uint8_t *)ctx = sum;
  if (strcmp(d->id, KILN_BACKEND_ID) == 0) fuzz_blob_chain(d->data, (size_t)d->size);
  return KILN_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  kiln_pte_info info;
  volatile uint8_t sink = 0;
  kiln_pte_read(data, size, &info, visit, (void *)&sink, NULL);
  return 0;
}
