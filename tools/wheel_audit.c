/* Checks a built wheel: its tag, its dist-info files, the requirement rules of kiln-runtime
 * (and of kiln), and each bundled library against the wheel's own tag, down to whether
 * every RUNPATH entry lands, once installed, where a required wheel puts its libraries. */
#include "wheel_audit.h"

#include "zip_read.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

enum wheel_kind { WHEEL_RUNTIME, WHEEL_EXPORTER };

/* Who installs the libraries a Kiln library may need, and where (relative to site-packages):
 * every library whose name starts with prefix and ends with suffix. */
typedef struct provider {
  const char *dist; /* normalized distribution name */
  const char *dir;
  const char *prefix, *suffix;
} provider;

static const provider providers[] = {
    {"executorch", "executorch/lib", "libexecutorch.so", ""},
    {"nvidia-cuda-runtime", "nvidia/cu13/lib", "libcudart.so.13", ""},
    {"nvidia-cublas", "nvidia/cu13/lib", "libcublas", ".so.13"}, /* libcublas, libcublasLt */
    {"nvidia-cudnn-cu13", "nvidia/cudnn/lib", "libcudnn", ".so.9"}, /* libcudnn, libcudnn_ops, ... */
};
#define N_PROVIDERS (sizeof providers / sizeof providers[0])

enum pin { PIN_EXACT, PIN_NONE };

/* Every requirement a Kiln wheel may state, how it must be bounded, and who must state it. */
static const struct requirement_rule {
  const char *dist;
  enum pin pin;
  int runtime_needs, exporter_needs;
} requirement_rules[] = {
    {"executorch", PIN_EXACT, 1, 1},
    {"torch", PIN_NONE, 1, 1},
    {"nvidia-cuda-runtime", PIN_EXACT, 1, 0},
    {"nvidia-cublas", PIN_EXACT, 1, 0},
    {"nvidia-cudnn-cu13", PIN_EXACT, 1, 0},
};
#define N_RULES (sizeof requirement_rules / sizeof requirement_rules[0])

typedef struct wheel {
  const char *file_name;
  enum wheel_kind kind;
  char dist[64], version[64], tag[160], data_dir[160], dist_info[160];
  const kiln_platform *platform; /* NULL when the tag names no supported platform */
  kiln_zip zip;
  int required[N_RULES];
  int requirements_read; /* METADATA was readable: required[] is what the wheel states */
  kiln_audit_report *r;
} wheel;

static const char *base_name(const char *path) {
  const char *slash = strrchr(path, '/');
  return slash ? slash + 1 : path;
}

/* PEP 503: lowercase, runs of '-', '_' and '.' become one '-'. */
static void normalize_name(const char *s, size_t len, char *out, size_t cap) {
  size_t o = 0;
  for (size_t i = 0; i < len && o + 1 < cap; i++) {
    if (s[i] == '-' || s[i] == '_' || s[i] == '.') {
      if (o == 0 || out[o - 1] != '-') out[o++] = '-';
    } else {
      out[o++] = (char)tolower((unsigned char)s[i]);
    }
  }
  out[o] = '\0';
}

static int copy_field(char *dst, size_t cap, const char *src, size_t len) {
  if (len == 0 || len >= cap) return -1;
  memcpy(dst, src, len);
  dst[len] = '\0';
  return 0;
}

