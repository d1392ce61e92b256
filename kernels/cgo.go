//go:build cgo

package kernels

/*
#cgo CFLAGS: -O3 -std=c11
#cgo LDFLAGS: -lm
#include "kernels.h"
*/
import "C"

import (
	"runtime"
	"unsafe"

	"golang.org/x/sys/cpu"

	"github.com/tandem-llm/tandem/weights"
)

// cLevel is the instruction-set level handed to the C kernels, detected
// once; tests lower it to exercise the portable paths.
var cLevel = detectLevel()

func detectLevel() C.int {
	switch runtime.GOARCH {
	case "amd64":
		avx2 := cpu.X86.HasAVX2 && cpu.X86.HasFMA && cpu.X86.HasF16C
		if avx2 && cpu.X86.HasAVX512F && cpu.X86.HasAVX512BW && cpu.X86.HasAVX512VL && cpu.X86.HasAVX512VNNI {
			return C.TK_AVX512
		}
		if cpu.X86.HasAVX2 && cpu.X86.HasFMA && cpu.X86.HasF16C {
			return C.TK_AVX2
		}
	case "arm64":
		if cpu.ARM64.HasASIMDDP {
			return C.TK_NEON_DOT
		}
		return C.TK_NEON
	}
	return C.TK_SCALAR
}

// cLevels lists the levels this machine can run, best first (for tests).
func cLevels() []C.int {
	switch cLevel {
	case C.TK_NEON_DOT:
		return []C.int{C.TK_NEON_DOT, C.TK_NEON, C.TK_SCALAR}
	case C.TK_AVX512:
		return []C.int{C.TK_AVX512, C.TK_AVX2, C.TK_SCALAR}
	case C.TK_SCALAR:
		return []C.int{C.TK_SCALAR}
	}
	return []C.int{cLevel, C.TK_SCALAR}
}

func init() {
	cLevelName = func() string {
		switch cLevel {
		case C.TK_AVX512:
			return "avx512-vnni"
		case C.TK_AVX2:
			return "avx2"
		case C.TK_NEON_DOT:
			return "neon-dot"
		case C.TK_NEON:
			return "neon"
		}
		return "scalar"
	}
	cImpl = &impl{name: "c", matmul: cMatMul, quantize: cQuantize, attention: cAttention, attentionF16: cAttentionF16, siluMul: cSiLUMul, expSum: cExpSum}
	backend = cImpl
}

// cQuantize: lengths were checked by quantizeActivations.
func cQuantize(x []float32, q []int8, d []float32, s []int32, block int) {
	if len(x) == 0 {
		return
	}
	C.tk_quantize(cLevel, (*C.float)(unsafe.Pointer(&x[0])), (*C.int8_t)(unsafe.Pointer(&q[0])),
		(*C.float)(unsafe.Pointer(&d[0])), (*C.int32_t)(unsafe.Pointer(&s[0])), C.int64_t(len(x)), C.int64_t(block))
}

// cMatMul: Pool.MatMul checked every length (checkMatMul), so the C side
// stays within w[:rows*rowBytes], x[:n*cols] and out[:n*rows].
func cMatMul(out []float32, w []byte, wt weights.DType, rowBytes, lo, hi, rows, cols int, x []float32, xq *quantized, n int) {
	var q *C.int8_t
	var d *C.float
	var s *C.int32_t
	if xq != nil {
		q = (*C.int8_t)(unsafe.Pointer(&xq.q[0]))
		d = (*C.float)(unsafe.Pointer(&xq.d[0]))
		s = (*C.int32_t)(unsafe.Pointer(&xq.s[0]))
	}
	C.tk_matmul(cLevel, C.int(wt), (*C.float)(unsafe.Pointer(&out[0])), (*C.uint8_t)(unsafe.Pointer(&w[0])), C.int64_t(rowBytes),
		C.int64_t(lo), C.int64_t(hi), C.int64_t(rows), C.int64_t(cols), (*C.float)(unsafe.Pointer(&x[0])), q, d, s, C.int64_t(n))
}

// cExpSum: ExpSum passes no empty x.
func cExpSum(x []float32, m float32) float64 {
	return float64(C.tk_exp_sum(cLevel, (*C.float)(unsafe.Pointer(&x[0])), C.int64_t(len(x)), C.float(m)))
}

// cSiLUMul: SiLUMul checked the lengths.
func cSiLUMul(gate, up []float32) {
	C.tk_silu_mul(cLevel, (*C.float)(unsafe.Pointer(&gate[0])), (*C.float)(unsafe.Pointer(&up[0])), C.int64_t(len(gate)))
}

// cAttention: Attention checked the rows (mustAttention).
// The K and V rows go to C as typed byte pointers, not unsafe.Pointer:
// cgo then knows they hold no Go pointers and skips its run-time check of
// each argument, which looked the KV buffers up in the heap on every call
// (1.2% of all samples in a profile of serving stories260K).
func cAttention(out, q, k, v []float32, heads, groups, qs, stride, off, prefix int, anc []int32, lo, hi []int, ld int, scale float32, scores []float32) {
	cAttend(0, out, q, (*C.uint8_t)(unsafe.Pointer(&k[0])), (*C.uint8_t)(unsafe.Pointer(&v[0])), heads, groups, qs, stride, off, prefix, anc, lo, hi, ld, scale, scores)
}

func cAttentionF16(out, q []float32, k, v []uint16, heads, groups, qs, stride, off, prefix int, anc []int32, lo, hi []int, ld int, scale float32, scores []float32) {
	cAttend(1, out, q, (*C.uint8_t)(unsafe.Pointer(&k[0])), (*C.uint8_t)(unsafe.Pointer(&v[0])), heads, groups, qs, stride, off, prefix, anc, lo, hi, ld, scale, scores)
}

// The C kernel takes lo and hi as int64_t arrays: Go's int must be 64
// bits where cgo builds (amd64, arm64).
var _ [unsafe.Sizeof(int(0)) - 8]struct{}

func cAttend(f16 C.int, out, q []float32, k, v *C.uint8_t, heads, groups, qs, stride, off, prefix int, anc []int32, lo, hi []int, ld int, scale float32, scores []float32) {
	var a *C.int32_t
	if len(anc) > 0 {
		a = (*C.int32_t)(unsafe.Pointer(&anc[0]))
	}
	var l, h *C.int64_t
	if lo != nil {
		l, h = (*C.int64_t)(unsafe.Pointer(&lo[0])), (*C.int64_t)(unsafe.Pointer(&hi[0]))
	}
	hd := (len(q) - (groups-1)*qs) / heads
	C.tk_attention(cLevel, f16, (*C.float)(unsafe.Pointer(&out[0])), (*C.float)(unsafe.Pointer(&q[0])), C.int64_t(qs), k, v,
		C.int64_t(hd), C.int64_t(heads), C.int64_t(groups), C.int64_t(stride), C.int64_t(off), C.int64_t(prefix),
		a, l, h, C.int64_t(len(anc)), C.float(scale), (*C.float)(unsafe.Pointer(&scores[0])), C.int64_t(ld))
}
