//go:build cgo

// C kernels behind package kernels. The Go wrappers check every length
// before calling in, so these functions trust their arguments.
#ifndef TANDEM_KERNELS_H
#define TANDEM_KERNELS_H

#include <stdint.h>

// The kernels round like the Go twins only without fused multiply-add
// contraction: GCC leaves it off in ISO C mode (-std=c11), clang obeys
// this pragma.
#pragma STDC FP_CONTRACT OFF

// Instruction-set levels, chosen once in Go from golang.org/x/sys/cpu.
enum {
	TK_SCALAR = 0,
	TK_AVX2 = 1,        // x86-64 with AVX2, FMA and F16C
	TK_NEON = 2,        // arm64 baseline
	TK_NEON_DOT = 3,    // arm64 with the SDOT instruction
	TK_AVX512 = 4,      // TK_AVX2 plus AVX-512 F, BW, VL and VNNI
};

// Weight types, by their GGUF ids.
enum {
	TK_F32 = 0,
	TK_F16 = 1,
	TK_Q4_0 = 2,
	TK_Q8_0 = 8,
	TK_Q4_K = 12,
	TK_Q6_K = 14,
	TK_BF16 = 30,
};

// tk_quantize quantizes n floats in blocks of `block` values: d[b] =
// max|x|/127, q = round-half-even(x/d), and s[g] is the sum of q over
// each 16 values. Bit-identical to the Go twin goQuantize.
void tk_quantize(int level, const float *x, int8_t *q, float *d, int32_t *s, int64_t n, int64_t block);

// tk_matmul computes rows [lo, hi) of out[j*rows + r] for j < n. Float
// weight types read x; quantized ones read the quantized activations
// (xq, xd, xs as produced by tk_quantize with the matching block).
//
// Every level is batch-invariant: out[j*rows + r] takes the same float
// steps whatever n and j are, so a vector's outputs are the same bits in
// any batch (speculative verification and server batching rely on it).
void tk_matmul(int level, int wt, float *out, const uint8_t *w, int64_t row_bytes,
	int64_t lo, int64_t hi, int64_t rows, int64_t cols, const float *x,
	const int8_t *xq, const float *xd, const int32_t *xs, int64_t n);

// tk_attention is the attention of slots groups of heads query heads
// that share one KV head: group s's queries are at q + s*qs (heads of hd
// values one after another) and its output at out + s*qs. Every group
// attends to KV rows 0..prefix-1, then to rows anc[lo[s]..hi[s]-1] (all
// of anc[0..nanc-1] when lo and hi are NULL, which only one group may be). k and v
// point at the bytes of float (f16 == 0) or IEEE half (f16 == 1)
// elements, row i at element i*stride + off. scores holds group s's head
// h at (s*heads + h)*ld, ld at least prefix plus the most rows a group
// adds. A group's bits are those it gets attending alone.
void tk_attention(int level, int f16, float *out, const float *q, int64_t qs, const uint8_t *k, const uint8_t *v,
	int64_t hd, int64_t heads, int64_t slots, int64_t stride, int64_t off, int64_t prefix, const int32_t *anc,
	const int64_t *lo, const int64_t *hi, int64_t nanc, float scale, float *scores, int64_t ld);

// tk_silu_mul sets gate[i] = silu(gate[i]) · up[i] for i < n (SwiGLU).
void tk_silu_mul(int level, float *gate, const float *up, int64_t n);

// tk_exp_sum sets x[i] = e^(x[i] - m) for i < n and returns their sum in
// double (a sampler's softmax over a whole vocabulary).
double tk_exp_sum(int level, float *x, int64_t n, float m);

// Per-level kernels (defined only on their architecture).
void tk_matmul_scalar(int wt, float *out, const uint8_t *w, int64_t row_bytes,
	int64_t lo, int64_t hi, int64_t rows, int64_t cols, const float *x,
	const int8_t *xq, const float *xd, const int32_t *xs, int64_t n);
void tk_matmul_avx2(int wt, float *out, const uint8_t *w, int64_t row_bytes,
	int64_t lo, int64_t hi, int64_t rows, int64_t cols, const float *x,
	const int8_t *xq, const float *xd, const int32_t *xs, int64_t n);
void tk_matmul_avx512(int wt, float *out, const uint8_t *w, int64_t row_bytes,
	int64_t lo, int64_t hi, int64_t rows, int64_t cols, const float *x,
	const int8_t *xq, const float *xd, const int32_t *xs, int64_t n);
void tk_quantize_avx2(const float *x, int8_t *q, float *d, int64_t n, int64_t block);
void tk_matmul_neon(int dot, int wt, float *out, const uint8_t *w, int64_t row_bytes,
	int64_t lo, int64_t hi, int64_t rows, int64_t cols, const float *x,
	const int8_t *xq, const float *xd, const int32_t *xs, int64_t n);

// Per-level attention helpers, for float and half rows: AVX2 computes
// the scores and the value sums of a group of heads in one call each;
// NEON gives one head's dot product with a K row and out += p·(V row).
void tk_scores_avx2(int f16, const float *q, int64_t qs, int64_t slots, int64_t heads, int64_t hd, const void *k,
	int64_t stride, int64_t off, int64_t base, int64_t prefix, const int32_t *extra, int64_t n, float scale,
	float *scores, int64_t ld);
void tk_values_avx2(int f16, float *out, int64_t os, int64_t slots, int64_t heads, int64_t hd, const float *p,
	int64_t ld, int64_t n, const void *v, int64_t stride, int64_t off, int64_t base, int64_t prefix,
	const int32_t *extra, int acc);
void tk_softmax_avx2(float *sc, int64_t n);
void tk_softmax_neon(float *sc, int64_t n);
void tk_silu_mul_avx2(float *gate, const float *up, int64_t n);
void tk_silu_mul_neon(float *gate, const float *up, int64_t n);
double tk_exp_sum_avx2(float *x, int64_t n, float m);
double tk_exp_sum_neon(float *x, int64_t n, float m);
float tk_dot_neon(int f16, const float *a, const void *b, int64_t n);
void tk_axpy_neon(int f16, float *y, float p, const void *x, int64_t n);

// Shared scalar helpers.
static inline float tk_f16(uint16_t h) {
	union { uint32_t u; float f; } v;
	uint32_t sign = (uint32_t)(h & 0x8000) << 16;
	uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
	if (exp == 0) {
		// zero or subnormal: man * 2^-24 is exact in float
		v.f = (float)man * 5.9604644775390625e-8f;
		v.u |= sign;
		return v.f;
	}
	if (exp == 31) {
		v.u = sign | 0x7f800000u | (man << 13);
	} else {
		v.u = sign | ((exp + 112) << 23) | (man << 13);
	}
	return v.f;
}

static inline float tk_bf16(uint16_t h) {
	union { uint32_t u; float f; } v;
	v.u = (uint32_t)h << 16;
	return v.f;
}

static inline uint16_t tk_le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

// Q4_K: the 6-bit scale and min of sub-block j (ggml's get_scale_min_k4).
static inline void tk_scale_min_k4(const uint8_t *s, int j, uint8_t *sc, uint8_t *m) {
	if (j < 4) {
		*sc = s[j] & 63;
		*m = s[j + 4] & 63;
	} else {
		*sc = (uint8_t)((s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4));
		*m = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
	}
}

// Round half to even for |v| < 2^22, as math.RoundToEven (needs the
// default rounding mode, which Go never changes).
static inline float tk_round_even(float v) {
	const float magic = 12582912.0f; // 1.5 * 2^23
	return v >= 0 ? (v + magic) - magic : (v - magic) + magic;
}

#endif