/* NAME-VERSION[-BUILD]-PY-ABI-PLATFORM.whl */
static int parse_file_name(wheel *w) {
  const char *name = base_name(w->file_name);
  size_t len = strlen(name);
  if (len < 5 || strcmp(name + len - 4, ".whl") != 0) return -1;
  len -= 4;
  const char *parts[6];
  size_t lens[6], n = 0;
  const char *start = name;
  for (size_t i = 0; i <= len; i++) {
    if (i < len && name[i] != '-') continue;
    if (n == 6) return -1;
    parts[n] = start;
    lens[n++] = (size_t)(name + i - start);
    start = name + i + 1;
  }
  if (n < 5) return -1;
  char py[16], abi[16], platform[64];
  if (copy_field(w->dist, sizeof w->dist, parts[0], lens[0]) ||
      copy_field(w->version, sizeof w->version, parts[1], lens[1]) ||
      copy_field(py, sizeof py, parts[n - 3], lens[n - 3]) ||
      copy_field(abi, sizeof abi, parts[n - 2], lens[n - 2]) ||
      copy_field(platform, sizeof platform, parts[n - 1], lens[n - 1]))
    return -1;
  snprintf(w->tag, sizeof w->tag, "%s-%s-%s", py, abi, platform);
  snprintf(w->dist_info, sizeof w->dist_info, "%s-%s.dist-info/", w->dist, w->version);
  snprintf(w->data_dir, sizeof w->data_dir, "%s-%s.data/", w->dist, w->version);
  if (strcmp(py, "py3") == 0 && strcmp(abi, "none") == 0)
    w->platform = kiln_platform_find(platform, strlen(platform));
  return 0;
}

/* A member's text, or NULL after reporting why there is none. */
static char *member_text(wheel *w, const char *file) {
  char path[200];
  snprintf(path, sizeof path, "%s%s", w->dist_info, file);
  const kiln_zip_entry *e = kiln_zip_find(&w->zip, path);
  if (!e) {
    kiln_audit_refuse(w->r, kiln_fail(&w->r->err, KILN_ERR_INVALID_ARGUMENT,
                                      "%.32s: the wheel lacks %.120s; every wheel carries "
                                      "METADATA, WHEEL and RECORD in its .dist-info",
                                      w->dist, path));
    return NULL;
  }
  uint8_t *text;
  size_t size;
  kiln_status st = kiln_zip_extract(&w->zip, e, &text, &size, &w->r->err);
  if (st != KILN_OK) {
    kiln_audit_refuse(w->r, st);
    return NULL;
  }
  return (char *)text;
}

/* Walks "Key: value" header lines up to the first blank line. Returns 0 at the end. */
static int next_header(const char **cursor, const char **key, size_t *key_len, const char **value,
                       size_t *value_len) {
  for (;;) {
    const char *line = *cursor;
    if (*line == '\0') return 0;
    const char *nl = strchr(line, '\n');
    const char *end = nl ? nl : line + strlen(line);
    *cursor = nl ? nl + 1 : end;
    if (end > line && end[-1] == '\r') end--;
    if (end == line) return 0; /* the blank line before the description */
    const char *colon = memchr(line, ':', (size_t)(end - line));
    if (!colon || line[0] == ' ' || line[0] == '\t') continue; /* a continuation line */
    const char *v = colon + 1;
    while (v < end && (*v == ' ' || *v == '\t')) v++;
    const char *v_end = end;
    while (v_end > v && (v_end[-1] == ' ' || v_end[-1] == '\t')) v_end--;
    *key = line;
    *key_len = (size_t)(colon - line);
    *value = v;
    *value_len = (size_t)(v_end - v);
    return 1;
  }
}

static int key_is(const char *key, size_t len, const char *want) {
  return strlen(want) == len && strncmp(key, want, len) == 0;
}

static void copy_bounded(char *dst, size_t cap, const char *src, size_t len) {
  size_t n = len < cap - 1 ? len : cap - 1;
  memcpy(dst, src, n);
  dst[n] = '\0';
}

