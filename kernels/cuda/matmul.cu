// Matrix times a batch of activation vectors: out[j*rows + r] = W[r]·x[j]
// for j < n, the device twin of kernels.Pool.MatMul.
//
// One warp computes one weight row for up to NC activation vectors, so a
// weight block is loaded once per NC vectors: NC = 1 serves decode, NC = 8
// prefill and tree verification. Lane l takes blocks l, l+32, ... of the
// row, so a warp reads 32 consecutive blocks of the row per step
// (coalesced), then the lanes' partial sums are reduced by shuffles.
//
// Q8_0 and Q4_0 weights multiply activations quantized to 32-value int8
// blocks by quantize_q8 (the same float steps as the host quantizer, so
// both multiply identical integers), four bytes at a time with dp4a.
//
// On the device, Q8_0 and Q4_0 matrices are stored split (repack_q): the
// quants of every block first, 32 (Q8_0) or 16 (Q4_0) bytes per block in
// GGUF order, then every block's f16 scale. A lane then loads its block
// with 16-byte loads, and a warp reads 512 or 1024 contiguous bytes per
// load instruction, where GGUF's 34- and 18-byte blocks allow only
// 2-byte loads.

#include "common.cuh"

// repack_q splits nblocks GGUF blocks of bb bytes (2-byte scale, then qb
// bytes of quants) from src into dst's split layout. One thread a block.
extern "C" __global__ void repack_q(uint8_t *dst, const uint8_t *src, long long nblocks, int bb)
{
	long long b = (long long)blockIdx.x * blockDim.x + threadIdx.x;
	if (b >= nblocks)
		return;
	int qb = bb - 2;
	const uint8_t *s = src + b * bb;
	uint8_t *q = dst + b * qb;
	for (int i = 0; i < qb; i++)
		q[i] = s[2 + i];
	uint8_t *d = dst + nblocks * qb + 2 * b;
	d[0] = s[0];
	d[1] = s[1];
}

// quantize_q8 quantizes nblocks blocks of 32 activations: one warp per
// block. scale = max|x|/127 and q = round-half-even(x/scale), computed as
// x * (1/scale) in float32 like the host quantizer; s gets the sum of q
// over each 16 values (Q4_0 subtracts 8 times it for its level offset).
extern "C" __global__ void quantize_q8(const float *x, int8_t *q, float *d, int *s, int nblocks)
{
	int blk = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
	int lane = threadIdx.x & 31;
	if (blk >= nblocks)
		return; // whole warps leave together
	float v = x[(size_t)blk * QK + lane];
	float amax = warp_max(fabsf(v));
	float scale = amax / 127.0f;
	float inv = scale != 0.0f ? 1.0f / scale : 0.0f;
	int qi = __float2int_rn(__fmul_rn(v, inv));
	q[(size_t)blk * QK + lane] = (int8_t)qi;
	if (lane == 0)
		d[blk] = scale;
	int sum = qi;
#pragma unroll
	for (int o = 8; o > 0; o >>= 1)
		sum += __shfl_xor_sync(FULL_MASK, sum, o); // stays within each half warp
	if ((lane & 15) == 0)
		s[(size_t)blk * 2 + (lane >> 4)] = sum;
}

// The warp's row and the first of its NC activation vectors; the whole
// warp returns when the row is past the end, so shuffles stay full.
#define MM_PROLOGUE                                                                                                    \
	int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);                                                       \
	int lane = threadIdx.x & 31;                                                                                       \
	if (r >= rows)                                                                                                     \
		return;                                                                                                        \
	int j0 = blockIdx.y * NC;                                                                                          \
	int nj = min(NC, n - j0);                                                                                          \
	float acc[NC];                                                                                                     \
	_Pragma("unroll") for (int j = 0; j < NC; j++) acc[j] = 0.0f;

// With add set, the product is added to out (the residual connection
// fused into the projection before it).
#define MM_EPILOGUE                                                                                                    \
	_Pragma("unroll") for (int j = 0; j < NC; j++)                                                                     \
	{                                                                                                                  \
		float v = warp_sum(acc[j]);                                                                                    \
		if (lane == 0 && j < nj) {                                                                                     \
			float *o = out + (size_t)(j0 + j) * rows + r;                                                              \
			*o = add ? __fadd_rn(*o, v) : v;                                                                           \
		}                                                                                                              \
	}

// load8 reads the 32 quantized activations of block xb as eight words.
__device__ __forceinline__ void load8(const int8_t *xq, size_t xb, int xi[8])
{
	const int4 *p = (const int4 *)(xq + xb * QK);
	int4 a = p[0], b = p[1];
	xi[0] = a.x, xi[1] = a.y, xi[2] = a.z, xi[3] = a.w;
	xi[4] = b.x, xi[5] = b.y, xi[6] = b.z, xi[7] = b.w;
}

