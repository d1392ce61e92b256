package weights

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// streamFixture synthesizes a small model and lists its layers and output
// head as stream groups, in compute order.
func streamFixture(t *testing.T) (*File, []Group) {
	t.Helper()
	sh := Shape{Name: "s", Dim: 64, Hidden: 160, Layers: 6, Heads: 4, KVHeads: 2, Vocab: 300, Context: 32}
	path := filepath.Join(t.TempDir(), "s.gguf")
	if err := Synth(path, SynthOptions{Shape: sh, Type: Q8_0, Seed: 3}); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	var groups []Group
	for l := 0; l < sh.Layers; l++ {
		g := Group{Name: fmt.Sprintf("blk.%d", l)}
		for _, m := range []string{"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_down", "ffn_up"} {
			g.Tensors = append(g.Tensors, fmt.Sprintf("blk.%d.%s.weight", l, m))
		}
		groups = append(groups, g)
	}
	groups = append(groups, Group{Name: "output", Tensors: []string{"output.weight"}},
		Group{Name: "token_embd", Tensors: []string{"token_embd.weight"}, Rows: true})
	return f, groups
}

// pass acquires every compute group in order, checks the bytes against
// the mapping and releases them; it returns the first error.
func pass(t *testing.T, s *Streamer, f *File, groups []Group) error {
	t.Helper()
	for g, grp := range groups {
		if grp.Rows {
			continue
		}
		views, err := s.Acquire(g)
		if err != nil {
			return err
		}
		for i, name := range grp.Tensors {
			tn, _ := f.Tensor(name)
			if !bytes.Equal(views[i], tn.Data) {
				t.Fatalf("%s: streamed bytes differ from the file", name)
			}
		}
		s.Release(g)
	}
	return nil
}

// TestStreamIOErrorMidPass makes one read fail in the middle of a pass:
// that Acquire returns the error (naming the file and tensor), and the
// next pass reads everything right, in both modes and with pinned groups
// or none.
func TestStreamIOErrorMidPass(t *testing.T) {
	f, groups := streamFixture(t)
	plan, err := PlanStream(f, groups, StreamOptions{})
	if err == nil || plan.Min == 0 {
		t.Fatalf("plan at budget 0: %v", err)
	}
	eio := errors.New("input/output error")
	for _, mode := range []StreamMode{StreamStd, StreamPipelined} {
		for _, budget := range []uint64{plan.Min, plan.Total / 2} {
			t.Run(fmt.Sprintf("%s/%d", mode, budget), func(t *testing.T) {
				// Fail the first read inside blk.4 unless it is pinned.
				t4, _ := f.Tensor("blk.4.ffn_up.weight")
				var fail atomic.Bool
				fail.Store(true)
				defer func(old func(*os.File, []byte, int64) (int, error)) { readFile = old }(readFile)
				readFile = func(fh *os.File, p []byte, off int64) (int, error) {
					if uint64(off) >= t4.Offset && uint64(off) < t4.Offset+t4.Size && fail.CompareAndSwap(true, false) {
						return 0, eio
					}
					return fh.ReadAt(p, off)
				}
				s, err := NewStreamer(f, groups, StreamOptions{Budget: budget, Mode: mode, ChunkBytes: 8 << 10})
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				err = pass(t, s, f, groups)
				if s.Plan().Pinned[4] {
					if err != nil {
						t.Fatalf("blk.4 pinned, yet the pass failed: %v", err)
					}
					return
				}
				if !errors.Is(err, eio) || !strings.Contains(err.Error(), f.Path) || !strings.Contains(err.Error(), "blk.4.ffn_up.weight") {
					t.Fatalf("pass with a failing read: err %v, want the IO error naming the file and tensor", err)
				}
				// The streamer stays usable: the next passes read it all.
				for i := 0; i < 2; i++ {
					if err := pass(t, s, f, groups); err != nil {
						t.Fatalf("pass %d after the error: %v", i, err)
					}
				}
				if st := s.Stats(); st.Peak > budget {
					t.Errorf("peak resident %d > budget %d", st.Peak, budget)
				}
			})
		}
	}
}

// TestStreamUnreadableFile removes the model between opening and
// streaming, and truncates it: both are errors that say what happened.
func TestStreamUnreadableFile(t *testing.T) {
	f, groups := streamFixture(t)
	plan, _ := PlanStream(f, groups, StreamOptions{})
	if err := os.Remove(f.Path); err != nil {
		t.Fatal(err)
	}
	_, err := NewStreamer(f, groups, StreamOptions{Budget: plan.Min})
	if err == nil || !strings.Contains(err.Error(), f.Path) {
		t.Fatalf("removed file: err %v, want one naming %s", err, f.Path)
	}

	g, groups := streamFixture(t)
	if err := os.Truncate(g.Path, g.Size-1); err != nil {
		t.Fatal(err)
	}
	_, err = NewStreamer(g, groups, StreamOptions{Budget: plan.Min})
	if err == nil || !strings.Contains(err.Error(), "changed") {
		t.Fatalf("truncated file: err %v, want one saying it changed", err)
	}
}