static void check_wheel_file(wheel *w) {
  char *text = member_text(w, "WHEEL");
  if (!text) return;
  const char *cursor = text, *key, *value;
  size_t key_len, value_len;
  int tags = 0;
  char shown[128];
  while (next_header(&cursor, &key, &key_len, &value, &value_len)) {
    copy_bounded(shown, sizeof shown, value, value_len);
    if (key_is(key, key_len, "Tag")) {
      tags++;
      if (strcmp(shown, w->tag) != 0)
        kiln_audit_refuse(w->r, kiln_fail(&w->r->err, KILN_ERR_INVALID_ARGUMENT,
                                          "%.32s: WHEEL declares tag %.64s but the file name says "
                                          "%.64s; write the same tag in both",
                                          w->dist, shown, w->tag));
    } else if (key_is(key, key_len, "Root-Is-Purelib") && strcmp(shown, "false") != 0) {
      kiln_audit_refuse(w->r, kiln_fail(&w->r->err, KILN_ERR_INVALID_ARGUMENT,
                                        "%.32s: WHEEL says Root-Is-Purelib: %.16s, but a wheel "
                                        "carrying a native library must say false",
                                        w->dist, shown));
    }
  }
  if (tags == 0)
    kiln_audit_refuse(w->r, kiln_fail(&w->r->err, KILN_ERR_INVALID_ARGUMENT,
                                      "%.32s: WHEEL declares no Tag; write 'Tag: %.80s' to match "
                                      "the file name",
                                      w->dist, w->tag));
  free(text);
}

/* ---------------------------------------------------------------- requirements */

typedef struct requirement {
  char name[64]; /* normalized */
  const char *spec; /* the version specifier, trimmed, without parentheses */
  size_t spec_len;
  int extras, marker, url;
} requirement;

static int parse_requirement(const char *s, size_t len, requirement *q) {
  memset(q, 0, sizeof *q);
  const char *p = s, *end = s + len;
  const char *name = p;
  while (p < end && (isalnum((unsigned char)*p) || *p == '-' || *p == '_' || *p == '.')) p++;
  if (p == name || (size_t)(p - name) >= sizeof q->name) return -1;
  normalize_name(name, (size_t)(p - name), q->name, sizeof q->name);
  while (p < end && *p == ' ') p++;
  if (p < end && *p == '[') {
    q->extras = 1;
    const char *close = memchr(p, ']', (size_t)(end - p));
    if (!close) return -1;
    p = close + 1;
  }
  const char *semi = p < end ? memchr(p, ';', (size_t)(end - p)) : NULL;
  if (semi) {
    q->marker = 1;
    end = semi;
  }
  while (p < end && (*p == ' ' || *p == '(')) p++;
  while (end > p && (end[-1] == ' ' || end[-1] == ')')) end--;
  if (p < end && *p == '@') q->url = 1;
  q->spec = p;
  q->spec_len = (size_t)(end - p);
  return 0;
}

/* "==1.5.1": one clause, no wildcard ("===" and "," fail the character test). */
static int is_exact_pin(const requirement *q) {
  if (q->spec_len < 3 || strncmp(q->spec, "==", 2) != 0) return 0;
  for (size_t i = 2; i < q->spec_len; i++) {
    char c = q->spec[i];
    if (!isalnum((unsigned char)c) && c != '.' && c != '+' && c != '!' && c != '-') return 0;
  }
  return 1;
}

