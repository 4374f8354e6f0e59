/* f16 and bf16 conversion: hand-picked edge cases (NaN, infinities, overflow, subnormals,
 * ties) and sweeps against a reference that rounds with double arithmetic instead of bits. */
#include "check.h"
#include "cpu/half.h"

#include <math.h>

static float from_bits(uint32_t x) { return kiln_bits_f32(x); }

/* The f16 value of bits h, from the format's definition. */
static double ref_f16_value(uint16_t h) {
  int exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (exp == 31) return man ? NAN : sign * INFINITY;
  if (exp == 0) return sign * ldexp(man, -24);
  return sign * ldexp(1024 + man, exp - 25);
}

/* Nearest f16 with ties to even, found by scaling and nearbyint (default rounding mode). */
static uint16_t ref_to_f16(float f) {
  uint16_t sign = signbit(f) ? 0x8000 : 0;
  double a = fabs((double)f);
  if (a >= 65520.0) return sign | 0x7c00;
  if (a < 0x1p-14) return sign | (uint16_t)nearbyint(a * 0x1p24);
  int e;
  frexp(a, &e);
  int exp = e - 1;
  double q = nearbyint(ldexp(a, 10 - exp));
  if (q == 2048.0) q = 1024.0, exp++;
  return sign | (uint16_t)((exp + 15) << 10 | ((int)q - 1024));
}

static uint16_t ref_to_bf16(float f) {
  uint16_t sign = signbit(f) ? 0x8000 : 0;
  double a = fabs((double)f);
  if (isinf(a)) return sign | 0x7f80;
  if (a < 0x1p-126) return sign | (uint16_t)nearbyint(a * 0x1p133);
  int e;
  frexp(a, &e);
  int exp = e - 1;
  double q = nearbyint(ldexp(a, 7 - exp));
  if (q == 256.0) q = 128.0, exp++;
  if (exp + 127 >= 255) return sign | 0x7f80;
  return sign | (uint16_t)((exp + 127) << 7 | ((int)q - 128));
}

static int is_f16_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }
static int is_bf16_nan(uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0; }

static void test_f16_decode_all(void) {
  int bad = -1;
  for (uint32_t h = 0; h < 65536 && bad < 0; h++) {
    double want = ref_f16_value((uint16_t)h);
    float got = kiln_f16_to_f32((uint16_t)h);
    if (isnan(want) ? !isnan(got) : (got != want || !signbit(got) != !signbit(want))) bad = (int)h;
  }
  if (bad >= 0) fprintf(stderr, "f16 0x%04x decodes wrong\n", (unsigned)bad);
  CHECK(bad < 0);
}

static void test_f16_encode_edges(void) {
  CHECK(kiln_f32_to_f16(1.0f) == 0x3c00);
  CHECK(kiln_f32_to_f16(-2.0f) == 0xc000);
  CHECK(kiln_f32_to_f16(0.0f) == 0x0000);
  CHECK(kiln_f32_to_f16(-0.0f) == 0x8000);
  CHECK(kiln_f32_to_f16(65504.0f) == 0x7bff);
  CHECK(kiln_f32_to_f16(from_bits(0x477fefffu)) == 0x7bff); /* just below 65520 */
  CHECK(kiln_f32_to_f16(65520.0f) == 0x7c00);               /* the tie goes to infinity */
  CHECK(kiln_f32_to_f16(1e10f) == 0x7c00);
  CHECK(kiln_f32_to_f16(INFINITY) == 0x7c00);
  CHECK(kiln_f32_to_f16(-INFINITY) == 0xfc00);
  CHECK(is_f16_nan(kiln_f32_to_f16(NAN)));
  CHECK(is_f16_nan(kiln_f32_to_f16(from_bits(0x7f800001u)))); /* payload only in low bits */
  CHECK(is_f16_nan(kiln_f32_to_f16(from_bits(0xffc00000u))));
  /* ties to even among normals */
  CHECK(kiln_f32_to_f16(1.0f + 0x1p-11f) == 0x3c00);
  CHECK(kiln_f32_to_f16(1.0f + 3 * 0x1p-11f) == 0x3c02);
  CHECK(kiln_f32_to_f16(nextafterf(1.0f + 0x1p-11f, 2.0f)) == 0x3c01);
  /* subnormals */
  CHECK(kiln_f32_to_f16(0x1p-24f) == 0x0001);
  CHECK(kiln_f32_to_f16(-0x1p-24f) == 0x8001);
  CHECK(kiln_f32_to_f16(0x1p-25f) == 0x0000);     /* tie between 0 and 2^-24 */
  CHECK(kiln_f32_to_f16(3 * 0x1p-25f) == 0x0002); /* tie between 1 and 2 units */
  CHECK(kiln_f32_to_f16(5 * 0x1p-25f) == 0x0002); /* tie between 2 and 3 units */
  CHECK(kiln_f32_to_f16(nextafterf(0x1p-25f, 1.0f)) == 0x0001);
  CHECK(kiln_f32_to_f16(0x1p-14f) == 0x0400);
  CHECK(kiln_f32_to_f16(0x1p-14f - 0x1p-25f) == 0x0400); /* rounds up into the normals */
  CHECK(kiln_f32_to_f16(1023 * 0x1p-24f) == 0x03ff);
  CHECK(kiln_f32_to_f16(from_bits(0x00000001u)) == 0x0000); /* f32 subnormal */
}

