/* The strict metadata reader: every rule of the schema refuses with its exact message, and the
 * writer's output reads back to the same metadata. */
#include "runtime/alloc.h"
#include "runtime/utf8.h"
#include "kiln/kiln.h"
#include "check.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#define IO_X "\"io\": [{\"name\": \"x\", \"kind\": \"input\", \"dtype\": \"f32\", \"shape\": [1, 4]}]"
#define IO_XY                                                                              \
  "\"io\": [{\"name\": \"x\", \"kind\": \"input\", \"dtype\": \"f32\", \"shape\": [1, 4]}, " \
  "{\"name\": \"y\", \"kind\": \"output\", \"dtype\": \"f32\", \"shape\": [1, 4]}]"

static const char example[] =
    "{\"producer\": \"kiln 0.1.0\", \"device_id\": 0, \"min_compute_capability\": 80, "
    "\"allow_tf32\": false,\n"
    " \"io\": [{\"name\": \"x\", \"kind\": \"input\", \"dtype\": \"f32\", \"shape\": [1, 4], "
    "\"max_shape\": [1, 4]},\n"
    "        {\"name\": \"out0\", \"kind\": \"output\", \"dtype\": \"f16\", \"shape\": [1, 8]}],\n"
    " \"aliases\": []}";

static kiln_metadata md; /* large: keep it off the stack */

static kiln_status parse(const char *doc, kiln_error *err) {
  return kiln_metadata_parse(doc, strlen(doc), &md, err);
}

/* Byte offset of the n-th (from 1) occurrence of needle in doc. */
static long offset_of(const char *doc, const char *needle, int n) {
  const char *p = doc - 1;
  for (int i = 0; i < n; i++) p = strstr(p + 1, needle);
  return p ? (long)(p - doc) : -1;
}

/* Parses doc, expects a refusal as an invalid program with exactly the message built from fmt. */
static void refused_as(const char *doc, const char *fmt, ...) KILN_PRINTF(2, 3);
static void refused_as(const char *doc, const char *fmt, ...) {
  char expected[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(expected, sizeof expected, fmt, ap);
  va_end(ap);
  kiln_error err = {0, ""};
  kiln_status st = parse(doc, &err);
  CHECK(st == KILN_ERR_INVALID_PROGRAM);
  CHECK(err.status == KILN_ERR_INVALID_PROGRAM);
  CHECK_STR(err.message, expected);
  CHECK(md.n_bindings == 0 && md.device_id == 0); /* nothing half-read is left behind */
}

static void test_example(void) {
  kiln_error err = {0, ""};
  CHECK(parse(example, &err) == KILN_OK);
  CHECK_STR(md.producer, "kiln 0.1.0");
  CHECK(md.device_id == 0 && md.min_compute_capability == 80 && md.allow_tf32 == 0);
  CHECK(md.n_bindings == 2 && md.n_aliases == 0);
  CHECK_STR(md.bindings[0].name, "x");
  CHECK(md.bindings[0].kind == KILN_IO_INPUT && md.bindings[0].dtype == KILN_F32);
  CHECK(md.bindings[0].rank == 2 && md.bindings[0].shape[1] == 4);
  CHECK_STR(md.bindings[1].name, "out0");
  CHECK(md.bindings[1].kind == KILN_IO_OUTPUT && md.bindings[1].dtype == KILN_F16);
  CHECK(md.bindings[1].max_shape[0] == 1 && md.bindings[1].max_shape[1] == 8);

  const char *defaults = "{\"producer\": \"p\", \"device_id\": 3, " IO_X "}";
  CHECK(parse(defaults, &err) == KILN_OK);
  CHECK(md.device_id == 3 && md.min_compute_capability == 0 && md.allow_tf32 == 0);
  CHECK(md.n_aliases == 0 && md.n_bindings == 1);

  const char *tf32 = "{\"producer\": \"p\", \"device_id\": 2147483647, \"allow_tf32\": true, " IO_X "}";
  CHECK(parse(tf32, &err) == KILN_OK);
  CHECK(md.device_id == 2147483647 && md.allow_tf32 == 1);

  const char *dynamic = "{\"producer\": \"p\", \"device_id\": 0, \"io\": [{\"name\": \"x\", \"kind\": "
                        "\"input\", \"dtype\": \"bf16\", \"shape\": [1, 4611686018427387904], "
                        "\"max_shape\": [16, 4611686018427387904]}, {\"dtype\": \"bool\", \"shape\": "
                        "[], \"kind\": \"output\", \"name\": \"flag\"}]}";
  CHECK(parse(dynamic, &err) == KILN_OK);
  CHECK(md.bindings[0].shape[0] == 1 && md.bindings[0].max_shape[0] == 16);
  CHECK(md.bindings[0].shape[1] == (int64_t)1 << 62);
  CHECK(md.bindings[1].rank == 0 && md.bindings[1].dtype == KILN_BOOL);

  const char *alias = "{\"producer\": \"p\", \"device_id\": 0, " IO_XY
                      ", \"aliases\": [{\"output\": 0, \"input\": 0, \"kind\": \"inplace\"}]}";
  CHECK(parse(alias, &err) == KILN_OK);
  CHECK(md.n_aliases == 1 && md.aliases[0].output == 0 && md.aliases[0].input == 0);
  CHECK_STR(md.aliases[0].kind, "inplace");

  const char *escapes = "{\"producer\": \"a\\\"b\\\\c\\/d\\u00e9\\ud83d\\ude00\", \"device_id\": 0, "
                        IO_X "}";
  CHECK(parse(escapes, &err) == KILN_OK);
  CHECK_STR(md.producer, "a\"b\\c/d\xc3\xa9\xf0\x9f\x98\x80");
}

static void test_device_id_range(void) {
  const char *d;
  d = "{\"producer\": \"p\", \"device_id\": 4294967299, " IO_X "}";
  refused_as(d, "metadata device_id = 4294967299 at byte %ld is out of range 0..2147483647: "
                "re-export the program", offset_of(d, "4294967299", 1));
  d = "{\"producer\": \"p\", \"device_id\": 2147483648, " IO_X "}";
  refused_as(d, "metadata device_id = 2147483648 at byte %ld is out of range 0..2147483647: "
                "re-export the program", offset_of(d, "2147483648", 1));
  d = "{\"producer\": \"p\", \"device_id\": -1, " IO_X "}";
  refused_as(d, "metadata device_id = -1 at byte %ld is out of range 0..2147483647: re-export the "
                "program", offset_of(d, "-1", 1));
  d = "{\"producer\": \"p\", \"device_id\": 18446744073709551619, " IO_X "}";
  refused_as(d, "metadata device_id = 18446744073709551619 at byte %ld is out of range "
                "0..2147483647: re-export the program", offset_of(d, "1844", 1));
  d = "{\"producer\": \"p\", \"device_id\": -9223372036854775808, " IO_X "}";
  refused_as(d, "metadata device_id = -9223372036854775808 at byte %ld is out of range "
                "0..2147483647: re-export the program", offset_of(d, "-92", 1));
  d = "{\"producer\": \"p\", \"device_id\": 0, \"min_compute_capability\": 1001, " IO_X "}";
  refused_as(d, "metadata min_compute_capability = 1001 at byte %ld is out of range 0..1000: "
                "re-export the program", offset_of(d, "1001", 1));
}

static void test_not_integers(void) {
  static const char *const bad[] = {"3.5", "3e2", "12abc", "0x3", "007", "-", "\"3\"", "true",
                                    "null"};
  char doc[256];
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    snprintf(doc, sizeof doc, "{\"producer\": \"p\", \"device_id\": %s, %s}", bad[i], IO_X);
    refused_as(doc, "metadata device_id at byte %ld is not an integer (\"%s\"): re-export the "
                    "program", offset_of(doc, bad[i], 1), bad[i]);
  }
  const char *d = "{\"producer\": \"p\", \"device_id\": 3}";
  CHECK(parse(d, NULL) == KILN_ERR_INVALID_PROGRAM); /* 3} ends at '}' yet io is missing */
  d = "{\"producer\": \"p\", \"device_id\":7, " IO_X "}";
  CHECK(parse(d, NULL) == KILN_OK && md.device_id == 7);
  d = "{\"producer\": \"p\", \"device_id\": 5\n, " IO_X "}";
  CHECK(parse(d, NULL) == KILN_OK && md.device_id == 5);
}

