/* The parse chain a loaded blob goes through, shared by the fuzz targets. */
#ifndef KILN_FUZZ_CHAIN_H
#define KILN_FUZZ_CHAIN_H

#include "kiln/kiln.h"

/* Metadata the reader accepts must write and read back to the same metadata (else traps). */
void fuzz_metadata_round_trip(const char *json, size_t len);
/* Container, then metadata (with the round trip), then the plan against the weights size. */
void fuzz_blob_chain(const uint8_t *data, size_t size);

#endif
