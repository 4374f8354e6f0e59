/* UTF-8 well-formedness, as RFC 3629 defines it (see utf8.h). */
#include "runtime/utf8.h"

size_t kiln_utf8_next(const unsigned char *s, size_t n, uint32_t *cp) {
  /* The lowest code point each length may encode, so shorter forms are overlong. */
  static const uint32_t least[5] = {0, 0, 0x80, 0x800, 0x10000};
  size_t len;
  uint32_t v;
  if (n == 0) return 0;
  if (s[0] < 0x80) len = 1, v = s[0];
  else if ((s[0] & 0xE0) == 0xC0) len = 2, v = s[0] & 0x1Fu;
  else if ((s[0] & 0xF0) == 0xE0) len = 3, v = s[0] & 0x0Fu;
  else if ((s[0] & 0xF8) == 0xF0) len = 4, v = s[0] & 0x07u;
  else return 0;
  if (len > n) return 0;
  for (size_t i = 1; i < len; i++) {
    if ((s[i] & 0xC0) != 0x80) return 0;
    v = v << 6 | (s[i] & 0x3Fu);
  }
  if (v < least[len] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  *cp = v;
  return len;
}

int kiln_utf8_is_control(uint32_t cp) { return cp < 0x20 || (cp >= 0x7F && cp <= 0x9F); }

size_t kiln_utf8_name_fault(const char *s, size_t n) {
  const unsigned char *u = (const unsigned char *)s;
  size_t i = 0;
  while (i < n) {
    uint32_t cp;
    size_t len = kiln_utf8_next(u + i, n - i, &cp);
    if (len == 0 || kiln_utf8_is_control(cp)) return i;
    i += len;
  }
  return n;
}
