// Attention over a KV cache with the Batch's tree visibility rule, the
// device twin of kernels.Attention: query head h of vector i attends to
// its sequence's rows 0..prefix[i]-1 (committed), then to the rows
// anc[lo[i]..hi[i]) (its tentative ancestors, root first, and itself).
// Query head h reads KV head h/group (grouped-query attention).
//
// One block per (head, vector): warps compute scores row by row (lanes
// split the head dimension), the block takes the softmax, then threads
// split the head dimension to sum the value rows. Scores go to a global
// scratch of maxlen floats per (vector, head), so any context fits.
#include "common.cuh"

template <typename T> __device__ __forceinline__ float ld(const T *p);
template <> __device__ __forceinline__ float ld<float>(const float *p) { return *p; }
template <> __device__ __forceinline__ float ld<__half>(const __half *p) { return __half2float(*p); }

template <typename T>
__device__ __forceinline__ void attend(float *out, const float *q, const unsigned long long *base, long long koff, long long voff,
				       int kvd, int heads, int group, int hd, const int *prefix, const int *anc, const int *lo,
				       const int *hi, float scale, float *scores, int maxlen)
{
	extern __shared__ float qs[]; // hd floats
	__shared__ float red[32];
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

	for (int t = warp; t < len; t += nw) {
		int row = t < pre ? t : anc[a0 + t - pre];
		const T *kr = K + (size_t)row * kvd;
		float s = 0.0f;
		for (int d = lane; d < hd; d += 32)
			s += qs[d] * ld(kr + d);
		s = warp_sum(s);
		if (lane == 0)
			sc[t] = s * scale;
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

	float *o = out + ((size_t)i * heads + h) * hd;
	for (int d = threadIdx.x; d < hd; d += blockDim.x) {
		float acc = 0.0f;
		for (int t = 0; t < len; t++) {
			int row = t < pre ? t : anc[a0 + t - pre];
			acc += (sc[t] * inv) * ld(V + (size_t)row * kvd + d);
		}
		o[d] = acc;
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
