//go:build cgo

// arm64 kernels: NEON is baseline there; the SDOT variant is compiled
// with a target attribute and chosen at run time (cpu.ARM64.HasASIMDDP).
#include "kernels.h"

#if defined(__aarch64__)
#include <arm_neon.h>

#define INLINE static inline __attribute__((always_inline))

#define TK_DOT 0
#define TK_FN(name) name##_neon
#define TK_TARGET
#include "matmul_neon.h"
#undef TK_DOT
#undef TK_FN
#undef TK_TARGET

#define TK_DOT 1
#define TK_FN(name) name##_dot
#define TK_TARGET __attribute__((target("arch=armv8.2-a+dotprod")))
#include "matmul_neon.h"

void tk_matmul_neon(int dot, int wt, float *out, const uint8_t *w, int64_t row_bytes,
	int64_t lo, int64_t hi, int64_t rows, int64_t cols, const float *x,
	const int8_t *xq, const float *xd, const int32_t *xs, int64_t n) {
	if (dot) {
		matmul_dot(wt, out, w, row_bytes, lo, hi, rows, cols, x, xq, xd, xs, n);
	} else {
		matmul_neon(wt, out, w, row_bytes, lo, hi, rows, cols, x, xq, xd, xs, n);
	}
}
#endif
