/* The strict reader and the writer of a blob's metadata JSON. The reader accepts exactly the
 * schema below and refuses everything else with a message naming the key and byte offset:
 *   {"producer": str, "device_id": int, "min_compute_capability": int?, "allow_tf32": bool?,
 *    "io": [{"name": str, "kind": "input"|"output", "dtype": str, "shape": [int],
 *            "max_shape": [int]?}],
 *    "aliases": [{"output": int, "input": int, "kind": "inplace"}]?, "annotations": any?} */
#include "runtime/alloc.h"
#include "runtime/utf8.h"
#include "kiln/kiln.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JSON_MAX_DEPTH 32
#define MAX_DIM ((int64_t)1 << 62)
#define MAX_COMPUTE_CAPABILITY 1000
#define PATH_LEN 32
#define TOKEN_SHOWN 24

typedef struct reader {
  const char *s;
  size_t len;
  size_t pos;
  kiln_error *err;
} reader;

static unsigned long long at(size_t pos) { return (unsigned long long)pos; }

static void skip_ws(reader *r) {
  while (r->pos < r->len) {
    char c = r->s[r->pos];
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') return;
    r->pos++;
  }
}

static int is_terminator(char c) {
  return c == ',' || c == '}' || c == ']' || c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static kiln_status truncated(reader *r) {
  return kiln_fail(r->err, KILN_ERR_INVALID_PROGRAM,
                   "metadata ends early at byte %llu (truncated document): re-export the program",
                   at(r->len));
}

static kiln_status syntax(reader *r, const char *expected) {
  return kiln_fail(r->err, KILN_ERR_INVALID_PROGRAM,
                   "metadata is not valid JSON at byte %llu: expected %.32s; re-export the program",
                   at(r->pos), expected);
}

/* Skips whitespace and returns the next byte, or -1 (with err set) at the document end. */
static int peek(reader *r) {
  skip_ws(r);
  if (r->pos >= r->len) {
    truncated(r);
    return -1;
  }
  return (unsigned char)r->s[r->pos];
}

static kiln_status expect(reader *r, char c, const char *expected) {
  int next = peek(r);
  if (next < 0) return KILN_ERR_INVALID_PROGRAM;
  if (next != (unsigned char)c) return syntax(r, expected);
  r->pos++;
  return KILN_OK;
}

/* ------------------------------------------------------------------ strings */

static int hex4(const char *p, unsigned *out) {
  unsigned v = 0;
  for (int i = 0; i < 4; i++) {
    char c = p[i];
    v <<= 4;
    if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
    else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
    else return -1;
  }
  *out = v;
  return 0;
}

static void put_byte(char *buf, size_t cap, size_t *n, unsigned char b) {
  if (buf && *n + 1 < cap) buf[*n] = (char)b;
  (*n)++;
}

static void put_utf8(char *buf, size_t cap, size_t *n, unsigned cp) {
  if (cp < 0x80) {
    put_byte(buf, cap, n, (unsigned char)cp);
  } else if (cp < 0x800) {
    put_byte(buf, cap, n, (unsigned char)(0xC0 | cp >> 6));
    put_byte(buf, cap, n, (unsigned char)(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    put_byte(buf, cap, n, (unsigned char)(0xE0 | cp >> 12));
    put_byte(buf, cap, n, (unsigned char)(0x80 | (cp >> 6 & 0x3F)));
    put_byte(buf, cap, n, (unsigned char)(0x80 | (cp & 0x3F)));
  } else {
    put_byte(buf, cap, n, (unsigned char)(0xF0 | cp >> 18));
    put_byte(buf, cap, n, (unsigned char)(0x80 | (cp >> 12 & 0x3F)));
    put_byte(buf, cap, n, (unsigned char)(0x80 | (cp >> 6 & 0x3F)));
    put_byte(buf, cap, n, (unsigned char)(0x80 | (cp & 0x3F)));
  }
}

static kiln_status bad_escape(reader *r, size_t pos) {
  return kiln_fail(r->err, KILN_ERR_INVALID_PROGRAM,
                   "metadata string has an invalid escape at byte %llu: only \\\" \\\\ \\/ \\b \\f "
                   "\\n \\r \\t and \\uXXXX are allowed; re-export the program",
                   at(pos));
}

/* Decodes the string at r->pos (which must be '"'). Stores at most cap-1 bytes of it in buf
 * (NUL-terminated; buf may be NULL to skip) and its full decoded length in *out_len. */
static kiln_status read_string(reader *r, char *buf, size_t cap, size_t *out_len) {
  size_t start = r->pos, n = 0;
  r->pos++; /* the opening quote */
  for (;;) {
    if (r->pos >= r->len)
      return kiln_fail(r->err, KILN_ERR_INVALID_PROGRAM,
                       "metadata string starting at byte %llu is not terminated: re-export the "
                       "program",
                       at(start));
    unsigned char c = (unsigned char)r->s[r->pos];
    if (c == '"') break;
    if (c < 0x20)
      return kiln_fail(r->err, KILN_ERR_INVALID_PROGRAM,
                       "metadata string has a raw control character at byte %llu: escape it; "
                       "re-export the program",
                       at(r->pos));
    if (c >= 0x80) {
      uint32_t cp;
      size_t len = kiln_utf8_next((const unsigned char *)r->s + r->pos, r->len - r->pos, &cp);
      if (len == 0)
        return kiln_fail(r->err, KILN_ERR_INVALID_PROGRAM,
                         "metadata string has a byte sequence at byte %llu that is not UTF-8 "
                         "(overlong, surrogate or past U+10FFFF); re-export the program",
                         at(r->pos));
      for (size_t k = 0; k < len; k++) put_byte(buf, cap, &n, (unsigned char)r->s[r->pos + k]);
      r->pos += len;
      continue;
    }
    if (c != '\\') {
      put_byte(buf, cap, &n, c);
      r->pos++;
      continue;
    }
    size_t esc = r->pos;
    if (esc + 1 >= r->len) {
      r->pos = r->len;
      continue; /* reported as unterminated above */
    }
    char e = r->s[esc + 1];
    r->pos = esc + 2;
    switch (e) {
    case '"': put_byte(buf, cap, &n, '"'); break;
    case '\\': put_byte(buf, cap, &n, '\\'); break;
    case '/': put_byte(buf, cap, &n, '/'); break;
    case 'b': put_byte(buf, cap, &n, '\b'); break;
    case 'f': put_byte(buf, cap, &n, '\f'); break;
    case 'n': put_byte(buf, cap, &n, '\n'); break;
    case 'r': put_byte(buf, cap, &n, '\r'); break;
    case 't': put_byte(buf, cap, &n, '\t'); break;
    case 'u': {
      unsigned cp, lo;
      if (r->len - r->pos < 4 || hex4(r->s + r->pos, &cp) != 0) return bad_escape(r, esc);
      r->pos += 4;
      if (cp >= 0xDC00 && cp <= 0xDFFF) return bad_escape(r, esc); /* lone low surrogate */
      if (cp >= 0xD800 && cp <= 0xDBFF) {
        if (r->len - r->pos < 6 || r->s[r->pos] != '\\' || r->s[r->pos + 1] != 'u' ||
            hex4(r->s + r->pos + 2, &lo) != 0 || lo < 0xDC00 || lo > 0xDFFF)
          return bad_escape(r, esc);
        r->pos += 6;
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
      }
      put_utf8(buf, cap, &n, cp);
      break;
    }
    default: return bad_escape(r, esc);
    }
  }
  r->pos++; /* the closing quote */
  if (buf && cap) buf[n < cap ? n : cap - 1] = '\0';
  *out_len = n;
  return KILN_OK;
}

/* Makes a decoded string safe to print in a one-line message. */
static char *printable(char *s) {
  for (char *p = s; *p; p++) {
    if ((unsigned char)*p < 0x20 || *p == 0x7F) *p = '?';
  }
  return s;
}

static kiln_status not_string(reader *r, const char *path) {
  return kiln_fail(r->err, KILN_ERR_INVALID_PROGRAM,
                   "metadata %.32s at byte %llu is not a string: re-export the program", path,
                   at(r->pos));
}

/* A string the metadata keeps (producer, binding name): 1..KILN_NAME_MAX-1 bytes, printable. */
static kiln_status read_text(reader *r, const char *path, char *buf) {
  int c = peek(r);
  if (c < 0) return KILN_ERR_INVALID_PROGRAM;
  if (c != '"') return not_string(r, path);
  size_t start = r->pos, n;
  kiln_status st = read_string(r, buf, KILN_NAME_MAX, &n);
  if (st != KILN_OK) return st;
  if (n == 0 || n >= KILN_NAME_MAX)
    return kiln_fail(r->err, KILN_ERR_INVALID_PROGRAM,
                     "metadata %.32s at byte %llu is %llu bytes long, outside 1..%u: re-export "
                     "the program",
                     path, at(start), (unsigned long long)n, (unsigned)(KILN_NAME_MAX - 1));
  if (kiln_utf8_name_fault(buf, n) != n)
    return kiln_fail(r->err, KILN_ERR_INVALID_PROGRAM,
                     "metadata %.32s at byte %llu contains a control character: re-export the "
                     "program",
                     path, at(start));
  return KILN_OK;
}

/* A short enumerated string ("input", "f32", "inplace"): up to cap-1 bytes kept. */
static kiln_status read_word(reader *r, const char *path, char *buf, size_t cap, size_t *n,
                             size_t *start) {
  int c = peek(r);
  if (c < 0) return KILN_ERR_INVALID_PROGRAM;
  if (c != '"') return not_string(r, path);
  *start = r->pos;
  return read_string(r, buf, cap, n);
}

/* ------------------------------------------------------------------ scalars */

/* The bytes from r->pos up to the next terminator: the whole value as written. */
static size_t token_end(const reader *r) {
  size_t e = r->pos;
  while (e < r->len && !is_terminator(r->s[e])) e++;
  return e;
}

static void show_token(const reader *r, size_t end, char *out) {
  size_t n = end - r->pos;
  if (n > TOKEN_SHOWN) n = TOKEN_SHOWN;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)r->s[r->pos + i];
    out[i] = c >= 0x20 && c < 0x7F ? (char)c : '?';
  }
  out[n] = '\0';
}

static kiln_status read_int(reader *r, const char *path, int64_t min, int64_t max, int64_t *out) {
  if (peek(r) < 0) return KILN_ERR_INVALID_PROGRAM;
  size_t end = token_end(r);
  char shown[TOKEN_SHOWN + 1];
  show_token(r, end, shown);
  const char *t = r->s + r->pos;
  size_t n = end - r->pos, i = 0;
  int negative = n > 0 && t[0] == '-';
  if (negative) i++;
  int well_formed = i < n && !(t[i] == '0' && n - i > 1);
  for (size_t k = i; k < n && well_formed; k++) well_formed = t[k] >= '0' && t[k] <= '9';
  if (!well_formed)
    return kiln_fail(r->err, KILN_ERR_INVALID_PROGRAM,
                     "metadata %.32s at byte %llu is not an integer (\"%.24s\"): re-export the "
                     "program",
                     path, at(r->pos), shown);
  uint64_t magnitude = 0;
  int fits = 1;
  for (; i < n && fits; i++) {
    uint64_t d = (uint64_t)(t[i] - '0');
    if (magnitude > (UINT64_MAX - d) / 10) fits = 0;
    else magnitude = magnitude * 10 + d;
  }
  int64_t v = 0;
  if (fits && negative) {
    if (magnitude > (uint64_t)INT64_MAX + 1) fits = 0;
    else v = magnitude == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)magnitude;
  } else if (fits) {
    if (magnitude > (uint64_t)INT64_MAX) fits = 0;
    else v = (int64_t)magnitude;
  }
  if (!fits || v < min || v > max)
    return kiln_fail(r->err, KILN_ERR_INVALID_PROGRAM,
                     "metadata %.32s = %.24s at byte %llu is out of range %lld..%lld: re-export "
                     "the program",
                     path, shown, at(r->pos), (long long)min, (long long)max);
  r->pos = end;
  *out = v;
  return KILN_OK;
}

