// Attention over a KV cache with the Batch's tree visibility rule, the
// device twin of kernels.Attention: query head h of vector i attends to
// its sequence's rows 0..prefix[i]-1 (committed), then to the rows
// anc[lo[i]..hi[i]) (its tentative ancestors, root first, and itself).
// Query head h reads KV head h/group (grouped-query attention).
//
// One block per (head, vector): warps compute scores row by row (lanes
// split the head dimension), the block takes the softmax, then each warp
// sums a share of the value rows and the shares are added. Scores go to a
// global scratch of maxlen floats per (vector, head), so any context fits.
// Decode attends with few blocks (one per head), so each keeps many loads
// in flight rather than waiting on one row at a time.
#include "common.cuh"

template <typename T> __device__ __forceinline__ float ld(const T *p);
template <> __device__ __forceinline__ float ld<float>(const float *p) { return *p; }
template <> __device__ __forceinline__ float ld<__half>(const __half *p) { return __half2float(*p); }

#define MAX_HEAD 256 // head dimension bound: MAX_HEAD/32 accumulators per lane

template <typename T>
__device__ __forceinline__ void attend(float *out, const float *q, const unsigned long long *base, long long koff, long long voff,
				       int kvd, int heads, int group, int hd, const int *prefix, const int *anc, const int *lo,
				       const int *hi, float scale, float *scores, int maxlen)
{
	extern __shared__ float sh[]; // hd floats of query, then nw*hd partial outputs
	__shared__ float red[32];
	float *qs = sh, *part = sh + hd;
	int h = blockIdx.x, i = blockIdx.y;
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
	int off = (h / group) * hd;
	const float *qi = q + ((size_t)i * heads + h) * hd;
	for (int d = threadIdx.x; d < hd; d += blockDim.x)
		qs[d] = qi[d];
	__syncthreads();

	const T *K = (const T *)base[i] + koff + off;
	const T *V = (const T *)base[i] + voff + off;
	int pre = prefix[i], a0 = lo[i];
	int len = pre + hi[i] - a0;
	float *sc = scores + ((size_t)i * heads + h) * maxlen;

	// Scores: a warp per row, lanes across the head; four rows at a time
	// so that four rows' loads are in flight before the reductions.
	for (int t0 = 4 * warp; t0 < len; t0 += 4 * nw) {
		float s[4];
#pragma unroll
		for (int u = 0; u < 4; u++) {
			s[u] = 0.0f;
			int t = t0 + u;
			if (t < len) {
				int row = t < pre ? t : anc[a0 + t - pre];
				const T *kr = K + (size_t)row * kvd;
				for (int d = lane; d < hd; d += 32)
					s[u] += qs[d] * ld(kr + d);
			}
		}
#pragma unroll
		for (int u = 0; u < 4; u++) {
			float v = warp_sum(s[u]);
			if (lane == 0 && t0 + u < len)
				sc[t0 + u] = v * scale;
		}
	}
	__syncthreads();

	float m = -INFINITY;
	for (int t = threadIdx.x; t < len; t += blockDim.x)
		m = fmaxf(m, sc[t]);
	m = block_max(m, red);
	float sum = 0.0f;
	for (int t = threadIdx.x; t < len; t += blockDim.x) {
		float e = expf(sc[t] - m);
		sc[t] = e;
		sum += e;
	}
	sum = block_sum(sum, red); // its barriers publish sc to the block
	float inv = 1.0f / sum;

	// Values: each warp sums its share of the rows, lanes across the head
	// (coalesced row reads), then the warps' partial sums are added.
	float acc[MAX_HEAD / 32];
#pragma unroll
	for (int k = 0; k < MAX_HEAD / 32; k++)
		acc[k] = 0.0f;
	for (int t = warp; t < len; t += nw) {
		int row = t < pre ? t : anc[a0 + t - pre];
		float p = sc[t] * inv;
		const T *vr = V + (size_t)row * kvd;
#pragma unroll
		for (int k = 0; k < MAX_HEAD / 32; k++)
			if (lane + 32 * k < hd)
				acc[k] += p * ld(vr + lane + 32 * k);
	}
#pragma unroll
	for (int k = 0; k < MAX_HEAD / 32; k++)
		if (lane + 32 * k < hd)
			part[warp * hd + lane + 32 * k] = acc[k];
	__syncthreads();
	float *o = out + ((size_t)i * heads + h) * hd;
	for (int d = threadIdx.x; d < hd; d += blockDim.x) {
		float v = 0.0f;
		for (int w = 0; w < nw; w++)
			v += part[w * hd + d];
		o[d] = v;
	}
}

extern "C" __global__ void attention_f32(float *out, const float *q, const unsigned long long *base, long long koff, long long voff,
					  int kvd, int heads, int group, int hd, const int *prefix, const int *anc, const int *lo,
					  const int *hi, float scale, float *scores, int maxlen)
{
	attend<float>(out, q, base, koff, voff, kvd, heads, group, hd, prefix, anc, lo, hi, scale, scores, maxlen);
}

extern "C" __global__ void attention_f16(float *out, const float *q, const unsigned long long *base, long long koff, long long voff,
					  int kvd, int heads, int group, int hd, const int *prefix, const int *anc, const int *lo,
					  const int *hi, float scale, float *scores, int maxlen)
{
	attend<__half>(out, q, base, koff, voff, kvd, heads, group, hd, prefix, anc, lo, hi, scale, scores, maxlen);
}
