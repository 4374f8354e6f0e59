/* Device selection for kiln_engine_load. */
#include "runtime/device.h"

#include "runtime/engine_internal.h"

#include <stdlib.h>
#include <string.h>

int kiln_cuda_count_devices(const char **reason) {
#ifdef KILN_WITH_CUDA
  kiln_error ignored;
  int count = kiln_cuda_device_count(&ignored);
  if (count > 0) return count;
  *reason = "the CUDA runtime reports no device";
#else
  *reason = "this library was built without CUDA";
#endif
  return 0;
}

int kiln_buffer_device(const void *ptr) {
#ifdef KILN_WITH_CUDA
  return kiln_cuda_buffer_device(ptr);
#else
  (void)ptr;
  return -1;
#endif
}

/* The device kind KILN_DEVICE asks for; AUTO (refused) when it names neither. */
static kiln_status kind_from_env(kiln_device_kind *kind, kiln_error *err) {
  const char *env = getenv("KILN_DEVICE");
  char shown[33];
  size_t n = 0;
  if (!env || strcmp(env, "cuda") == 0) {
    *kind = KILN_DEVICE_CUDA;
    return KILN_OK;
  }
  if (strcmp(env, "cpu") == 0) {
    *kind = KILN_DEVICE_CPU;
    return KILN_OK;
  }
  for (; env[n] && n < sizeof shown - 1; n++)
    shown[n] = (unsigned char)env[n] < 0x20 || env[n] == 0x7f ? '?' : env[n];
  shown[n] = '\0';
  return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                   "KILN_DEVICE=\"%.32s\" names no device: set it to cpu or cuda, or unset it to "
                   "use the GPU",
                   shown);
}

kiln_status kiln_select_device(const kiln_engine_options *opts, int32_t metadata_device_id,
                               kiln_cuda_counter count_cuda, kiln_device_kind *kind,
                               int32_t *device_id, kiln_error *err) {
  const char *reason = "";
  int count;
  kiln_status s;
  if (opts->device != KILN_DEVICE_AUTO && opts->device != KILN_DEVICE_CPU &&
      opts->device != KILN_DEVICE_CUDA)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "load option device %d is not AUTO (0), CPU (1) or CUDA (2); pass one of them",
                     (int)opts->device);
  if (opts->device_id < -1)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "load option device_id %d is below -1; pass -1 for the program's device or a "
                     "device number",
                     (int)opts->device_id);
  *kind = opts->device;
  if (*kind == KILN_DEVICE_AUTO && (s = kind_from_env(kind, err))) return s;
  *device_id = opts->device_id >= 0 ? opts->device_id : metadata_device_id;
  if (*kind == KILN_DEVICE_CPU) return KILN_OK;
  if ((count = count_cuda(&reason)) <= 0)
    return kiln_fail(err, KILN_ERR_UNAVAILABLE,
                     "no CUDA GPU found (%.40s): set KILN_DEVICE=cpu or pass the load option "
                     "device=cpu to run the CPU reference engine",
                     reason);
  if (*device_id >= count)
    return kiln_fail(err, KILN_ERR_UNAVAILABLE,
                     "CUDA device %d does not exist: this machine has %d (0..%d); pass the load "
                     "option device_id or export for an existing device",
                     (int)*device_id, count, count - 1);
  return KILN_OK;
}