static int token_is(const reader *r, size_t end, const char *word) {
  size_t n = strlen(word);
  return end - r->pos == n && memcmp(r->s + r->pos, word, n) == 0;
}

static kiln_status read_bool(reader *r, const char *path, int *out) {
  if (peek(r) < 0) return KILN_ERR_INVALID_PROGRAM;
  size_t end = token_end(r);
  if (token_is(r, end, "true") || token_is(r, end, "false")) {
    *out = r->s[r->pos] == 't';
    r->pos = end;
    return KILN_OK;
  }
  char shown[TOKEN_SHOWN + 1];
  show_token(r, end, shown);
  return kiln_fail(r->err, KILN_ERR_INVALID_PROGRAM,
                   "metadata %.32s at byte %llu is not true or false (\"%.24s\"): re-export the "
                   "program",
                   path, at(r->pos), shown);
}

/* ------------------------------------------------------------------ any value (annotations) */

static int is_digit(char c) { return c >= '0' && c <= '9'; }

/* -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? and nothing else. */
static int json_number(const char *t, size_t n) {
  size_t i = 0;
  if (i < n && t[i] == '-') i++;
  if (i >= n || !is_digit(t[i])) return 0;
  if (t[i] == '0') i++;
  else while (i < n && is_digit(t[i])) i++;
  if (i < n && t[i] == '.') {
    if (++i >= n || !is_digit(t[i])) return 0;
    while (i < n && is_digit(t[i])) i++;
  }
  if (i < n && (t[i] == 'e' || t[i] == 'E')) {
    i++;
    if (i < n && (t[i] == '+' || t[i] == '-')) i++;
    if (i >= n || !is_digit(t[i])) return 0;
    while (i < n && is_digit(t[i])) i++;
  }
  return i == n;
}

