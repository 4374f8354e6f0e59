/* Float op math shared by the elementwise kernels, the fused pointwise chain and the FUSED
 * group kernels, so a fused step computes exactly what its unfused op does. Self-contained (the
 * KILN_OP_* names and CUDA's built-in math only): the library embeds this text in every FUSED
 * kernel it compiles at load (cuda_fused_jit.c), so those kernels run this same math. */
#ifndef KILN_CUDA_OP_MATH_CUH
#define KILN_CUDA_OP_MATH_CUH

#define KCU_GELU_TANH_K 0.7978845608028654f /* sqrt(2/pi) */

#define KCU_NAN __int_as_float(0x7fc00000)

static __device__ __forceinline__ float kcu_binop(int op, float a, float b, float alpha) {
  switch (op) {
  case KILN_OP_ADD: return a + alpha * b;
  case KILN_OP_SUB: return a - alpha * b;
  case KILN_OP_MUL: return a * b;
  /* NaN propagates (fminf would drop it); of two equal values a wins, as on the CPU. */
  case KILN_OP_MINIMUM: return a != a || b != b ? KCU_NAN : (b < a ? b : a);
  case KILN_OP_MAXIMUM: return a != a || b != b ? KCU_NAN : (a < b ? b : a);
  default: return a / b;
  }
}

/* x + 3 clamped to [0, 6]: hardswish's and hardsigmoid's factor. */
static __device__ __forceinline__ float kcu_relu6_shift3(float x) {
  float y = x + 3.0f;
  return y < 0.0f ? 0.0f : (y > 6.0f ? 6.0f : y);
}

static __device__ __forceinline__ float kcu_unop(int op, float x, float p) {
  switch (op) {
  case KILN_OP_RELU: return x > 0.0f ? x : 0.0f;
  case KILN_OP_GELU:
    if (p != 0.0f) return 0.5f * x * (1.0f + tanhf(KCU_GELU_TANH_K * (x + 0.044715f * x * x * x)));
    return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
  case KILN_OP_SILU: return x / (1.0f + expf(-x));
  case KILN_OP_SIGMOID: return 1.0f / (1.0f + expf(-x));
  case KILN_OP_TANH: return tanhf(x);
  case KILN_OP_EXP: return expf(x);
  case KILN_OP_SQRT: return sqrtf(x);
  case KILN_OP_RSQRT: return rsqrtf(x);
  case KILN_OP_NEG: return -x;
  case KILN_OP_POW: return powf(x, p);
  case KILN_OP_ABS: return fabsf(x);
  case KILN_OP_LOG: return logf(x);
  case KILN_OP_COS: return cosf(x);
  case KILN_OP_SIN: return sinf(x);
  case KILN_OP_ERF: return erff(x);
  case KILN_OP_HARDSWISH: return x * kcu_relu6_shift3(x) / 6.0f;
  case KILN_OP_HARDSIGMOID: return kcu_relu6_shift3(x) / 6.0f;
  default: return x; /* CAST */
  }
}

#endif
