package kernels

import (
	"fmt"

	"github.com/tandem-llm/tandem/weights"
)

// impl is one kernel backend: the matmul, its activation quantizer,
// attention and SwiGLU (an exponential per hidden unit), where inference
// time goes, and the exponentials of a sampler's softmax. The other
// vector ops are Go in both (a cgo call costs more than they do).
type impl struct {
	attention    func(out, q, k, v []float32, heads, groups, qs, stride, off, prefix int, anc []int32, lo, hi []int, ld int, scale float32, scores []float32)
	attentionF16 func(out, q []float32, k, v []uint16, heads, groups, qs, stride, off, prefix int, anc []int32, lo, hi []int, ld int, scale float32, scores []float32)
	name         string
	matmul       func(out []float32, w []byte, wt weights.DType, rowBytes, lo, hi, rows, cols int, x []float32, xq *quantized, n int)
	quantize     func(x []float32, q []int8, d []float32, s []int32, block int)
	siluMul      func(gate, up []float32)
	expSum       func(x []float32, m float32) float64
}

var goImpl = &impl{name: "go", matmul: goMatMul, quantize: goQuantize, attention: goAttention, attentionF16: goAttentionF16,
	siluMul: goSiLUMul, expSum: goExpSum}

// cImpl is set by the cgo build when the C kernels are compiled in.
var cImpl *impl

// backend is the active implementation: C when compiled in (cgo.go's
// init switches to it), else Go.
var backend = goImpl

// SetBackend selects "c" (cgo builds only) or "go". It is for tests and
// the --kernels flag, and must not run concurrently with kernels.
func SetBackend(name string) error {
	switch {
	case name == "go":
		backend = goImpl
	case name == "c" && cImpl != nil:
		backend = cImpl
	case name == "c":
		return fmt.Errorf("kernels: the C backend is not compiled in (build with CGO_ENABLED=1 and a C compiler)")
	default:
		return fmt.Errorf("kernels: unknown backend %q (want c or go)", name)
	}
	return nil
}

// Backend names the active backend.
func Backend() string { return backend.name }

// Backends lists the compiled-in backends, fastest first.
func Backends() []string {
	if cImpl != nil {
		return []string{"c", "go"}
	}
	return []string{"go"}
}

// cLevelName names the C kernels' instruction set (set by cgo.go).
var cLevelName = func() string { return "" }

// Level names the instruction set the active backend runs: for C,
// "avx512-vnni", "avx2", "neon-dot", "neon" or "scalar"; "go" for Go.
func Level() string {
	if backend == cImpl {
		return cLevelName()
	}
	return "go"
}
