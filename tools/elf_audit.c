/* Checks a built shared library against Kiln's packaging rules: what it links, where it
 * looks for it, which glibc/libstdc++ symbol versions it needs, how it registers with
 * ExecuTorch, what it exports, and that it carries no private C++ runtime. */
#include "elf_audit.h"

#include <elf.h>
#include <string.h>

#define REGISTER_BACKEND "_ZN10executorch7runtime16register_backendERKNS0_7BackendE"
#define DELEGATE_PREFIX "libexecutorch_backend_"

void kiln_audit_refuse(kiln_audit_report *r, kiln_status status) {
  (void)status;
  /* Names come from untrusted files: a control or non-ASCII byte must not split or garble the line. */
  for (char *c = r->err.message; *c; c++)
    if ((unsigned char)*c < 0x20 || (unsigned char)*c > 0x7e) *c = '?';
  fprintf(r->out, "%s\n", r->err.message);
  r->n_problems++;
}

/* ---------------------------------------------------------------- symbol versions */

enum { FAMILY_GLIBC, FAMILY_GLIBCXX, FAMILY_CXXABI, FAMILY_COUNT };

static const char *const family_prefix[FAMILY_COUNT] = {"GLIBC_", "GLIBCXX_", "CXXABI_"};

/* The newest versions each manylinux policy allows on x86_64 (auditwheel's policy table). */
static const kiln_platform platforms[] = {
    {"manylinux_2_17_x86_64", {2, 17, 0}, {3, 4, 19}, {1, 3, 7}},
    {"manylinux_2_24_x86_64", {2, 24, 0}, {3, 4, 22}, {1, 3, 10}},
    {"manylinux_2_27_x86_64", {2, 27, 0}, {3, 4, 24}, {1, 3, 11}},
    {"manylinux_2_28_x86_64", {2, 28, 0}, {3, 4, 24}, {1, 3, 11}},
    {"manylinux_2_31_x86_64", {2, 31, 0}, {3, 4, 28}, {1, 3, 12}},
    {"manylinux_2_34_x86_64", {2, 34, 0}, {3, 4, 29}, {1, 3, 13}},
    {"manylinux_2_35_x86_64", {2, 35, 0}, {3, 4, 30}, {1, 3, 13}},
    {"manylinux_2_39_x86_64", {2, 39, 0}, {3, 4, 33}, {1, 3, 15}},
};
#define N_PLATFORMS (sizeof platforms / sizeof platforms[0])

/* Version names without numbers, as the number of the first policy that allows them. */
static const struct {
  const char *name;
  int family;
  uint32_t version[3];
} named_versions[] = {
    {"GLIBC_ABI_DT_RELR", FAMILY_GLIBC, {2, 36, 0}},
    {"CXXABI_TM_1", FAMILY_CXXABI, {1, 3, 0}},
    {"CXXABI_FLOAT128", FAMILY_CXXABI, {1, 3, 10}},
};

static const uint32_t *platform_limit(const kiln_platform *p, int family) {
  return family == FAMILY_GLIBC ? p->glibc : family == FAMILY_GLIBCXX ? p->glibcxx : p->cxxabi;
}

static int version_cmp(const uint32_t a[3], const uint32_t b[3]) {
  for (int i = 0; i < 3; i++)
    if (a[i] != b[i]) return a[i] < b[i] ? -1 : 1;
  return 0;
}

/* "2.34" or "3.4.30": up to three numbers of at most four digits. */
static int parse_version(const char *s, uint32_t out[3]) {
  memset(out, 0, 3 * sizeof *out);
  for (int part = 0; part < 3; part++) {
    int digits = 0;
    while (*s >= '0' && *s <= '9') {
      if (++digits > 4) return -1;
      out[part] = out[part] * 10 + (uint32_t)(*s++ - '0');
    }
    if (digits == 0) return -1;
    if (*s == '\0') return 0;
    if (*s++ != '.') return -1;
  }
  return -1;
}

