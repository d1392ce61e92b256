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

// TestParseDevice: the device names Options.Device, serve's --lanes and
// generate's --device share.
func TestParseDevice(t *testing.T) {
	for _, tc := range []struct {
		in  string
		gpu bool
		ord int
		ok  bool
	}{
		{"", false, 0, true}, {"cpu", false, 0, true}, {"cuda", true, 0, true}, {"cuda:0", true, 0, true}, {"cuda:3", true, 3, true},
		{"cuda:", false, 0, false}, {"cuda:-1", false, 0, false}, {"cuda:x", false, 0, false}, {"cuda0", false, 0, false}, {"gpu", false, 0, false},
	} {
		gpu, ord, err := ParseDevice(tc.in)
		if (err == nil) != tc.ok || gpu != tc.gpu || ord != tc.ord {
			t.Errorf("ParseDevice(%q) = %v, %d, %v", tc.in, gpu, ord, err)
		}
	}
}
