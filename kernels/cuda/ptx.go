// Package cuda runs tandem's kernels on an NVIDIA GPU through the CUDA
// driver API (gorgonia.org/cu): device memory, streams, pinned host
// buffers and the launches of the kernels in this folder's .cu files,
// which are compiled to PTX for each supported architecture and embedded.
//
// Everything but the PTX table (this file) is behind the cuda build tag:
// without it nothing links against CUDA, and CGO_ENABLED=0 and Android
// builds never see this package. `make cuda-ptx` regenerates the PTX
// (needs nvcc), `make cuda` builds and compile-checks the tagged code.
package cuda

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strings"
)

// Archs are the architectures PTX is generated for, oldest first:
// Jetson Nano (5.3), TX2 (6.2), Xavier (7.2), Orin (8.7) and Hopper (9.0,
// the H100 the tests ran on). A GPU runs the newest one it supports; the
// driver compiles PTX for the GPU it loads it on, so a 7.5 or 8.6 card
// runs sm_72 code and a newer one sm_90 code.
var Archs = []int{53, 62, 72, 87, 90}

// Modules are the .cu files, each compiled to one PTX module per arch.
var Modules = []string{"matmul", "ops", "attention"}

// Entries are the kernels the Go side launches, by module.
var Entries = map[string][]string{
	"matmul": {
		"repack_q", "quantize_q8",
		"matmul_q8_0_1", "matmul_q4_0_1", "matmul_f32_1", "matmul_f16_1", "matmul_bf16_1",
		"matmul_q8_0_8", "matmul_q4_0_8", "matmul_f32_8", "matmul_f16_8", "matmul_bf16_8",
	},
	"ops":       {"rmsnorm", "rope", "silu_mul", "add", "embed", "kv_put", "kv_move"},
	"attention": {"attention_f32", "attention_f16"},
}

//go:embed ptx/*.ptx ptx/SOURCES
var ptxFS embed.FS

// ChooseArch returns the newest PTX architecture a GPU of compute
// capability major.minor can run.
func ChooseArch(major, minor int) (int, error) {
	cc := major*10 + minor
	best := 0
	for _, a := range Archs {
		if a <= cc {
			best = a
		}
	}
	if best == 0 {
		return 0, fmt.Errorf("cuda: compute capability %d.%d is older than %d.%d, the oldest tandem has PTX for", major, minor, Archs[0]/10, Archs[0]%10)
	}
	return best, nil
}

// PTX returns the embedded PTX text of a module for an architecture.
func PTX(module string, arch int) (string, error) {
	b, err := ptxFS.ReadFile(ptxName(module, arch))
	if err != nil {
		return "", fmt.Errorf("cuda: no PTX for module %s on sm_%d: %w (run make cuda-ptx)", module, arch, err)
	}
	return string(b), nil
}

func ptxName(module string, arch int) string { return fmt.Sprintf("ptx/%s.sm_%d.ptx", module, arch) }

// SourcesDigest is the digest `make cuda-ptx` records in ptx/SOURCES: the
// SHA-256 of every .cu and .cuh file of fsys, by name order, each as its
// name, a NUL, its bytes and a NUL. Tests compare it with the sources on
// disk, so PTX that was not regenerated after a kernel change is caught.
// A folder without sources is an error, not the digest of nothing: a test
// binary run from another folder would otherwise report stale PTX.
func SourcesDigest(fsys fs.FS) (string, error) {
	var names []string
	for _, pat := range []string{"*.cu", "*.cuh"} {
		m, err := fs.Glob(fsys, pat)
		if err != nil {
			return "", err
		}
		names = append(names, m...)
	}
	if len(names) == 0 {
		return "", errors.New("cuda: no .cu or .cuh files in this folder: run the test from kernels/cuda, as go test does (tools/cuda-tests.sh runs the compiled tests so)")
	}
	sort.Strings(names)
	h := sha256.New()
	for _, n := range names {
		b, err := fs.ReadFile(fsys, n)
		if err != nil {
			return "", err
		}
		h.Write([]byte(n))
		h.Write([]byte{0})
		h.Write(b)
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// recordedDigest is the digest of the sources the embedded PTX was made from.
func recordedDigest() (string, error) {
	b, err := ptxFS.ReadFile("ptx/SOURCES")
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}
