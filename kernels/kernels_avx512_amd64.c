//go:build cgo

// x86-64 kernels for AVX-512 with VNNI (F, BW, VL, VNNI, plus FMA and
// F16C): Q8_0, Q4_0 and F16, where decode and prefill spend their time.
// Other weight types fall back to the AVX2 kernels. Compiled with target
// attributes; Go selects this level only after checking the CPU.
//
// Q8_0 and Q4_0 multiply with vpdpbusd (unsigned 8-bit × signed 8-bit,
// four products summed into each 32-bit lane, exact). The weights are
// made the unsigned side: Q4_0 levels are 0..15 already (the true weight
// is level-8), Q8_0 weights get 128 added (w ^ 0x80). Each dot product
// then carries an offset of c·Σx (c = 8 or 128) over the block, which is
// taken out by starting the accumulator at -c·(sums of x over each
// lane's four bytes): one vpdpbusd per 64 weights, no sign tricks.
//
// A tile of R weight rows × C activation columns is computed together:
// each unpacked weight block is used for C columns and each activation
// block for R rows. Two blocks fill a 512-bit register; block scales are
// gathered eight at a time and spread to the two 256-bit halves by a
// permute.
//
// Batch invariance: each output takes the same float steps in a tile of
// any shape and in q32_gemv (per lane, fma of the block's integer sum by
// weight scale × activation scale; the tail apart; one final reduction),
// so a column's outputs are the same bits whatever else is in the batch.
// A repacked GEMM (lanes = rows) ran twice as fast at 64 columns but
// summed in another order, so verification logits differed from decode
// and a near-tie could flip a greedy token; it was dropped.
#include "kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

AVX512 INLINE float hsum512(__m512 v) { return _mm512_reduce_add_ps(v); }

// scales8 converts the f16 scales at the start of 8 consecutive blocks
// of bb bytes to float.
// Scalar loads rather than a gather: vpgatherdd is microcoded and slow
// on CPUs with the gather-data-sampling mitigation.
AVX512 INLINE __m256 scales8(const uint8_t *blk, int bb) {
	__m128i h = _mm_setr_epi16((short)tk_le16(blk), (short)tk_le16(blk + bb), (short)tk_le16(blk + 2 * bb),
		(short)tk_le16(blk + 3 * bb), (short)tk_le16(blk + 4 * bb), (short)tk_le16(blk + 5 * bb),
		(short)tk_le16(blk + 6 * bb), (short)tk_le16(blk + 7 * bb));
	return _mm256_cvtph_ps(h);
}

// weights64 unpacks blocks b and b+1 of a Q8_0 (bb 34) or Q4_0 (bb 18)
// row into 64 unsigned bytes in activation order.
AVX512 INLINE __m512i weights64(const int bb, const uint8_t *blk) {
	if (bb == 34) {
		__m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(blk + 2))),
			_mm256_loadu_si256((const __m256i *)(blk + 36)), 1);
		return _mm512_xor_si512(v, _mm512_set1_epi8((char)0x80));
	}
	// [qs0 qs0 qs1 qs1], then the odd 128-bit lanes shift to the high
	// nibbles: weights 0..15 and 16..31 of each block.
	__m512i v = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(blk + 2)));
	v = _mm512_mask_broadcast_i32x4(v, 0xff00, _mm_loadu_si128((const __m128i *)(blk + 20)));
	const __m512i shift = _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4);
	return _mm512_and_si512(_mm512_srlv_epi64(v, shift), _mm512_set1_epi8(15));
}

// weights32 is weights64 for a single block (the odd tail).
AVX512 INLINE __m256i weights32(const int bb, const uint8_t *blk) {
	if (bb == 34) {
		return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(blk + 2)), _mm256_set1_epi8((char)0x80));
	}
	__m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(blk + 2)));
	v = _mm256_srlv_epi64(v, _mm256_setr_epi64x(0, 0, 4, 4));
	return _mm256_and_si256(v, _mm256_set1_epi8(15));
}

