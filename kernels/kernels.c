//go:build cgo

// Dispatch and the portable scalar kernels. The scalar kernels compute
// exactly what the Go twins in matmul.go compute.
#include "kernels.h"

#include <math.h>
#include <string.h>

void tk_quantize(int level, const float *x, int8_t *q, float *d, int32_t *s, int64_t n, int64_t block) {
#if defined(__x86_64__)
	if (level == TK_AVX2 || level == TK_AVX512) {
		tk_quantize_avx2(x, q, d, n, block);
		goto sums;
	}
#endif
	(void)level;
	for (int64_t b = 0; b < n / block; b++) {
		const float *xb = x + b * block;
		float amax = 0;
		for (int64_t i = 0; i < block; i++) {
			float a = xb[i] < 0 ? -xb[i] : xb[i];
			amax = a > amax ? a : amax;
		}
		float scale = amax / 127.0f;
		float inv = scale != 0 ? 1.0f / scale : 0.0f;
		for (int64_t i = 0; i < block; i++) {
			q[b * block + i] = (int8_t)tk_round_even(xb[i] * inv);
		}
		d[b] = scale;
	}
#if defined(__x86_64__)
sums:
#endif
	for (int64_t g = 0; g < n / 16; g++) {
		int32_t sum = 0;
		for (int i = 0; i < 16; i++) {
			sum += q[16 * g + i];
		}
		s[g] = sum;
	}
}

void tk_matmul(int level, int wt, float *out, const uint8_t *w, int64_t row_bytes,
	int64_t lo, int64_t hi, int64_t rows, int64_t cols, const float *x,
	const int8_t *xq, const float *xd, const int32_t *xs, int64_t n) {
	switch (level) {
#if defined(__x86_64__)
	case TK_AVX512:
		if (wt == TK_Q8_0 || wt == TK_Q4_0 || wt == TK_F16) {
			tk_matmul_avx512(wt, out, w, row_bytes, lo, hi, rows, cols, x, xq, xd, xs, n);
			return;
		}
		tk_matmul_avx2(wt, out, w, row_bytes, lo, hi, rows, cols, x, xq, xd, xs, n);
		return;
	case TK_AVX2:
		tk_matmul_avx2(wt, out, w, row_bytes, lo, hi, rows, cols, x, xq, xd, xs, n);
		return;
#endif
#if defined(__aarch64__)
	case TK_NEON:
	case TK_NEON_DOT:
		tk_matmul_neon(level == TK_NEON_DOT, wt, out, w, row_bytes, lo, hi, rows, cols, x, xq, xd, xs, n);
		return;
#endif
	default:
		tk_matmul_scalar(wt, out, w, row_bytes, lo, hi, rows, cols, x, xq, xd, xs, n);
	}
}

static float weight_at(int wt, const uint8_t *row, int64_t c) {
	switch (wt) {
	case TK_F32: {
		union { uint32_t u; float f; } v;
		const uint8_t *p = row + 4 * c;
		v.u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
		return v.f;
	}
	case TK_F16:
		return tk_f16(tk_le16(row + 2 * c));
	default:
		return tk_bf16(tk_le16(row + 2 * c));
	}
}