static kiln_status skip_value(reader *r, int depth);

/* Skips an object or array whose opening byte is at r->pos; keys are not interpreted. */
static kiln_status skip_container(reader *r, int depth) {
  char close = r->s[r->pos] == '{' ? '}' : ']';
  r->pos++;
  int c = peek(r);
  if (c < 0) return KILN_ERR_INVALID_PROGRAM;
  if (c == close) {
    r->pos++;
    return KILN_OK;
  }
  for (;;) {
    kiln_status st;
    if (close == '}') {
      size_t n;
      c = peek(r);
      if (c < 0) return KILN_ERR_INVALID_PROGRAM;
      if (c != '"') return syntax(r, "a key in double quotes");
      if ((st = read_string(r, NULL, 0, &n)) != KILN_OK) return st;
      if ((st = expect(r, ':', "':' after a key")) != KILN_OK) return st;
    }
    if ((st = skip_value(r, depth + 1)) != KILN_OK) return st;
    c = peek(r);
    if (c < 0) return KILN_ERR_INVALID_PROGRAM;
    r->pos++;
    if (c == close) return KILN_OK;
    if (c != ',') {
      r->pos--;
      return syntax(r, close == '}' ? "',' or '}'" : "',' or ']'");
    }
  }
}

static kiln_status skip_value(reader *r, int depth) {
  int c = peek(r);
  if (c < 0) return KILN_ERR_INVALID_PROGRAM;
  if (c == '{' || c == '[') {
    if (depth > JSON_MAX_DEPTH)
      return kiln_fail(r->err, KILN_ERR_INVALID_PROGRAM,
                       "metadata nests deeper than %d levels at byte %llu: re-export the program",
                       JSON_MAX_DEPTH, at(r->pos));
    return skip_container(r, depth);
  }
  if (c == '"') {
    size_t n;
    return read_string(r, NULL, 0, &n);
  }
  size_t end = token_end(r);
  if (token_is(r, end, "true") || token_is(r, end, "false") || token_is(r, end, "null") ||
      json_number(r->s + r->pos, end - r->pos)) {
    r->pos = end;
    return KILN_OK;
  }
  return syntax(r, "a JSON value");
}

