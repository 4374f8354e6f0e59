/* Mapping the files the command line reads. */
#include "mapped_file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

const char *kiln_clean_text(const char *s, char *out, size_t cap) {
  size_t n = 0;
  for (; *s && n + 1 < cap; s++) out[n++] = (unsigned char)*s < 0x20 || *s == 0x7F ? '?' : *s;
  out[n] = '\0';
  return out;
}

kiln_status kiln_map_file(const char *path, mapped_file *f, kiln_error *err) {
  char shown[128];
  memset(f, 0, sizeof *f);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT, "cannot open %.120s: %.64s",
                     kiln_clean_text(path, shown, sizeof shown), strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "%.120s is not a regular file: pass a blob or a .pte file",
                     kiln_clean_text(path, shown, sizeof shown));
  }
  f->size = (size_t)st.st_size;
  if (f->size > 0) {
    f->map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (f->map == MAP_FAILED) {
      f->map = NULL;
      close(fd);
      return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY, "cannot map %.120s (%llu bytes): %.64s",
                       kiln_clean_text(path, shown, sizeof shown), (unsigned long long)f->size,
                       strerror(errno));
    }
    f->data = f->map;
  }
  close(fd);
  return KILN_OK;
}

void kiln_unmap_file(mapped_file *f) {
  if (f->map) munmap(f->map, f->size);
}