void tk_matmul_scalar(int wt, float *out, const uint8_t *w, int64_t row_bytes,
	int64_t lo, int64_t hi, int64_t rows, int64_t cols, const float *x,
	const int8_t *xq, const float *xd, const int32_t *xs, int64_t n) {
	for (int64_t r = lo; r < hi; r++) {
		const uint8_t *row = w + r * row_bytes;
		for (int64_t j = 0; j < n; j++) {
			float acc = 0;
			switch (wt) {
			case TK_Q8_0: {
				int64_t nb = cols / 32;
				for (int64_t b = 0; b < nb; b++) {
					const uint8_t *blk = row + b * 34;
					const int8_t *y = xq + (j * nb + b) * 32;
					int32_t sum = 0;
					for (int i = 0; i < 32; i++) {
						sum += (int8_t)blk[2 + i] * y[i];
					}
					acc += (float)sum * (tk_f16(tk_le16(blk)) * xd[j * nb + b]);
				}
				break;
			}
			case TK_Q4_0: {
				int64_t nb = cols / 32;
				for (int64_t b = 0; b < nb; b++) {
					const uint8_t *blk = row + b * 18;
					const int8_t *y = xq + (j * nb + b) * 32;
					int32_t sum = 0;
					for (int i = 0; i < 16; i++) {
						sum += (blk[2 + i] & 15) * y[i] + (blk[2 + i] >> 4) * y[i + 16];
					}
					int64_t g = 2 * (j * nb + b);
					sum -= 8 * (xs[g] + xs[g + 1]);
					acc += (float)sum * (tk_f16(tk_le16(blk)) * xd[j * nb + b]);
				}
				break;
			}
			case TK_Q4_K: {
				int64_t nb = cols / 256;
				for (int64_t b = 0; b < nb; b++) {
					const uint8_t *blk = row + b * 144;
					const int8_t *y = xq + (j * nb + b) * 256;
					const int32_t *bs = xs + (j * nb + b) * 16;
					int32_t sumi = 0, summ = 0;
					for (int sb = 0; sb < 8; sb++) {
						uint8_t sc, m;
						tk_scale_min_k4(blk + 4, sb, &sc, &m);
						const uint8_t *qs = blk + 16 + 32 * (sb / 2);
						int shift = 4 * (sb & 1);
						int32_t isum = 0;
						for (int l = 0; l < 32; l++) {
							isum += ((qs[l] >> shift) & 15) * y[32 * sb + l];
						}
						sumi += sc * isum;
						summ += m * (bs[2 * sb] + bs[2 * sb + 1]);
					}
					float dx = xd[j * nb + b];
					acc += (tk_f16(tk_le16(blk)) * dx) * (float)sumi - (tk_f16(tk_le16(blk + 2)) * dx) * (float)summ;
				}
				break;
			}
			case TK_Q6_K: {
				int64_t nb = cols / 256;
				for (int64_t b = 0; b < nb; b++) {
					const uint8_t *blk = row + b * 210;
					const int8_t *y = xq + (j * nb + b) * 256;
					const int32_t *bs = xs + (j * nb + b) * 16;
					int32_t isum[16] = {0};
					for (int h = 0; h < 2; h++) {
						const uint8_t *ql = blk + 64 * h, *qh = blk + 128 + 32 * h;
						const int8_t *yh = y + 128 * h;
						int32_t *g = isum + 8 * h;
						for (int l = 0; l < 32; l++) {
							int is = l / 16;
							g[is] += ((ql[l] & 15) | ((qh[l] >> 0 & 3) << 4)) * yh[l];
							g[is + 2] += ((ql[l + 32] & 15) | ((qh[l] >> 2 & 3) << 4)) * yh[l + 32];
							g[is + 4] += ((ql[l] >> 4) | ((qh[l] >> 4 & 3) << 4)) * yh[l + 64];
							g[is + 6] += ((ql[l + 32] >> 4) | ((qh[l] >> 6 & 3) << 4)) * yh[l + 96];
						}
					}
					int32_t sumi = 0;
					for (int i = 0; i < 16; i++) {
						sumi += (int8_t)blk[192 + i] * (isum[i] - 32 * bs[i]);
					}
					acc += (tk_f16(tk_le16(blk + 208)) * xd[j * nb + b]) * (float)sumi;
				}
				break;
			}
			default: {
				// Four lanes then pairwise, as the Go twin's dot.
				const float *xj = x + j * cols;
				float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
				int64_t i = 0;
				for (; i + 4 <= cols; i += 4) {
					s0 += weight_at(wt, row, i) * xj[i];
					s1 += weight_at(wt, row, i + 1) * xj[i + 1];
					s2 += weight_at(wt, row, i + 2) * xj[i + 2];
					s3 += weight_at(wt, row, i + 3) * xj[i + 3];
				}
				for (; i < cols; i++) {
					s0 += weight_at(wt, row, i) * xj[i];
				}
				acc = (s0 + s1) + (s2 + s3);
			}
			}
			out[j * rows + r] = acc;
		}
	}
}

static float dot_row(int level, int f16, const float *q, const void *k, int64_t hd) {
	switch (level) {
#if defined(__aarch64__)
	case TK_NEON:
	case TK_NEON_DOT:
		return tk_dot_neon(f16, q, k, hd);
#endif
	default: {
		float s = 0;
		for (int64_t d = 0; d < hd; d++) {
			s += q[d] * (f16 ? tk_f16(((const uint16_t *)k)[d]) : ((const float *)k)[d]);
		}
		return s;
	}
	}
}

