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
// Every kernel here is batch-invariant: a vector's outputs take the same
// float steps whatever else is in the batch, so a verified token tree
// sees exactly decode's logits (a near-tie cannot flip a greedy token).
// Each weight type has one order of summation, followed by its one-vector
// and its batched kernel alike:
//
//   - Q8_0: lane order. q32_gemv and q32_tile put two blocks in
//     a 512-bit register, one 4-byte group per lane, and each lane keeps
//     its own running sum (fma of the group's integer sum by weight scale
//     × activation scale; the tail apart; one final reduction). A tile of
//     R rows × C columns shares weight and activation loads. F16 tiles
//     likewise give each output its own running sums.
//   - Q4_0: sixteen sums (see s16_gemv), which a packed GEMM with one row
//     per lane can also follow: prefill 1.4-1.5x the tiles' speed at
//     equal decode speed. For Q8_0 the sixteen-sum matrix-vector kernel
//     lost 15-50% of decode to its shuffles on the machine we measured,
//     so Q8_0 keeps the lane order and the tiles.
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

// q32_tile computes an R×C tile of a Q8_0 matmul (bb 34): rows r0..r0+R-1,
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

// q32_gemv computes rows r0..r0+R-1 of a Q8_0 (bb 34) matrix-vector
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

// The sixteen-sum order (Q4_0), the same in s16_gemv and s16_gemm so that
// a vector's outputs do not depend on the batch it is in: for each block
// b, its exact integer dot product D_b and its scale s_b = dw_b·dx_b (one
// float multiply); sixteen running sums, acc_k = fma(D_b, s_b, acc_k) for
// the blocks b ≡ k (mod 16) in order; then one fixed tree,
// ((acc_k + acc_k+8) pairwise at distance 4, 2, 1). The matrix-vector
// kernel holds the sixteen sums in the lanes of one register (lane = block
// mod 16); the batched kernel holds one register per sum (lane = row).

// pi_order is the block of each lane after the transposing reduction
// below (red3 leaves the block sums in this order, and the scales follow
// it); pi_inv puts lanes back in block order.
AVX512 INLINE __m512i pi_order(void) { return _mm512_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15); }
AVX512 INLINE __m512i pi_inv(void) { return _mm512_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15); }

// The transposing reduction of eight registers of 4-byte-group partial
// sums (register p: blocks 2p and 2p+1 of sixteen, eight groups each) to
// one register of the sixteen block sums (integer adds: exact in any order).
AVX512 INLINE __m512i red1(__m512i a, __m512i b) {
	return _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
}
AVX512 INLINE __m512i red2(__m512i a, __m512i b) {
	return _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
}
AVX512 INLINE __m512i red3(__m512i x, __m512i y) {
	return _mm512_add_epi32(_mm512_shuffle_i32x4(x, y, 0x88), _mm512_shuffle_i32x4(x, y, 0xdd));
}

// tree16 is the fixed final sum of the sixteen running sums (block order).
AVX512 INLINE float tree16(__m512 v) {
	__m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
	__m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
	__m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
	return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 1)));
}

// pair_weights loads blocks b and b+1 of a row's weights (or block b alone,
// the upper half zero, when one) as unsigned bytes.
AVX512 INLINE __m512i pair_weights(const int bb, const uint8_t *blk, int two) {
	return two ? weights64(bb, blk) : _mm512_zextsi256_si512(weights32(bb, blk));
}

// s16_x loads the activations of blocks b+2p and b+2p+1 (of m in the
// step; a missing block reads as zeros) and their offset sums -c·Σx.
AVX512 INLINE __m512i s16_x(const int8_t *x, int64_t b, int p, int m, __m512i offs, __m512i *neg) {
	const int have = m - 2 * p;
	__m512i xv = _mm512_setzero_si512();
	if (have >= 2) {
		xv = _mm512_loadu_si512((const void *)(x + (b + 2 * p) * 32));
	} else if (have == 1) {
		xv = _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)(x + (b + 2 * p) * 32)));
	}
	*neg = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), offs, xv));
	return xv;
}

// s16_scales returns the weight scales of a step's m blocks in block
// order; past them zero, so a missing block adds D = 0 at scale 0.
AVX512 INLINE __m512 s16_scales(const int bb, const uint8_t *blk, int m) {
	if (m == 16) {
		return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(scales8w(blk, bb))),
			_mm256_castps_pd(scales8w(blk + 8 * bb, bb)), 1));
	}
	float sw[16] = {0};
	for (int i = 0; i < m; i++) {
		sw[i] = _cvtsh_ss(tk_le16(blk + i * bb));
	}
	return _mm512_loadu_ps(sw);
}

