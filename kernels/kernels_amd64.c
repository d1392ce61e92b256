//go:build cgo

// x86-64 kernels for AVX2 + FMA + F16C (the _amd64 suffix limits the
// file to amd64 builds), compiled with target attributes
// so the package builds with default CFLAGS; Go only selects them after
// checking the CPU. Up to four activation columns share each weight
// load, so batched calls read the weights once per four vectors.
#include "kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <string.h>
#include <math.h>

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

AVX2 INLINE float hsum_ps(__m256 v) {
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	s = _mm_add_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

// hsum8_ps returns the horizontal sums of v[0..7], each added in
// hsum_ps's order ((x0+x4)+(x2+x6)) + ((x1+x5)+(x3+x7)), so a sum has
// the same bits reduced alone or with seven others.
AVX2 INLINE __m256 hsum8_ps(const __m256 v[8]) {
	// t[j]: row 2j's x_i+x_{i+4} in the low 128-bit lane, row 2j+1's in
	// the high one.
	__m256 t[4];
	for (int j = 0; j < 4; j++) {
		t[j] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * j], v[2 * j + 1], 0x20),
			_mm256_permute2f128_ps(v[2 * j], v[2 * j + 1], 0x31));
	}
	// u[j]: per lane (p0+p2, p1+p3) of rows 4j and 4j+2 (low lane),
	// 4j+1 and 4j+3 (high lane).
	__m256 u[2];
	for (int j = 0; j < 2; j++) {
		u[j] = _mm256_add_ps(_mm256_shuffle_ps(t[2 * j], t[2 * j + 1], _MM_SHUFFLE(1, 0, 1, 0)),
			_mm256_shuffle_ps(t[2 * j], t[2 * j + 1], _MM_SHUFFLE(3, 2, 3, 2)));
	}
	// The even rows' sums land in the low lane, the odd rows' in the high.
	return _mm256_permutevar8x32_ps(_mm256_hadd_ps(u[0], u[1]), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

AVX2 INLINE int32_t hsum_epi32(__m256i v) {
	__m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
	s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
	s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
	return _mm_cvtsi128_si32(s);
}

AVX2 INLINE float f16_avx2(const uint8_t *p) { return _cvtsh_ss(tk_le16(p)); }

AVX2 INLINE __m256i pair128(__m128i lo, __m128i hi) {
	return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

// Q8_0 and Q4_0: signed weights w and activations y meet in maddubs as
// |w| · (y with w's sign), then pairs widen to int32 lanes.
AVX2 INLINE __m256i dot_signed(__m256i w, __m256i y) {
	__m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(y, w));
	return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

// Q8_0/Q4_0 weights of block b as 32 signed bytes.
AVX2 INLINE __m256i q8_0_weights(const uint8_t *blk) {
	return _mm256_loadu_si256((const __m256i *)(blk + 2));
}

AVX2 INLINE __m256i q4_0_weights(const uint8_t *blk) {
	const __m128i m4 = _mm_set1_epi8(15);
	__m128i v = _mm_loadu_si128((const __m128i *)(blk + 2));
	__m256i wq = pair128(_mm_and_si128(v, m4), _mm_and_si128(_mm_srli_epi16(v, 4), m4));
	return _mm256_sub_epi8(wq, _mm256_set1_epi8(8));
}

// q32_row: Q8_0 (bb = 34) or Q4_0 (bb = 18). Two blocks per step with
// separate accumulators, so consecutive FMAs do not wait on each other.
AVX2 INLINE void q32_row(const int bb, float *out, const uint8_t *row, int64_t nb, const int8_t *xq, const float *xd,
	int64_t j0, const int nc, int64_t rows) {
	__m256 acc0[4], acc1[4];
	for (int c = 0; c < 4; c++) {
		acc0[c] = acc1[c] = _mm256_setzero_ps();
	}
	int64_t b = 0;
	for (; b + 2 <= nb; b += 2) {
		const uint8_t *b0 = row + b * bb, *b1 = b0 + bb;
		float d0 = f16_avx2(b0), d1 = f16_avx2(b1);
		__m256i w0 = bb == 34 ? q8_0_weights(b0) : q4_0_weights(b0);
		__m256i w1 = bb == 34 ? q8_0_weights(b1) : q4_0_weights(b1);
		for (int c = 0; c < nc; c++) {
			int64_t jb = (j0 + c) * nb + b;
			__m256i p0 = dot_signed(w0, _mm256_loadu_si256((const __m256i *)(xq + jb * 32)));
			__m256i p1 = dot_signed(w1, _mm256_loadu_si256((const __m256i *)(xq + jb * 32 + 32)));
			acc0[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_set1_ps(d0 * xd[jb]), acc0[c]);
			acc1[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1), _mm256_set1_ps(d1 * xd[jb + 1]), acc1[c]);
		}
	}
	if (b < nb) {
		const uint8_t *b0 = row + b * bb;
		float d0 = f16_avx2(b0);
		__m256i w0 = bb == 34 ? q8_0_weights(b0) : q4_0_weights(b0);
		for (int c = 0; c < nc; c++) {
			int64_t jb = (j0 + c) * nb + b;
			__m256i p0 = dot_signed(w0, _mm256_loadu_si256((const __m256i *)(xq + jb * 32)));
			acc0[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_set1_ps(d0 * xd[jb]), acc0[c]);
		}
	}
	for (int c = 0; c < nc; c++) {
		out[(j0 + c) * rows] = hsum_ps(_mm256_add_ps(acc0[c], acc1[c]));
	}
}

// Q4_K and Q6_K sum each super-block exactly in integers and then take
// the same float steps as the Go twins, so the results match bit for bit.
AVX2 INLINE void q4_k_row(float *out, const uint8_t *row, int64_t nb, const int8_t *xq, const float *xd,
	const int32_t *xs, int64_t j0, const int nc, int64_t rows) {
	const __m256i m4 = _mm256_set1_epi8(15);
	float acc[4] = {0, 0, 0, 0};
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *blk = row + b * 144;
		float d = f16_avx2(blk), dmin = f16_avx2(blk + 2);
		uint8_t sc[8], m[8];
		for (int j = 0; j < 8; j++) {
			tk_scale_min_k4(blk + 4, j, &sc[j], &m[j]);
		}
		// sub-block mins in the order _mm256_hadd_epi32 leaves pair sums
		const __m256i mv = _mm256_setr_epi32(m[0], m[1], m[4], m[5], m[2], m[3], m[6], m[7]);
		__m256i lo[4], hi[4];
		for (int k = 0; k < 4; k++) {
			__m256i q = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * k));
			lo[k] = _mm256_and_si256(q, m4);
			hi[k] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
		}
		for (int c = 0; c < nc; c++) {
			int64_t jb = (j0 + c) * nb + b;
			const int8_t *y = xq + jb * 256;
			const int32_t *bs = xs + jb * 16;
			__m256i sumi = _mm256_setzero_si256();
			for (int k = 0; k < 4; k++) {
				__m256i p0 = _mm256_maddubs_epi16(lo[k], _mm256_loadu_si256((const __m256i *)(y + 64 * k)));
				__m256i p1 = _mm256_maddubs_epi16(hi[k], _mm256_loadu_si256((const __m256i *)(y + 64 * k + 32)));
				p0 = _mm256_madd_epi16(p0, _mm256_set1_epi16(sc[2 * k]));
				p1 = _mm256_madd_epi16(p1, _mm256_set1_epi16(sc[2 * k + 1]));
				sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
			}
			// Σ_j m_j·(sum of x over sub-block j); hadd leaves the pair
			// sums in the order of mv.
			__m256i pairs = _mm256_hadd_epi32(_mm256_loadu_si256((const __m256i *)bs), _mm256_loadu_si256((const __m256i *)(bs + 8)));
			int32_t summ = hsum_epi32(_mm256_mullo_epi32(pairs, mv));
			float dx = xd[jb];
			acc[c] += (d * dx) * (float)hsum_epi32(sumi) - (dmin * dx) * (float)summ;
		}
	}
	for (int c = 0; c < nc; c++) {
		out[(j0 + c) * rows] = acc[c];
	}
}