static void test_not_booleans(void) {
  static const char *const bad[] = {"trueX", "falsehood", "1", "\"true\"", "True", "nul"};
  char doc[256];
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    snprintf(doc, sizeof doc, "{\"producer\": \"p\", \"device_id\": 0, \"allow_tf32\": %s, %s}", bad[i],
             IO_X);
    refused_as(doc, "metadata allow_tf32 at byte %ld is not true or false (\"%s\"): re-export the "
                    "program", offset_of(doc, bad[i], 1), bad[i]);
  }
}

static void test_nested_lookalikes(void) {
  kiln_error err = {0, ""};
  const char *before = "{\"annotations\": {\"device_id\": 7, \"x\": [{\"device_id\": 8}]}, "
                       "\"producer\": \"p\", \"device_id\": 2, " IO_X "}";
  CHECK(parse(before, &err) == KILN_OK);
  CHECK(md.device_id == 2);
  const char *after = "{\"producer\": \"p\", \"device_id\": 2, " IO_X
                      ", \"annotations\": {\"device_id\": 7, \"io\": []}}";
  CHECK(parse(after, &err) == KILN_OK);
  CHECK(md.device_id == 2 && md.n_bindings == 1);
  const char *in_string = "{\"producer\": \"\\\"device_id\\\": 9, device_id: 9\", \"device_id\": 1, "
                          IO_X "}";
  CHECK(parse(in_string, &err) == KILN_OK);
  CHECK(md.device_id == 1);
  /* Only the nested and quoted lookalikes are present: the real key is missing. */
  const char *only_nested = "{\"producer\": \"device_id: 9\", \"annotations\": {\"device_id\": 7}, "
                            IO_X "}";
  refused_as(only_nested, "metadata is missing required key \"device_id\": re-export the program");
  /* A name is a key only when a colon follows it. */
  const char *no_colon = "{\"producer\": \"p\", \"device_id\" 4, " IO_X "}";
  refused_as(no_colon, "metadata is not valid JSON at byte %ld: expected ':' after a key; "
                       "re-export the program", offset_of(no_colon, " 4", 1) + 1);
  const char *bare = "{\"producer\": \"p\", device_id: 4, " IO_X "}";
  refused_as(bare, "metadata is not valid JSON at byte %ld: expected a key in double quotes; "
                   "re-export the program", offset_of(bare, "device_id", 1));
  /* A nested device_id out of range is not read as the real one either. */
  const char *nested_bad = "{\"annotations\": {\"device_id\": 4294967299}, \"producer\": \"p\", "
                           "\"device_id\": 0, " IO_X "}";
  CHECK(parse(nested_bad, &err) == KILN_OK);
  CHECK(md.device_id == 0);
}