// s16_sums returns one row's sixteen block sums of a step (lane order
// pi_order), from its weights at blk.
AVX512 INLINE __m512i s16_sums(const int bb, const uint8_t *blk, const __m512i xv[8], const __m512i neg[8], int m) {
	__m512i h[2];
	for (int k = 0; k < 2; k++) {
		__m512i q[2];
		for (int e = 0; e < 2; e++) {
			__m512i d[2];
			for (int i = 0; i < 2; i++) {
				const int p = 4 * k + 2 * e + i;
				const int have = m - 2 * p;
				d[i] = have <= 0 ? _mm512_setzero_si512()
					: _mm512_dpbusd_epi32(neg[p], pair_weights(bb, blk + 2 * p * bb, have >= 2), xv[p]);
			}
			q[e] = red1(d[0], d[1]);
		}
		h[k] = red2(q[0], q[1]);
	}
	return red3(h[0], h[1]);
}

// s16_step adds one step of m blocks (weights at w, the step's first
// block of row 0) into rows r0..r0+R-1's sixteen running sums.
AVX512 INLINE void s16_step(const int bb, const int R, __m512 acc[], const uint8_t *w, int64_t row_bytes, int64_t r0,
	const __m512i xv[8], const __m512i neg[8], __m512 sx, const int m) {
	const __m512i pi = pi_order();
	for (int r = 0; r < R; r++) {
		const uint8_t *blk = w + (r0 + r) * row_bytes;
		const __m512i sums = s16_sums(bb, blk, xv, neg, m);
		const __m512 s = _mm512_permutexvar_ps(pi, _mm512_mul_ps(s16_scales(bb, blk, m), sx));
		acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), s, acc[r]);
	}
}

// s16_gemv computes rows r0..r0+R-1 of a matrix-vector product
// (one activation column: decode), sixteen blocks per step: per row,
// eight vpdpbusd give the 4-byte-group partial sums of the sixteen
// blocks, a transposing reduction gives the block sums, and one fma adds
// them into the sixteen running sums (lanes). Rows go one after another
// within a step, so few registers are live and the activations and
// their offset sums are shared.
AVX512 INLINE void s16_gemv(const int bb, const int R, float *out, const uint8_t *w, int64_t row_bytes, int64_t r0,
	int64_t nb, const int8_t *x, const float *dx) {
	const __m512i offs = _mm512_set1_epi8((char)(bb == 34 ? 128 : 8));
	__m512 acc[GEMV_R];
	for (int r = 0; r < R; r++) {
		acc[r] = _mm512_setzero_ps();
	}
	for (int64_t b = 0; b < nb; b += 16) {
		const int m = nb - b < 16 ? (int)(nb - b) : 16; // blocks in this step
		__m512i xv[8], neg[8];
		for (int p = 0; p < 8; p++) {
			xv[p] = s16_x(x, b, p, m, offs, &neg[p]);
		}
		const __m512 sx = _mm512_maskz_loadu_ps((__mmask16)((1u << m) - 1), dx + b);
		// A literal 16 lets the full steps fold s16_sums' checks away.
		if (m == 16) {
			prefetch_rows(w, row_bytes, r0, R, nb * bb, (b + PREFETCH_BLOCKS) * bb, 16 * bb);
			s16_step(bb, R, acc, w + b * bb, row_bytes, r0, xv, neg, sx, 16);
		} else {
			s16_step(bb, R, acc, w + b * bb, row_bytes, r0, xv, neg, sx, m);
		}
	}
	const __m512i inv = pi_inv();
	for (int r = 0; r < R; r++) {
		out[r0 + r] = tree16(_mm512_permutexvar_ps(inv, acc[r]));
	}
}

// gemv_rows runs q32_gemv (Q8_0) or s16_gemv (Q4_0) over rows lo..hi-1;
// bb is a constant at each call site so the block-size branches fold away.
AVX512 INLINE void gemv_rows(const int bb, float *out, const uint8_t *w, int64_t row_bytes, int64_t lo, int64_t hi,
	int64_t nb, const int8_t *xq, const float *xd) {
	int64_t r = lo;
	for (; r + GEMV_R <= hi; r += GEMV_R) {
		if (bb == 18) {
			s16_gemv(bb, GEMV_R, out, w, row_bytes, r, nb, xq, xd);
		} else {
			q32_gemv(bb, GEMV_R, out, w, row_bytes, r, nb, xq, xd);
		}
	}
	for (; r < hi; r++) {
		if (bb == 18) {
			s16_gemv(bb, 1, out, w, row_bytes, r, nb, xq, xd);
		} else {
			q32_gemv(bb, 1, out, w, row_bytes, r, nb, xq, xd);
		}
	}
}