/* 1: name is a version of a policy family (written to family/version); 0: not a policy
 * family (GCC_3.0, a CUDA library's own versions); -1: a family version no policy allows. */
static int classify_version(const char *name, int *family, uint32_t version[3]) {
  for (size_t i = 0; i < sizeof named_versions / sizeof named_versions[0]; i++)
    if (strcmp(name, named_versions[i].name) == 0) {
      *family = named_versions[i].family;
      memcpy(version, named_versions[i].version, 3 * sizeof *version);
      return 1;
    }
  for (int f = 0; f < FAMILY_COUNT; f++) {
    size_t n = strlen(family_prefix[f]);
    if (strncmp(name, family_prefix[f], n) == 0) {
      *family = f;
      return parse_version(name + n, version) == 0 ? 1 : -1;
    }
  }
  return 0;
}

typedef struct version_needs {
  const char *newest[FAMILY_COUNT]; /* the version name, or NULL when the family is unused */
  uint32_t version[FAMILY_COUNT][3];
  const char *unallowed; /* a family version no policy allows (GLIBC_PRIVATE), or NULL */
} version_needs;

static void collect_needs(const kiln_elf *elf, version_needs *needs) {
  memset(needs, 0, sizeof *needs);
  for (uint32_t i = 0; i < elf->n_verneed; i++) {
    int family;
    uint32_t v[3];
    int kind = classify_version(elf->verneed[i].name, &family, v);
    if (kind < 0 && !needs->unallowed) needs->unallowed = elf->verneed[i].name;
    if (kind <= 0) continue;
    if (!needs->newest[family] || version_cmp(v, needs->version[family]) > 0) {
      needs->newest[family] = elf->verneed[i].name;
      memcpy(needs->version[family], v, sizeof v);
    }
  }
}

static int platform_allows(const kiln_platform *p, const version_needs *needs) {
  if (needs->unallowed) return 0;
  for (int f = 0; f < FAMILY_COUNT; f++)
    if (needs->newest[f] && version_cmp(needs->version[f], platform_limit(p, f)) > 0) return 0;
  return 1;
}

const kiln_platform *kiln_platform_find(const char *tag, size_t len) {
  for (size_t i = 0; i < N_PLATFORMS; i++)
    if (strlen(platforms[i].tag) == len && memcmp(platforms[i].tag, tag, len) == 0)
      return &platforms[i];
  return NULL;
}

const kiln_platform *kiln_platform_lowest(const kiln_elf *elf) {
  version_needs needs;
  collect_needs(elf, &needs);
  for (size_t i = 0; i < N_PLATFORMS; i++)
    if (platform_allows(&platforms[i], &needs)) return &platforms[i];
  return NULL;
}

/* Up to three undefined symbols bound to version name, comma-separated, into buf. */
static void symbols_needing(const kiln_elf *elf, const char *name, char *buf, size_t cap) {
  size_t used = 0, shown = 0;
  buf[0] = '\0';
  for (uint32_t i = 0; i < elf->n_dynsym; i++) {
    const kiln_elf_symbol *s = &elf->dynsym[i];
    const kiln_elf_version_need *need = kiln_elf_symbol_need(elf, s);
    if (s->defined || !need || strcmp(need->name, name) != 0) continue;
    if (shown == 3) {
      snprintf(buf + used, cap - used, ", ...");
      return;
    }
    int n = snprintf(buf + used, cap - used, "%s%s", shown ? ", " : "", s->name);
    if (n < 0 || (size_t)n >= cap - used) return;
    used += (size_t)n;
    shown++;
  }
  if (shown == 0) snprintf(buf, cap, "no symbol named");
}

