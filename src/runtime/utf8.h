/* UTF-8 well-formedness, for the names and strings a blob or a caller hands to Kiln. */
#ifndef KILN_UTF8_H
#define KILN_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* The length (1..4) of the well-formed UTF-8 sequence at s[0..n), with its code point in *cp,
 * or 0 when it is malformed: a stray continuation byte, a truncated sequence, an overlong
 * form, a surrogate (U+D800..U+DFFF) or a value past U+10FFFF. */
size_t kiln_utf8_next(const unsigned char *s, size_t n, uint32_t *cp);

/* 1 when cp is a control character (C0, DEL or C1), which no name may hold. */
int kiln_utf8_is_control(uint32_t cp);

/* The byte offset of the first malformed sequence or control character in s[0..n), or n. */
size_t kiln_utf8_name_fault(const char *s, size_t n);

#endif