static void test_keys(void) {
  const char *d;
  d = "{\"producer\": \"p\", \"device_id\": 0, \"io\": [{\"name\": \"x\", \"kind\": \"input\", "
      "\"dtpye\": \"f32\", \"shape\": [1]}]}";
  refused_as(d, "metadata io[0] has unknown key \"dtpye\" at byte %ld: a misspelled or newer key; "
                "re-export the program with this Kiln release", offset_of(d, "\"dtpye", 1));
  d = "{\"producer\": \"p\", \"device_id\": 0, \"io\": [{\"name\": \"x\", \"kind\": \"input\", "
      "\"shape\": [1]}]}";
  refused_as(d, "metadata io[0] is missing required key \"dtype\": re-export the program");
  d = "{\"producer\": \"p\", \"device_id\": 0, \"device_idd\": 1, " IO_X "}";
  refused_as(d, "metadata has unknown key \"device_idd\" at byte %ld: a misspelled or newer key; "
                "re-export the program with this Kiln release", offset_of(d, "\"device_idd", 1));
  d = "{\"producer\": \"p\", \"device_id\": 0, \"device_id\": 1, " IO_X "}";
  refused_as(d, "metadata has duplicate key \"device_id\" at byte %ld: each key may appear once; "
                "re-export the program", offset_of(d, "\"device_id", 2));
  d = "{\"producer\": \"p\", \"device_id\": 0, " IO_X ", " IO_X "}";
  refused_as(d, "metadata has duplicate key \"io\" at byte %ld: each key may appear once; "
                "re-export the program", offset_of(d, "\"io", 2));
  d = "{\"producer\": \"p\", \"device_id\": 0, \"io\": [{\"name\": \"x\", \"name\": \"y\", \"kind\": "
      "\"input\", \"dtype\": \"f32\", \"shape\": [1]}]}";
  refused_as(d, "metadata io[0] has duplicate key \"name\" at byte %ld: each key may appear once; "
                "re-export the program", offset_of(d, "\"name", 2));
  d = "{\"producer\": \"p\", \"device_id\": 0, \"dev\\nice\": 1, " IO_X "}";
  refused_as(d, "metadata has unknown key \"dev?ice\" at byte %ld: a misspelled or newer key; "
                "re-export the program with this Kiln release", offset_of(d, "\"dev\\n", 1));
  d = "{\"device_id\": 0, " IO_X "}";
  refused_as(d, "metadata is missing required key \"producer\": re-export the program");
  d = "{\"producer\": \"p\", \"device_id\": 0}";
  refused_as(d, "metadata is missing required key \"io\": re-export the program");
  d = "{}";
  refused_as(d, "metadata is missing required key \"producer\": re-export the program");
  d = "{\"producer\": \"p\", \"device_id\": 0, " IO_XY
      ", \"aliases\": [{\"output\": 0, \"kind\": \"inplace\"}]}";
  refused_as(d, "metadata aliases[0] is missing required key \"input\": re-export the program");
  d = "{\"producer\": \"p\", \"device_id\": 0, " IO_XY
      ", \"aliases\": [{\"output\": 0, \"input\": 0, \"kind\": \"inplace\", \"when\": 1}]}";
  refused_as(d, "metadata aliases[0] has unknown key \"when\" at byte %ld: a misspelled or newer "
                "key; re-export the program with this Kiln release", offset_of(d, "\"when", 1));
}

static void test_aliases(void) {
  const char *d;
  d = "{\"producer\": \"p\", \"device_id\": 0, " IO_XY
      ", \"aliases\": [{\"output\": 1, \"input\": 0, \"kind\": \"inplace\"}]}";
  refused_as(d, "metadata aliases[0].output = 1 is out of range: the metadata has 1 outputs; "
                "re-export the program");
  d = "{\"producer\": \"p\", \"device_id\": 0, " IO_XY
      ", \"aliases\": [{\"output\": 0, \"input\": 4, \"kind\": \"inplace\"}]}";
  refused_as(d, "metadata aliases[0].input = 4 is out of range: the metadata has 1 inputs; "
                "re-export the program");
  d = "{\"producer\": \"p\", \"device_id\": 0, " IO_XY
      ", \"aliases\": [{\"output\": 0, \"input\": 4294967296, \"kind\": \"inplace\"}]}";
  refused_as(d, "metadata aliases[0].input = 4294967296 at byte %ld is out of range 0..4294967295: "
                "re-export the program", offset_of(d, "4294967296", 1));
  d = "{\"producer\": \"p\", \"device_id\": 0, " IO_XY
      ", \"aliases\": [{\"output\": 0, \"input\": 0, \"kind\": \"copy\"}]}";
  refused_as(d, "metadata aliases[0].kind at byte %ld is \"copy\", not \"inplace\": re-export the "
                "program", offset_of(d, "\"copy", 1));
  d = "{\"producer\": \"p\", \"device_id\": 0, \"io\": [{\"name\": \"x\", \"kind\": \"input\", "
      "\"dtype\": \"f32\", \"shape\": [1, 4]}, {\"name\": \"y\", \"kind\": \"output\", \"dtype\": "
      "\"f16\", \"shape\": [1, 4]}], \"aliases\": [{\"output\": 0, \"input\": 0, \"kind\": "
      "\"inplace\"}]}";
  refused_as(d, "metadata aliases[0] pairs output \"y\" with input \"x\" of a different dtype or "
                "shape: re-export the program");
  d = "{\"producer\": \"p\", \"device_id\": 0, \"io\": [{\"name\": \"x\", \"kind\": \"input\", "
      "\"dtype\": \"f32\", \"shape\": [1, 4]}, {\"name\": \"y\", \"kind\": \"output\", \"dtype\": "
      "\"f32\", \"shape\": [1, 5]}], \"aliases\": [{\"output\": 0, \"input\": 0, \"kind\": "
      "\"inplace\"}]}";
  refused_as(d, "metadata aliases[0] pairs output \"y\" with input \"x\" of a different dtype or "
                "shape: re-export the program");
  d = "{\"producer\": \"p\", \"device_id\": 0, " IO_XY
      ", \"aliases\": [{\"output\": 0, \"input\": 0, \"kind\": \"inplace\"}, {\"output\": 0, "
      "\"input\": 0, \"kind\": \"inplace\"}]}";
  refused_as(d, "metadata aliases[1] repeats output 0 or input 0 of aliases[0]: re-export the "
                "program");
}

