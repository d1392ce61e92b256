package model

import (
	"strings"
	"testing"

	"github.com/tandem-llm/tandem/internal/testutil"
	"github.com/tandem-llm/tandem/weights"
)

// TestDeviceOption: Options.Device names a backend or fails with an error
// that says what to write instead.
func TestDeviceOption(t *testing.T) {
	f, err := weights.Open(testutil.Model(t, "stories260K.bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, tc := range []struct{ device, want string }{
		{"tpu", "want cpu, cuda or cuda:N"},
		{"cuda:x", "want cuda:N"},
		{"cuda:-1", "want cuda:N"},
	} {
		m, err := Load(f, Options{Threads: 1, Device: tc.device})
		if err == nil {
			m.Close()
			t.Fatalf("device %q: no error", tc.device)
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("device %q: %v; want it to say %q", tc.device, err, tc.want)
		}
	}
	for _, d := range []string{"", "cpu"} {
		m, err := Load(f, Options{Threads: 1, Device: d})
		if err != nil {
			t.Fatalf("device %q: %v", d, err)
		}
		m.Close()
	}
}
