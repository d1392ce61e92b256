//go:build cuda

// Package cuinit starts the CUDA driver before gorgonia.org/cu does, so
// that a machine without a usable GPU gets a clear message instead of
// that package's: its init calls cuInit and exits the process when it
// fails, before any code of ours could run.
//
// Go initializes packages in import-path order among those whose imports
// are ready, and this package imports nothing gorgonia.org/cu does not,
// so "github.com/tandem-llm/..." runs first. kernels/cuda imports it.
//
// Without a GPU, a test binary prints why and exits as a run with no
// tests (go test shows "[no tests to run]"), so the cuda-tagged tests
// skip; any other program exits with status 1 and says what to do.
package cuinit

/*
#cgo LDFLAGS: -lcuda
#include <cuda.h>

static int tk_cuinit(const char **msg) {
	CUresult r = cuInit(0);
	int n = 0;
	*msg = "";
	if (r == CUDA_SUCCESS) {
		r = cuDeviceGetCount(&n);
		if (r == CUDA_SUCCESS && n == 0)
			r = CUDA_ERROR_NO_DEVICE;
	}
	if (r != CUDA_SUCCESS)
		cuGetErrorString(r, msg);
	return (int)r;
}
*/
import "C"

import (
	"fmt"
	"os"
)

func init() {
	var msg *C.char
	code := C.tk_cuinit(&msg)
	if code == 0 {
		return
	}
	why := fmt.Sprintf("CUDA driver cannot start: cuInit: %s (error %d)", C.GoString(msg), int(code))
	if testBinary() {
		fmt.Printf("--- SKIP: every test of this cuda-tagged binary: %s; run it on a machine with an NVIDIA GPU and its driver\n", why)
		fmt.Println("testing: warning: no tests to run")
		fmt.Println("PASS")
		os.Exit(0)
	}
	fmt.Fprintf(os.Stderr, "%s: built with -tags cuda, which needs an NVIDIA GPU and its driver: %s. Run it where the GPU is, or build without -tags cuda to compute on the CPU.\n", os.Args[0], why)
	os.Exit(1)
}

// testBinary reports whether this is a go test binary (named pkg.test, or
// run with -test. flags). testing.Testing cannot be used: importing
// testing would order this package after gorgonia.org/cu.
func testBinary() bool {
	if n := len(os.Args[0]); n >= 5 && os.Args[0][n-5:] == ".test" {
		return true
	}
	for _, a := range os.Args[1:] {
		if len(a) > 6 && a[:6] == "-test." {
			return true
		}
	}
	return false
}
