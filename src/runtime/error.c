/* Status names and bounded error formatting shared by every part of Kiln. */
#include "kiln/kiln.h"

#include <stdarg.h>
#include <stdio.h>

kiln_status kiln_fail(kiln_error *err, kiln_status status, const char *fmt, ...) {
  if (err) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    /* Messages echo bytes from blobs and callers: keep them to printable ASCII everywhere. */
    for (char *p = err->message; *p; p++)
      if ((unsigned char)*p < 0x20 || (unsigned char)*p > 0x7E) *p = '?';
    err->status = status;
  }
  return status;
}

const char *kiln_status_name(kiln_status status) {
  switch (status) {
  case KILN_OK: return "ok";
  case KILN_ERR_INVALID_PROGRAM: return "invalid program";
  case KILN_ERR_INCOMPATIBLE: return "incompatible";
  case KILN_ERR_INVALID_ARGUMENT: return "invalid argument";
  case KILN_ERR_OUT_OF_MEMORY: return "out of memory";
  case KILN_ERR_INTERNAL: return "internal";
  case KILN_ERR_UNAVAILABLE: return "unavailable";
  case KILN_ERR_UNSUPPORTED: return "unsupported";
  }
  return "unknown status";
}