/* ------------------------------------------------------------------ objects */

/* Reads the next key of an object whose '{' or ',' was just consumed, and its ':'. Sets *done
 * when the object closes instead (allowed only right after '{'). */
static kiln_status next_key(reader *r, int first, char *key, size_t *key_len, size_t *key_pos,
                            int *done) {
  *done = 0;
  int c = peek(r);
  if (c < 0) return KILN_ERR_INVALID_PROGRAM;
  if (first && c == '}') {
    r->pos++;
    *done = 1;
    return KILN_OK;
  }
  if (c != '"') return syntax(r, first ? "a key in double quotes or '}'" : "a key in double quotes");
  *key_pos = r->pos;
  kiln_status st = read_string(r, key, KILN_NAME_MAX + 1, key_len);
  if (st != KILN_OK) return st;
  return expect(r, ':', "':' after a key");
}

/* After a member's value: consumes ',' (returns with *done 0) or '}' (*done 1). */
static kiln_status after_member(reader *r, int *done) {
  int c = peek(r);
  if (c < 0) return KILN_ERR_INVALID_PROGRAM;
  if (c != ',' && c != '}') return syntax(r, "',' or '}'");
  r->pos++;
  *done = c == '}';
  return KILN_OK;
}

/* Index of key in names (exact bytes), or -1. */
static int key_index(const char *const *names, int count, const char *key, size_t len) {
  for (int i = 0; i < count; i++) {
    if (strlen(names[i]) == len && memcmp(names[i], key, len) == 0) return i;
  }
  return -1;
}

/* Looks a key up and refuses an unknown or repeated one; label is "" or " io[3]". */
static kiln_status claim_key(reader *r, const char *label, const char *const *names, int count,
                             char *key, size_t len, size_t pos, unsigned *seen, int *index) {
  *index = key_index(names, count, key, len);
  if (*index < 0)
    return kiln_fail(r->err, KILN_ERR_INVALID_PROGRAM,
                     "metadata%.16s has unknown key \"%.64s\" at byte %llu: a misspelled or newer "
                     "key; re-export the program with this Kiln release",
                     label, printable(key), at(pos));
  if (*seen & 1u << *index)
    return kiln_fail(r->err, KILN_ERR_INVALID_PROGRAM,
                     "metadata%.16s has duplicate key \"%.64s\" at byte %llu: each key may appear "
                     "once; re-export the program",
                     label, printable(key), at(pos));
  *seen |= 1u << *index;
  return KILN_OK;
}

static kiln_status require_keys(reader *r, const char *label, const char *const *names,
                                unsigned required, unsigned seen) {
  for (int i = 0; names[i]; i++) {
    if ((required & 1u << i) && !(seen & 1u << i))
      return kiln_fail(r->err, KILN_ERR_INVALID_PROGRAM,
                       "metadata%.16s is missing required key \"%.24s\": re-export the program",
                       label, names[i]);
  }
  return KILN_OK;
}

static kiln_status open_object(reader *r, const char *label) {
  int c = peek(r);
  if (c < 0) return KILN_ERR_INVALID_PROGRAM;
  if (c != '{')
    return kiln_fail(r->err, KILN_ERR_INVALID_PROGRAM,
                     "metadata%.16s at byte %llu is not a JSON object: re-export the program",
                     label, at(r->pos));
  r->pos++;
  return KILN_OK;
}

static kiln_status open_array(reader *r, const char *path) {
  int c = peek(r);
  if (c < 0) return KILN_ERR_INVALID_PROGRAM;
  if (c != '[')
    return kiln_fail(r->err, KILN_ERR_INVALID_PROGRAM,
                     "metadata %.32s at byte %llu is not a JSON array: re-export the program", path,
                     at(r->pos));
  r->pos++;
  return KILN_OK;
}

/* Calls item(r, i, ctx) for each element of the array at r->pos; max bounds the count. */
typedef kiln_status (*item_fn)(reader *r, uint32_t index, void *ctx);