static void test_bindings(void) {
  const char *d;
  char doc[8192];
  d = "{\"producer\": \"p\", \"device_id\": 0, \"io\": [{\"name\": \"x\", \"kind\": \"inout\", "
      "\"dtype\": \"f32\", \"shape\": [1]}]}";
  refused_as(d, "metadata io[0].kind at byte %ld is \"inout\", not \"input\" or \"output\": "
                "re-export the program", offset_of(d, "\"inout", 1));
  d = "{\"producer\": \"p\", \"device_id\": 0, \"io\": [{\"name\": \"x\", \"kind\": \"input\", "
      "\"dtype\": \"f64\", \"shape\": [1]}]}";
  refused_as(d, "metadata io[0].dtype at byte %ld names unknown dtype \"f64\": expected f32, f16, "
                "bf16, i64, i32 or bool; re-export the program", offset_of(d, "\"f64", 1));
  d = "{\"producer\": \"p\", \"device_id\": 0, \"io\": [{\"name\": \"x\", \"kind\": \"input\", "
      "\"dtype\": \"f32\", \"shape\": [1, 2, 3, 4, 5, 6, 7, 8, 9]}]}";
  refused_as(d, "metadata io[0].shape has more than 8 dimensions (at byte %ld): Kiln supports 8 at "
                "most; re-export the program", offset_of(d, "9]", 1));
  d = "{\"producer\": \"p\", \"device_id\": 0, \"io\": [{\"name\": \"x\", \"kind\": \"input\", "
      "\"dtype\": \"f32\", \"shape\": [1, 4611686018427387905]}]}";
  refused_as(d, "metadata io[0].shape[1] = 4611686018427387905 at byte %ld is out of range "
                "0..4611686018427387904: re-export the program", offset_of(d, "46", 1));
  d = "{\"producer\": \"p\", \"device_id\": 0, \"io\": [{\"name\": \"x\", \"kind\": \"input\", "
      "\"dtype\": \"f32\", \"shape\": [-1]}]}";
  refused_as(d, "metadata io[0].shape[0] = -1 at byte %ld is out of range 0..4611686018427387904: "
                "re-export the program", offset_of(d, "-1", 1));
  d = "{\"producer\": \"p\", \"device_id\": 0, \"io\": [{\"name\": \"x\", \"kind\": \"input\", "
      "\"dtype\": \"f32\", \"shape\": 4}]}";
  refused_as(d, "metadata io[0].shape at byte %ld is not a JSON array: re-export the program",
             offset_of(d, "4}", 1));
  d = "{\"producer\": \"p\", \"device_id\": 0, \"io\": [{\"name\": \"x\", \"kind\": \"input\", "
      "\"dtype\": \"f32\", \"shape\": [1, 4], \"max_shape\": [2]}]}";
  refused_as(d, "metadata io[0] max_shape has 1 dimensions but shape has 2: re-export the program");
  d = "{\"producer\": \"p\", \"device_id\": 0, \"io\": [{\"name\": \"x\", \"kind\": \"input\", "
      "\"dtype\": \"f32\", \"shape\": [1, 4], \"max_shape\": [2, 3]}]}";
  refused_as(d, "metadata io[0] (\"x\") max_shape[1] = 3 is below shape[1] = 4: re-export the "
                "program");
  d = "{\"producer\": \"p\", \"device_id\": 0, \"io\": [{\"name\": \"\", \"kind\": \"input\", "
      "\"dtype\": \"f32\", \"shape\": [1]}]}";
  refused_as(d, "metadata io[0].name at byte %ld is 0 bytes long, outside 1..63: re-export the "
                "program", offset_of(d, "\"\"", 1));
  d = "{\"producer\": \"p\", \"device_id\": 0, \"io\": [{\"name\": \"x\\ty\", \"kind\": \"input\", "
      "\"dtype\": \"f32\", \"shape\": [1]}]}";
  refused_as(d, "metadata io[0].name at byte %ld contains a control character: re-export the "
                "program", offset_of(d, "\"x\\", 1));
  d = "{\"producer\": 5, \"device_id\": 0, " IO_X "}";
  refused_as(d, "metadata producer at byte %ld is not a string: re-export the program",
             offset_of(d, "5", 1));
  d = "{\"producer\": \"p\", \"device_id\": 0, \"io\": {}}";
  refused_as(d, "metadata io at byte %ld is not a JSON array: re-export the program",
             offset_of(d, "{}", 1));
  d = "{\"producer\": \"p\", \"device_id\": 0, \"io\": [[1]]}";
  refused_as(d, "metadata io[0] at byte %ld is not a JSON object: re-export the program",
             offset_of(d, "[1]", 1));

  /* Names of 63 bytes are kept whole; 64 is one too many. */
  char name[65];
  memset(name, 'n', 64);
  name[64] = '\0';
  snprintf(doc, sizeof doc, "{\"producer\": \"p\", \"device_id\": 0, \"io\": [{\"name\": \"%s\", "
           "\"kind\": \"input\", \"dtype\": \"f32\", \"shape\": [1]}]}", name);
  refused_as(doc, "metadata io[0].name at byte %ld is 64 bytes long, outside 1..63: re-export the "
                  "program", offset_of(doc, "\"nnn", 1));
  name[63] = '\0';
  snprintf(doc, sizeof doc, "{\"producer\": \"p\", \"device_id\": 0, \"io\": [{\"name\": \"%s\", "
           "\"kind\": \"input\", \"dtype\": \"f32\", \"shape\": [1]}]}", name);
  CHECK(parse(doc, NULL) == KILN_OK);
  CHECK(strlen(md.bindings[0].name) == 63);
}