// spreads sets the permutes that spread scales 2p and 2p+1 of eight
// over the two 256-bit halves (blocks b+2p and b+2p+1 of a group).
AVX512 INLINE void spreads(__m512i spread[4]) {
	const __m512i base = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
	for (int p = 0; p < 4; p++) {
		spread[p] = _mm512_add_epi32(base, _mm512_set1_epi32(2 * p));
	}
}

// PREFETCH_BLOCKS is how far ahead of the block being computed a row is
// prefetched. Decode streams each row from memory once; the hardware
// prefetcher alone keeps the kernel latency-bound. Near a row's end the
// lines asked for are those of the rows the next step reads (R rows on):
// aiming past the end, into the tile's own next row, wasted a third of
// the prefetches on TinyLlama's rows and cost 20-35% of decode speed.
#define PREFETCH_BLOCKS 64

// prefetch_rows asks for `bytes` bytes (whole lines) at offset o of rows
// r0..r0+R-1, each holding len bytes of data; an offset past the end
// lands at o-len in the row R on.
AVX512 INLINE void prefetch_rows(const uint8_t *w, int64_t row_bytes, int64_t r0, const int R, int64_t len, int64_t o,
	const int bytes) {
	const int64_t pf = o < len ? o : R * row_bytes + o - len;
	for (int r = 0; r < R; r++) {
		const char *ahead = (const char *)(w + (r0 + r) * row_bytes + pf);
		for (int line = 0; line < bytes; line += 64) {
			_mm_prefetch(ahead + line, _MM_HINT_T0);
		}
	}
}

// q32_tile computes an R×C tile of a Q8_0/Q4_0 matmul: rows r0..r0+R-1,
// columns j0..j0+C-1. R and C are constants at every call site.
AVX512 INLINE void q32_tile(const int bb, const int R, const int C, float *out, const uint8_t *w, int64_t row_bytes,
	int64_t r0, int64_t nb, const int8_t *xq, const float *xd, int64_t j0, int64_t rows) {
	const int off = bb == 34 ? 128 : 8;
	const __m512i offs = _mm512_set1_epi8((char)off);
	const __m256i offs256 = _mm256_set1_epi8((char)off);
	__m512 acc[4][4];
	for (int r = 0; r < R; r++) {
		for (int c = 0; c < C; c++) {
			acc[r][c] = _mm512_setzero_ps();
		}
	}
	const uint8_t *row[4];
	const int8_t *x[4];
	const float *dx[4];
	for (int r = 0; r < R; r++) {
		row[r] = w + (r0 + r) * row_bytes;
	}
	for (int c = 0; c < C; c++) {
		x[c] = xq + (j0 + c) * nb * 32;
		dx[c] = xd + (j0 + c) * nb;
	}
	__m512i spread[4];
	spreads(spread);
	int64_t b = 0;
	for (; b + 8 <= nb; b += 8) {
		__m512 sw[4], sx[4];
		prefetch_rows(w, row_bytes, r0, R, nb * bb, (b + PREFETCH_BLOCKS) * bb, 8 * bb);
		for (int r = 0; r < R; r++) {
			sw[r] = _mm512_castps256_ps512(scales8(row[r] + b * bb, bb));
		}
		for (int c = 0; c < C; c++) {
			sx[c] = _mm512_castps256_ps512(_mm256_loadu_ps(dx[c] + b));
		}
		for (int p = 0; p < 4; p++) {
			__m512i wv[4], xv[4], neg[4];
			__m512 swp[4];
			for (int r = 0; r < R; r++) {
				wv[r] = weights64(bb, row[r] + (b + 2 * p) * bb);
				swp[r] = _mm512_permutexvar_ps(spread[p], sw[r]);
			}
			for (int c = 0; c < C; c++) {
				xv[c] = _mm512_loadu_si512((const void *)(x[c] + (b + 2 * p) * 32));
				neg[c] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), offs, xv[c]));
			}
			for (int c = 0; c < C; c++) {
				__m512 sxp = _mm512_permutexvar_ps(spread[p], sx[c]);
				for (int r = 0; r < R; r++) {
					__m512i d = _mm512_dpbusd_epi32(neg[c], wv[r], xv[c]);
					acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(swp[r], sxp), acc[r][c]);
				}
			}
		}
	}
	// Fewer than 8 blocks left: one block at a time, scalar scales.
	__m256 tail[4][4];
	for (int r = 0; r < R; r++) {
		for (int c = 0; c < C; c++) {
			tail[r][c] = _mm256_setzero_ps();
		}
	}
	for (; b < nb; b++) {
		__m256i wv[4];
		float dw[4];
		for (int r = 0; r < R; r++) {
			const uint8_t *blk = row[r] + b * bb;
			wv[r] = weights32(bb, blk);
			dw[r] = _cvtsh_ss(tk_le16(blk));
		}
		for (int c = 0; c < C; c++) {
			__m256i xv = _mm256_loadu_si256((const __m256i *)(x[c] + b * 32));
			__m256i neg = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_dpbusd_epi32(_mm256_setzero_si256(), offs256, xv));
			for (int r = 0; r < R; r++) {
				__m256i d = _mm256_dpbusd_epi32(neg, wv[r], xv);
				tail[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_set1_ps(dw[r] * dx[c][b]), tail[r][c]);
			}
		}
	}
	for (int r = 0; r < R; r++) {
		for (int c = 0; c < C; c++) {
			__m512 t = _mm512_add_ps(acc[r][c], _mm512_castps256_ps512(tail[r][c]));
			out[(j0 + c) * rows + r0 + r] = hsum512(t);
		}
	}
}