AVX2 INLINE void q6_k_row(float *out, const uint8_t *row, int64_t nb, const int8_t *xq, const float *xd,
	const int32_t *xs, int64_t j0, const int nc, int64_t rows) {
	const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(3);
	float acc[4] = {0, 0, 0, 0};
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *blk = row + b * 210;
		const int8_t *sc = (const int8_t *)(blk + 192);
		float d = f16_avx2(blk + 208);
		__m256i lv[8], sv[8];
		const __m256i sc0 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)sc));
		const __m256i sc1 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(sc + 8)));
		for (int h = 0; h < 2; h++) {
			__m256i ql0 = _mm256_loadu_si256((const __m256i *)(blk + 64 * h));
			__m256i ql1 = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32));
			__m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
			// levels 0..63 of the four 32-weight runs of this half
			lv[4 * h + 0] = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4));
			lv[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4));
			lv[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4));
			lv[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4));
			for (int k = 0; k < 4; k++) {
				int a = 8 * h + 2 * k; // run k's two 16-weight scales
				sv[4 * h + k] = pair128(_mm_set1_epi16(sc[a]), _mm_set1_epi16(sc[a + 1]));
			}
		}
		for (int c = 0; c < nc; c++) {
			int64_t jb = (j0 + c) * nb + b;
			const int8_t *y = xq + jb * 256;
			const int32_t *bs = xs + jb * 16;
			__m256i sumi = _mm256_setzero_si256();
			for (int k = 0; k < 8; k++) {
				__m256i p = _mm256_maddubs_epi16(lv[k], _mm256_loadu_si256((const __m256i *)(y + 32 * k)));
				sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, sv[k]));
			}
			// less 32·Σ sc_i·(sum of x over 16-group i), the level offset
			__m256i off = _mm256_add_epi32(_mm256_mullo_epi32(sc0, _mm256_loadu_si256((const __m256i *)bs)),
				_mm256_mullo_epi32(sc1, _mm256_loadu_si256((const __m256i *)(bs + 8))));
			sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(off, 5));
			acc[c] += (d * xd[jb]) * (float)hsum_epi32(sumi);
		}
	}
	for (int c = 0; c < nc; c++) {
		out[(j0 + c) * rows] = acc[c];
	}
}

