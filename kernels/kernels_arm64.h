//go:build cgo

// NEON matmul kernels, included twice by kernels_arm64.c: once for baseline
// arm64 (TK_DOT 0, widening multiplies) and once for CPUs with SDOT
// (TK_DOT 1, compiled for armv8.2-a+dotprod). TK_FN names the variant's
// functions and TK_TARGET holds its target attribute.

TK_TARGET INLINE int32x4_t TK_FN(dot16)(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if TK_DOT
	return vdotq_s32(acc, a, b);
#else
	// |a·b| <= 128·127 fits int16; pairs widen into the int32 lanes.
	acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
	return vpadalq_s16(acc, vmull_high_s8(a, b));
#endif
}

TK_TARGET INLINE void TK_FN(q32_row)(const int bb, float *out, const uint8_t *row, int64_t nb,
	const int8_t *xq, const float *xd, int64_t j0, const int nc, int64_t rows) {
	float32x4_t acc[4] = {vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0)};
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *blk = row + b * bb;
		float dw = tk_f16(tk_le16(blk));
		int8x16_t w0, w1;
		if (bb == 34) {
			w0 = vld1q_s8((const int8_t *)blk + 2);
			w1 = vld1q_s8((const int8_t *)blk + 18);
		} else {
			uint8x16_t v = vld1q_u8(blk + 2);
			w0 = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(15))), vdupq_n_s8(8));
			w1 = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), vdupq_n_s8(8));
		}
		for (int c = 0; c < nc; c++) {
			int64_t jb = (j0 + c) * nb + b;
			const int8_t *y = xq + jb * 32;
			int32x4_t p = TK_FN(dot16)(TK_FN(dot16)(vdupq_n_s32(0), w0, vld1q_s8(y)), w1, vld1q_s8(y + 16));
			acc[c] = vfmaq_n_f32(acc[c], vcvtq_f32_s32(p), dw * xd[jb]);
		}
	}
	for (int c = 0; c < nc; c++) {
		out[(j0 + c) * rows] = vaddvq_f32(acc[c]);
	}
}

// Q4_K and Q6_K: exact integer sums per super-block, then the Go twin's
// float steps, so results match it bit for bit.
TK_TARGET INLINE void TK_FN(q4_k_row)(float *out, const uint8_t *row, int64_t nb, const int8_t *xq,
	const float *xd, const int32_t *xs, int64_t j0, const int nc, int64_t rows) {
	float acc[4] = {0, 0, 0, 0};
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *blk = row + b * 144;
		float d = tk_f16(tk_le16(blk)), dmin = tk_f16(tk_le16(blk + 2));
		uint8_t sc[8], m[8];
		for (int j = 0; j < 8; j++) {
			tk_scale_min_k4(blk + 4, j, &sc[j], &m[j]);
		}
		int8x16_t q[16]; // sub-block j is q[2j], q[2j+1]
		for (int k = 0; k < 4; k++) {
			uint8x16_t a = vld1q_u8(blk + 16 + 32 * k), b2 = vld1q_u8(blk + 32 + 32 * k);
			q[4 * k + 0] = vreinterpretq_s8_u8(vandq_u8(a, vdupq_n_u8(15)));
			q[4 * k + 1] = vreinterpretq_s8_u8(vandq_u8(b2, vdupq_n_u8(15)));
			q[4 * k + 2] = vreinterpretq_s8_u8(vshrq_n_u8(a, 4));
			q[4 * k + 3] = vreinterpretq_s8_u8(vshrq_n_u8(b2, 4));
		}
		for (int c = 0; c < nc; c++) {
			int64_t jb = (j0 + c) * nb + b;
			const int8_t *y = xq + jb * 256;
			const int32_t *bs = xs + jb * 16;
			int32_t sumi = 0, summ = 0;
			for (int j = 0; j < 8; j++) {
				int32x4_t p = TK_FN(dot16)(vdupq_n_s32(0), q[2 * j], vld1q_s8(y + 32 * j));
				p = TK_FN(dot16)(p, q[2 * j + 1], vld1q_s8(y + 32 * j + 16));
				sumi += sc[j] * vaddvq_s32(p);
				summ += m[j] * (bs[2 * j] + bs[2 * j + 1]);
			}
			float dx = xd[jb];
			acc[c] += (d * dx) * (float)sumi - (dmin * dx) * (float)summ;
		}
	}
	for (int c = 0; c < nc; c++) {
		out[(j0 + c) * rows] = acc[c];
	}
}

