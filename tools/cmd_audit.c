/* kiln audit: checks a built library or wheel against Kiln's packaging rules. Exit status 0
 * when it passes, 1 with one line per problem when it does not, 2 on a usage error. */
#include "commands.h"

#include "elf_audit.h"
#include "wheel_audit.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_EXPORTS 64
/* Larger than any library or wheel Kiln builds; refused before allocating. */
#define MAX_INPUT_SIZE (1ull << 31)

static const char usage[] =
    "usage: kiln audit LIBRARY.so [--platform manylinux_2_NN_x86_64] [--export SYMBOL]...\n"
    "       kiln audit LIBRARY.so --min-platform [--export SYMBOL]...\n"
    "       kiln audit WHEEL.whl [--export SYMBOL]...\n";

static const char *base_name(const char *path) {
  const char *slash = strrchr(path, '/');
  return slash ? slash + 1 : path;
}

static kiln_status read_file(const char *path, uint8_t **out, size_t *out_size, kiln_error *err) {
  *out = NULL;
  *out_size = 0;
  FILE *f = fopen(path, "rb");
  if (!f)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT, "cannot open %.96s (%.64s); pass the path of a "
                     "built library or wheel", path, strerror(errno));
  long size = -1;
  if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
  if (size < 0 || (unsigned long long)size > MAX_INPUT_SIZE || fseek(f, 0, SEEK_SET) != 0) {
    fclose(f);
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "cannot size %.96s, or it is larger than 2 GiB; pass a regular file of a "
                     "built library or wheel",
                     path);
  }
  uint8_t *data = malloc(size ? (size_t)size : 1);
  if (!data) {
    fclose(f);
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY, "out of memory reading %.96s (%lld bytes)", path,
                     (long long)size);
  }
  size_t got = fread(data, 1, (size_t)size, f);
  fclose(f);
  if (got != (size_t)size) {
    free(data);
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT, "cannot read %.96s (got %llu of %lld bytes)",
                     path, (unsigned long long)got, (long long)size);
  }
  *out = data;
  *out_size = (size_t)size;
  return KILN_OK;
}

static int has_suffix(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* Audits one library; prints the lowest tag when min_platform is set, else a verdict. */
static int audit_library(const char *path, const uint8_t *data, size_t size,
                         const kiln_platform *platform, int min_platform,
                         const char *const *exports, uint32_t n_exports, kiln_audit_report *r) {
  kiln_elf elf;
  kiln_status st = kiln_elf_read(data, size, base_name(path), &elf, &r->err);
  if (st != KILN_OK) {
    kiln_audit_refuse(r, st);
    return 1;
  }
  kiln_library_rules rules = {.name = base_name(path),
                              .platform = platform,
                              .exports = exports,
                              .n_exports = n_exports};
  kiln_audit_library(&elf, &rules, r);
  const kiln_platform *lowest = kiln_platform_lowest(&elf);
  kiln_elf_release(&elf);
  if (r->n_problems) return 1;
  if (min_platform) printf("%s\n", lowest->tag);
  else printf("kiln audit: %s passes (%s)\n", base_name(path), platform ? platform->tag : lowest->tag);
  return 0;
}

int kiln_cmd_audit(int argc, char **argv) {
  const char *path = NULL, *platform_tag = NULL;
  const char *exports[MAX_EXPORTS];
  uint32_t n_exports = 0;
  int min_platform = 0;
  for (int i = 1; i < argc; i++) { /* argv[0] is "audit" */
    if (strcmp(argv[i], "--platform") == 0 && i + 1 < argc) {
      platform_tag = argv[++i];
    } else if (strcmp(argv[i], "--export") == 0 && i + 1 < argc && n_exports < MAX_EXPORTS) {
      exports[n_exports++] = argv[++i];
    } else if (strcmp(argv[i], "--min-platform") == 0) {
      min_platform = 1;
    } else if (argv[i][0] != '-' && !path) {
      path = argv[i];
    } else {
      fprintf(stderr, "kiln audit: unexpected argument '%s'\n%s", argv[i], usage);
      return 2;
    }
  }
  if (!path) {
    fputs(usage, stderr);
    return 2;
  }
  int wheel = has_suffix(path, ".whl");
  if (wheel && (platform_tag || min_platform)) {
    fprintf(stderr, "kiln audit: a wheel is audited against its own tag; drop --platform and "
                    "--min-platform\n%s", usage);
    return 2;
  }
  if (platform_tag && min_platform) {
    fprintf(stderr, "kiln audit: --platform and --min-platform exclude each other\n%s", usage);
    return 2;
  }
  const kiln_platform *platform = NULL;
  if (platform_tag && !(platform = kiln_platform_find(platform_tag, strlen(platform_tag)))) {
    fprintf(stderr,
            "kiln audit: unknown platform tag '%s'; supported: manylinux_2_NN_x86_64 for NN in "
            "17 24 27 28 31 34 35 39\n",
            platform_tag);
    return 2;
  }
  kiln_audit_report report = {.out = stderr};
  uint8_t *data;
  size_t size;
  kiln_status st = read_file(path, &data, &size, &report.err);
  if (st != KILN_OK) {
    kiln_audit_refuse(&report, st);
    return 1;
  }
  int rc;
  if (wheel) {
    rc = kiln_audit_wheel(path, data, size, exports, n_exports, &report) ? 1 : 0;
    if (rc == 0) printf("kiln audit: %s passes\n", base_name(path));
  } else {
    rc = audit_library(path, data, size, platform, min_platform, exports, n_exports, &report);
  }
  free(data);
  return rc;
}