AVX2 INLINE __m256 load8(int wt, const uint8_t *p) {
	switch (wt) {
	case TK_F32:
		return _mm256_loadu_ps((const float *)p);
	case TK_F16:
		return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
	default: // BF16
		return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
	}
}

AVX2 INLINE float load1(int wt, const uint8_t *p) {
	switch (wt) {
	case TK_F32: {
		float f;
		__builtin_memcpy(&f, p, 4);
		return f;
	}
	case TK_F16:
		return _cvtsh_ss(tk_le16(p));
	default:
		return tk_bf16(tk_le16(p));
	}
}

AVX2 INLINE void float_row(int wt, float *out, const uint8_t *row, int64_t cols, const float *x,
	int64_t j0, const int nc, int64_t rows) {
	const int64_t es = wt == TK_F32 ? 4 : 2;
	__m256 a0[4], a1[4];
	for (int c = 0; c < 4; c++) {
		a0[c] = a1[c] = _mm256_setzero_ps();
	}
	int64_t i = 0;
	for (; i + 16 <= cols; i += 16) {
		__m256 w0 = load8(wt, row + i * es), w1 = load8(wt, row + (i + 8) * es);
		for (int c = 0; c < nc; c++) {
			const float *xc = x + (j0 + c) * cols + i;
			a0[c] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xc), a0[c]);
			a1[c] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xc + 8), a1[c]);
		}
	}
	for (; i + 8 <= cols; i += 8) {
		__m256 w0 = load8(wt, row + i * es);
		for (int c = 0; c < nc; c++) {
			a0[c] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + (j0 + c) * cols + i), a0[c]);
		}
	}
	for (int c = 0; c < nc; c++) {
		float s = hsum_ps(_mm256_add_ps(a0[c], a1[c]));
		const float *xc = x + (j0 + c) * cols;
		for (int64_t t = i; t < cols; t++) {
			s += load1(wt, row + t * es) * xc[t];
		}
		out[(j0 + c) * rows] = s;
	}
}

// dots8 sets v[c][r] to row r's products with vector c, summed into
// eight lanes, for the eight rows at p[0..7] (len values, a multiple of
// 8) and the nc vectors at x + c·len: each row is loaded once for all of
// them, and its two accumulator chains are float_row's and dot_avx2's,
// so hsum8_ps(v[c]) gives their sums' bits for eight rows at a time.
// One row at a time, each sum ended in a horizontal sum of six
// instructions, against one to eight FMAs for rows of 8 to 64 values
// (stories260K's attention heads and matrices).
AVX2 INLINE void dots8(int wt, int64_t es, const uint8_t *const p[8], int64_t len, const float *x, const int nc,
	__m256 v[4][8]) {
	for (int r = 0; r < 8; r++) {
		__m256 a0[4], a1[4];
		for (int c = 0; c < nc; c++) {
			a0[c] = a1[c] = _mm256_setzero_ps();
		}
		int64_t i = 0;
		for (; i + 16 <= len; i += 16) {
			__m256 w0 = load8(wt, p[r] + i * es), w1 = load8(wt, p[r] + (i + 8) * es);
			for (int c = 0; c < nc; c++) {
				const float *xc = x + c * len + i;
				a0[c] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xc), a0[c]);
				a1[c] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xc + 8), a1[c]);
			}
		}
		if (i < len) {
			__m256 w0 = load8(wt, p[r] + i * es);
			for (int c = 0; c < nc; c++) {
				a0[c] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + c * len + i), a0[c]);
			}
		}
		for (int c = 0; c < nc; c++) {
			v[c][r] = _mm256_add_ps(a0[c], a1[c]);
		}
	}
}