static kiln_status read_array(reader *r, const char *path, uint32_t max, const char *unit,
                              item_fn item, void *ctx, uint32_t *count) {
  kiln_status st = open_array(r, path);
  if (st != KILN_OK) return st;
  *count = 0;
  int c = peek(r);
  if (c < 0) return KILN_ERR_INVALID_PROGRAM;
  if (c == ']') {
    r->pos++;
    return KILN_OK;
  }
  for (;;) {
    if (peek(r) < 0) return KILN_ERR_INVALID_PROGRAM;
    if (*count == max)
      return kiln_fail(r->err, KILN_ERR_INVALID_PROGRAM,
                       "metadata %.32s has more than %u %.16s (at byte %llu): Kiln supports %u at "
                       "most; re-export the program",
                       path, (unsigned)max, unit, at(r->pos), (unsigned)max);
    if ((st = item(r, *count, ctx)) != KILN_OK) return st;
    (*count)++;
    c = peek(r);
    if (c < 0) return KILN_ERR_INVALID_PROGRAM;
    if (c != ',' && c != ']') return syntax(r, "',' or ']'");
    r->pos++;
    if (c == ']') return KILN_OK;
  }
}

/* ------------------------------------------------------------------ bindings */

typedef struct dims_ctx {
  const char *path;
  int64_t *dims;
} dims_ctx;

static kiln_status read_dim(reader *r, uint32_t index, void *ctx) {
  dims_ctx *d = ctx;
  char path[PATH_LEN];
  snprintf(path, sizeof path, "%s[%u]", d->path, (unsigned)index);
  return read_int(r, path, 0, MAX_DIM, &d->dims[index]);
}

static kiln_status read_dims(reader *r, const char *path, int64_t *dims, int32_t *rank) {
  dims_ctx ctx = {path, dims};
  uint32_t n = 0;
  kiln_status st = read_array(r, path, KILN_MAX_RANK, "dimensions", read_dim, &ctx, &n);
  *rank = (int32_t)n;
  return st;
}

enum { B_NAME, B_KIND, B_DTYPE, B_SHAPE, B_MAX_SHAPE, B_KEYS };
static const char *const binding_keys[B_KEYS + 1] = {"name", "kind", "dtype", "shape", "max_shape",
                                                     NULL};

static kiln_status read_binding(reader *r, uint32_t index, void *ctx) {
  kiln_binding *b = &((kiln_binding *)ctx)[index];
  char label[24], path[PATH_LEN], key[KILN_NAME_MAX + 1], word[16];
  snprintf(label, sizeof label, " io[%u]", (unsigned)index);
  kiln_status st = open_object(r, label);
  if (st != KILN_OK) return st;
  unsigned seen = 0;
  int32_t max_rank = 0;
  for (int first = 1, done = 0;; first = 0) {
    size_t klen, kpos = 0, wlen = 0, wpos = 0;
    int k;
    if ((st = next_key(r, first, key, &klen, &kpos, &done)) != KILN_OK) return st;
    if (done) break;
    if ((st = claim_key(r, label, binding_keys, B_KEYS, key, klen, kpos, &seen, &k)) != KILN_OK)
      return st;
    snprintf(path, sizeof path, "io[%u].%s", (unsigned)index, binding_keys[k]);
    switch (k) {
    case B_NAME: st = read_text(r, path, b->name); break;
    case B_KIND:
      st = read_word(r, path, word, sizeof word, &wlen, &wpos);
      if (st != KILN_OK) break;
      if (wlen == 5 && memcmp(word, "input", 5) == 0) b->kind = KILN_IO_INPUT;
      else if (wlen == 6 && memcmp(word, "output", 6) == 0) b->kind = KILN_IO_OUTPUT;
      else
        st = kiln_fail(r->err, KILN_ERR_INVALID_PROGRAM,
                       "metadata %.32s at byte %llu is \"%.16s\", not \"input\" or \"output\": "
                       "re-export the program",
                       path, at(wpos), printable(word));
      break;
    case B_DTYPE:
      st = read_word(r, path, word, sizeof word, &wlen, &wpos);
      if (st == KILN_OK && (wlen >= sizeof word || kiln_dtype_from_name(word, wlen, &b->dtype) != 0))
        st = kiln_fail(r->err, KILN_ERR_INVALID_PROGRAM,
                       "metadata %.32s at byte %llu names unknown dtype \"%.16s\": expected f32, "
                       "f16, bf16, i64, i32 or bool; re-export the program",
                       path, at(wpos), printable(word));
      break;
    case B_SHAPE: st = read_dims(r, path, b->shape, &b->rank); break;
    default: st = read_dims(r, path, b->max_shape, &max_rank); break;
    }
    if (st != KILN_OK) return st;
    if ((st = after_member(r, &done)) != KILN_OK) return st;
    if (done) break;
  }
  unsigned required = 1u << B_NAME | 1u << B_KIND | 1u << B_DTYPE | 1u << B_SHAPE;
  if ((st = require_keys(r, label, binding_keys, required, seen)) != KILN_OK) return st;
  if (!(seen & 1u << B_MAX_SHAPE)) {
    memcpy(b->max_shape, b->shape, sizeof b->shape);
  } else if (max_rank != b->rank) {
    return kiln_fail(r->err, KILN_ERR_INVALID_PROGRAM,
                     "metadata io[%u] max_shape has %d dimensions but shape has %d: re-export the "
                     "program",
                     (unsigned)index, (int)max_rank, (int)b->rank);
  }
  return KILN_OK;
}

