/* A minimal test harness: CHECK records a failure and goes on; main prints the totals. */
#ifndef KILN_TEST_CHECK_H
#define KILN_TEST_CHECK_H

#include <stdio.h>
#include <string.h>

static int check_passed, check_failed;

#define CHECK(cond)                                                                     \
  do {                                                                                  \
    if (cond) {                                                                         \
      check_passed++;                                                                   \
    } else {                                                                            \
      check_failed++;                                                                   \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);          \
    }                                                                                   \
  } while (0)

#define CHECK_STR(actual, expected)                                                     \
  do {                                                                                  \
    const char *a_ = (actual), *e_ = (expected);                                        \
    if (strcmp(a_, e_) == 0) {                                                          \
      check_passed++;                                                                   \
    } else {                                                                            \
      check_failed++;                                                                   \
      fprintf(stderr, "%s:%d: expected \"%s\"\n  got      \"%s\"\n", __FILE__, __LINE__, \
              e_, a_);                                                                  \
    }                                                                                   \
  } while (0)

/* Prints "N passed, N failed" and returns the process exit status. */
static int check_report(const char *suite) {
  printf("%s: %d passed, %d failed\n", suite, check_passed, check_failed);
  return check_failed ? 1 : 0;
}

#endif