// scales8w is scales8 with vector loads: the eight f16 scales are picked
// out of the block bytes by word permutes (Q4_0's 144 bytes hold them
// within the first 128, Q8_0's 272 within two 128-byte windows).
AVX512 INLINE __m256 scales8w(const uint8_t *blk, int bb) {
	const __m512i l0 = _mm512_loadu_si512((const void *)blk), l1 = _mm512_loadu_si512((const void *)(blk + 64));
	if (bb == 18) {
		const __m512i idx = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
			63, 54, 45, 36, 27, 18, 9, 0);
		return _mm256_cvtph_ps(_mm512_castsi512_si128(_mm512_permutex2var_epi16(l0, idx, l1)));
	}
	const __m512i l2 = _mm512_loadu_si512((const void *)(blk + 136)), l3 = _mm512_loadu_si512((const void *)(blk + 200));
	const __m512i lo = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
		0, 0, 0, 0, 51, 34, 17, 0);
	const __m512i hi = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
		51, 34, 17, 0, 0, 0, 0, 0);
	const __m512i v = _mm512_mask_mov_epi16(_mm512_permutex2var_epi16(l0, lo, l1), 0xf0,
		_mm512_permutex2var_epi16(l2, hi, l3));
	return _mm256_cvtph_ps(_mm512_castsi512_si128(v));
}

// GEMV_R: weight rows per step of a matrix-vector product. Decode is a
// stream of independent rows; eight at a time keep eight prefetch
// streams in flight and share each activation load and offset sum.
#define GEMV_R 8