static void check_requirement(wheel *w, const char *text, size_t len) {
  const char *wheel_name = w->dist;
  char shown[128];
  copy_bounded(shown, sizeof shown, text, len);
  requirement q;
  if (parse_requirement(text, len, &q) != 0) {
    kiln_audit_refuse(w->r, kiln_fail(&w->r->err, KILN_ERR_INVALID_ARGUMENT,
                                      "%.32s: cannot read Requires-Dist '%.96s'; write NAME "
                                      "followed by an optional version specifier",
                                      wheel_name, shown));
    return;
  }
  if (strcmp(q.name, "kiln") == 0) {
    if (w->kind == WHEEL_RUNTIME)
      kiln_audit_refuse(w->r, kiln_fail(&w->r->err, KILN_ERR_INVALID_ARGUMENT,
                                        "%.32s requires kiln, the exporter that builds it: no "
                                        "resolver can satisfy a wheel that depends on its parent; "
                                        "drop the requirement",
                                        wheel_name));
    else
      kiln_audit_refuse(w->r, kiln_fail(&w->r->err, KILN_ERR_INVALID_ARGUMENT,
                                        "%.32s requires kiln, that is, itself; drop the "
                                        "requirement",
                                        wheel_name));
    return;
  }
  size_t rule = 0;
  while (rule < N_RULES && strcmp(requirement_rules[rule].dist, q.name) != 0) rule++;
  if (rule == N_RULES) {
    if (w->kind == WHEEL_RUNTIME)
      kiln_audit_refuse(w->r, kiln_fail(&w->r->err, KILN_ERR_INVALID_ARGUMENT,
                                        "%.32s: requirement '%.96s' is not allowed; kiln-runtime "
                                        "requires only executorch, torch and the CUDA runtime and "
                                        "math libraries",
                                        wheel_name, shown));
    return;
  }
  if (w->required[rule]++) {
    kiln_audit_refuse(w->r, kiln_fail(&w->r->err, KILN_ERR_INVALID_ARGUMENT,
                                      "%.32s requires %.32s more than once; keep one requirement",
                                      wheel_name, q.name));
    return;
  }
  if (q.extras || q.marker || q.url) {
    kiln_audit_refuse(w->r, kiln_fail(&w->r->err, KILN_ERR_INVALID_ARGUMENT,
                                      "%.32s: requirement '%.96s' carries extras, a marker or a "
                                      "URL; require the plain package so it always installs",
                                      wheel_name, shown));
    return;
  }
  if (requirement_rules[rule].pin == PIN_EXACT && !is_exact_pin(&q))
    kiln_audit_refuse(w->r, kiln_fail(&w->r->err, KILN_ERR_INVALID_ARGUMENT,
                                      "%.32s: %.32s must be pinned exactly (NAME==X.Y.Z), since "
                                      "the library is built against one ABI; found '%.96s'",
                                      wheel_name, q.name, shown));
  if (requirement_rules[rule].pin == PIN_NONE && q.spec_len != 0)
    kiln_audit_refuse(w->r, kiln_fail(&w->r->err, KILN_ERR_INVALID_ARGUMENT,
                                      "%.32s: %.32s must be required by name with no version "
                                      "bound, leaving the choice to the user; found '%.96s'",
                                      wheel_name, q.name, shown));
}

static void check_metadata(wheel *w) {
  char *text = member_text(w, "METADATA");
  if (!text) return;
  w->requirements_read = 1;
  const char *cursor = text, *key, *value;
  size_t key_len, value_len;
  char name[64] = "", version[64] = "", want[64];
  while (next_header(&cursor, &key, &key_len, &value, &value_len)) {
    if (key_is(key, key_len, "Name")) normalize_name(value, value_len, name, sizeof name);
    else if (key_is(key, key_len, "Version")) copy_bounded(version, sizeof version, value, value_len);
    else if (key_is(key, key_len, "Requires-Dist")) check_requirement(w, value, value_len);
  }
  normalize_name(w->dist, strlen(w->dist), want, sizeof want);
  if (strcmp(name, want) != 0 || strcmp(version, w->version) != 0)
    kiln_audit_refuse(w->r, kiln_fail(&w->r->err, KILN_ERR_INVALID_ARGUMENT,
                                      "%.32s: METADATA names %.48s %.24s but the file name says "
                                      "%.48s %.24s; write both from one source",
                                      w->dist, name, version, want, w->version));
  for (size_t i = 0; i < N_RULES; i++) {
    int needs = w->kind == WHEEL_RUNTIME ? requirement_rules[i].runtime_needs
                                         : requirement_rules[i].exporter_needs;
    if (needs && !w->required[i])
      kiln_audit_refuse(w->r, kiln_fail(&w->r->err, KILN_ERR_INVALID_ARGUMENT,
                                        "%.32s does not require %.32s; add it to Requires-Dist "
                                        "(%.24s)",
                                        w->dist, requirement_rules[i].dist,
                                        requirement_rules[i].pin == PIN_EXACT
                                            ? "pinned exactly"
                                            : "by name, no bound"));
  }
  free(text);
}

