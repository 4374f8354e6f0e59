/* The checks a blob passes at load before any device is touched, shared by the engine's
 * loader and by `kiln inspect`, so that a tool never passes what a delegate would refuse. */
#ifndef KILN_LOAD_CHECKS_H
#define KILN_LOAD_CHECKS_H

#include "kiln/kiln.h"

/* Container, metadata and plan, then the metadata's bindings against the plan's inputs and
 * outputs. On success *plan is filled (release it with kiln_plan_release); on failure nothing
 * is left to release. */
kiln_status kiln_check_blob(const void *blob, size_t size, kiln_blob_view *view,
                            kiln_metadata *md, kiln_plan *plan, kiln_error *err);

#endif
