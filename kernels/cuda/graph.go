//go:build cuda

package cuda

/*
#include <cuda.h>

static CUresult tk_begin_capture(CUstream s) {
	// Relaxed: Go may run the goroutine that launches on any thread.
	return cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED);
}

static CUresult tk_end_capture(CUstream s, CUgraphExec *exec) {
	CUgraph g = NULL;
	CUresult r = cuStreamEndCapture(s, &g);
	if (r != CUDA_SUCCESS)
		return r;
#if CUDA_VERSION >= 11040
	r = cuGraphInstantiateWithFlags(exec, g, 0);
#else
	r = cuGraphInstantiate(exec, g, NULL, NULL, 0);
#endif
	cuGraphDestroy(g); // the executable graph keeps what it needs
	return r;
}
*/
import "C"

import (
	"fmt"
	"unsafe"

	"gorgonia.org/cu"
)

// Graph is a recorded sequence of a Stream's kernel launches that replays
// with one launch: a decode pass is hundreds of small kernels, whose
// launch costs, not their work, bound it.
//
// A replay runs the kernels with the arguments they were recorded with,
// so the buffers they use must stay where they were (and their contents
// change only through uploads between replays).
type Graph struct {
	d    *Device
	exec C.CUgraphExec
}

func cStream(s cu.Stream) C.CUstream { return C.CUstream(unsafe.Pointer(s.C())) }

// BeginCapture starts recording the kernels launched on s into a Graph
// (EndCapture); they do not run. Between the two, uploads, downloads,
// Sync and scratch growth are not allowed (Reserve the scratch first).
func (s *Stream) BeginCapture() error {
	if s.err != nil {
		return s.err
	}
	defer s.d.bind()()
	if r := C.tk_begin_capture(cStream(s.compute)); r != C.CUDA_SUCCESS {
		return s.fail(fmt.Errorf("cuda: GPU %d: begin capture: CUresult %d", s.d.Ordinal, int(r)))
	}
	s.capturing = true
	return nil
}

// EndCapture ends the recording and returns it as a Graph; after a failed
// launch during the capture it returns that error and no graph.
func (s *Stream) EndCapture() (*Graph, error) {
	if !s.capturing {
		return nil, fmt.Errorf("cuda: end capture without a capture")
	}
	s.capturing = false
	defer s.d.bind()()
	var exec C.CUgraphExec
	r := C.tk_end_capture(cStream(s.compute), &exec)
	if s.err != nil {
		if r == C.CUDA_SUCCESS {
			C.cuGraphExecDestroy(exec)
		}
		return nil, s.err
	}
	if r != C.CUDA_SUCCESS {
		return nil, s.fail(fmt.Errorf("cuda: GPU %d: end capture: CUresult %d", s.d.Ordinal, int(r)))
	}
	return &Graph{d: s.d, exec: exec}, nil
}

// Launch replays g on the compute stream.
func (s *Stream) Launch(g *Graph) error {
	if s.err != nil {
		return s.err
	}
	defer s.d.bind()()
	if r := C.cuGraphLaunch(g.exec, cStream(s.compute)); r != C.CUDA_SUCCESS {
		return s.fail(fmt.Errorf("cuda: GPU %d: graph launch: CUresult %d", s.d.Ordinal, int(r)))
	}
	return nil
}

// Close releases the graph (after the replays that use it are done).
func (g *Graph) Close() error {
	if g == nil || g.exec == nil {
		return nil
	}
	defer g.d.bind()()
	r := C.cuGraphExecDestroy(g.exec)
	g.exec = nil
	if r != C.CUDA_SUCCESS {
		return fmt.Errorf("cuda: destroying a graph: CUresult %d", int(r))
	}
	return nil
}

// Reserve grows the stream's scratch to n bytes now, so that the kernels
// of a capture never need to grow it. Growing it changes Generation.
func (s *Stream) Reserve(n int64) error {
	_, err := s.scratchBuf(n)
	return err
}

// MatMulScratch is the scratch MatMul needs for n vectors of cols values.
func MatMulScratch(n, cols int) int64 {
	vals := int64(n) * int64(cols)
	return vals + vals/32*4 + vals/16*4
}

// AttentionScratch is the scratch Attention needs.
func AttentionScratch(n, heads, maxLen int) int64 {
	return int64(n) * int64(heads) * int64(maxLen) * 4
}