// s16_gemm (Q4_0, two columns or more) repacks a tile of 16 weight
// rows, GEMM_KC blocks at a time, into a scratch buffer where each 32-bit
// lane of a 512-bit register is one row: per block, eight registers of
// 16 rows × 4 unsigned weights, then the 16 row scales as floats. One
// broadcast of 4 activation bytes then feeds 64 multiply-adds
// (vpdpbusd), and per block and column the rows' scales apply in one
// vector step. The sixteen running sums of each column live in a stack
// array, so columns go in groups of GEMM_SG: the repacking is paid once
// per tile and group.
#define GEMM_KC 32 // a multiple of 16: a chunk starts at residue 0
#define GEMM_C 8
#define GEMM_SG 32
#define PACK_BLOCK 576 // 8 × 64 weight bytes + 16 float scales

// qs16 loads the 16 weight bytes of a Q4_0 block (18 bytes, at col in
// row 0) of row r, or zeros past the tile's last row nr-1.
AVX512 INLINE __m128i qs16(const uint8_t *col, int64_t row_bytes, int r, int nr) {
	return r < nr ? _mm_loadu_si128((const __m128i *)(col + r * row_bytes + 2)) : _mm_setzero_si128();
}

// pack16 repacks Q4_0 blocks k0..k0+kc-1 of rows r0..r0+nr-1 (nr <= 16;
// the missing rows get zero weights and scales). Register t < 4 of a
// block takes, one row per 32-bit lane, the low nibbles of the row's
// weight bytes 4t..4t+3 (weights 4t..4t+3) and register t+4 their high
// nibbles (weights 16+4t..16+4t+3): activation bytes 4t.. for register
// t, as s16_chunk reads them. The nibbles are split after a 4×4
// transpose of the rows' 32-bit words, not before: unpacking each row
// into activation order first took twice the shuffles.
AVX512 INLINE void pack16(uint8_t *buf, const uint8_t *w, int64_t row_bytes, int64_t r0, int nr, int64_t k0,
	int64_t kc) {
	const __m512i low = _mm512_set1_epi8(15);
	for (int64_t k = 0; k < kc; k++) {
		uint8_t *dst = buf + k * PACK_BLOCK;
		const uint8_t *col = w + r0 * row_bytes + (k0 + k) * 18;
		// q[j] holds rows j, j+4, j+8, j+12 in its 128-bit lanes.
		__m512i q[4];
		for (int j = 0; j < 4; j++) {
			__m512i v = _mm512_castsi128_si512(qs16(col, row_bytes, j, nr));
			v = _mm512_inserti32x4(v, qs16(col, row_bytes, j + 4, nr), 1);
			v = _mm512_inserti32x4(v, qs16(col, row_bytes, j + 8, nr), 2);
			q[j] = _mm512_inserti32x4(v, qs16(col, row_bytes, j + 12, nr), 3);
		}
		// Lane L of q[0..3] is rows 4L..4L+3; after the transpose,
		// u[t]'s 32-bit lane i is word t of row i.
		const __m512i a = _mm512_unpacklo_epi32(q[0], q[1]), b = _mm512_unpackhi_epi32(q[0], q[1]);
		const __m512i c = _mm512_unpacklo_epi32(q[2], q[3]), d = _mm512_unpackhi_epi32(q[2], q[3]);
		const __m512i u[4] = {_mm512_unpacklo_epi64(a, c), _mm512_unpackhi_epi64(a, c), _mm512_unpacklo_epi64(b, d),
			_mm512_unpackhi_epi64(b, d)};
		for (int t = 0; t < 4; t++) {
			_mm512_storeu_si512((void *)(dst + 64 * t), _mm512_and_si512(u[t], low));
			_mm512_storeu_si512((void *)(dst + 64 * (t + 4)), _mm512_and_si512(_mm512_srli_epi16(u[t], 4), low));
		}
		float *sc = (float *)(dst + 512);
		for (int i = 0; i < 16; i++) {
			sc[i] = i < nr ? _cvtsh_ss(tk_le16(col + i * row_bytes)) : 0;
		}
	}
}