static void format_limit(const kiln_platform *p, int family, char *buf, size_t cap) {
  const uint32_t *v = platform_limit(p, family);
  if (family == FAMILY_GLIBC)
    snprintf(buf, cap, "%s%u.%u", family_prefix[family], (unsigned)v[0], (unsigned)v[1]);
  else
    snprintf(buf, cap, "%s%u.%u.%u", family_prefix[family], (unsigned)v[0], (unsigned)v[1],
             (unsigned)v[2]);
}

static void check_versions(const kiln_elf *elf, const kiln_library_rules *rules,
                           kiln_audit_report *r) {
  version_needs needs;
  collect_needs(elf, &needs);
  char symbols[160], limit[32];
  if (needs.unallowed) {
    symbols_needing(elf, needs.unallowed, symbols, sizeof symbols);
    kiln_audit_refuse(r, kiln_fail(&r->err, KILN_ERR_UNSUPPORTED,
                                   "%.40s needs %.24s (%.64s), which no manylinux policy allows; "
                                   "stop using that private glibc interface",
                                   rules->name, needs.unallowed, symbols));
    return;
  }
  if (!rules->platform) {
    if (kiln_platform_lowest(elf)) return;
    const kiln_platform *newest = &platforms[N_PLATFORMS - 1];
    for (int f = 0; f < FAMILY_COUNT; f++) {
      if (!needs.newest[f] || version_cmp(needs.version[f], platform_limit(newest, f)) <= 0)
        continue;
      symbols_needing(elf, needs.newest[f], symbols, sizeof symbols);
      kiln_audit_refuse(r, kiln_fail(&r->err, KILN_ERR_UNSUPPORTED,
                                     "%.40s needs %.24s (%.48s), which no supported tag allows "
                                     "(newest %.24s); build in a manylinux container or with an "
                                     "older toolchain",
                                     rules->name, needs.newest[f], symbols, newest->tag));
    }
    return;
  }
  for (int f = 0; f < FAMILY_COUNT; f++) {
    if (!needs.newest[f] || version_cmp(needs.version[f], platform_limit(rules->platform, f)) <= 0)
      continue;
    symbols_needing(elf, needs.newest[f], symbols, sizeof symbols);
    format_limit(rules->platform, f, limit, sizeof limit);
    kiln_audit_refuse(r, kiln_fail(&r->err, KILN_ERR_UNSUPPORTED,
                                   "%.40s needs %.24s (%.48s) but %.24s allows up to %.20s; "
                                   "build in that manylinux container or with an older toolchain",
                                   rules->name, needs.newest[f], symbols, rules->platform->tag,
                                   limit));
  }
}

/* ---------------------------------------------------------------- what it links */

static const char *const allowed_needed[] = {
    "libexecutorch.so", "libcudart.so.13",  "libcublasLt.so.13", "libcublas.so.13",
    "libstdc++.so.6",   "libgcc_s.so.1",    "libm.so.6",         "libc.so.6",
    "libpthread.so.0",  "libdl.so.2",       "ld-linux-x86-64.so.2", "librt.so.1",
};

static int needed_allowed(const char *name) {
  for (size_t i = 0; i < sizeof allowed_needed / sizeof allowed_needed[0]; i++)
    if (strcmp(name, allowed_needed[i]) == 0) return 1;
  size_t n = strlen(name);
  /* cuDNN ships as libcudnn.so.9 plus sub-libraries libcudnn_<part>.so.9. */
  return strncmp(name, "libcudnn", 8) == 0 && n >= 13 && strcmp(name + n - 5, ".so.9") == 0;
}

static void check_needed(const kiln_elf *elf, const kiln_library_rules *rules,
                         kiln_audit_report *r) {
  for (uint32_t i = 0; i < elf->n_needed; i++) {
    if (needed_allowed(elf->needed[i])) continue;
    kiln_audit_refuse(r, kiln_fail(&r->err, KILN_ERR_UNSUPPORTED,
                                   "%.48s links %.48s, which a Kiln library must not (allowed: "
                                   "libexecutorch.so, CUDA runtime, cuBLAS, cuDNN, libc, libm, "
                                   "libstdc++); remove it from the link",
                                   rules->name, elf->needed[i]));
  }
}

