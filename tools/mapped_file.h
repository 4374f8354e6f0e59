/* A file the command line reads, mapped read-only, and a path made safe to print. */
#ifndef KILN_TOOLS_MAPPED_FILE_H
#define KILN_TOOLS_MAPPED_FILE_H

#include "kiln/kiln.h"

typedef struct mapped_file {
  const uint8_t *data;
  size_t size;
  void *map;
} mapped_file;

/* Copies s into out (cap bytes) with control characters shown as '?'. */
const char *kiln_clean_text(const char *s, char *out, size_t cap);
/* Maps a regular file; refusals name the path and the cause. */
kiln_status kiln_map_file(const char *path, mapped_file *f, kiln_error *err);
void kiln_unmap_file(mapped_file *f);

#endif