static void axpy_row(int level, int f16, float *out, float p, const void *v, int64_t hd) {
	switch (level) {
#if defined(__aarch64__)
	case TK_NEON:
	case TK_NEON_DOT:
		tk_axpy_neon(f16, out, p, v, hd);
		return;
#endif
	default:
		for (int64_t d = 0; d < hd; d++) {
			out[d] += p * (f16 ? tk_f16(((const uint16_t *)v)[d]) : ((const float *)v)[d]);
		}
	}
}

static void softmax_row(int level, float *sc, int64_t n) {
	switch (level) {
#if defined(__x86_64__)
	case TK_AVX2:
	case TK_AVX512:
		tk_softmax_avx2(sc, n);
		return;
#endif
#if defined(__aarch64__)
	case TK_NEON:
	case TK_NEON_DOT:
		tk_softmax_neon(sc, n);
		return;
#endif
	default: {
		float mx = -INFINITY;
		for (int64_t i = 0; i < n; i++) {
			mx = sc[i] > mx ? sc[i] : mx;
		}
		float sum = 0;
		for (int64_t i = 0; i < n; i++) {
			sc[i] = expf(sc[i] - mx);
			sum += sc[i];
		}
		float inv = 1.0f / sum;
		for (int64_t i = 0; i < n; i++) {
			sc[i] *= inv;
		}
	}
	}
}

// attend_one is tk_attention for one group over rows 0..prefix-1 and
// extra[0..nextra-1], scores holding heads*(prefix+nextra).
static void attend_one(int level, int f16, int avx2, float *out, const float *q, const uint8_t *k, const uint8_t *v,
	int64_t hd, int64_t heads, int64_t stride, int64_t off, int64_t prefix, const int32_t *extra, int64_t nextra,
	float scale, float *scores) {
	const int64_t es = f16 ? 2 : 4;
	const int64_t n = prefix + nextra;
	// Rows outer, heads inner: a K or V row is loaded once and stays in
	// L1 for every head that shares it.
	if (avx2) {
#if defined(__x86_64__)
		tk_scores_avx2(f16, q, 0, 1, heads, hd, k, stride, off, 0, prefix, extra, n, scale, scores, n);
#endif
	} else {
		for (int64_t i = 0; i < n; i++) {
			int64_t row = i < prefix ? i : extra[i - prefix];
			const char *kr = (const char *)k + (row * stride + off) * es;
			for (int64_t h = 0; h < heads; h++) {
				scores[h * n + i] = dot_row(level, f16, q + h * hd, kr, hd) * scale;
			}
		}
	}
	for (int64_t h = 0; h < heads; h++) {
		softmax_row(level, scores + h * n, n);
	}
	if (avx2) {
#if defined(__x86_64__)
		tk_values_avx2(f16, out, 0, 1, heads, hd, scores, n, n, v, stride, off, 0, prefix, extra, 0);
#endif
		return;
	}
	memset(out, 0, (size_t)(heads * hd) * sizeof(float));
	for (int64_t i = 0; i < n; i++) {
		int64_t row = i < prefix ? i : extra[i - prefix];
		const char *vr = (const char *)v + (row * stride + off) * es;
		for (int64_t h = 0; h < heads; h++) {
			axpy_row(level, f16, out + h * hd, scores[h * n + i], vr, hd);
		}
	}
}

