//go:build cgo

// arm64 kernels: NEON is baseline there; the SDOT variant is compiled
// with a target attribute and chosen at run time (cpu.ARM64.HasASIMDDP).
#include "kernels.h"

#if defined(__aarch64__)
#include <arm_neon.h>

#define INLINE static inline __attribute__((always_inline))

#define TK_DOT 0
#define TK_FN(name) name##_neon
#define TK_TARGET
#include "kernels_arm64.h"
#undef TK_DOT
#undef TK_FN
#undef TK_TARGET

#define TK_DOT 1
#define TK_FN(name) name##_dot
#define TK_TARGET __attribute__((target("arch=armv8.2-a+dotprod")))
#include "kernels_arm64.h"

void tk_matmul_neon(int dot, int wt, float *out, const uint8_t *w, int64_t row_bytes,
	int64_t lo, int64_t hi, int64_t rows, int64_t cols, const float *x,
	const int8_t *xq, const float *xd, const int32_t *xs, int64_t n) {
	if (dot) {
		matmul_dot(wt, out, w, row_bytes, lo, hi, rows, cols, x, xq, xd, xs, n);
	} else {
		matmul_neon(wt, out, w, row_bytes, lo, hi, rows, cols, x, xq, xd, xs, n);
	}
}
// Attention helpers need no SDOT: float FMAs, half rows widened first.
static inline float32x4_t load4_any(int f16, const uint8_t *p) {
	if (f16) {
		return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)p)));
	}
	return vld1q_f32((const float *)p);
}

float tk_dot_neon(int f16, const float *a, const void *b, int64_t n) {
	const int64_t es = f16 ? 2 : 4;
	const uint8_t *p = b;
	float32x4_t acc0 = vdupq_n_f32(0), acc1 = vdupq_n_f32(0);
	int64_t i = 0;
	for (; i + 8 <= n; i += 8) {
		acc0 = vfmaq_f32(acc0, load4_any(f16, p + i * es), vld1q_f32(a + i));
		acc1 = vfmaq_f32(acc1, load4_any(f16, p + (i + 4) * es), vld1q_f32(a + i + 4));
	}
	float s = vaddvq_f32(vaddq_f32(acc0, acc1));
	for (; i < n; i++) {
		s += a[i] * (f16 ? tk_f16(((const uint16_t *)b)[i]) : ((const float *)b)[i]);
	}
	return s;
}

void tk_axpy_neon(int f16, float *y, float a, const void *x, int64_t n) {
	const int64_t es = f16 ? 2 : 4;
	const uint8_t *p = x;
	int64_t i = 0;
	for (; i + 4 <= n; i += 4) {
		vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), load4_any(f16, p + i * es), a));
	}
	for (; i < n; i++) {
		y[i] += a * (f16 ? tk_f16(((const uint16_t *)x)[i]) : ((const float *)x)[i]);
	}
}
#endif
