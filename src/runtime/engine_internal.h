/* The engine object and the interface every execution backend (CPU, CUDA) implements. */
#ifndef KILN_ENGINE_INTERNAL_H
#define KILN_ENGINE_INTERNAL_H

#include "kiln/kiln.h"

#include <pthread.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A backend owns everything it allocates in init (arena, state, staging, streams, graphs) and
 * allocates nothing in execute. The engine has already checked every caller view against
 * the bindings (dtype, shape, byte size, contiguity) before calling execute. */
typedef struct kiln_backend {
  const char *name;
  kiln_status (*init)(kiln_engine *e, kiln_error *err);
  kiln_status (*execute)(kiln_engine *e, const kiln_tensor_view *inputs,
                         const kiln_tensor_view *outputs, kiln_error *err);
  void (*destroy)(kiln_engine *e);
  /* Copies each state's initial value into its buffer; also what init does once. */
  kiln_status (*reset_state)(kiln_engine *e, kiln_error *err);
} kiln_backend;

struct kiln_engine {
  kiln_metadata metadata;
  kiln_plan plan;
  /* What a backend runs: plan itself, or for a dynamic plan `shaped`, whose tensors and ops
   * (allocated at load) hold this call's dims and attributes; offsets stay the plan's. */
  const kiln_plan *current;
  kiln_plan shaped;
  int64_t sym_values[KILN_MAX_SYMBOLS];
  /* `shaped` holds the sizes at shaped_values (a call at the same values skips shape inference) */
  int shaped_valid;
  int64_t shaped_values[KILN_MAX_SYMBOLS];
  uint8_t *weights; /* host copy, KILN_WEIGHTS_ALIGN-aligned; a backend may free it in init */
  uint64_t weights_size;
  int32_t device_id;
  char device_name[32];
  const kiln_backend *backend;
  void *impl; /* the backend's state */
  pthread_mutex_t lock;
};

/* The plan a backend runs this call (an engine assembled without kiln_engine_load has only plan). */
static inline const kiln_plan *kiln_engine_current(const kiln_engine *e) {
  return e->current ? e->current : &e->plan;
}

extern const kiln_backend kiln_cpu_backend;
#ifdef KILN_WITH_CUDA
extern const kiln_backend kiln_cuda_backend;
/* Number of CUDA devices, or -1 with err set when the driver/runtime reports none. */
int kiln_cuda_device_count(kiln_error *err);
/* See kiln_buffer_device (core/device.h). */
int kiln_cuda_buffer_device(const void *ptr);
#endif

#ifdef __cplusplus
}
#endif

#endif