// float_rows8 is float_row for the eight rows at rows8[0..7] (cols a
// multiple of 8).
AVX2 INLINE void float_rows8(int wt, float *out, const uint8_t *const rows8[8], int64_t cols, const float *x,
	int64_t j0, const int nc, int64_t rows) {
	__m256 v[4][8];
	dots8(wt, wt == TK_F32 ? 4 : 2, rows8, cols, x + j0 * cols, nc, v);
	for (int c = 0; c < nc; c++) {
		_mm256_storeu_ps(out + (j0 + c) * rows, hsum8_ps(v[c]));
	}
}

// rows_nc runs one row for nc columns starting at j0; nc is a constant at
// each call site below so the column loops unroll.
AVX2 INLINE void row_nc(int wt, float *out, const uint8_t *row, int64_t cols, const float *x,
	const int8_t *xq, const float *xd, const int32_t *xs, int64_t j0, const int nc, int64_t rows) {
	switch (wt) {
	case TK_Q8_0:
		q32_row(34, out, row, cols / 32, xq, xd, j0, nc, rows);
		break;
	case TK_Q4_0:
		q32_row(18, out, row, cols / 32, xq, xd, j0, nc, rows);
		break;
	case TK_Q4_K:
		q4_k_row(out, row, cols / 256, xq, xd, xs, j0, nc, rows);
		break;
	case TK_Q6_K:
		q6_k_row(out, row, cols / 256, xq, xd, xs, j0, nc, rows);
		break;
	default:
		float_row(wt, out, row, cols, x, j0, nc, rows);
	}
}

AVX2 void tk_matmul_avx2(int wt, float *out, const uint8_t *w, int64_t row_bytes,
	int64_t lo, int64_t hi, int64_t rows, int64_t cols, const float *x,
	const int8_t *xq, const float *xd, const int32_t *xs, int64_t n) {
	int64_t r = lo;
	if ((wt == TK_F32 || wt == TK_F16 || wt == TK_BF16) && cols % 8 == 0) {
		for (; r + 8 <= hi; r += 8) {
			const uint8_t *rows8[8];
			for (int k = 0; k < 8; k++) {
				rows8[k] = w + (r + k) * row_bytes;
			}
			int64_t j = 0;
			for (; j + 4 <= n; j += 4) {
				float_rows8(wt, out + r, rows8, cols, x, j, 4, rows);
			}
			switch (n - j) {
			case 3:
				float_rows8(wt, out + r, rows8, cols, x, j, 3, rows);
				break;
			case 2:
				float_rows8(wt, out + r, rows8, cols, x, j, 2, rows);
				break;
			case 1:
				float_rows8(wt, out + r, rows8, cols, x, j, 1, rows);
				break;
			}
		}
	}
	for (; r < hi; r++) {
		const uint8_t *row = w + r * row_bytes;
		int64_t j = 0;
		for (; j + 4 <= n; j += 4) {
			row_nc(wt, out + r, row, cols, x, xq, xd, xs, j, 4, rows);
		}
		switch (n - j) {
		case 3:
			row_nc(wt, out + r, row, cols, x, xq, xd, xs, j, 3, rows);
			break;
		case 2:
			row_nc(wt, out + r, row, cols, x, xq, xd, xs, j, 2, rows);
			break;
		case 1:
			row_nc(wt, out + r, row, cols, x, xq, xd, xs, j, 1, rows);
			break;
		}
	}
}

AVX2 void tk_quantize_avx2(const float *x, int8_t *q, float *d, int64_t n, int64_t block) {
	const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
	for (int64_t b = 0; b < n / block; b++) {
		const float *xb = x + b * block;
		__m256 mx = _mm256_setzero_ps();
		for (int64_t i = 0; i < block; i += 8) {
			mx = _mm256_max_ps(mx, _mm256_and_ps(_mm256_loadu_ps(xb + i), absmask));
		}
		__m128 m = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
		m = _mm_max_ps(m, _mm_movehl_ps(m, m));
		m = _mm_max_ss(m, _mm_movehdup_ps(m));
		float scale = _mm_cvtss_f32(m) / 127.0f;
		__m256 inv = _mm256_set1_ps(scale != 0 ? 1.0f / scale : 0.0f);
		for (int64_t i = 0; i < block; i += 32) {
			__m256i v[4];
			for (int k = 0; k < 4; k++) {
				__m256 r = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(xb + i + 8 * k), inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
				v[k] = _mm256_cvtps_epi32(r);
			}
			// packs interleave 128-bit lanes; the permute restores order
			__m256i p = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
			p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
			_mm256_storeu_si256((__m256i *)(q + b * block + i), p);
		}
		d[b] = scale;
	}
}

