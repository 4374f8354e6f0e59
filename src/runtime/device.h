/* Which engine a load runs on: the load options, KILN_DEVICE and the metadata's device id. */
#ifndef KILN_DEVICE_H
#define KILN_DEVICE_H

#include "kiln/kiln.h"

/* Number of CUDA devices; 0 with *reason set (a short phrase) when there are none. */
typedef int (*kiln_cuda_counter)(const char **reason);

/* The counter of this build: the CUDA runtime's, or none when built without CUDA. */
int kiln_cuda_count_devices(const char **reason);

/* The CUDA device whose memory ptr points into and the host cannot read, or -1 for memory the
 * host can read (always -1 in a build without CUDA, which cannot tell). */
int kiln_buffer_device(const void *ptr);

/* Chooses CPU or CUDA (opts->device, else KILN_DEVICE=cpu|cuda, else CUDA) and the device id
 * (opts->device_id when >= 0, else metadata_device_id), asking count_cuda only when CUDA is
 * chosen. A missing GPU or device is KILN_ERR_UNAVAILABLE with the way to the CPU engine. */
kiln_status kiln_select_device(const kiln_engine_options *opts, int32_t metadata_device_id,
                               kiln_cuda_counter count_cuda, kiln_device_kind *kind,
                               int32_t *device_id, kiln_error *err);

#endif
