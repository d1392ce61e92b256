//go:build !cuda

package model

import "fmt"

// newCUDAOps: this build has no GPU backend.
func newCUDAOps(m *Model, ordinal int) (ops, error) {
	return nil, fmt.Errorf("model: device cuda:%d: this binary was built without CUDA support; rebuild with -tags cuda (see README, \"CUDA (Jetson GPU)\")", ordinal)
}