static void check_search_path(const char *path, const char *tag, const kiln_library_rules *rules,
                              kiln_audit_report *r) {
  const char *entry = path;
  for (;;) {
    const char *end = strchr(entry, ':');
    size_t len = end ? (size_t)(end - entry) : strlen(entry);
    if (len == 0) {
      kiln_audit_refuse(r, kiln_fail(&r->err, KILN_ERR_UNSUPPORTED,
                                     "%.48s has an empty %.7s entry in '%.80s', which makes the "
                                     "loader search the current directory; remove the stray ':'",
                                     rules->name, tag, path));
    } else {
      size_t origin = strncmp(entry, "$ORIGIN", 7) == 0     ? 7
                      : strncmp(entry, "${ORIGIN}", 9) == 0 ? 9
                                                            : 0;
      if (origin == 0 || (origin < len && entry[origin] != '/')) {
        char shown[81];
        size_t n = len < sizeof shown - 1 ? len : sizeof shown - 1;
        memcpy(shown, entry, n);
        shown[n] = '\0';
        kiln_audit_refuse(r, kiln_fail(&r->err, KILN_ERR_UNSUPPORTED,
                                       "%.48s has %.7s entry '%.80s', which is not "
                                       "$ORIGIN-relative; use $ORIGIN/... so it finds its "
                                       "dependencies wherever it is installed",
                                       rules->name, tag, shown));
      }
    }
    if (!end) break;
    entry = end + 1;
  }
}

/* ---------------------------------------------------------------- symbols */

static const kiln_elf_symbol *find_defined(const kiln_elf_symbol *syms, uint32_t n,
                                           const char *name) {
  for (uint32_t i = 0; i < n; i++)
    if (syms[i].defined && strcmp(syms[i].name, name) == 0) return &syms[i];
  return NULL;
}

static int is_delegate(const kiln_elf *elf, const char *name) {
  if (strncmp(name, DELEGATE_PREFIX, strlen(DELEGATE_PREFIX)) == 0) return 1;
  for (uint32_t i = 0; i < elf->n_needed; i++)
    if (strcmp(elf->needed[i], "libexecutorch.so") == 0) return 1;
  return 0;
}

static void check_registration(const kiln_elf *elf, const kiln_library_rules *rules,
                               kiln_audit_report *r) {
  if (find_defined(elf->dynsym, elf->n_dynsym, REGISTER_BACKEND) ||
      find_defined(elf->symtab, elf->n_symtab, REGISTER_BACKEND)) {
    kiln_audit_refuse(r, kiln_fail(&r->err, KILN_ERR_UNSUPPORTED,
                                   "%.48s defines executorch::runtime::register_backend, so it "
                                   "registers into a private registry; link libexecutorch.so "
                                   "and import the symbol instead",
                                   rules->name));
    return;
  }
  if (!is_delegate(elf, rules->name)) return;
  int imported = 0;
  for (uint32_t i = 0; i < elf->n_dynsym; i++)
    if (!elf->dynsym[i].defined && strcmp(elf->dynsym[i].name, REGISTER_BACKEND) == 0)
      imported = 1;
  if (!imported)
    kiln_audit_refuse(r, kiln_fail(&r->err, KILN_ERR_UNSUPPORTED,
                                   "%.48s does not import executorch::runtime::register_backend, "
                                   "so loading it registers no backend; register from a static "
                                   "initializer against libexecutorch.so",
                                   rules->name));
  if (!elf->has_init_array)
    kiln_audit_refuse(r, kiln_fail(&r->err, KILN_ERR_UNSUPPORTED,
                                   "%.48s has no .init_array initializer, so loading it runs no "
                                   "registration; register the backend from a static initializer",
                                   rules->name));
}