// TestPlanStreamSpreadsPins checks pinned layers are spread through the
// pass rather than bunched at its start, and the budget is never exceeded.
func TestPlanStreamSpreadsPins(t *testing.T) {
	f, groups := streamFixture(t)
	probe, _ := PlanStream(f, groups, StreamOptions{})
	for k := 1; k <= 5; k++ {
		budget := 2*probe.Min + uint64(k)*probe.Min
		p, err := PlanStream(f, groups, StreamOptions{Budget: budget, Mode: StreamPipelined})
		if err != nil {
			t.Fatal(err)
		}
		if p.PinBytes+p.Window > budget {
			t.Errorf("budget %d: pinned %d + window %d", budget, p.PinBytes, p.Window)
		}
		var pinned []int
		for i, on := range p.Pinned[:len(groups)-2] { // the layers
			if on {
				pinned = append(pinned, i)
			}
		}
		if len(pinned) == 0 {
			t.Fatalf("budget for %d more groups pinned no layer", k)
		}
		// No two pinned layers adjacent while unpinned ones remain
		// elsewhere, unless more than half are pinned.
		if len(pinned) <= 3 {
			for i := 1; i < len(pinned); i++ {
				if pinned[i] == pinned[i-1]+1 {
					t.Errorf("budget %d pins layers %v: bunched", budget, pinned)
				}
			}
		}
		t.Logf("budget %d: layers %v pinned", budget, pinned)
	}
}

// TestStreamReadsRuns: tensors of a group that lie back to back in the
// file are read together (one read per run when the chunk holds it), and
// a read failing inside a run names every tensor it spans, not only the
// run's first.
func TestStreamReadsRuns(t *testing.T) {
	f, groups := streamFixture(t)
	plan, _ := PlanStream(f, groups, StreamOptions{})
	// The reads one pass needs: a run of adjacent tensors per streamed group.
	var runs int
	var inner *Tensor // a tensor that is not first in its run
	streamed := func(s *Streamer, g int) bool { return !s.Plan().Pinned[g] && !groups[g].Rows }
	countRuns := func(s *Streamer) {
		runs, inner = 0, nil
		for g, grp := range groups {
			if !streamed(s, g) {
				continue
			}
			var end uint64
			for i, name := range grp.Tensors {
				tn, _ := f.Tensor(name)
				if i == 0 || tn.Offset != end {
					runs++
				} else if inner == nil {
					inner = tn
				}
				end = tn.Offset + tn.Size
			}
		}
	}
	var reads atomic.Int64
	var failAt atomic.Uint64 // an offset whose read fails once (0: none)
	eio := errors.New("input/output error")
	defer func(old func(*os.File, []byte, int64) (int, error)) { readFile = old }(readFile)
	readFile = func(fh *os.File, p []byte, off int64) (int, error) {
		reads.Add(1)
		if at := failAt.Load(); at != 0 && uint64(off) <= at && at < uint64(off)+uint64(len(p)) && failAt.CompareAndSwap(at, 0) {
			return 0, eio
		}
		return fh.ReadAt(p, off)
	}
	s, err := NewStreamer(f, groups, StreamOptions{Budget: plan.Min, Mode: StreamStd, ChunkBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	countRuns(s)
	if inner == nil {
		t.Fatal("the fixture has no two adjacent tensors in a streamed group: the test checks nothing")
	}
	if err := pass(t, s, f, groups); err != nil { // warm-up reads the pinned groups too
		t.Fatal(err)
	}
	reads.Store(0)
	if err := pass(t, s, f, groups); err != nil {
		t.Fatal(err)
	}
	if got := reads.Load(); got != int64(runs) {
		t.Errorf("a pass made %d reads, want %d (one per run of adjacent tensors)", got, runs)
	}
	// The chunk covers the whole run, so the failing read starts before
	// inner: the error must name inner too.
	failAt.Store(inner.Offset + inner.Size/2)
	err = pass(t, s, f, groups)
	if !errors.Is(err, eio) || !strings.Contains(err.Error(), inner.Name) {
		t.Fatalf("read failing inside %s: %v", inner.Name, err)
	}
}

// TestStreamAheadIsNotConsumed: whenever the counters are read, a
// pipelined streamer's BytesRead less what it has read ahead is exactly
// the streamed bytes of the passes compute finished, though the reader
// keeps loading the next pass's groups meanwhile.
func TestStreamAheadIsNotConsumed(t *testing.T) {
	f, groups := streamFixture(t)
	plan, err := PlanStream(f, groups, StreamOptions{Mode: StreamPipelined})
	if err == nil {
		t.Fatal("plan at budget 0 succeeded")
	}
	s, err := NewStreamer(f, groups, StreamOptions{Budget: plan.Total / 2, Mode: StreamPipelined, ChunkBytes: 8 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	perPass := s.Plan().Streamed(groups, f)
	if perPass == 0 {
		t.Fatal("setup: nothing streams at half the model")
	}
	sawAhead := false
	for passes := uint64(0); passes < 3; passes++ {
		// Sample while the reader fills the window for the next pass,
		// until it has read something ahead (the reader goroutine may not
		// have run yet on a busy machine).
		for i := 0; i < 200 || !sawAhead; i++ {
			st := s.Stats()
			if got := st.BytesRead - st.Ahead; got != passes*perPass {
				t.Fatalf("after %d passes: read %d, %d of it ahead: consumed %d, want %d", passes, st.BytesRead, st.Ahead, got, passes*perPass)
			}
			sawAhead = sawAhead || st.Ahead > 0
			if i >= 200 {
				if i > 20000 {
					t.Fatal("the reader never read ahead of compute")
				}
				time.Sleep(time.Millisecond)
			}
		}
		if err := pass(t, s, f, groups); err != nil {
			t.Fatal(err)
		}
	}
}
