//go:build !cuda

package model

import (
	"strings"
	"testing"

	"github.com/tandem-llm/tandem/internal/testutil"
	"github.com/tandem-llm/tandem/weights"
)

// TestDeviceCUDAUntagged: without -tags cuda, asking for the GPU says how
// to get it.
func TestDeviceCUDAUntagged(t *testing.T) {
	f, err := weights.Open(testutil.Model(t, "stories260K.bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, d := range []string{"cuda", "cuda:1"} {
		_, err := Load(f, Options{Threads: 1, Device: d})
		if err == nil || !strings.Contains(err.Error(), "-tags cuda") {
			t.Errorf("device %q: %v; want an error that says to build with -tags cuda", d, err)
		}
	}
}