/* Builds a document with n copies of one binding. */
static char *many_bindings(unsigned n) {
  static const char one[] = "{\"name\": \"b\", \"kind\": \"input\", \"dtype\": \"f32\", \"shape\": [1]}";
  size_t cap = 64 + (size_t)n * (sizeof one + 2);
  char *doc = malloc(cap);
  if (!doc) return NULL;
  size_t len = (size_t)snprintf(doc, cap, "{\"producer\": \"p\", \"device_id\": 0, \"io\": [");
  for (unsigned i = 0; i < n; i++)
    len += (size_t)snprintf(doc + len, cap - len, "%s%s", i ? ", " : "", one);
  snprintf(doc + len, cap - len, "]}");
  return doc;
}

static void test_counts(void) {
  char *doc = many_bindings(KILN_MAX_BINDINGS);
  CHECK(doc && parse(doc, NULL) == KILN_OK && md.n_bindings == KILN_MAX_BINDINGS);
  free(doc);
  doc = many_bindings(KILN_MAX_BINDINGS + 1);
  CHECK(doc != NULL);
  if (doc) {
    refused_as(doc, "metadata io has more than 256 bindings (at byte %ld): Kiln supports 256 at "
                    "most; re-export the program",
               offset_of(doc, "{\"name\"", KILN_MAX_BINDINGS + 1));
    free(doc);
  }
}

static void test_strings(void) {
  const char *d;
  d = "{\"producer\": \"p\\x41\", \"device_id\": 0, " IO_X "}";
  refused_as(d, "metadata string has an invalid escape at byte %ld: only \\\" \\\\ \\/ \\b \\f \\n "
                "\\r \\t and \\uXXXX are allowed; re-export the program", offset_of(d, "\\x", 1));
  d = "{\"producer\": \"p\\u12G4\", \"device_id\": 0, " IO_X "}";
  refused_as(d, "metadata string has an invalid escape at byte %ld: only \\\" \\\\ \\/ \\b \\f \\n "
                "\\r \\t and \\uXXXX are allowed; re-export the program", offset_of(d, "\\u", 1));
  d = "{\"producer\": \"p\\ud800x\", \"device_id\": 0, " IO_X "}";
  refused_as(d, "metadata string has an invalid escape at byte %ld: only \\\" \\\\ \\/ \\b \\f \\n "
                "\\r \\t and \\uXXXX are allowed; re-export the program", offset_of(d, "\\u", 1));
  d = "{\"producer\": \"p\\udc00\", \"device_id\": 0, " IO_X "}";
  refused_as(d, "metadata string has an invalid escape at byte %ld: only \\\" \\\\ \\/ \\b \\f \\n "
                "\\r \\t and \\uXXXX are allowed; re-export the program", offset_of(d, "\\u", 1));
  d = "{\"producer\": \"p\tq\", \"device_id\": 0, " IO_X "}";
  refused_as(d, "metadata string has a raw control character at byte %ld: escape it; re-export the "
                "program", offset_of(d, "\t", 1));
  d = "{\"producer\": \"p, \"device_id\": 0}";
  refused_as(d, "metadata is not valid JSON at byte %ld: expected ',' or '}'; re-export the "
                "program", offset_of(d, "device_id", 1));
  d = "{\"producer\": \"unterminated";
  refused_as(d, "metadata string starting at byte %ld is not terminated: re-export the program",
             offset_of(d, "\"unt", 1));
  d = "{\"producer\": \"ends in a backslash\\";
  refused_as(d, "metadata string starting at byte %ld is not terminated: re-export the program",
             offset_of(d, "\"ends", 1));
}

/* A document whose binding is named `name` (raw bytes, as written into the JSON). */
static const char *named(const char *name) {
  static char doc[256];
  snprintf(doc, sizeof doc,
           "{\"producer\": \"p\", \"device_id\": 0, \"io\": [{\"name\": \"%s\", \"kind\": "
           "\"input\", \"dtype\": \"f32\", \"shape\": [1]}]}",
           name);
  return doc;
}

/* JSON is UTF-8: malformed sequences anywhere in a string, and control characters in a name,
 * are refused; well-formed text of any plane is kept byte for byte. */