// q32_gemv computes rows r0..r0+R-1 of a Q8_0/Q4_0 matrix-vector
// product (one activation column: decode). Unlike q32_tile it folds the
// activation scales into the row scales once per eight blocks and loads
// the scales with vector permutes: at one column the kernel is bound by
// instructions per weight byte, not by the multiplies.
AVX512 INLINE void q32_gemv(const int bb, const int R, float *out, const uint8_t *w, int64_t row_bytes, int64_t r0,
	int64_t nb, const int8_t *x, const float *dx) {
	const __m512i offs = _mm512_set1_epi8((char)(bb == 34 ? 128 : 8));
	const __m256i offs256 = _mm256_set1_epi8((char)(bb == 34 ? 128 : 8));
	__m512 acc[GEMV_R];
	__m256 tail[GEMV_R];
	const uint8_t *row[GEMV_R];
	for (int r = 0; r < R; r++) {
		acc[r] = _mm512_setzero_ps();
		tail[r] = _mm256_setzero_ps();
		row[r] = w + (r0 + r) * row_bytes;
	}
	__m512i spread[4];
	spreads(spread);
	int64_t b = 0;
	for (; b + 8 <= nb; b += 8) {
		const __m256 sx = _mm256_loadu_ps(dx + b);
		__m512 s[GEMV_R];
		prefetch_rows(w, row_bytes, r0, R, nb * bb, (b + PREFETCH_BLOCKS) * bb, 8 * bb);
		for (int r = 0; r < R; r++) {
			s[r] = _mm512_castps256_ps512(_mm256_mul_ps(scales8w(row[r] + b * bb, bb), sx));
		}
		for (int p = 0; p < 4; p++) {
			const __m512i xv = _mm512_loadu_si512((const void *)(x + (b + 2 * p) * 32));
			const __m512i neg = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), offs, xv));
			for (int r = 0; r < R; r++) {
				const __m512i d = _mm512_dpbusd_epi32(neg, weights64(bb, row[r] + (b + 2 * p) * bb), xv);
				acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_permutexvar_ps(spread[p], s[r]), acc[r]);
			}
		}
	}
	for (; b < nb; b++) {
		const __m256i xv = _mm256_loadu_si256((const __m256i *)(x + b * 32));
		const __m256i neg = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_dpbusd_epi32(_mm256_setzero_si256(), offs256, xv));
		for (int r = 0; r < R; r++) {
			const uint8_t *blk = row[r] + b * bb;
			const __m256i d = _mm256_dpbusd_epi32(neg, weights32(bb, blk), xv);
			tail[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_set1_ps(_cvtsh_ss(tk_le16(blk)) * dx[b]), tail[r]);
		}
	}
	for (int r = 0; r < R; r++) {
		out[r0 + r] = hsum512(_mm512_add_ps(acc[r], _mm512_castps256_ps512(tail[r])));
	}
}

// gemv_rows runs q32_gemv over rows lo..hi-1; bb is a constant at each
// call site so the block-size branches fold away.
AVX512 INLINE void gemv_rows(const int bb, float *out, const uint8_t *w, int64_t row_bytes, int64_t lo, int64_t hi,
	int64_t nb, const int8_t *xq, const float *xd) {
	int64_t r = lo;
	for (; r + GEMV_R <= hi; r += GEMV_R) {
		q32_gemv(bb, GEMV_R, out, w, row_bytes, r, nb, xq, xd);
	}
	for (; r < hi; r++) {
		q32_gemv(bb, 1, out, w, row_bytes, r, nb, xq, xd);
	}
}

