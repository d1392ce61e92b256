// The small per-token operations of the forward recipe, device twins of
// kernels.RMSNorm, RoPE, SiLUMul and Add, plus the embedding lookup
// (weights.Dequantize of one row per token) and the KV cache writes.
// Where the host computes a step in float64 (sqrt, pow, sin, cos) these
// do too, so results match the host's to float32 rounding.
#include "common.cuh"

// rmsnorm normalises vector src[j] (src = rows ? rows[j] : j) of x into
// out[j]: out = x / sqrt(mean(x²) + eps) · w. One block per vector.
extern "C" __global__ void rmsnorm(float *out, const float *x, const float *w, const int *rows, int dim, float eps)
{
	__shared__ float red[32];
	int j = blockIdx.x;
	const float *xr = x + (size_t)(rows ? rows[j] : j) * dim;
	float ss = 0.0f;
	for (int i = threadIdx.x; i < dim; i += blockDim.x)
		ss = __fadd_rn(ss, __fmul_rn(xr[i], xr[i]));
	ss = block_sum(ss, red);
	float scale = 1.0f / (float)sqrt((double)(ss / (float)dim + eps));
	float *o = out + (size_t)j * dim;
	for (int i = threadIdx.x; i < dim; i += blockDim.x)
		o[i] = __fmul_rn(w[i], __fmul_rn(scale, xr[i]));
}

__device__ __forceinline__ void rotate(float *p, float c, float s)
{
	float v0 = p[0], v1 = p[1];
	p[0] = __fsub_rn(__fmul_rn(v0, c), __fmul_rn(v1, s));
	p[1] = __fadd_rn(__fmul_rn(v0, s), __fmul_rn(v1, c));
}

// rope rotates adjacent pairs of every head of q (heads per vector) and k
// (kvheads per vector, k may be null) at each vector's position. One
// thread per (vector, pair), which computes the angle once for all heads.
extern "C" __global__ void rope(float *q, float *k, const int *pos, int n, int heads, int kvheads, int hd, float theta)
{
	int half = hd >> 1;
	int t = blockIdx.x * blockDim.x + threadIdx.x;
	if (t >= n * half)
		return;
	int j = t / half, i = 2 * (t % half);
	float freq = 1.0f / (float)pow((double)theta, (double)((float)i / (float)hd));
	double s, c;
	sincos((double)__fmul_rn((float)pos[j], freq), &s, &c);
	float fs = (float)s, fc = (float)c;
	float *qj = q + (size_t)j * heads * hd + i;
	for (int h = 0; h < heads; h++)
		rotate(qj + h * hd, fc, fs);
	if (k) {
		float *kj = k + (size_t)j * kvheads * hd + i;
		for (int h = 0; h < kvheads; h++)
			rotate(kj + h * hd, fc, fs);
	}
}

// silu_mul sets gate[i] = silu(gate[i]) · up[i] (SwiGLU).
extern "C" __global__ void silu_mul(float *gate, const float *up, long long count)
{
	long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
	if (i >= count)
		return;
	float g = gate[i];
	gate[i] = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), up[i]);
}

// add adds x into dst (the residual connection).
extern "C" __global__ void add(float *dst, const float *x, long long count)
{
	long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
	if (i < count)
		dst[i] = __fadd_rn(dst[i], x[i]);
}

// embed dequantizes row tokens[j] of the embedding table into out[j]. One
// block per token. Q8_0 and Q4_0 tables are in the split layout of
// repack_q (matmul.cu), as every quantized matrix on the device is.
extern "C" __global__ void embed(float *out, const uint8_t *table, int type, int vocab, const int *tokens, int dim)
{
	int j = blockIdx.x;
	size_t tok = tokens[j];
	size_t nb = dim / QK;
	float *o = out + (size_t)j * dim;
	for (int c = threadIdx.x; c < dim; c += blockDim.x) {
		float v;
		switch (type) {
		case TYPE_F32:
			v = ((const float *)table)[tok * dim + c];
			break;
		case TYPE_F16:
			v = f16(((const uint16_t *)table)[tok * dim + c]);
			break;
		case TYPE_BF16:
			v = bf16(((const uint16_t *)table)[tok * dim + c]);
			break;
		case TYPE_Q8_0: {
			size_t b = tok * nb + c / QK;
			float d = f16(((const uint16_t *)(table + (size_t)vocab * nb * QK))[b]);
			v = __fmul_rn((float)(int8_t)table[b * QK + c % QK], d);
			break;
		}
		case TYPE_Q4_0: {
			size_t b = tok * nb + c / QK;
			float d = f16(((const uint16_t *)(table + (size_t)vocab * nb * (QK / 2)))[b]);
			int e = c % QK;
			uint8_t q = table[b * (QK / 2) + (e & 15)];
			int level = e < 16 ? (q & 15) : (q >> 4);
			v = __fmul_rn((float)(level - 8), d);
			break;
		}
		default:
			v = __int_as_float(0x7fc00000); // NaN: the host refuses other types
		}
		o[c] = v;
	}
}

// kv_put writes vector j of k and v (kvd values each) into row rows[j] of
// the sequence whose rows start at base[j]: K at element koff, V at voff.
// F16 caches round to half precision, nearest even, as weights.F32ToF16.
extern "C" __global__ void kv_put(const float *k, const float *v, const unsigned long long *base, const int *rows, long long koff,
				   long long voff, int kvd, int n, int half)
{
	int t = blockIdx.x * blockDim.x + threadIdx.x;
	if (t >= n * kvd)
		return;
	int j = t / kvd, d = t % kvd;
	size_t at = (size_t)rows[j] * kvd + d;
	if (half) {
		__half *p = (__half *)base[j];
		p[koff + at] = __float2half_rn(k[t]);
		p[voff + at] = __float2half_rn(v[t]);
	} else {
		float *p = (float *)base[j];
		p[koff + at] = k[t];
		p[voff + at] = v[t];
	}
}

// kv_move copies row src[m] to row dst[m] of every plane of one sequence,
// for m in order: each thread owns one 16-bit unit of a row in one plane
// and applies the moves to it in sequence, so a row written by an earlier
// move is read by a later one as the host's front-to-back copy reads it.
extern "C" __global__ void kv_move(uint16_t *base, int planes, long long plane_units, int row_units, const int *dst,
				    const int *src, int nmoves)
{
	long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
	if (t >= (long long)planes * row_units)
		return;
	uint16_t *p = base + (t / row_units) * plane_units + t % row_units;
	for (int m = 0; m < nmoves; m++)
		p[(size_t)dst[m] * row_units] = p[(size_t)src[m] * row_units];
}
