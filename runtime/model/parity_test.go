package model

import (
	"math"
	"testing"

	"github.com/tandem-llm/tandem/internal/testutil"
	"github.com/tandem-llm/tandem/kernels"
	"github.com/tandem-llm/tandem/runtime/kv"
	"github.com/tandem-llm/tandem/weights"
)

// record is one line of ../shared/testdata/*.greedy.jsonl.
type record = testutil.Greedy

func readRecords(t testing.TB, name string) []record {
	return testutil.GreedyRecords(t, name)
}

// load opens a shared model; both are closed when the test ends.
func load(t testing.TB, name string) *Model {
	t.Helper()
	f, err := weights.Open(testutil.Model(t, name))
	if err != nil {
		t.Fatal(err)
	}
	m, err := Load(f, Options{Threads: 2})
	if err != nil {
		f.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		m.Close()
		f.Close()
	})
	return m
}

// backends lists the kernel backends this build has: "go" always, "c"
// when cgo is on. Each subtest runs with the backend set and restores it.
func backends(t *testing.T, fn func(t *testing.T)) {
	prev := kernels.Backend()
	defer kernels.SetBackend(prev)
	for _, be := range []string{"c", "go"} {
		t.Run(be, func(t *testing.T) {
			if err := kernels.SetBackend(be); err != nil {
				if be == "go" {
					t.Fatal(err)
				}
				t.Skipf("backend %s unavailable: %v", be, err)
			}
			fn(t)
		})
	}
}

func argmax(x []float32) int32 {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return int32(best)
}

// greedy prefills prompt as one chain, then decodes one token per Forward
// until BOS or the reference run's 200 positions, as llama2.c's run does.
// It returns the generated ids and a copy of the first-step logits.
func greedy(t testing.TB, m *Model, cache *kv.Cache, prompt []int32) ([]int32, []float32) {
	t.Helper()
	var first []float32
	ids := greedyLogits(t, m, cache, prompt, func(logits []float32) {
		if first == nil {
			first = append([]float32(nil), logits...)
		}
	})
	return ids, first
}

// greedyLogits is greedy with a callback seeing the logits of every step
// (step 0 is the prompt's last position).
func greedyLogits(t testing.TB, m *Model, cache *kv.Cache, prompt []int32, step func(logits []float32)) []int32 {
	t.Helper()
	seq, err := cache.NewSeq()
	if err != nil {
		t.Fatal(err)
	}
	defer cache.Free(seq)
	var b Batch
	var out Logits
	b.Chain(prompt, 0, seq, -1, true)
	if err := m.Forward(&b, cache, &out); err != nil {
		t.Fatal(err)
	}
	cache.CommitAll(seq)
	logits := out.Row(len(prompt) - 1)
	var ids []int32
	// The references cover 200 positions; a smaller cache stops sooner.
	for steps := min(201, cache.Config().Context+1) - len(prompt); len(ids) < steps; {
		step(logits)
		id := argmax(logits)
		ids = append(ids, id)
		if id == 1 || len(ids) == steps {
			break
		}
		b.Reset()
		b.Add(id, int32(cache.Len(seq)), seq, -1, true)
		if err := m.Forward(&b, cache, &out); err != nil {
			t.Fatalf("decode step %d: %v", len(ids), err)
		}
		cache.CommitAll(seq)
		logits = out.Row(0)
	}
	return ids
}