/* ------------------------------------------------------------------ aliases */

enum { A_OUTPUT, A_INPUT, A_KIND, A_KEYS };
static const char *const alias_keys[A_KEYS + 1] = {"output", "input", "kind", NULL};

static kiln_status read_alias(reader *r, uint32_t index, void *ctx) {
  kiln_alias *a = &((kiln_alias *)ctx)[index];
  char label[24], path[PATH_LEN], key[KILN_NAME_MAX + 1];
  snprintf(label, sizeof label, " aliases[%u]", (unsigned)index);
  kiln_status st = open_object(r, label);
  if (st != KILN_OK) return st;
  unsigned seen = 0;
  for (int first = 1, done = 0;; first = 0) {
    size_t klen, kpos = 0, wlen = 0, wpos = 0;
    int64_t v;
    int k;
    if ((st = next_key(r, first, key, &klen, &kpos, &done)) != KILN_OK) return st;
    if (done) break;
    if ((st = claim_key(r, label, alias_keys, A_KEYS, key, klen, kpos, &seen, &k)) != KILN_OK)
      return st;
    snprintf(path, sizeof path, "aliases[%u].%s", (unsigned)index, alias_keys[k]);
    if (k == A_KIND) {
      st = read_word(r, path, a->kind, sizeof a->kind, &wlen, &wpos);
      if (st == KILN_OK && (wlen != 7 || memcmp(a->kind, "inplace", 7) != 0))
        st = kiln_fail(r->err, KILN_ERR_INVALID_PROGRAM,
                       "metadata %.32s at byte %llu is \"%.16s\", not \"inplace\": re-export the "
                       "program",
                       path, at(wpos), printable(a->kind));
    } else {
      st = read_int(r, path, 0, UINT32_MAX, &v);
      if (st == KILN_OK) *(k == A_OUTPUT ? &a->output : &a->input) = (uint32_t)v;
    }
    if (st != KILN_OK) return st;
    if ((st = after_member(r, &done)) != KILN_OK) return st;
    if (done) break;
  }
  return require_keys(r, label, alias_keys, 1u << A_OUTPUT | 1u << A_INPUT | 1u << A_KIND, seen);
}

/* ------------------------------------------------------------------ the document */

enum { T_PRODUCER, T_DEVICE_ID, T_MIN_CC, T_ALLOW_TF32, T_IO, T_ALIASES, T_ANNOTATIONS, T_KEYS };
static const char *const top_keys[T_KEYS + 1] = {"producer", "device_id", "min_compute_capability",
                                                 "allow_tf32", "io", "aliases", "annotations",
                                                 NULL};

static kiln_status read_document(reader *r, kiln_metadata *md) {
  char key[KILN_NAME_MAX + 1];
  kiln_status st = open_object(r, "");
  if (st != KILN_OK) return st;
  unsigned seen = 0;
  for (int first = 1, done = 0;; first = 0) {
    size_t klen, kpos = 0;
    int64_t v;
    int k;
    if ((st = next_key(r, first, key, &klen, &kpos, &done)) != KILN_OK) return st;
    if (done) break;
    if ((st = claim_key(r, "", top_keys, T_KEYS, key, klen, kpos, &seen, &k)) != KILN_OK) return st;
    switch (k) {
    case T_PRODUCER: st = read_text(r, "producer", md->producer); break;
    case T_DEVICE_ID:
      if ((st = read_int(r, "device_id", 0, INT32_MAX, &v)) == KILN_OK) md->device_id = (int32_t)v;
      break;
    case T_MIN_CC:
      st = read_int(r, "min_compute_capability", 0, MAX_COMPUTE_CAPABILITY, &v);
      if (st == KILN_OK) md->min_compute_capability = (int32_t)v;
      break;
    case T_ALLOW_TF32: st = read_bool(r, "allow_tf32", &md->allow_tf32); break;
    case T_IO:
      st = read_array(r, "io", KILN_MAX_BINDINGS, "bindings", read_binding, md->bindings, &md->n_bindings);
      break;
    case T_ALIASES:
      st = read_array(r, "aliases", KILN_MAX_ALIASES, "aliases", read_alias, md->aliases, &md->n_aliases);
      break;
    default: st = skip_value(r, 2); break;
    }
    if (st != KILN_OK) return st;
    if ((st = after_member(r, &done)) != KILN_OK) return st;
    if (done) break;
  }
  skip_ws(r);
  if (r->pos != r->len)
    return kiln_fail(r->err, KILN_ERR_INVALID_PROGRAM,
                     "metadata has trailing bytes at byte %llu after the closing '}': re-export "
                     "the program",
                     at(r->pos));
  return require_keys(r, "", top_keys, 1u << T_PRODUCER | 1u << T_DEVICE_ID | 1u << T_IO, seen);
}