static void test_utf8(void) {
  static const char *const malformed[] = {
      "\xff\xfe",          /* bytes never in UTF-8 */
      "\xc0\xaf",          /* overlong '/' */
      "\xe0\x80\xaf",      /* overlong '/' in three bytes */
      "\xed\xa0\x80",      /* the surrogate U+D800 */
      "\xf4\x90\x80\x80",  /* U+110000 */
      "a\x80",             /* a stray continuation byte */
      "\xe2\x82",          /* a truncated sequence */
  };
  static const char *const controls[] = {"a\x7f", "a\xc2\x85", "a\\u007f", "a\\u0085", "a\\u0000"};
  kiln_error err = {0, ""};
  const char *d;
  for (size_t i = 0; i < sizeof malformed / sizeof *malformed; i++) {
    d = named(malformed[i]);
    refused_as(d, "metadata string has a byte sequence at byte %ld that is not UTF-8 (overlong, "
                  "surrogate or past U+10FFFF); re-export the program",
               (long)(strstr(d, malformed[i]) - d) + (malformed[i][0] == 'a'));
  }
  for (size_t i = 0; i < sizeof controls / sizeof *controls; i++) {
    d = named(controls[i]);
    refused_as(d, "metadata io[0].name at byte %ld contains a control character: re-export the "
                  "program", (long)(strstr(d, controls[i]) - d) - 1);
  }
  /* Also in strings the reader only skips, such as an annotation. */
  d = "{\"producer\": \"p\", \"device_id\": 0, " IO_X ", \"annotations\": [\"\xc0\xaf\"]}";
  refused_as(d, "metadata string has a byte sequence at byte %ld that is not UTF-8 (overlong, "
                "surrogate or past U+10FFFF); re-export the program", offset_of(d, "\xc0", 1));
  /* A key: refused before its bytes could reach a message. */
  d = "{\"\xf0roducer\": \"p\", \"device_id\": 0, " IO_X "}";
  refused_as(d, "metadata string has a byte sequence at byte %ld that is not UTF-8 (overlong, "
                "surrogate or past U+10FFFF); re-export the program", offset_of(d, "\xf0", 1));
  /* Well-formed UTF-8 is kept, and shown in messages as '?' per byte. */
  CHECK(parse(named("gr\xc3\xb6\xc3\x9f" "e \xe2\x82\xac \xf0\x9f\x94\xa5"), &err) == KILN_OK);
  CHECK_STR(md.bindings[0].name, "gr\xc3\xb6\xc3\x9f" "e \xe2\x82\xac \xf0\x9f\x94\xa5");
  CHECK(parse(named("\\u00e9\\ud83d\\udd25"), &err) == KILN_OK);
  CHECK_STR(md.bindings[0].name, "\xc3\xa9\xf0\x9f\x94\xa5");
  d = "{\"pr\xc3\xb6" "ducer\": \"p\", \"device_id\": 0, " IO_X "}";
  refused_as(d, "metadata has unknown key \"pr??ducer\" at byte %ld: a misspelled or newer key; "
                "re-export the program with this Kiln release", offset_of(d, "\"pr", 1));
}

/* The decoder never reads past the bytes it is given, however the sequence continues. */
static void test_utf8_bounds(void) {
  uint32_t cp = 0;
  CHECK(kiln_utf8_next((const unsigned char *)"\xe2\x82\xac", 3, &cp) == 3 && cp == 0x20AC);
  CHECK(kiln_utf8_next((const unsigned char *)"\xe2\x82\xac", 2, &cp) == 0);
  CHECK(kiln_utf8_next((const unsigned char *)"\xf0\x9f\x94\xa5", 3, &cp) == 0);
  CHECK(kiln_utf8_next((const unsigned char *)"a", 0, &cp) == 0);
}

/* kiln_fail keeps every message to printable ASCII, whatever its arguments hold. */
static void test_message_bytes(void) {
  kiln_error err = {0, ""};
  CHECK(kiln_fail(&err, KILN_ERR_INVALID_ARGUMENT, "name \"%s\"; pass another",
                  "a\xf0\x01\x7f\n\xc3\xb6z") == KILN_ERR_INVALID_ARGUMENT);
  CHECK_STR(err.message, "name \"a??????z\"; pass another");
}

static void test_truncation(void) {
  refused_as("", "metadata ends early at byte 0 (truncated document): re-export the program");
  refused_as("  \n", "metadata ends early at byte 3 (truncated document): re-export the program");
  const char *d = "{\"producer\": \"p\", \"device_id\": 12";
  refused_as(d, "metadata ends early at byte %ld (truncated document): re-export the program",
             (long)strlen(d));
  d = "{\"producer\": \"p\", \"allow_tf32\": true";
  refused_as(d, "metadata ends early at byte %ld (truncated document): re-export the program",
             (long)strlen(d));
  /* Every proper prefix of a valid document is refused, and none is misread. */
  size_t n = strlen(example);
  int all_refused = 1;
  for (size_t len = 0; len < n; len++) {
    kiln_error err = {0, ""};
    if (kiln_metadata_parse(example, len, &md, &err) != KILN_ERR_INVALID_PROGRAM) all_refused = 0;
  }
  CHECK(all_refused);
  d = "{\"producer\": \"p\", \"device_id\": 0, " IO_X "} {";
  refused_as(d, "metadata has trailing bytes at byte %ld after the closing '}': re-export the "
                "program", (long)strlen(d) - 1);
  d = "{\"producer\": \"p\", \"device_id\": 0, " IO_X ",}";
  refused_as(d, "metadata is not valid JSON at byte %ld: expected a key in double quotes; "
                "re-export the program", (long)strlen(d) - 1);
}