// TestParity reproduces the reference greedy runs token for token, and
// their first-step logits within 1e-4 + 1e-5·|reference| (numpy's
// allclose rule), on both kernel backends. The relative term covers
// summation order: NEON's four-lane FMA accumulates a 512-term dot product
// in a different order than the reference did, and on arm64 llama2xs lands
// 1.0e-4 from a logit of -12.76 (8e-6 relative); amd64 stays within 5.5e-5.
//
// With an F16 cache, K and V are rounded to half precision (relative
// error 2^-11) before attention. The first-step logits are then held to
// 0.5 absolute (measured worst: 0.0096 on stories260K, 0.23 on llama2xs,
// whose sharper attention amplifies the rounding), and the tokens to the
// reference for the first 20 of each record: later, a rounding can flip a
// near tie (llama2xs record 3 departs at token 43), after which the
// streams legitimately differ.
//
// The race detector slows the pure-Go kernels about fifteenfold, and
// qemu (the arm64 run, in -short mode) both backends: there two records
// and their first 48 tokens are checked. The CGO_ENABLED=0 run checks
// the Go kernels on every record in full, the race run the C kernels.
func TestParity(t *testing.T) {
	for _, tc := range []struct {
		model, refs string
	}{
		{"stories260K.bin", "stories260K.greedy.jsonl"},
		{"stories260K.gguf", "stories260K.greedy.jsonl"},
		{"llama2xs_model.bin", "llama2xs.greedy.jsonl"},
	} {
		t.Run(tc.model, func(t *testing.T) {
			m := load(t, tc.model)
			recs := readRecords(t, tc.refs)
			backends(t, func(t *testing.T) {
				checked, limit := recs, 0
				if testing.Short() || raceEnabled && kernels.Backend() == "go" {
					checked, limit = recs[:2], 48
				}
				for _, ct := range []struct {
					typ     weights.DType
					logitTo float64
					tokens  int // compared tokens per record, 0 = all
				}{
					{weights.F32, 1e-4, 0},
					{weights.F16, 0.5, 20},
				} {
					if limit > 0 && (ct.tokens == 0 || ct.tokens > limit) {
						ct.tokens = limit
					}
					t.Run(ct.typ.String(), func(t *testing.T) {
						checkRecords(t, m, checked, ct.typ, ct.logitTo, ct.tokens)
					})
				}
			})
		})
	}
}

// checkRecords runs every record greedily on m with a cache of type typ
// and holds the first-step logits to logitTo + 1e-5·|reference| and the
// first tokens ids (all when 0) to the reference; it decodes no further
// than it compares.
func checkRecords(t *testing.T, m *Model, recs []record, typ weights.DType, logitTo float64, tokens int) {
	t.Helper()
	ctx := 200
	if tokens > 0 {
		longest := 0
		for _, r := range recs {
			longest = max(longest, len(r.PromptIDs))
		}
		ctx = min(ctx, longest+tokens)
	}
	cache, err := m.NewCache(ctx, typ)
	if err != nil {
		t.Fatal(err)
	}
	var worst float64
	for ri, r := range recs {
		ids, first := greedy(t, m, cache, r.PromptIDs)
		if len(first) != len(r.FirstLogits) {
			t.Fatalf("record %d: %d logits, reference has %d", ri, len(first), len(r.FirstLogits))
		}
		for i := range first {
			d := math.Abs(float64(first[i] - r.FirstLogits[i]))
			worst = max(worst, d)
			if tol := logitTo + 1e-5*math.Abs(float64(r.FirstLogits[i])); !(d <= tol) {
				t.Fatalf("record %d (%q): first logit %d = %v, reference %v (|diff| %.3g > %.3g)", ri, r.Prompt, i, first[i], r.FirstLogits[i], d, tol)
			}
		}
		want := r.GeneratedIDs
		if tokens > 0 {
			want = want[:min(len(want), tokens)]
			ids = ids[:min(len(ids), tokens)]
		}
		if len(ids) != len(want) {
			t.Fatalf("record %d (%q): %d tokens, reference %d\n got %v\nwant %v", ri, r.Prompt, len(ids), len(want), ids, want)
		}
		for i := range want {
			if ids[i] != want[i] {
				t.Fatalf("record %d (%q): token %d is %d, reference %d\n got %v\nwant %v", ri, r.Prompt, i, ids[i], want[i], ids, want)
			}
		}
	}
	t.Logf("%d records, worst first-logit |diff| %.3g", len(recs), worst)
}