TK_TARGET INLINE void TK_FN(q6_k_row)(float *out, const uint8_t *row, int64_t nb, const int8_t *xq,
	const float *xd, const int32_t *xs, int64_t j0, const int nc, int64_t rows) {
	const uint8x16_t m4 = vdupq_n_u8(15), m2 = vdupq_n_u8(3);
	float acc[4] = {0, 0, 0, 0};
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *blk = row + b * 210;
		const int8_t *sc = (const int8_t *)(blk + 192);
		float d = tk_f16(tk_le16(blk + 208));
		int8x16_t lv[16]; // levels of weights 16g..16g+15
		for (int h = 0; h < 2; h++) {
			for (int p = 0; p < 2; p++) {
				uint8x16_t ql0 = vld1q_u8(blk + 64 * h + 16 * p);
				uint8x16_t ql1 = vld1q_u8(blk + 64 * h + 32 + 16 * p);
				uint8x16_t qh = vld1q_u8(blk + 128 + 32 * h + 16 * p);
				int g = 8 * h + p;
				lv[g + 0] = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(ql0, m4), vshlq_n_u8(vandq_u8(qh, m2), 4)));
				lv[g + 2] = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(ql1, m4), vshlq_n_u8(vandq_u8(vshrq_n_u8(qh, 2), m2), 4)));
				lv[g + 4] = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(ql0, 4), vshlq_n_u8(vandq_u8(vshrq_n_u8(qh, 4), m2), 4)));
				lv[g + 6] = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(ql1, 4), vshlq_n_u8(vshrq_n_u8(qh, 6), 4)));
			}
		}
		for (int c = 0; c < nc; c++) {
			int64_t jb = (j0 + c) * nb + b;
			const int8_t *y = xq + jb * 256;
			const int32_t *bs = xs + jb * 16;
			int32_t sumi = 0;
			for (int g = 0; g < 16; g++) {
				int32_t isum = vaddvq_s32(TK_FN(dot16)(vdupq_n_s32(0), lv[g], vld1q_s8(y + 16 * g)));
				sumi += sc[g] * (isum - 32 * bs[g]);
			}
			acc[c] += (d * xd[jb]) * (float)sumi;
		}
	}
	for (int c = 0; c < nc; c++) {
		out[(j0 + c) * rows] = acc[c];
	}
}

TK_TARGET INLINE float32x4_t TK_FN(load4)(int wt, const uint8_t *p) {
	switch (wt) {
	case TK_F32:
		return vld1q_f32((const float *)p);
	case TK_F16:
		return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)p)));
	default:
		return vreinterpretq_f32_u32(vshlq_n_u32(vmovl_u16(vld1_u16((const uint16_t *)p)), 16));
	}
}

TK_TARGET INLINE void TK_FN(float_row)(int wt, float *out, const uint8_t *row, int64_t cols, const float *x,
	int64_t j0, const int nc, int64_t rows) {
	const int64_t es = wt == TK_F32 ? 4 : 2;
	float32x4_t a0[4], a1[4];
	for (int c = 0; c < 4; c++) {
		a0[c] = a1[c] = vdupq_n_f32(0);
	}
	int64_t i = 0;
	for (; i + 8 <= cols; i += 8) {
		float32x4_t w0 = TK_FN(load4)(wt, row + i * es), w1 = TK_FN(load4)(wt, row + (i + 4) * es);
		for (int c = 0; c < nc; c++) {
			const float *xc = x + (j0 + c) * cols + i;
			a0[c] = vfmaq_f32(a0[c], w0, vld1q_f32(xc));
			a1[c] = vfmaq_f32(a1[c], w1, vld1q_f32(xc + 4));
		}
	}
	for (int c = 0; c < nc; c++) {
		float s = vaddvq_f32(vaddq_f32(a0[c], a1[c]));
		const float *xc = x + (j0 + c) * cols;
		for (int64_t t = i; t < cols; t++) {
			float wv;
			if (wt == TK_F32) {
				__builtin_memcpy(&wv, row + 4 * t, 4);
			} else if (wt == TK_F16) {
				wv = tk_f16(tk_le16(row + 2 * t));
			} else {
				wv = tk_bf16(tk_le16(row + 2 * t));
			}
			s += wv * xc[t];
		}
		out[(j0 + c) * rows] = s;
	}
}

TK_TARGET INLINE void TK_FN(row_nc)(int wt, float *out, const uint8_t *row, int64_t cols, const float *x,
	const int8_t *xq, const float *xd, const int32_t *xs, int64_t j0, const int nc, int64_t rows) {
	switch (wt) {
	case TK_Q8_0:
		TK_FN(q32_row)(34, out, row, cols / 32, xq, xd, j0, nc, rows);
		break;
	case TK_Q4_0:
		TK_FN(q32_row)(18, out, row, cols / 32, xq, xd, j0, nc, rows);
		break;
	case TK_Q4_K:
		TK_FN(q4_k_row)(out, row, cols / 256, xq, xd, xs, j0, nc, rows);
		break;
	case TK_Q6_K:
		TK_FN(q6_k_row)(out, row, cols / 256, xq, xd, xs, j0, nc, rows);
		break;
	default:
		TK_FN(float_row)(wt, out, row, cols, x, j0, nc, rows);
	}
}

TK_TARGET static void TK_FN(matmul)(int wt, float *out, const uint8_t *w, int64_t row_bytes,
	int64_t lo, int64_t hi, int64_t rows, int64_t cols, const float *x,
	const int8_t *xq, const float *xd, const int32_t *xs, int64_t n) {
	for (int64_t r = lo; r < hi; r++) {
		const uint8_t *row = w + r * row_bytes;
		int64_t j = 0;
		for (; j + 4 <= n; j += 4) {
			TK_FN(row_nc)(wt, out + r, row, cols, x, xq, xd, xs, j, 4, rows);
		}
		switch (n - j) {
		case 3:
			TK_FN(row_nc)(wt, out + r, row, cols, x, xq, xd, xs, j, 3, rows);
			break;
		case 2:
			TK_FN(row_nc)(wt, out + r, row, cols, x, xq, xd, xs, j, 2, rows);
			break;
		case 1:
			TK_FN(row_nc)(wt, out + r, row, cols, x, xq, xd, xs, j, 1, rows);
			break;
		}
	}
}