// dot_avx2 is one head's q · k: two accumulator chains, then the
// values past the last multiple of eight in scalar.
AVX2 INLINE float dot_avx2(int wt, int64_t es, const float *a, const uint8_t *p, int64_t n) {
	__m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
	int64_t i = 0;
	for (; i + 16 <= n; i += 16) {
		acc0 = _mm256_fmadd_ps(load8(wt, p + i * es), _mm256_loadu_ps(a + i), acc0);
		acc1 = _mm256_fmadd_ps(load8(wt, p + (i + 8) * es), _mm256_loadu_ps(a + i + 8), acc1);
	}
	for (; i + 8 <= n; i += 8) {
		acc0 = _mm256_fmadd_ps(load8(wt, p + i * es), _mm256_loadu_ps(a + i), acc0);
	}
	float s = hsum_ps(_mm256_add_ps(acc0, acc1));
	for (; i < n; i++) {
		s += a[i] * load1(wt, p + i * es);
	}
	return s;
}

// scores8 sets the scores of eight rows (K rows at p[0..7], hd a
// multiple of 8) for H heads from h0 (dots8), head h's at scores + h·ld.
AVX2 INLINE void scores8(const int H, int wt, int64_t es, const float *q, int64_t h0, int64_t hd,
	const uint8_t *const p[8], int64_t ld, int64_t r0, float scale, float *scores) {
	__m256 v[4][8];
	dots8(wt, es, p, hd, q + h0 * hd, H, v);
	for (int j = 0; j < H; j++) {
		_mm256_storeu_ps(scores + (h0 + j) * ld + r0, _mm256_mul_ps(hsum8_ps(v[j]), _mm256_set1_ps(scale)));
	}
}

// scores_heads8 runs scores8 for the heads, four at a time, then a pair,
// then one at a time.
AVX2 INLINE void scores_heads8(int wt, int64_t es, const float *q, int64_t heads, int64_t hd, const uint8_t *const p[8],
	int64_t ld, int64_t r, float scale, float *scores) {
	int64_t h = 0;
	for (; h + 4 <= heads; h += 4) {
		scores8(4, wt, es, q, h, hd, p, ld, r, scale, scores);
	}
	if (h + 2 <= heads) { // grouped-query pairs: stories260K, the embedded target
		scores8(2, wt, es, q, h, hd, p, ld, r, scale, scores);
		h += 2;
	}
	for (; h < heads; h++) {
		scores8(1, wt, es, q, h, hd, p, ld, r, scale, scores);
	}
}

// score_row sets one row's scores (its K row at p) for the heads: four
// heads' accumulator chains at a time, then one head at a time.
AVX2 INLINE void score_row(int wt, int64_t es, const float *q, int64_t heads, int64_t hd, const uint8_t *p,
	int64_t ld, int64_t r, float scale, float *scores) {
	int64_t h = 0;
	for (; h + 4 <= heads; h += 4) {
		const float *qh[4] = {q + h * hd, q + (h + 1) * hd, q + (h + 2) * hd, q + (h + 3) * hd};
		__m256 acc0[4], acc1[4];
		for (int j = 0; j < 4; j++) {
			acc0[j] = _mm256_setzero_ps();
			acc1[j] = _mm256_setzero_ps();
		}
		int64_t i = 0;
		for (; i + 16 <= hd; i += 16) {
			__m256 k0 = load8(wt, p + i * es), k1 = load8(wt, p + (i + 8) * es);
			for (int j = 0; j < 4; j++) {
				acc0[j] = _mm256_fmadd_ps(k0, _mm256_loadu_ps(qh[j] + i), acc0[j]);
				acc1[j] = _mm256_fmadd_ps(k1, _mm256_loadu_ps(qh[j] + i + 8), acc1[j]);
			}
		}
		if (i + 8 <= hd) {
			__m256 k0 = load8(wt, p + i * es);
			for (int j = 0; j < 4; j++) {
				acc0[j] = _mm256_fmadd_ps(k0, _mm256_loadu_ps(qh[j] + i), acc0[j]);
			}
			i += 8;
		}
		for (int j = 0; j < 4; j++) {
			float s = hsum_ps(_mm256_add_ps(acc0[j], acc1[j]));
			for (int64_t t = i; t < hd; t++) {
				s += qh[j][t] * load1(wt, p + t * es);
			}
			scores[(h + j) * ld + r] = s * scale;
		}
	}
	for (; h < heads; h++) {
		scores[h * ld + r] = dot_avx2(wt, es, q + h * hd, p, hd) * scale;
	}
}

