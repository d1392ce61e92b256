package model

import (
	"slices"
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

// attendJob's tasks cover every slot's every head once, in runs of one
// sequence's slots and groups of one KV head's heads, and share a
// prefix's rows as widely as the workers allow: runs of a sequence's
// slots cut (with a remainder) when there are few, never across
// sequences, and bounded by maxTreeScores.
func TestAttendTasksCoverEverySlotOnce(t *testing.T) {
	cases := []struct {
		name             string
		seqs             []int // each slot's sequence
		heads, kvHeads   int
		workers, maxLen  int
		longestRun       int // the longest run a task may take
		wantShareAtLeast int // some task takes this many slots
	}{
		{"decode batch", []int{0, 1, 2, 3}, 8, 4, 2, 40, 1, 1},
		{"one tree, two workers", slices.Repeat([]int{5}, 16), 8, 4, 2, 40, 16, 16},
		{"one tree, eight workers", slices.Repeat([]int{5}, 16), 8, 4, 8, 40, 4, 4},
		{"a remainder", slices.Repeat([]int{5}, 7), 8, 2, 2, 40, 4, 4},
		{"trees and decodes", []int{1, 1, 1, 2, 3, 3, 3, 3, 3, 1}, 4, 2, 2, 40, 5, 5},
		{"a long prefill", slices.Repeat([]int{0}, 300), 8, 4, 2, 4096, maxTreeScores / (2 * 4096), 64},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := &Model{cfg: Config{Heads: c.heads, KVHeads: c.kvHeads}}
			b := &Batch{Seq: c.seqs}
			j := &attendJob{m: m, b: b, n: len(c.seqs), maxLen: c.maxLen}
			chunks := j.Units(c.workers)
			if chunks <= 0 || chunks > len(j.tasks) || len(m.buf.scores) < chunks*j.span {
				t.Fatalf("%d chunks of %d tasks, scores %d for spans of %d", chunks, len(j.tasks), len(m.buf.scores), j.span)
			}
			seen := make([]int, len(c.seqs)*c.heads)
			most := 0
			for _, task := range j.tasks {
				n := task.i1 - task.i0
				most = max(most, n)
				if n > c.longestRun || n*j.heads*c.maxLen > j.span {
					t.Errorf("task %+v: %d slots, more than %d or than its scores hold", task, n, c.longestRun)
				}
				if (task.h0+j.heads-1)/(c.heads/c.kvHeads) != task.h0/(c.heads/c.kvHeads) {
					t.Errorf("task %+v: heads of two KV heads", task)
				}
				for i := task.i0; i < task.i1; i++ {
					if c.seqs[i] != c.seqs[task.i0] {
						t.Errorf("task %+v: slots of sequences %d and %d", task, c.seqs[task.i0], c.seqs[i])
					}
					for h := task.h0; h < task.h0+j.heads; h++ {
						seen[i*c.heads+h]++
					}
				}
			}
			for k, n := range seen {
				if n != 1 {
					t.Fatalf("slot %d head %d in %d tasks", k/c.heads, k%c.heads, n)
				}
			}
			if most < c.wantShareAtLeast {
				t.Errorf("runs of at most %d slots, want %d sharing their prefix", most, c.wantShareAtLeast)
			}
		})
	}
}