static void check_record(wheel *w) {
  char *text = member_text(w, "RECORD");
  if (!text) return;
  char record_path[200];
  snprintf(record_path, sizeof record_path, "%sRECORD", w->dist_info);
  for (uint32_t i = 0; i < w->zip.n_entries; i++) {
    const char *name = w->zip.entries[i].name;
    size_t len = strlen(name);
    if (name[len - 1] == '/' || strcmp(name, record_path) == 0) continue;
    int listed = 0;
    for (const char *line = text; *line && !listed;) {
      listed = strncmp(line, name, len) == 0 && line[len] == ',';
      const char *nl = strchr(line, '\n');
      line = nl ? nl + 1 : line + strlen(line);
    }
    if (!listed)
      kiln_audit_refuse(w->r, kiln_fail(&w->r->err, KILN_ERR_INVALID_ARGUMENT,
                                        "%.32s: member '%.96s' is missing from RECORD, so pip "
                                        "cannot verify or uninstall it; regenerate RECORD",
                                        w->dist, name));
  }
  free(text);
}

/* ---------------------------------------------------------------- bundled libraries */

static int is_library(const char *name) {
  const char *base = base_name(name), *so = strstr(base, ".so");
  while (so) {
    const char *p = so + 3;
    while (*p == '.' || (*p >= '0' && *p <= '9')) p++;
    if (*p == '\0') return 1;
    so = strstr(so + 1, ".so");
  }
  return 0;
}

/* Where a member lands relative to site-packages, or NULL when it lands elsewhere. */
static const char *installed_path(const wheel *w, const char *name) {
  size_t n = strlen(w->data_dir);
  if (strncmp(name, w->data_dir, n) != 0) return name;
  if (strncmp(name + n, "purelib/", 8) == 0 || strncmp(name + n, "platlib/", 8) == 0)
    return name + n + 8;
  return NULL;
}

/* Joins the library's directory and an $ORIGIN-relative entry into a path relative to
 * site-packages ("" is site-packages itself). Returns -1 when it climbs out. */
static int resolve_entry(const char *lib_dir, size_t lib_dir_len, const char *rest,
                         size_t rest_len, char *out, size_t cap) {
  size_t o = 0;
  if (lib_dir_len >= cap) return -1;
  memcpy(out, lib_dir, lib_dir_len);
  o = lib_dir_len;
  out[o] = '\0';
  const char *p = rest, *end = rest + rest_len;
  while (p < end) {
    const char *slash = memchr(p, '/', (size_t)(end - p));
    size_t n = slash ? (size_t)(slash - p) : (size_t)(end - p);
    if (n == 2 && p[0] == '.' && p[1] == '.') {
      if (o == 0) return -1;
      while (o > 0 && out[o - 1] != '/') o--;
      if (o > 0) o--;
    } else if (n > 0 && !(n == 1 && p[0] == '.')) {
      if (o + (o > 0) + n >= cap) return -1;
      if (o > 0) out[o++] = '/';
      memcpy(out + o, p, n);
      o += n;
    }
    out[o] = '\0';
    p += n + 1;
  }
  return 0;
}

static int wheel_installs_into(const wheel *w, const char *dir) {
  size_t n = strlen(dir);
  for (uint32_t i = 0; i < w->zip.n_entries; i++) {
    const char *path = installed_path(w, w->zip.entries[i].name);
    if (path && (n == 0 || (strncmp(path, dir, n) == 0 && path[n] == '/'))) return 1;
  }
  return 0;
}

static int provider_required(const wheel *w, const provider *p) {
  for (size_t i = 0; i < N_RULES; i++)
    if (strcmp(requirement_rules[i].dist, p->dist) == 0) return w->required[i] != 0;
  return 0;
}