template <int NC>
__device__ __forceinline__ void mm_q8_0(float *out, const uint8_t *w, const int8_t *xq, const float *xd, int rows, int cols, int n, int add)
{
	MM_PROLOGUE
	int nb = cols / QK;
	const int4 *qrow = (const int4 *)(w + (size_t)r * nb * QK);
	const uint16_t *drow = (const uint16_t *)(w + (size_t)rows * nb * QK) + (size_t)r * nb;
	// Unrolled so that several blocks' loads are in flight at once: a
	// decode row is only a few blocks per lane, each a DRAM round trip.
#pragma unroll 4
	for (int b = lane; b < nb; b += 32) {
		int4 a = qrow[2 * b], c = qrow[2 * b + 1];
		float dw = f16(drow[b]);
		int wq[8] = {a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w};
#pragma unroll
		for (int j = 0; j < NC; j++) {
			if (j < nj) {
				size_t xb = (size_t)(j0 + j) * nb + b;
				int xi[8];
				load8(xq, xb, xi);
				int sum = 0;
#pragma unroll
				for (int i = 0; i < 8; i++)
					sum = dot4(wq[i], xi[i], sum);
				// Unfused, as the host kernels compute it.
				acc[j] = __fadd_rn(acc[j], __fmul_rn((float)sum, __fmul_rn(dw, xd[xb])));
			}
		}
	}
	MM_EPILOGUE
}

template <int NC>
__device__ __forceinline__ void mm_q4_0(float *out, const uint8_t *w, const int8_t *xq, const float *xd, const int *xs, int rows, int cols, int n, int add)
{
	MM_PROLOGUE
	int nb = cols / QK;
	const int4 *qrow = (const int4 *)(w + (size_t)r * nb * (QK / 2));
	const uint16_t *drow = (const uint16_t *)(w + (size_t)rows * nb * (QK / 2)) + (size_t)r * nb;
	// Unrolled so that several blocks' loads are in flight at once: a
	// decode row is only a few blocks per lane, each a DRAM round trip.
#pragma unroll 4
	for (int b = lane; b < nb; b += 32) {
		int4 a = qrow[b];
		float dw = f16(drow[b]);
		// Byte i holds weight i (low nibble) and weight i+16 (high).
		uint32_t v4[4] = {(uint32_t)a.x, (uint32_t)a.y, (uint32_t)a.z, (uint32_t)a.w};
		int lo[4], hi[4];
#pragma unroll
		for (int i = 0; i < 4; i++) {
			lo[i] = (int)(v4[i] & 0x0f0f0f0fu);
			hi[i] = (int)((v4[i] >> 4) & 0x0f0f0f0fu);
		}
#pragma unroll
		for (int j = 0; j < NC; j++) {
			if (j < nj) {
				size_t xb = (size_t)(j0 + j) * nb + b;
				int xi[8];
				load8(xq, xb, xi);
				int sum = 0;
#pragma unroll
				for (int i = 0; i < 4; i++) {
					sum = dot4(lo[i], xi[i], sum);
					sum = dot4(hi[i], xi[4 + i], sum);
				}
				// Σ (q-8)·x = Σ q·x - 8·Σ x
				sum -= 8 * (xs[2 * xb] + xs[2 * xb + 1]);
				acc[j] = __fadd_rn(acc[j], __fmul_rn((float)sum, __fmul_rn(dw, xd[xb])));
			}
		}
	}
	MM_EPILOGUE
}

// mm_float multiplies F32, F16 or BF16 weights by float activations; lanes
// take consecutive columns, so each load instruction is coalesced.
template <int NC, int TYPE>
__device__ __forceinline__ void mm_float(float *out, const void *w, const float *x, int rows, int cols, int n, int add)
{
	MM_PROLOGUE
	const float *x0 = x + (size_t)j0 * cols;
#pragma unroll 4
	for (int c = lane; c < cols; c += 32) {
		float wv;
		if (TYPE == TYPE_F32)
			wv = ((const float *)w)[(size_t)r * cols + c];
		else if (TYPE == TYPE_F16)
			wv = f16(((const uint16_t *)w)[(size_t)r * cols + c]);
		else
			wv = bf16(((const uint16_t *)w)[(size_t)r * cols + c]);
#pragma unroll
		for (int j = 0; j < NC; j++)
			if (j < nj)
				acc[j] += wv * x0[(size_t)j * cols + c];
	}
	MM_EPILOGUE
}

#define MM_ENTRIES(NC)                                                                                                 \
	extern "C" __global__ void matmul_q8_0_##NC(float *out, const uint8_t *w, const int8_t *xq, const float *xd,       \
						     const int *xs, int rows, int cols, int n, int add)                                \
	{                                                                                                                  \
		mm_q8_0<NC>(out, w, xq, xd, rows, cols, n, add);                                                                    \
	}                                                                                                                  \
	extern "C" __global__ void matmul_q4_0_##NC(float *out, const uint8_t *w, const int8_t *xq, const float *xd,       \
						     const int *xs, int rows, int cols, int n, int add)                                \
	{                                                                                                                  \
		mm_q4_0<NC>(out, w, xq, xd, xs, rows, cols, n, add);                                                                \
	}                                                                                                                  \
	extern "C" __global__ void matmul_f32_##NC(float *out, const void *w, const float *x, int rows, int cols, int n, int add)  \
	{                                                                                                                  \
		mm_float<NC, TYPE_F32>(out, w, x, rows, cols, n, add);                                                              \
	}                                                                                                                  \
	extern "C" __global__ void matmul_f16_##NC(float *out, const void *w, const float *x, int rows, int cols, int n, int add)  \
	{                                                                                                                  \
		mm_float<NC, TYPE_F16>(out, w, x, rows, cols, n, add);                                                              \
	}                                                                                                                  \
	extern "C" __global__ void matmul_bf16_##NC(float *out, const void *w, const float *x, int rows, int cols, int n, int add) \
	{                                                                                                                  \
		mm_float<NC, TYPE_BF16>(out, w, x, rows, cols, n, add);                                                             \
	}

MM_ENTRIES(1)
MM_ENTRIES(8)