void tk_attention(int level, int f16, float *out, const float *q, int64_t qs, const uint8_t *k, const uint8_t *v,
	int64_t hd, int64_t heads, int64_t slots, int64_t stride, int64_t off, int64_t prefix, const int32_t *anc,
	const int64_t *lo, const int64_t *hi, int64_t nanc, float scale, float *scores, int64_t ld) {
	const int64_t es = f16 ? 2 : 4;
#if defined(__x86_64__)
	const int avx2 = level == TK_AVX2 || level == TK_AVX512;
#else
	const int avx2 = 0;
#endif
	if (slots == 1) {
		// One group reads its prefix and its own rows in one pass.
		const int64_t a = lo ? lo[0] : 0, b = hi ? hi[0] : nanc;
		attend_one(level, f16, avx2, out, q, k, v, hd, heads, stride, off, prefix, b > a ? anc + a : NULL, b - a,
			scale, scores);
		return;
	}
	// Several groups come with their ranges (kernels.mustAttention).
	// The prefix's rows are read once for every group, rows outer, and
	// then each group's own rows: each head's sums still run in the order
	// of a lone head's over its rows, so grouping changes no bit.
	if (avx2) {
#if defined(__x86_64__)
		tk_scores_avx2(f16, q, qs, slots, heads, hd, k, stride, off, 0, prefix, NULL, prefix, scale, scores, ld);
		for (int64_t s = 0; s < slots; s++) {
			const int64_t a = lo[s], b = hi[s];
			tk_scores_avx2(f16, q + s * qs, 0, 1, heads, hd, k, stride, off, 0, 0, b > a ? anc + a : NULL, b - a, scale,
				scores + s * heads * ld + prefix, ld);
		}
#endif
	} else {
		for (int64_t i = 0; i < prefix; i++) {
			const char *kr = (const char *)k + (i * stride + off) * es;
			for (int64_t s = 0; s < slots; s++) {
				for (int64_t h = 0; h < heads; h++) {
					scores[(s * heads + h) * ld + i] = dot_row(level, f16, q + s * qs + h * hd, kr, hd) * scale;
				}
			}
		}
		for (int64_t s = 0; s < slots; s++) {
			const int64_t a = lo[s], b = hi[s];
			for (int64_t i = a; i < b; i++) {
				const char *kr = (const char *)k + ((int64_t)anc[i] * stride + off) * es;
				for (int64_t h = 0; h < heads; h++) {
					scores[(s * heads + h) * ld + prefix + i - a] = dot_row(level, f16, q + s * qs + h * hd, kr, hd) * scale;
				}
			}
		}
	}
	for (int64_t s = 0; s < slots; s++) {
		const int64_t n = prefix + hi[s] - lo[s];
		for (int64_t h = 0; h < heads; h++) {
			softmax_row(level, scores + (s * heads + h) * ld, n);
		}
	}
	if (avx2) {
#if defined(__x86_64__)
		tk_values_avx2(f16, out, qs, slots, heads, hd, scores, ld, prefix, v, stride, off, 0, prefix, NULL, 0);
		for (int64_t s = 0; s < slots; s++) {
			const int64_t a = lo[s], b = hi[s];
			tk_values_avx2(f16, out + s * qs, 0, 1, heads, hd, scores + s * heads * ld + prefix, ld, b - a, v, stride,
				off, 0, 0, b > a ? anc + a : NULL, 1);
		}
#endif
		return;
	}
	for (int64_t s = 0; s < slots; s++) {
		memset(out + s * qs, 0, (size_t)(heads * hd) * sizeof(float));
	}
	for (int64_t i = 0; i < prefix; i++) {
		const char *vr = (const char *)v + (i * stride + off) * es;
		for (int64_t s = 0; s < slots; s++) {
			for (int64_t h = 0; h < heads; h++) {
				axpy_row(level, f16, out + s * qs + h * hd, scores[(s * heads + h) * ld + i], vr, hd);
			}
		}
	}
	for (int64_t s = 0; s < slots; s++) {
		const int64_t a = lo[s], b = hi[s];
		for (int64_t i = a; i < b; i++) {
			const char *vr = (const char *)v + ((int64_t)anc[i] * stride + off) * es;
			for (int64_t h = 0; h < heads; h++) {
				axpy_row(level, f16, out + s * qs + h * hd, scores[(s * heads + h) * ld + prefix + i - a], vr, hd);
			}
		}
	}
}

double tk_exp_sum(int level, float *x, int64_t n, float m) {
	switch (level) {
#if defined(__x86_64__)
	case TK_AVX2:
	case TK_AVX512:
		return tk_exp_sum_avx2(x, n, m);
#endif
#if defined(__aarch64__)
	case TK_NEON:
	case TK_NEON_DOT:
		return tk_exp_sum_neon(x, n, m);
#endif
	default: {
		double sum = 0;
		for (int64_t i = 0; i < n; i++) {
			x[i] = expf(x[i] - m);
			sum += x[i];
		}
		return sum;
	}
	}
}

void tk_silu_mul(int level, float *gate, const float *up, int64_t n) {
	switch (level) {
#if defined(__x86_64__)
	case TK_AVX2:
	case TK_AVX512:
		tk_silu_mul_avx2(gate, up, n);
		return;
#endif
#if defined(__aarch64__)
	case TK_NEON:
	case TK_NEON_DOT:
		tk_silu_mul_neon(gate, up, n);
		return;
#endif
	default:
		for (int64_t i = 0; i < n; i++) {
			gate[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
		}
	}
}