static const provider *provider_of(const char *soname) {
  size_t n = strlen(soname);
  for (size_t i = 0; i < N_PROVIDERS; i++) {
    size_t np = strlen(providers[i].prefix), ns = strlen(providers[i].suffix);
    if (n >= np + ns && strncmp(soname, providers[i].prefix, np) == 0 &&
        strcmp(soname + n - ns, providers[i].suffix) == 0)
      return &providers[i];
  }
  return NULL;
}

#define MAX_REACHED 16

static void check_library_paths(wheel *w, const kiln_elf *elf, const char *path) {
  const char *lib = base_name(path);
  const char *runpath = elf->runpath ? elf->runpath : elf->rpath;
  char reached[MAX_REACHED][160];
  size_t n_reached = 0;
  const char *slash = strrchr(path, '/');
  size_t dir_len = slash ? (size_t)(slash - path) : 0;
  for (const char *entry = runpath; entry && *entry;) {
    const char *colon = strchr(entry, ':');
    size_t len = colon ? (size_t)(colon - entry) : strlen(entry);
    size_t origin = strncmp(entry, "$ORIGIN", 7) == 0 ? 7 : strncmp(entry, "${ORIGIN}", 9) == 0 ? 9 : 0;
    /* Entries that are not $ORIGIN-relative were refused by the library rules already. */
    if (origin && len >= origin && (len == origin || entry[origin] == '/')) {
      char shown[81], resolved[160];
      copy_bounded(shown, sizeof shown, entry, len);
      if (resolve_entry(path, dir_len, entry + origin, len - origin, resolved, sizeof resolved)) {
        kiln_audit_refuse(w->r, kiln_fail(&w->r->err, KILN_ERR_UNSUPPORTED,
                                          "%.48s has RUNPATH entry '%.80s', which climbs out of "
                                          "site-packages once installed; point it at a directory "
                                          "a required wheel installs",
                                          lib, shown));
      } else {
        int known = wheel_installs_into(w, resolved);
        for (size_t i = 0; i < N_PROVIDERS && !known; i++)
          known = strcmp(resolved, providers[i].dir) == 0 && provider_required(w, &providers[i]);
        if (!known)
          kiln_audit_refuse(w->r, kiln_fail(&w->r->err, KILN_ERR_UNSUPPORTED,
                                            "%.40s: RUNPATH entry '%.64s' lands on "
                                            "site-packages/%.48s, where no required wheel "
                                            "installs; fix or remove the entry",
                                            lib, shown, resolved));
        if (n_reached < MAX_REACHED) copy_bounded(reached[n_reached++], 160, resolved, strlen(resolved));
      }
    }
    entry = colon ? colon + 1 : entry + len;
  }
  for (uint32_t i = 0; i < elf->n_needed; i++) {
    const provider *p = provider_of(elf->needed[i]);
    if (!p) continue;
    if (!provider_required(w, p)) {
      kiln_audit_refuse(w->r, kiln_fail(&w->r->err, KILN_ERR_UNSUPPORTED,
                                        "%.48s needs %.32s from %.24s, which %.32s does not "
                                        "require; add it to Requires-Dist, pinned exactly",
                                        lib, elf->needed[i], p->dist, w->dist));
      continue;
    }
    int reachable = 0;
    for (size_t k = 0; k < n_reached && !reachable; k++) reachable = strcmp(reached[k], p->dir) == 0;
    if (!reachable)
      kiln_audit_refuse(w->r, kiln_fail(&w->r->err, KILN_ERR_UNSUPPORTED,
                                        "%.48s needs %.32s but no RUNPATH entry reaches %.24s, "
                                        "where %.24s installs it; add that directory, "
                                        "$ORIGIN-relative",
                                        lib, elf->needed[i], p->dir, p->dist));
  }
}