static void check_exports(const kiln_elf *elf, const kiln_library_rules *rules,
                          kiln_audit_report *r) {
  for (uint32_t i = 0; i < rules->n_exports; i++) {
    const char *name = rules->exports[i];
    const kiln_elf_symbol *s = find_defined(elf->dynsym, elf->n_dynsym, name);
    if (s && s->bind != STB_LOCAL && s->visibility == STV_DEFAULT) continue;
    if (s || find_defined(elf->symtab, elf->n_symtab, name))
      kiln_audit_refuse(r, kiln_fail(&r->err, KILN_ERR_UNSUPPORTED,
                                     "%.48s: %.64s is present but hidden, so the loader cannot "
                                     "find it; give it default visibility (KILN_API)",
                                     rules->name, name));
    else
      kiln_audit_refuse(r, kiln_fail(&r->err, KILN_ERR_UNSUPPORTED,
                                     "%.48s does not define %.64s, which its users look up; "
                                     "build it from the sources that define and export it",
                                     rules->name, name));
  }
}

/* Symbols that only the C++ runtime itself defines, all older than every supported policy:
 * a library defining one carries a static copy. (Newer std::__throw_* helpers may be defined
 * legitimately: inline in headers, or from the toolchain's libstdc++_nonshared.a in the
 * manylinux containers.) */
static int is_cxx_runtime_symbol(const char *name) {
  static const char *const runtime_symbols[] = {
      "__cxa_throw",          "__cxa_allocate_exception",    "__cxa_begin_catch",
      "__gxx_personality_v0", "_ZSt4cout",                   "_ZSt9terminatev",
      "_ZNSt8ios_base4InitC1Ev", "_ZNSt6localeC1Ev",         "_ZNSt6locale7classicEv",
      "_ZSt17__throw_bad_allocv", "_ZSt20__throw_length_errorPKc",
      "_ZSt19__throw_logic_errorPKc", "_ZSt20__throw_out_of_rangePKc",
  };
  for (size_t i = 0; i < sizeof runtime_symbols / sizeof runtime_symbols[0]; i++)
    if (strcmp(name, runtime_symbols[i]) == 0) return 1;
  return 0;
}

static void check_cxx_runtime(const kiln_elf *elf, const kiln_library_rules *rules,
                              kiln_audit_report *r) {
  const kiln_elf_symbol *tables[2] = {elf->dynsym, elf->symtab};
  uint32_t counts[2] = {elf->n_dynsym, elf->n_symtab};
  for (int t = 0; t < 2; t++)
    for (uint32_t i = 0; i < counts[t]; i++) {
      if (!tables[t][i].defined || !is_cxx_runtime_symbol(tables[t][i].name)) continue;
      kiln_audit_refuse(r, kiln_fail(&r->err, KILN_ERR_UNSUPPORTED,
                                     "%.48s carries a private copy of the C++ runtime (defines "
                                     "%.64s); link libstdc++ as a shared library (drop "
                                     "-static-libstdc++)",
                                     rules->name, tables[t][i].name));
      return;
    }
}

void kiln_audit_library(const kiln_elf *elf, const kiln_library_rules *rules,
                        kiln_audit_report *r) {
  if (elf->machine != EM_X86_64)
    kiln_audit_refuse(r, kiln_fail(&r->err, KILN_ERR_UNSUPPORTED,
                                   "%.48s is built for ELF machine %u, not x86_64 (62); build it "
                                   "for x86_64, the only architecture the wheels support",
                                   rules->name, (unsigned)elf->machine));
  check_needed(elf, rules, r);
  if (elf->runpath) check_search_path(elf->runpath, "RUNPATH", rules, r);
  if (elf->rpath) check_search_path(elf->rpath, "RPATH", rules, r);
  check_versions(elf, rules, r);
  check_registration(elf, rules, r);
  check_exports(elf, rules, r);
  check_cxx_runtime(elf, rules, r);
}