/* Rules that span entries, shared by the reader and the writer. */
static kiln_status check_relations(const kiln_metadata *md, kiln_status status, kiln_error *err) {
  uint32_t n_in = 0, n_out = 0;
  const kiln_binding *inputs[KILN_MAX_BINDINGS], *outputs[KILN_MAX_BINDINGS];
  for (uint32_t i = 0; i < md->n_bindings; i++) {
    const kiln_binding *b = &md->bindings[i];
    for (int d = 0; d < b->rank; d++) {
      if (b->max_shape[d] < b->shape[d])
        return kiln_fail(err, status,
                         "metadata io[%u] (\"%.64s\") max_shape[%d] = %lld is below shape[%d] = "
                         "%lld: re-export the program",
                         (unsigned)i, b->name, d, (long long)b->max_shape[d], d,
                         (long long)b->shape[d]);
    }
    if (b->kind == KILN_IO_INPUT) inputs[n_in++] = b;
    else outputs[n_out++] = b;
  }
  for (uint32_t i = 0; i < md->n_aliases; i++) {
    const kiln_alias *a = &md->aliases[i];
    if (a->output >= n_out)
      return kiln_fail(err, status,
                       "metadata aliases[%u].output = %u is out of range: the metadata has %u "
                       "outputs; re-export the program",
                       (unsigned)i, (unsigned)a->output, (unsigned)n_out);
    if (a->input >= n_in)
      return kiln_fail(err, status,
                       "metadata aliases[%u].input = %u is out of range: the metadata has %u "
                       "inputs; re-export the program",
                       (unsigned)i, (unsigned)a->input, (unsigned)n_in);
    const kiln_binding *o = outputs[a->output], *in = inputs[a->input];
    if (o->dtype != in->dtype || o->rank != in->rank ||
        memcmp(o->shape, in->shape, sizeof o->shape[0] * (size_t)o->rank) != 0)
      return kiln_fail(err, status,
                       "metadata aliases[%u] pairs output \"%.64s\" with input \"%.64s\" of a "
                       "different dtype or shape: re-export the program",
                       (unsigned)i, o->name, in->name);
    for (uint32_t j = 0; j < i; j++) {
      if (md->aliases[j].output == a->output || md->aliases[j].input == a->input)
        return kiln_fail(err, status,
                         "metadata aliases[%u] repeats output %u or input %u of aliases[%u]: "
                         "re-export the program",
                         (unsigned)i, (unsigned)a->output, (unsigned)a->input, (unsigned)j);
    }
  }
  return KILN_OK;
}

kiln_status kiln_metadata_parse(const char *json, size_t len, kiln_metadata *out, kiln_error *err) {
  if (!out)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "kiln_metadata_parse needs an output: pass a kiln_metadata to fill");
  memset(out, 0, sizeof *out);
  if (!json && len != 0)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "metadata pointer is NULL but its length is %llu: pass the metadata bytes",
                     (unsigned long long)len);
  reader r = {json, len, 0, err};
  kiln_status st = read_document(&r, out);
  if (st == KILN_OK) st = check_relations(out, KILN_ERR_INVALID_PROGRAM, err);
  if (st != KILN_OK) memset(out, 0, sizeof *out);
  return st;
}

/* ------------------------------------------------------------------ the writer */

typedef struct text {
  char *p;
  size_t len, cap;
  int failed;
} text;

static void emit(text *t, const char *s, size_t n) {
  if (t->failed) return;
  if (t->cap - t->len <= n) {
    size_t cap = t->cap ? t->cap : 1024;
    while (cap - t->len <= n) cap *= 2;
    char *p = kiln_realloc(t->p, cap);
    if (!p) {
      t->failed = 1;
      return;
    }
    t->p = p;
    t->cap = cap;
  }
  memcpy(t->p + t->len, s, n);
  t->len += n;
  t->p[t->len] = '\0';
}

static void emit_str(text *t, const char *s) { emit(t, s, strlen(s)); }

static void emit_int(text *t, long long v) {
  char buf[24];
  int n = snprintf(buf, sizeof buf, "%lld", v);
  emit(t, buf, (size_t)n);
}

/* A JSON string; the caller has refused control characters. */
static void emit_quoted(text *t, const char *s) {
  emit(t, "\"", 1);
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') emit(t, "\\", 1);
    emit(t, s, 1);
  }
  emit(t, "\"", 1);
}

static void emit_dims(text *t, const int64_t *dims, int32_t rank) {
  emit(t, "[", 1);
  for (int32_t d = 0; d < rank; d++) {
    if (d) emit(t, ", ", 2);
    emit_int(t, (long long)dims[d]);
  }
  emit(t, "]", 1);
}

/* 1..KILN_NAME_MAX-1 bytes of UTF-8 before the NUL, no control characters: what the reader
 * takes as a name. */
static int valid_text(const char *s, size_t cap) {
  const char *nul = memchr(s, '\0', cap);
  if (!nul || nul == s) return 0;
  return kiln_utf8_name_fault(s, (size_t)(nul - s)) == (size_t)(nul - s);
}