static void check_libraries(wheel *w, const char *const *exports, uint32_t n_exports) {
  /* The library each wheel exists to carry. */
  const char *main_library = w->kind == WHEEL_RUNTIME ? "libexecutorch_backend_kiln.so" : "libkiln.so";
  int carried = 0;
  for (uint32_t i = 0; i < w->zip.n_entries; i++) {
    const kiln_zip_entry *e = &w->zip.entries[i];
    if (!is_library(e->name)) continue;
    const char *path = installed_path(w, e->name);
    if (path && strcmp(base_name(path), main_library) == 0) carried = 1;
    if (!path) {
      kiln_audit_refuse(w->r, kiln_fail(&w->r->err, KILN_ERR_UNSUPPORTED,
                                        "%.32s: library '%.96s' installs outside site-packages, "
                                        "where nothing loads it from; place it in the package",
                                        w->dist, e->name));
      continue;
    }
    uint8_t *bytes;
    size_t size;
    kiln_status st = kiln_zip_extract(&w->zip, e, &bytes, &size, &w->r->err);
    if (st != KILN_OK) {
      kiln_audit_refuse(w->r, st);
      continue;
    }
    kiln_elf elf;
    st = kiln_elf_read(bytes, size, base_name(path), &elf, &w->r->err);
    if (st != KILN_OK) {
      kiln_audit_refuse(w->r, st);
    } else {
      kiln_library_rules rules = {.name = base_name(path),
                                  .platform = w->platform,
                                  .exports = exports,
                                  .n_exports = n_exports};
      kiln_audit_library(&elf, &rules, w->r);
      /* Without the requirements, where RUNPATH may point is unknown: METADATA was refused. */
      if (w->requirements_read) check_library_paths(w, &elf, path);
      kiln_elf_release(&elf);
    }
    free(bytes);
  }
  if (!carried)
    kiln_audit_refuse(w->r, kiln_fail(&w->r->err, KILN_ERR_INVALID_ARGUMENT,
                                      "%.32s carries no %.32s, the library it exists to ship; "
                                      "build the library before the wheel",
                                      w->dist, main_library));
}

unsigned kiln_audit_wheel(const char *file_name, const uint8_t *data, size_t size,
                          const char *const *exports, uint32_t n_exports, kiln_audit_report *r) {
  unsigned before = r->n_problems;
  wheel w = {.file_name = file_name, .r = r};
  const char *shown = base_name(file_name);
  if (parse_file_name(&w) != 0) {
    kiln_audit_refuse(r, kiln_fail(&r->err, KILN_ERR_INVALID_ARGUMENT,
                                   "%.96s is not a wheel file name "
                                   "(NAME-VERSION-PYTHON-ABI-PLATFORM.whl); keep the name the "
                                   "wheel was built with",
                                   shown));
    return r->n_problems - before;
  }
  if (strcmp(w.dist, "kiln_runtime") == 0) {
    w.kind = WHEEL_RUNTIME;
  } else if (strcmp(w.dist, "kiln") == 0) {
    w.kind = WHEEL_EXPORTER;
  } else {
    kiln_audit_refuse(r, kiln_fail(&r->err, KILN_ERR_INVALID_ARGUMENT,
                                   "%.96s is a wheel of %.64s, not of kiln or kiln_runtime; the "
                                   "audit knows only Kiln's two wheels",
                                   shown, w.dist));
    return r->n_problems - before;
  }
  if (!w.platform)
    kiln_audit_refuse(r, kiln_fail(&r->err, KILN_ERR_INVALID_ARGUMENT,
                                   "%.64s has tag %.64s; a Kiln wheel is tagged "
                                   "py3-none-manylinux_2_NN_x86_64 with NN from kiln audit "
                                   "--min-platform",
                                   shown, w.tag));
  kiln_status st = kiln_zip_open(data, size, shown, &w.zip, &r->err);
  if (st != KILN_OK) {
    kiln_audit_refuse(r, st);
    return r->n_problems - before;
  }
  check_wheel_file(&w);
  check_metadata(&w);
  check_record(&w);
  check_libraries(&w, exports, n_exports);
  kiln_zip_release(&w.zip);
  return r->n_problems - before;
}
