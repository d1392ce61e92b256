// Shared helpers of tandem's CUDA kernels. The kernels are C-linkage
// entry points (extern "C") so the Go side finds them by plain name in
// the PTX; everything else is inline device code.
//
// Layouts are those of the host kernels (package kernels): an activation
// batch is n vectors stored one after another, a weight matrix is rows of
// GGUF blocks, and a KV sequence is 2*layers planes of context rows of
// kvdim values (K of layer l is plane 2l, V plane 2l+1).
#ifndef TANDEM_COMMON_CUH
#define TANDEM_COMMON_CUH

#include <cuda_fp16.h>
#include <stdint.h>

#define FULL_MASK 0xffffffffu

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(FULL_MASK, v, o);
	return v;
}

__device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
	return v;
}

// block_sum and block_max reduce over a whole block (blockDim.x a
// multiple of 32, at most 1024); red is 32 floats of shared memory. Every
// thread gets the result.
__device__ __forceinline__ float block_sum(float v, float *red)
{
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
	v = warp_sum(v);
	__syncthreads(); // red may still be read by a previous reduction
	if (lane == 0)
		red[warp] = v;
	__syncthreads();
	v = lane < nw ? red[lane] : 0.0f;
	return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float *red)
{
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
	v = warp_max(v);
	__syncthreads();
	if (lane == 0)
		red[warp] = v;
	__syncthreads();
	v = lane < nw ? red[lane] : -INFINITY;
	return warp_max(v);
}

__device__ __forceinline__ float f16(uint16_t h) { return __half2float(__ushort_as_half(h)); }

__device__ __forceinline__ float bf16(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

// dot4 adds the products of the four signed bytes of a and b to c.
__device__ __forceinline__ int dot4(int a, int b, int c)
{
#if __CUDA_ARCH__ >= 610
	return __dp4a(a, b, c);
#else
	// sm_53 (Jetson Nano) has no dp4a.
	return c + (int)(int8_t)a * (int)(int8_t)b + (int)(int8_t)(a >> 8) * (int)(int8_t)(b >> 8) +
	       (int)(int8_t)(a >> 16) * (int)(int8_t)(b >> 16) + (int)(int8_t)(a >> 24) * (int)(int8_t)(b >> 24);
#endif
}

// Weight types, numbered as GGML numbers them (weights.DType).
#define TYPE_F32 0
#define TYPE_F16 1
#define TYPE_Q4_0 2
#define TYPE_Q8_0 8
#define TYPE_BF16 30

#define QK 32
#define Q8_0_BYTES 34
#define Q4_0_BYTES 18

#endif