// s16_chunk adds the chunk's blocks (packed in buf, from block k0) of
// C columns from j0 into their running sums racc[c][b mod 16]; the
// first sixteen blocks start them.
AVX512 INLINE void s16_chunk(const int off, const int C, const uint8_t *buf, int64_t kc, int64_t k0, int64_t nb,
	const int8_t *xq, const float *xd, const int32_t *xs, int64_t j0, __m512 (*racc)[16]) {
	for (int64_t k = 0; k < kc; k++) {
		const uint8_t *p = buf + k * PACK_BLOCK;
		const int64_t b = k0 + k;
		__m512i ai[GEMM_C];
		for (int c = 0; c < C; c++) {
			// start at -off·Σx so the unsigned weights' offset cancels
			const int64_t xb = (j0 + c) * nb + b;
			ai[c] = _mm512_set1_epi32(-off * (xs[2 * xb] + xs[2 * xb + 1]));
		}
		for (int t = 0; t < 8; t++) {
			const __m512i wv = _mm512_loadu_si512((const void *)(p + 64 * t));
			for (int c = 0; c < C; c++) {
				int32_t x4;
				__builtin_memcpy(&x4, xq + ((j0 + c) * nb + b) * 32 + 4 * t, 4);
				ai[c] = _mm512_dpbusd_epi32(ai[c], wv, _mm512_set1_epi32(x4));
			}
		}
		const __m512 sw = _mm512_loadu_ps((const float *)(p + 512));
		const int res = (int)(b & 15);
		for (int c = 0; c < C; c++) {
			const __m512 s = _mm512_mul_ps(sw, _mm512_set1_ps(xd[(j0 + c) * nb + b]));
			const __m512 prev = b < 16 ? _mm512_setzero_ps() : racc[c][res];
			racc[c][res] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ai[c]), s, prev);
		}
	}
}

AVX512 static void s16_gemm(float *out, const uint8_t *w, int64_t row_bytes, int64_t lo, int64_t hi,
	int64_t rows, int64_t nb, const int8_t *xq, const float *xd, const int32_t *xs, int64_t n) {
	_Alignas(64) uint8_t buf[GEMM_KC * PACK_BLOCK];
	__m512 racc[GEMM_SG][16];
	const int off = 8; // Q4_0 levels are weight + 8
	for (int64_t r0 = lo; r0 < hi; r0 += 16) {
		int nr = hi - r0 < 16 ? (int)(hi - r0) : 16;
		__mmask16 m = (__mmask16)((1u << nr) - 1);
		for (int64_t s0 = 0; s0 < n; s0 += GEMM_SG) {
			int64_t sn = n - s0 < GEMM_SG ? n - s0 : GEMM_SG;
			for (int64_t k0 = 0; k0 < nb; k0 += GEMM_KC) {
				int64_t kc = nb - k0 < GEMM_KC ? nb - k0 : GEMM_KC;
				pack16(buf, w, row_bytes, r0, nr, k0, kc);
				int64_t j = 0;
				for (; j + GEMM_C <= sn; j += GEMM_C) {
					s16_chunk(off, GEMM_C, buf, kc, k0, nb, xq, xd, xs, s0 + j, racc + j);
				}
				switch (sn - j) {
#define TAIL(c) case c: s16_chunk(off, c, buf, kc, k0, nb, xq, xd, xs, s0 + j, racc + j); break;
				TAIL(7) TAIL(6) TAIL(5) TAIL(4) TAIL(3) TAIL(2) TAIL(1)
#undef TAIL
				}
			}
			// The fixed tree over the sixteen sums (those no block
			// reached are zero).
			for (int64_t c = 0; c < sn; c++) {
				__m512 a[8];
				for (int k = 0; k < 8; k++) {
					__m512 lo8 = k < nb ? racc[c][k] : _mm512_setzero_ps();
					__m512 hi8 = k + 8 < nb ? racc[c][k + 8] : _mm512_setzero_ps();
					a[k] = _mm512_add_ps(lo8, hi8);
				}
				for (int k = 0; k < 4; k++) {
					a[k] = _mm512_add_ps(a[k], a[k + 4]);
				}
				for (int k = 0; k < 2; k++) {
					a[k] = _mm512_add_ps(a[k], a[k + 2]);
				}
				_mm512_mask_storeu_ps(out + (s0 + c) * rows + r0, m, _mm512_add_ps(a[0], a[1]));
			}
		}
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
	const int8_t *xq, const float *xd, const int32_t *xs, int64_t n) {
	int64_t r = lo;
	if (n == 1 && wt == TK_Q4_0) {
		gemv_rows(18, out, w, row_bytes, lo, hi, cols / 32, xq, xd);
		return;
	}
	if (n == 1 && wt == TK_Q8_0) {
		gemv_rows(34, out, w, row_bytes, lo, hi, cols / 32, xq, xd);
		return;
	}
	if (wt == TK_Q4_0) {
		s16_gemm(out, w, row_bytes, lo, hi, rows, cols / 32, xq, xd, xs, n);
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