// tk_scores_avx2 sets scores[(s·heads + h)·ld + i] = scale · (q_sh · K_i)
// for slots groups of heads (group s's queries at q + s·qs) and rows i <
// n, row i being base + i below prefix and extra[i − prefix] from there:
// each K row is loaded once for every group and up to four heads at a
// time, whose accumulator chains overlap instead of one head's two
// waiting on each other, and where hd is a multiple of 8 rows go eight at
// a time (scores8), the rest one at a time. Each head's sum is
// dot_avx2's, in its order: a score's bits depend neither on the heads
// and groups beside it nor on the rows.
AVX2 void tk_scores_avx2(int f16, const float *q, int64_t qs, int64_t slots, int64_t heads, int64_t hd, const void *k,
	int64_t stride, int64_t off, int64_t base, int64_t prefix, const int32_t *extra, int64_t n, float scale,
	float *scores, int64_t ld) {
	const int wt = f16 ? TK_F16 : TK_F32;
	const int64_t es = f16 ? 2 : 4;
	int64_t r = 0;
	if (hd % 8 == 0) {
		for (; r + 8 <= n; r += 8) {
			const uint8_t *p[8];
			if (r + 8 <= prefix) { // consecutive rows: no index to choose and multiply out
				const uint8_t *p0 = (const uint8_t *)k + ((base + r) * stride + off) * es;
				for (int j = 0; j < 8; j++) {
					p[j] = p0 + j * stride * es;
				}
			} else {
				for (int j = 0; j < 8; j++) {
					const int64_t row = r + j < prefix ? base + r + j : extra[r + j - prefix];
					p[j] = (const uint8_t *)k + (row * stride + off) * es;
				}
			}
			if (slots == 1) { // decode: a loop of one group cost its heads' 8-row scores 7%
				scores_heads8(wt, es, q, heads, hd, p, ld, r, scale, scores);
				continue;
			}
			for (int64_t s = 0; s < slots; s++) {
				scores_heads8(wt, es, q + s * qs, heads, hd, p, ld, r, scale, scores + s * heads * ld);
			}
		}
	}
	for (; r < n; r++) {
		const int64_t row = r < prefix ? base + r : extra[r - prefix];
		const uint8_t *p = (const uint8_t *)k + (row * stride + off) * es;
		for (int64_t s = 0; s < slots; s++) {
			score_row(wt, es, q + s * qs, heads, hd, p, ld, r, scale, scores + s * heads * ld);
		}
	}
}

// values_row adds one V row (its values d0.. at x) times each head's
// probability (p[j·ld]) to the accumulators.
AVX2 INLINE void values_row(const int hn, const int dc, int wt, int64_t es, const uint8_t *x, const float *p,
	int64_t ld, __m256 acc[8]) {
	for (int c = 0; c < dc; c++) {
		__m256 xv = load8(wt, x + 8 * c * es);
		for (int j = 0; j < hn; j++) {
			acc[j * dc + c] = _mm256_fmadd_ps(_mm256_set1_ps(p[j * ld]), xv, acc[j * dc + c]);
		}
	}
}

// values_block adds Σ_i p_h[i] · V_i to out_h for hn heads (p_h = p +
// h·ld; row i is base + i below prefix, extra[i − prefix] from there)
// over output values d0..d0+8·dc-1, starting from zero or, with acc, from
// what out holds: hn·dc accumulators of eight values stay in registers
// over the rows, which are added in order with one FMA each, whatever hn:
// a head's bits do not depend on the heads beside it, nor on where its
// rows were split (a stored accumulator reloads the same bits). hn and dc
// are constants at each call, so the accumulators are registers and
// there are enough of them to keep the FMAs independent.
AVX2 INLINE void values_block(const int hn, const int dc, int wt, int64_t es, float *out, int64_t hd, int64_t d0,
	const float *p, int64_t ld, int64_t n, const uint8_t *v, int64_t stride, int64_t off, int64_t base,
	int64_t prefix, const int32_t *extra, int acc_in) {
	__m256 acc[8];
	for (int j = 0; j < hn; j++) {
		for (int c = 0; c < dc; c++) {
			acc[j * dc + c] = acc_in ? _mm256_loadu_ps(out + j * hd + d0 + 8 * c) : _mm256_setzero_ps();
		}
	}
	// The prefix's rows are consecutive: a pointer steps over them, where
	// choosing each row's index and multiplying it out cost the loop a
	// tenth. The rows after it are looked up.
	const int64_t np = n < prefix ? n : prefix;
	const uint8_t *x = v + (base * stride + off + d0) * es;
	for (int64_t i = 0; i < np; i++, x += stride * es) {
		values_row(hn, dc, wt, es, x, p + i, ld, acc);
	}
	for (int64_t i = np; i < n; i++) {
		values_row(hn, dc, wt, es, v + ((int64_t)extra[i - prefix] * stride + off + d0) * es, p + i, ld, acc);
	}
	for (int j = 0; j < hn; j++) {
		for (int c = 0; c < dc; c++) {
			_mm256_storeu_ps(out + j * hd + d0 + 8 * c, acc[j * dc + c]);
		}
	}
}