static void test_f16_encode_sweep(void) {
  uint32_t bad = 0, checked = 0;
  for (uint64_t x = 0; x <= 0xffffffffu; x += 4093) {
    float f = from_bits((uint32_t)x);
    uint16_t got = kiln_f32_to_f16(f);
    int ok = isnan(f) ? is_f16_nan(got) : got == ref_to_f16(f);
    if (!ok && !bad) {
      fprintf(stderr, "f32 0x%08x -> f16 0x%04x, want 0x%04x\n", (unsigned)x, got, ref_to_f16(f));
      bad = 1;
    }
    checked++;
  }
  CHECK(!bad && checked > 1000000);
}

static void test_bf16_edges(void) {
  CHECK(kiln_f32_to_bf16(1.0f) == 0x3f80);
  CHECK(kiln_f32_to_bf16(from_bits(0x3f808000u)) == 0x3f80); /* tie, even stays */
  CHECK(kiln_f32_to_bf16(from_bits(0x3f818000u)) == 0x3f82); /* tie, odd rounds up */
  CHECK(kiln_f32_to_bf16(from_bits(0x3f808001u)) == 0x3f81);
  CHECK(kiln_f32_to_bf16(from_bits(0x7f7fffffu)) == 0x7f80); /* the largest f32 rounds to inf */
  CHECK(kiln_f32_to_bf16(from_bits(0x7f7f7fffu)) == 0x7f7f);
  CHECK(kiln_f32_to_bf16(-INFINITY) == 0xff80);
  CHECK(is_bf16_nan(kiln_f32_to_bf16(from_bits(0x7f800001u)))); /* would truncate to inf */
  CHECK(is_bf16_nan(kiln_f32_to_bf16(from_bits(0xff800001u))));
  CHECK(kiln_f32_to_bf16(from_bits(0x00018000u)) == 0x0002); /* subnormal tie, odd rounds up */
  CHECK(kiln_f32_to_bf16(-0.0f) == 0x8000);
  CHECK(kiln_bf16_to_f32(0x3f80) == 1.0f);
  CHECK(kiln_bf16_to_f32(0xff80) == -INFINITY);
  CHECK(isnan(kiln_bf16_to_f32(0x7fc1)));
  CHECK(kiln_bf16_to_f32(0x0001) == 0x1p-133f);
}

static void test_bf16_sweep(void) {
  uint32_t bad = 0, checked = 0;
  for (uint64_t x = 0; x <= 0xffffffffu; x += 4093) {
    float f = from_bits((uint32_t)x);
    uint16_t got = kiln_f32_to_bf16(f);
    int ok = isnan(f) ? is_bf16_nan(got) : got == ref_to_bf16(f);
    if (!ok && !bad) {
      fprintf(stderr, "f32 0x%08x -> bf16 0x%04x, want 0x%04x\n", (unsigned)x, got, ref_to_bf16(f));
      bad = 1;
    }
    checked++;
  }
  CHECK(!bad && checked > 1000000);
}

/* Every f16 survives f16 -> f32 -> f16 unchanged (NaNs stay NaN). */
static void test_f16_round_trip(void) {
  int bad = -1;
  for (uint32_t h = 0; h < 65536 && bad < 0; h++) {
    uint16_t back = kiln_f32_to_f16(kiln_f16_to_f32((uint16_t)h));
    if (is_f16_nan((uint16_t)h) ? !is_f16_nan(back) : back != h) bad = (int)h;
  }
  CHECK(bad < 0);
}

int main(void) {
  test_f16_decode_all();
  test_f16_encode_edges();
  test_f16_encode_sweep();
  test_bf16_edges();
  test_bf16_sweep();
  test_f16_round_trip();
  return check_report("test_cpu_half");
}