// f16_tile: R rows × C columns of an F16 matmul, 16 weights per step,
// the tail under a mask.
AVX512 INLINE void f16_tile(const int R, const int C, float *out, const uint8_t *w, int64_t row_bytes,
	int64_t r0, int64_t cols, const float *x, int64_t j0, int64_t rows) {
	__m512 acc[4][4];
	for (int r = 0; r < R; r++) {
		for (int c = 0; c < C; c++) {
			acc[r][c] = _mm512_setzero_ps();
		}
	}
	const uint16_t *row[4];
	const float *xc[4];
	for (int r = 0; r < R; r++) {
		row[r] = (const uint16_t *)(w + (r0 + r) * row_bytes);
	}
	for (int c = 0; c < C; c++) {
		xc[c] = x + (j0 + c) * cols;
	}
	int64_t i = 0;
	for (; i + 16 <= cols; i += 16) {
		if ((i & 31) == 0) { // a line of each row every 32 weights
			prefetch_rows(w, row_bytes, r0, R, 2 * cols, 2 * i + PREFETCH_BLOCKS * 32, 64);
		}
		__m512 wv[4];
		for (int r = 0; r < R; r++) {
			wv[r] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row[r] + i)));
		}
		for (int c = 0; c < C; c++) {
			__m512 xv = _mm512_loadu_ps(xc[c] + i);
			for (int r = 0; r < R; r++) {
				acc[r][c] = _mm512_fmadd_ps(wv[r], xv, acc[r][c]);
			}
		}
	}
	if (i < cols) {
		__mmask16 m = (__mmask16)((1u << (cols - i)) - 1);
		__m512 wv[4];
		for (int r = 0; r < R; r++) {
			wv[r] = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, row[r] + i));
		}
		for (int c = 0; c < C; c++) {
			__m512 xv = _mm512_maskz_loadu_ps(m, xc[c] + i);
			for (int r = 0; r < R; r++) {
				acc[r][c] = _mm512_fmadd_ps(wv[r], xv, acc[r][c]);
			}
		}
	}
	for (int r = 0; r < R; r++) {
		for (int c = 0; c < C; c++) {
			out[(j0 + c) * rows + r0 + r] = hsum512(acc[r][c]);
		}
	}
}


AVX512 INLINE void tile(int wt, const int R, const int C, float *out, const uint8_t *w, int64_t row_bytes,
	int64_t r0, int64_t cols, const float *x, const int8_t *xq, const float *xd, int64_t j0, int64_t rows) {
	switch (wt) {
	case TK_Q8_0:
		q32_tile(34, R, C, out, w, row_bytes, r0, cols / 32, xq, xd, j0, rows);
		break;
	case TK_Q4_0:
		q32_tile(18, R, C, out, w, row_bytes, r0, cols / 32, xq, xd, j0, rows);
		break;
	default:
		f16_tile(R, C, out, w, row_bytes, r0, cols, x, j0, rows);
	}
}

// TILE_C: columns per tile in batched calls (prefill, verification).
#define TILE_C 4

// rows_r runs R rows against every column, in tiles of TILE_C columns.
AVX512 INLINE void rows_r(int wt, const int R, float *out, const uint8_t *w, int64_t row_bytes, int64_t r0,
	int64_t cols, const float *x, const int8_t *xq, const float *xd, int64_t n, int64_t rows) {
	int64_t j = 0;
	for (; j + TILE_C <= n; j += TILE_C) {
		tile(wt, R, TILE_C, out, w, row_bytes, r0, cols, x, xq, xd, j, rows);
	}
	switch (n - j) {
	case 3:
		tile(wt, R, 3, out, w, row_bytes, r0, cols, x, xq, xd, j, rows);
		break;
	case 2:
		tile(wt, R, 2, out, w, row_bytes, r0, cols, x, xq, xd, j, rows);
		break;
	case 1:
		tile(wt, R, 1, out, w, row_bytes, r0, cols, x, xq, xd, j, rows);
		break;
	}
}

// tk_matmul_avx512 handles Q8_0, Q4_0 and F16 (see tk_has_avx512).
AVX512 void tk_matmul_avx512(int wt, float *out, const uint8_t *w, int64_t row_bytes,
	int64_t lo, int64_t hi, int64_t rows, int64_t cols, const float *x,
	const int8_t *xq, const float *xd, int64_t n) {
	int64_t r = lo;
	if (n == 1 && wt == TK_Q8_0) {
		gemv_rows(34, out, w, row_bytes, lo, hi, cols / 32, xq, xd);
		return;
	}
	if (n == 1 && wt == TK_Q4_0) {
		gemv_rows(18, out, w, row_bytes, lo, hi, cols / 32, xq, xd);
		return;
	}
	for (; r + 4 <= hi; r += 4) {
		rows_r(wt, 4, out, w, row_bytes, r, cols, x, xq, xd, n, rows);
	}
	for (; r < hi; r++) {
		rows_r(wt, 1, out, w, row_bytes, r, cols, x, xq, xd, n, rows);
	}
}

#endif