static void test_nesting(void) {
  enum { DEEP = 100000 };
  char *doc = malloc(DEEP + 64);
  CHECK(doc != NULL);
  if (!doc) return;
  memset(doc, '[', DEEP);
  doc[DEEP] = '\0';
  refused_as(doc, "metadata at byte 0 is not a JSON object: re-export the program");
  int head = snprintf(doc, 64, "{\"annotations\": ");
  memset(doc + head, '[', DEEP);
  doc[head + DEEP] = '\0';
  /* The annotations value is level 2 under the document; level 33 is refused. */
  refused_as(doc, "metadata nests deeper than 32 levels at byte %ld: re-export the program",
             (long)head + 31);
  head = snprintf(doc, 64, "{\"annotations\": ");
  memset(doc + head, '{', 1);
  for (int i = 1; i < DEEP / 8; i++) memcpy(doc + head + 1 + (i - 1) * 6, "\"k\": {", 6);
  doc[head + 1 + (DEEP / 8 - 1) * 6] = '\0';
  refused_as(doc, "metadata nests deeper than 32 levels at byte %ld: re-export the program",
             (long)head + 1 + 30 * 6 + 5);
  free(doc);

  /* 31 levels inside the annotations are accepted. */
  char ok[256];
  int n = snprintf(ok, sizeof ok, "{\"producer\": \"p\", \"device_id\": 0, %s, \"annotations\": ", IO_X);
  for (int i = 0; i < 31; i++) ok[n++] = '[';
  for (int i = 0; i < 31; i++) ok[n++] = ']';
  snprintf(ok + n, sizeof ok - (size_t)n, "}");
  CHECK(parse(ok, NULL) == KILN_OK);
}

static void test_annotations(void) {
  kiln_error err = {0, ""};
  const char *d = "{\"producer\": \"p\", \"device_id\": 0, " IO_X ", \"annotations\": {\"a\": [1, "
                  "-2.5e-3, 0, true, false, null, \"s\\n\\u0041\", {}, []], \"b\": {\"c\": 1E+2}}}";
  CHECK(parse(d, &err) == KILN_OK);
  d = "{\"producer\": \"p\", \"device_id\": 0, " IO_X ", \"annotations\": [1.]}";
  refused_as(d, "metadata is not valid JSON at byte %ld: expected a JSON value; re-export the "
                "program", offset_of(d, "1.", 1));
  d = "{\"producer\": \"p\", \"device_id\": 0, " IO_X ", \"annotations\": [01]}";
  refused_as(d, "metadata is not valid JSON at byte %ld: expected a JSON value; re-export the "
                "program", offset_of(d, "01", 1));
  d = "{\"producer\": \"p\", \"device_id\": 0, " IO_X ", \"annotations\": {\"a\" 1}}";
  refused_as(d, "metadata is not valid JSON at byte %ld: expected ':' after a key; re-export the "
                "program", offset_of(d, " 1}", 1) + 1);
  d = "{\"producer\": \"p\", \"device_id\": 0, " IO_X ", \"annotations\": [1 2]}";
  refused_as(d, "metadata is not valid JSON at byte %ld: expected ',' or ']'; re-export the "
                "program", offset_of(d, "2]", 1));
  d = "{\"producer\": \"p\", \"device_id\": 0, " IO_X ", \"annotations\": [nullx]}";
  refused_as(d, "metadata is not valid JSON at byte %ld: expected a JSON value; re-export the "
                "program", offset_of(d, "nullx", 1));
}

static void test_arguments(void) {
  kiln_error err = {0, ""};
  CHECK(kiln_metadata_parse(NULL, 4, &md, &err) == KILN_ERR_INVALID_ARGUMENT);
  CHECK_STR(err.message, "metadata pointer is NULL but its length is 4: pass the metadata bytes");
  CHECK(kiln_metadata_parse("{}", 2, NULL, &err) == KILN_ERR_INVALID_ARGUMENT);
  CHECK_STR(err.message, "kiln_metadata_parse needs an output: pass a kiln_metadata to fill");
  char *out = NULL;
  size_t len = 0;
  CHECK(kiln_metadata_write(NULL, &out, &len, &err) == KILN_ERR_INVALID_ARGUMENT);
  CHECK_STR(err.message, "kiln_metadata_write needs metadata, out and out_len: pass all three");
}

static kiln_metadata written, reread;