static kiln_status check_writable(const kiln_metadata *md, kiln_error *err) {
  if (!valid_text(md->producer, sizeof md->producer))
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "metadata producer must be 1 to %u bytes of printable UTF-8: set producer",
                     (unsigned)(KILN_NAME_MAX - 1));
  if (md->device_id < 0 || md->min_compute_capability < 0 ||
      md->min_compute_capability > MAX_COMPUTE_CAPABILITY || (md->allow_tf32 & ~1) != 0)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "metadata device_id %d, min_compute_capability %d or allow_tf32 %d is out of "
                     "range: use a device_id >= 0, a capability 0..%d and tf32 0 or 1",
                     (int)md->device_id, (int)md->min_compute_capability, md->allow_tf32,
                     MAX_COMPUTE_CAPABILITY);
  if (md->n_bindings > KILN_MAX_BINDINGS || md->n_aliases > KILN_MAX_ALIASES)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "metadata has %u bindings and %u aliases: at most %u and %u are supported",
                     (unsigned)md->n_bindings, (unsigned)md->n_aliases, (unsigned)KILN_MAX_BINDINGS,
                     (unsigned)KILN_MAX_ALIASES);
  for (uint32_t i = 0; i < md->n_bindings; i++) {
    const kiln_binding *b = &md->bindings[i];
    if (!valid_text(b->name, sizeof b->name))
      return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                       "metadata io[%u] name must be 1 to %u bytes of printable UTF-8: name the binding",
                       (unsigned)i, (unsigned)(KILN_NAME_MAX - 1));
    if ((unsigned)b->kind > KILN_IO_OUTPUT || (unsigned)b->dtype >= KILN_DTYPE_COUNT ||
        b->rank < 0 || b->rank > KILN_MAX_RANK)
      return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                       "metadata io[%u] (\"%.64s\") has kind %d, dtype %d or rank %d out of range: "
                       "fix the binding",
                       (unsigned)i, b->name, (int)b->kind, (int)b->dtype, (int)b->rank);
    for (int d = 0; d < b->rank; d++) {
      if (b->shape[d] < 0 || b->shape[d] > MAX_DIM || b->max_shape[d] > MAX_DIM)
        return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                         "metadata io[%u] (\"%.64s\") dimension %d is outside 0..2^62: fix the "
                         "binding's shape",
                         (unsigned)i, b->name, d);
    }
  }
  for (uint32_t i = 0; i < md->n_aliases; i++) {
    if (strcmp(md->aliases[i].kind, "inplace") != 0)
      return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                       "metadata aliases[%u] kind is not \"inplace\": set the alias kind",
                       (unsigned)i);
  }
  return check_relations(md, KILN_ERR_INVALID_ARGUMENT, err);
}

kiln_status kiln_metadata_write(const kiln_metadata *md, char **out, size_t *out_len,
                                kiln_error *err) {
  if (!md || !out || !out_len)
    return kiln_fail(err, KILN_ERR_INVALID_ARGUMENT,
                     "kiln_metadata_write needs metadata, out and out_len: pass all three");
  *out = NULL;
  *out_len = 0;
  kiln_status st = check_writable(md, err);
  if (st != KILN_OK) return st;
  text t = {NULL, 0, 0, 0};
  emit_str(&t, "{\"producer\": ");
  emit_quoted(&t, md->producer);
  emit_str(&t, ", \"device_id\": ");
  emit_int(&t, md->device_id);
  emit_str(&t, ", \"min_compute_capability\": ");
  emit_int(&t, md->min_compute_capability);
  emit_str(&t, md->allow_tf32 ? ", \"allow_tf32\": true" : ", \"allow_tf32\": false");
  emit_str(&t, ",\n \"io\": [");
  for (uint32_t i = 0; i < md->n_bindings; i++) {
    const kiln_binding *b = &md->bindings[i];
    emit_str(&t, i ? ",\n        {\"name\": " : "{\"name\": ");
    emit_quoted(&t, b->name);
    emit_str(&t, b->kind == KILN_IO_INPUT ? ", \"kind\": \"input\"" : ", \"kind\": \"output\"");
    emit_str(&t, ", \"dtype\": ");
    emit_quoted(&t, kiln_dtype_name(b->dtype));
    emit_str(&t, ", \"shape\": ");
    emit_dims(&t, b->shape, b->rank);
    if (memcmp(b->max_shape, b->shape, sizeof b->shape[0] * (size_t)b->rank) != 0) {
      emit_str(&t, ", \"max_shape\": ");
      emit_dims(&t, b->max_shape, b->rank);
    }
    emit_str(&t, "}");
  }
  emit_str(&t, "],\n \"aliases\": [");
  for (uint32_t i = 0; i < md->n_aliases; i++) {
    emit_str(&t, i ? ", {\"output\": " : "{\"output\": ");
    emit_int(&t, md->aliases[i].output);
    emit_str(&t, ", \"input\": ");
    emit_int(&t, md->aliases[i].input);
    emit_str(&t, ", \"kind\": \"inplace\"}");
  }
  emit_str(&t, "]}\n");
  if (t.failed) {
    free(t.p);
    return kiln_fail(err, KILN_ERR_OUT_OF_MEMORY,
                     "out of host memory writing the metadata of %u bindings: free memory and "
                     "retry",
                     (unsigned)md->n_bindings);
  }
  *out = t.p;
  *out_len = t.len;
  return KILN_OK;
}