// values_heads runs values_block over all of hd for hn heads: eight
// accumulators wide where hd allows, then one at a time, then the values
// past the last multiple of eight in scalar.
AVX2 INLINE void values_heads(const int hn, int wt, int64_t es, float *out, int64_t hd, const float *p, int64_t ld,
	int64_t n, const uint8_t *v, int64_t stride, int64_t off, int64_t base, int64_t prefix, const int32_t *extra,
	int acc_in) {
	const int dc = 8 / hn;
	int64_t d = 0;
	for (; d + 8 * dc <= hd; d += 8 * dc) {
		values_block(hn, dc, wt, es, out, hd, d, p, ld, n, v, stride, off, base, prefix, extra, acc_in);
	}
	for (; d + 8 <= hd; d += 8) {
		values_block(hn, 1, wt, es, out, hd, d, p, ld, n, v, stride, off, base, prefix, extra, acc_in);
	}
	for (; d < hd; d++) {
		for (int j = 0; j < hn; j++) {
			float y = acc_in ? out[j * hd + d] : 0;
			for (int64_t i = 0; i < n; i++) {
				int64_t row = i < prefix ? base + i : extra[i - prefix];
				y += p[j * ld + i] * load1(wt, v + (row * stride + off + d) * es);
			}
			out[j * hd + d] = y;
		}
	}
}

// values_tile is values_heads for one group's heads, in blocks of 8, 4, 2
// and 1 heads.
AVX2 INLINE void values_tile(int wt, int64_t es, float *out, int64_t heads, int64_t hd, const float *p, int64_t ld,
	int64_t n, const uint8_t *v, int64_t stride, int64_t off, int64_t base, int64_t prefix, const int32_t *extra,
	int acc_in) {
	int64_t h = 0;
	for (; h + 8 <= heads; h += 8) {
		values_heads(8, wt, es, out + h * hd, hd, p + h * ld, ld, n, v, stride, off, base, prefix, extra, acc_in);
	}
	if (h + 4 <= heads) {
		values_heads(4, wt, es, out + h * hd, hd, p + h * ld, ld, n, v, stride, off, base, prefix, extra, acc_in);
		h += 4;
	}
	if (h + 2 <= heads) {
		values_heads(2, wt, es, out + h * hd, hd, p + h * ld, ld, n, v, stride, off, base, prefix, extra, acc_in);
		h += 2;
	}
	if (h < heads) {
		values_heads(1, wt, es, out + h * hd, hd, p + h * ld, ld, n, v, stride, off, base, prefix, extra, acc_in);
	}
}

// values_tile_rows is how many rows several groups take in turn: their V rows
// (at most 64 × 64 floats for a KV head of TinyLlama's) stay in L1 for
// every group, where a whole context's would be read again for each.
enum { values_tile_rows = 64 };

// tk_values_avx2 adds Σ_i p_sh[i] · V_i to out_sh (group s's heads at
// out + s·os, p_sh = p + (s·heads + h)·ld) over rows i < n, row i being
// base + i below prefix and extra[i − prefix] from there, starting from
// zero or, with acc, from what out holds. One group takes the rows in
// one pass; several take them a tile at a time.
AVX2 void tk_values_avx2(int f16, float *out, int64_t os, int64_t slots, int64_t heads, int64_t hd, const float *p,
	int64_t ld, int64_t n, const void *v, int64_t stride, int64_t off, int64_t base, int64_t prefix,
	const int32_t *extra, int acc) {
	const int wt = f16 ? TK_F16 : TK_F32;
	const int64_t es = f16 ? 2 : 4;
	if (n == 0) {
		if (!acc) {
			for (int64_t s = 0; s < slots; s++) {
				memset(out + s * os, 0, (size_t)(heads * hd) * sizeof(float));
			}
		}
		return;
	}
	if (slots == 1) { // one group takes its rows in one pass
		values_tile(wt, es, out, heads, hd, p, ld, n, v, stride, off, base, prefix, extra, acc);
		return;
	}
	const int64_t tile = values_tile_rows;
	for (int64_t i0 = 0; i0 < n; i0 += tile) {
		const int64_t m = n - i0 < tile ? n - i0 : tile;
		// The tile's rows, renumbered from 0.
		const int64_t tp = prefix > i0 ? prefix - i0 : 0;
		const int32_t *te = prefix > i0 ? extra : extra + (i0 - prefix);
		for (int64_t s = 0; s < slots; s++) {
			values_tile(wt, es, out + s * os, heads, hd, p + s * heads * ld + i0, ld, m, v, stride, off,
				base + i0, tp, te, acc || i0 > 0);
		}
	}
}