static void test_round_trip(void) {
  kiln_error err = {0, ""};
  memset(&written, 0, sizeof written);
  snprintf(written.producer, sizeof written.producer, "kiln \"%s\" \\", KILN_VERSION_STRING);
  written.device_id = 3;
  written.min_compute_capability = 90;
  written.allow_tf32 = 1;
  written.n_bindings = 3;
  kiln_binding *b = written.bindings;
  snprintf(b[0].name, sizeof b[0].name, "tokens");
  b[0].kind = KILN_IO_INPUT;
  b[0].dtype = KILN_I64;
  b[0].rank = 2;
  b[0].shape[0] = 1, b[0].shape[1] = 7;
  b[0].max_shape[0] = 1, b[0].max_shape[1] = 128;
  snprintf(b[1].name, sizeof b[1].name, "cache");
  b[1].kind = KILN_IO_INPUT;
  b[1].dtype = KILN_BF16;
  b[1].rank = 3;
  b[1].shape[0] = 2, b[1].shape[1] = 3, b[1].shape[2] = (int64_t)1 << 62;
  memcpy(b[1].max_shape, b[1].shape, sizeof b[1].shape);
  b[2] = b[1];
  snprintf(b[2].name, sizeof b[2].name, "cache_out");
  b[2].kind = KILN_IO_OUTPUT;
  written.n_aliases = 1;
  written.aliases[0].output = 0;
  written.aliases[0].input = 1;
  snprintf(written.aliases[0].kind, sizeof written.aliases[0].kind, "inplace");

  char *json = NULL, *again = NULL;
  size_t len = 0, len2 = 0;
  CHECK(kiln_metadata_write(&written, &json, &len, &err) == KILN_OK);
  CHECK(json && strlen(json) == len);
  CHECK(kiln_metadata_parse(json, len, &reread, &err) == KILN_OK);
  CHECK(memcmp(&written, &reread, sizeof written) == 0);
  CHECK(kiln_metadata_write(&reread, &again, &len2, &err) == KILN_OK);
  CHECK(again && len == len2 && memcmp(json, again, len) == 0);
  kiln_free(json);
  kiln_free(again);

  /* The example document reads and writes back to an equivalent document. */
  CHECK(parse(example, &err) == KILN_OK);
  CHECK(kiln_metadata_write(&md, &json, &len, &err) == KILN_OK);
  CHECK(json && kiln_metadata_parse(json, len, &reread, &err) == KILN_OK);
  CHECK(memcmp(&md, &reread, sizeof md) == 0);
  kiln_free(json);

  /* The writer refuses what the reader would refuse, so it never writes an unreadable blob. */
  written.aliases[0].input = 2;
  CHECK(kiln_metadata_write(&written, &json, &len, &err) == KILN_ERR_INVALID_ARGUMENT);
  CHECK_STR(err.message, "metadata aliases[0].input = 2 is out of range: the metadata has 2 inputs; "
                         "re-export the program");
  CHECK(json == NULL);
  written.aliases[0].input = 1;
  written.bindings[1].dtype = (kiln_dtype)9;
  CHECK(kiln_metadata_write(&written, &json, &len, &err) == KILN_ERR_INVALID_ARGUMENT);
  CHECK_STR(err.message, "metadata io[1] (\"cache\") has kind 0, dtype 9 or rank 3 out of range: "
                         "fix the binding");
  written.bindings[1].dtype = KILN_BF16;
  written.bindings[0].name[0] = '\0';
  CHECK(kiln_metadata_write(&written, &json, &len, &err) == KILN_ERR_INVALID_ARGUMENT);
  CHECK_STR(err.message, "metadata io[0] name must be 1 to 63 bytes of printable UTF-8: name the "
                         "binding");
  memcpy(written.bindings[0].name, "a\xc0\xaf", 4); /* the reader refuses it: so does the writer */
  CHECK(kiln_metadata_write(&written, &json, &len, &err) == KILN_ERR_INVALID_ARGUMENT);
  CHECK_STR(err.message, "metadata io[0] name must be 1 to 63 bytes of printable UTF-8: name the "
                         "binding");
  memcpy(written.bindings[0].name, "a\x7f", 3);
  CHECK(kiln_metadata_write(&written, &json, &len, &err) == KILN_ERR_INVALID_ARGUMENT);
  snprintf(written.bindings[0].name, sizeof written.bindings[0].name, "tokens");
  written.device_id = -1;
  CHECK(kiln_metadata_write(&written, &json, &len, &err) == KILN_ERR_INVALID_ARGUMENT);
  CHECK_STR(err.message, "metadata device_id -1, min_compute_capability 90 or allow_tf32 1 is out "
                         "of range: use a device_id >= 0, a capability 0..1000 and tf32 0 or 1");
  written.device_id = 0;
  written.bindings[0].max_shape[1] = 6;
  CHECK(kiln_metadata_write(&written, &json, &len, &err) == KILN_ERR_INVALID_ARGUMENT);
  CHECK_STR(err.message, "metadata io[0] (\"tokens\") max_shape[1] = 6 is below shape[1] = 7: "
                         "re-export the program");
}

/* Failing the n-th allocation of the writer, for every n: out of memory with a message and
 * nothing returned, until n passes the writer's allocations. 200 bindings grow its buffer
 * several times. */
static void test_writer_allocation_failures(void) {
  int failures = 0, n;
  memset(&written, 0, sizeof written);
  snprintf(written.producer, sizeof written.producer, "p");
  written.n_bindings = 200;
  for (uint32_t i = 0; i < written.n_bindings; i++) {
    kiln_binding *b = &written.bindings[i];
    snprintf(b->name, sizeof b->name, "binding_%u", (unsigned)i);
    b->kind = i ? KILN_IO_OUTPUT : KILN_IO_INPUT;
    b->rank = 1;
    b->shape[0] = b->max_shape[0] = 4;
  }
  for (n = 1; n < 50; n++) {
    kiln_error err = {0, ""};
    char *json = NULL;
    size_t len = 0;
    kiln_test_fail_allocations = n;
    kiln_status st = kiln_metadata_write(&written, &json, &len, &err);
    if (kiln_test_fail_allocations > 0) { /* the n-th allocation never came */
      kiln_test_fail_allocations = 0;
      CHECK(st == KILN_OK && json != NULL && len > 10000);
      kiln_free(json);
      break;
    }
    CHECK(st == KILN_ERR_OUT_OF_MEMORY && json == NULL && len == 0);
    CHECK_STR(err.message, "out of host memory writing the metadata of 200 bindings: free memory "
                           "and retry");
    failures++;
  }
  kiln_test_fail_allocations = 0;
  CHECK(failures >= 4 && n < 50);
}

int main(void) {
  test_example();
  test_device_id_range();
  test_not_integers();
  test_not_booleans();
  test_nested_lookalikes();
  test_keys();
  test_aliases();
  test_bindings();
  test_counts();
  test_strings();
  test_utf8();
  test_utf8_bounds();
  test_message_bytes();
  test_truncation();
  test_nesting();
  test_annotations();
  test_arguments();
  test_round_trip();
  test_writer_allocation_failures();
  return check_report("test_metadata");
}
