//go:build cuda

package cuda

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/tandem-llm/tandem/weights"
)

// TestUploader: matrices copied through the chunk ring (an odd chunk
// size, so chunks wrap around it and split blocks) land in the layout
// UploadWeights makes, byte for byte; the caller's bytes may change once
// Weights returns; the compute queue sees them after ComputeWait; a
// quantized matrix without enough scratch is refused.
func TestUploader(t *testing.T) {
	s := stream(t)
	rng := rand.New(rand.NewPCG(21, 22))
	u, err := s.NewUploader(3, 1000)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := u.Close(); err != nil {
			t.Error(err)
		}
	}()
	if u.PinnedBytes() != 3000 {
		t.Errorf("pinned %d bytes, want 3000", u.PinnedBytes())
	}
	read, done := newEvent(t, s), newEvent(t, s)
	const rows, cols = 37, 96
	for _, wt := range MatMulTypes {
		t.Run(wt.String(), func(t *testing.T) {
			raw := randomMatrix(t, rng, wt, rows, cols, false)
			want := make([]byte, len(raw))
			if err := s.Download(want, weightsOn(t, s, raw, wt, rows, cols)); err != nil {
				t.Fatal(err)
			}
			dst := upload(t, s, make([]byte, len(raw)))
			scratch := upload(t, s, make([]byte, len(raw)))
			for round := 0; round < 2; round++ {
				// The first write into dst waits for the compute queued so
				// far (a kernel reading it would be there).
				if err := s.RecordCompute(read); err != nil {
					t.Fatal(err)
				}
				u.WaitBefore(read)
				src := append([]byte(nil), raw...)
				if err := u.Weights(dst, scratch, src, wt, rows, cols); err != nil {
					t.Fatal(err)
				}
				clear(src) // out of the caller's memory already
				if err := u.Record(done); err != nil {
					t.Fatal(err)
				}
				if err := s.ComputeWait(done); err != nil {
					t.Fatal(err)
				}
				if err := s.SyncEvent(done); err != nil {
					t.Fatal(err)
				}
				got := make([]byte, len(raw))
				if err := s.Download(got, dst); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, want) {
					t.Fatalf("round %d: uploaded bytes differ from UploadWeights'", round)
				}
			}
			if wt == weights.Q8_0 || wt == weights.Q4_0 {
				if err := u.Weights(dst, scratch.Slice(0, 8), raw, wt, rows, cols); err == nil {
					t.Error("a quantized matrix with 8 bytes of scratch was accepted")
				}
			}
			if err := u.Weights(dst, scratch, raw[:len(raw)-1], wt, rows, cols); err == nil {
				t.Error("a short matrix was accepted")
			}
		})
	}
	if _, err := s.NewUploader(1, 1000); err == nil {
		t.Error("an uploader with one chunk was accepted")
	}
}

func newEvent(t *testing.T, s *Stream) *Event {
	t.Helper()
	e, err := s.NewEvent()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Error(err)
		}
	})
	return e
}
