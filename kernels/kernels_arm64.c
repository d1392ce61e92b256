//go:build cgo

// arm64 kernels: NEON is baseline there; the SDOT variant is compiled
// with a target attribute and chosen at run time (cpu.ARM64.HasASIMDDP).
#include "kernels.h"

#if defined(__aarch64__)
#include <arm_neon.h>
#include <math.h>

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

// exp4 is e^x for four x, as exp8 in kernels_amd64.c: the same range
// reduction and polynomial, 0 below the smallest normal result, +Inf
// above the largest.
static inline float32x4_t exp4(float32x4_t x) {
	const float32x4_t lo = vdupq_n_f32(-87.33654f), hi = vdupq_n_f32(88.37626f);
	uint32x4_t under = vcltq_f32(x, lo), over = vcgtq_f32(x, hi);
	x = vminq_f32(vmaxq_f32(x, lo), hi);
	float32x4_t n = vrndnq_f32(vmulq_n_f32(x, 1.44269504088896341f));
	float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693359375f));
	r = vfmsq_f32(r, n, vdupq_n_f32(-2.12194440e-4f));
	float32x4_t p = vdupq_n_f32(1.9875691500e-4f);
	p = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), p, r);
	p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, r);
	p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, r);
	p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, r);
	p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, r);
	p = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.0f)), p, vmulq_f32(r, r));
	int32x4_t e = vshlq_n_s32(vcvtq_s32_f32(n), 23);
	p = vreinterpretq_f32_s32(vaddq_s32(vreinterpretq_s32_f32(p), e));
	p = vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(p), under));
	return vbslq_f32(over, vdupq_n_f32(INFINITY), p);
}

// tk_softmax_neon is softmax in place over n scores, four at a time; the
// tail goes through a padded vector (its padding adds 0), so every score
// takes the same steps and a row's result depends only on the row.
void tk_softmax_neon(float *sc, int64_t n) {
	if (n <= 0) {
		return;
	}
	int64_t full = n & ~(int64_t)3;
	int tail = (int)(n - full);
	float pad[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
	for (int i = 0; i < tail; i++) {
		pad[i] = sc[full + i];
	}
	float32x4_t mx = vld1q_f32(pad);
	for (int64_t i = 0; i < full; i += 4) {
		mx = vmaxq_f32(mx, vld1q_f32(sc + i));
	}
	float32x4_t m = vdupq_n_f32(vmaxvq_f32(mx));
	float32x4_t sum = vdupq_n_f32(0);
	for (int64_t i = 0; i < full; i += 4) {
		float32x4_t e = exp4(vsubq_f32(vld1q_f32(sc + i), m));
		vst1q_f32(sc + i, e);
		sum = vaddq_f32(sum, e);
	}
	if (tail) {
		// exp(-inf - m) is 0: the padding adds nothing.
		float32x4_t e = exp4(vsubq_f32(vld1q_f32(pad), m));
		vst1q_f32(pad, e);
		sum = vaddq_f32(sum, e);
	}
	float inv = 1.0f / vaddvq_f32(sum);
	for (int64_t i = 0; i < full; i += 4) {
		vst1q_f32(sc + i, vmulq_n_f32(vld1q_f32(sc + i), inv));
	}
	for (int i = 0; i < tail; i++) {
		sc[full + i] = pad[i] * inv;
	}
}

// tk_exp_sum_neon is tk_exp_sum four at a time, summed in two double
// lanes; the tail goes through a padded vector whose padding adds 0.
double tk_exp_sum_neon(float *x, int64_t n, float m) {
	float32x4_t mv = vdupq_n_f32(m);
	float64x2_t lo = vdupq_n_f64(0), hi = vdupq_n_f64(0);
	int64_t i = 0;
	for (; i + 4 <= n; i += 4) {
		float32x4_t e = exp4(vsubq_f32(vld1q_f32(x + i), mv));
		vst1q_f32(x + i, e);
		lo = vaddq_f64(lo, vcvt_f64_f32(vget_low_f32(e)));
		hi = vaddq_f64(hi, vcvt_high_f64_f32(e));
	}
	if (i < n) {
		float pad[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
		int tail = (int)(n - i);
		for (int j = 0; j < tail; j++) {
			pad[j] = x[i + j] - m;
		}
		float32x4_t e = exp4(vld1q_f32(pad));
		vst1q_f32(pad, e);
		for (int j = 0; j < tail; j++) {
			x[i + j] = pad[j];
		}
		lo = vaddq_f64(lo, vcvt_f64_f32(vget_low_f32(e)));
		hi = vaddq_f64(hi, vcvt_high_f64_f32(e));
	}
	float64x2_t s = vaddq_f64(lo, hi);
	return vgetq_lane_f64(s, 0) + vgetq_lane_f64(s, 1);
}

// silu4 is SwiGLU for four elements: g / (1 + e^-g) · u.
static inline float32x4_t silu4(float32x4_t g, float32x4_t u) {
	return vmulq_f32(vdivq_f32(g, vaddq_f32(vdupq_n_f32(1.0f), exp4(vnegq_f32(g)))), u);
}

// tk_silu_mul_neon is SwiGLU four elements at a time, the tail through a
// padded vector, as tk_silu_mul_avx2.
void tk_silu_mul_neon(float *gate, const float *up, int64_t n) {
	int64_t i = 0;
	for (; i + 4 <= n; i += 4) {
		vst1q_f32(gate + i, silu4(vld1q_f32(gate + i), vld1q_f32(up + i)));
	}
	if (i < n) {
		float g4[4] = {0}, u4[4] = {0};
		int tail = (int)(n - i);
		for (int j = 0; j < tail; j++) {
			g4[j] = gate[i + j];
			u4[j] = up[i + j];
		}
		vst1q_f32(g4, silu4(vld1q_f32(g4), vld1q_f32(u4)));
		for (int j = 0; j < tail; j++) {
			gate[i + j] = g4[j];
		}
	}
}
#endif