// exp8 is e^x for eight x within 2 ULP: x = n·ln2 + r with |r| ≤ ln2/2,
// e^r by Cephes' polynomial, then 2^n added to the exponent bits. Below
// the smallest normal result it returns 0, above the largest +Inf.
// glibc's expf cost a call per element, which was most of attention's
// softmax and of SwiGLU.
AVX2 INLINE __m256 exp8(__m256 x) {
	const __m256 lo = _mm256_set1_ps(-87.33654f), hi = _mm256_set1_ps(88.37626f);
	__m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
	__m256 over = _mm256_cmp_ps(x, hi, _CMP_GT_OQ);
	x = _mm256_min_ps(hi, _mm256_max_ps(lo, x)); // a NaN stays NaN
	__m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
		_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	__m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
	r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
	__m256 p = _mm256_set1_ps(1.9875691500e-4f);
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
	p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
	__m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
	p = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), e));
	return _mm256_blendv_ps(_mm256_andnot_ps(under, p), _mm256_set1_ps(INFINITY), over);
}

// tk_softmax_avx2 is softmax in place over n scores, eight at a time:
// the tail is loaded and stored under a mask (its lanes add 0), so every
// score takes the same steps and a row's result depends only on the row.
AVX2 void tk_softmax_avx2(float *sc, int64_t n) {
	if (n <= 0) {
		return;
	}
	int64_t full = n & ~(int64_t)7;
	int tail = (int)(n - full);
	__m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(tail), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
	__m256 mx = _mm256_set1_ps(-INFINITY);
	for (int64_t i = 0; i < full; i += 8) {
		mx = _mm256_max_ps(mx, _mm256_loadu_ps(sc + i));
	}
	if (tail) {
		__m256 t = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_maskload_ps(sc + full, mask), _mm256_castsi256_ps(mask));
		mx = _mm256_max_ps(mx, t);
	}
	__m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
	m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
	m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
	__m256 m = _mm256_set1_ps(_mm_cvtss_f32(m4));
	__m256 sum = _mm256_setzero_ps();
	for (int64_t i = 0; i < full; i += 8) {
		__m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sc + i), m));
		_mm256_storeu_ps(sc + i, e);
		sum = _mm256_add_ps(sum, e);
	}
	if (tail) {
		__m256 e = exp8(_mm256_sub_ps(_mm256_maskload_ps(sc + full, mask), m));
		e = _mm256_and_ps(e, _mm256_castsi256_ps(mask));
		_mm256_maskstore_ps(sc + full, mask, e);
		sum = _mm256_add_ps(sum, e);
	}
	__m256 inv = _mm256_set1_ps(1.0f / hsum_ps(sum));
	for (int64_t i = 0; i < full; i += 8) {
		_mm256_storeu_ps(sc + i, _mm256_mul_ps(_mm256_loadu_ps(sc + i), inv));
	}
	if (tail) {
		_mm256_maskstore_ps(sc + full, mask, _mm256_mul_ps(_mm256_maskload_ps(sc + full, mask), inv));
	}
}

// tk_exp_sum_avx2 is tk_exp_sum eight at a time, summed in four double
// lanes; the tail is loaded and stored under a mask (its lanes add 0), so
// an element's value does not depend on where it sits.
AVX2 double tk_exp_sum_avx2(float *x, int64_t n, float m) {
	__m256 mv = _mm256_set1_ps(m);
	__m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
	int64_t i = 0;
	for (; i + 8 <= n; i += 8) {
		__m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv));
		_mm256_storeu_ps(x + i, e);
		lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
		hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
	}
	if (i < n) {
		__m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - i)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
		__m256 e = exp8(_mm256_sub_ps(_mm256_maskload_ps(x + i, mask), mv));
		e = _mm256_and_ps(e, _mm256_castsi256_ps(mask));
		_mm256_maskstore_ps(x + i, mask, e);
		lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
		hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
	}
	double s[4];
	_mm256_storeu_pd(s, _mm256_add_pd(lo, hi));
	return (s[0] + s[2]) + (s[1] + s[3]);
}

// silu8 is SwiGLU for eight elements: g / (1 + e^-g) · u.
AVX2 INLINE __m256 silu8(__m256 g, __m256 u) {
	__m256 e = exp8(_mm256_xor_ps(g, _mm256_set1_ps(-0.0f)));
	return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

// tk_silu_mul_avx2 is SwiGLU eight elements at a time, the tail under a
// mask: each element takes the same steps wherever it sits, so a token's
// activations do not depend on its batch.
AVX2 void tk_silu_mul_avx2(float *gate, const float *up, int64_t n) {
	int64_t i = 0;
	for (; i + 8 <= n; i += 8) {
		_mm256_storeu_ps(gate + i, silu8(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
	}
	if (i < n) {
		__m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - i)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
		_mm256_maskstore_ps(gate + i, mask, silu8(_mm256_maskload_ps(gate + i, mask), _mm256_maskload_ps(up + i, mask)));
	}
}

#endif
