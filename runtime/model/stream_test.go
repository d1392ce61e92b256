package model

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tandem-llm/tandem/internal/testutil"
	"github.com/tandem-llm/tandem/weights"
)

// loadStreamed opens path and loads it streaming under opt.
func loadStreamed(t testing.TB, path string, opt weights.StreamOptions) (*Model, *weights.File) {
	t.Helper()
	return loadPath(t, path, Options{Threads: 2, Stream: &opt})
}

// loadPath opens path and loads it; both are closed when the test ends.
// streamPositions bounds the streamed decodes: every position streams
// the whole model again (with mmap, faulting it in page by page), and
// what is computed does not depend on where the bytes came from, which
// the first 64 tokens show as well as 200.
const streamPositions = 64

// privateCopy copies a model file into the test's temporary directory.
func privateCopy(t *testing.T, src string) string {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), filepath.Base(src))
	f, err := os.Create(dst)
	if err != nil {
		t.Fatal(err)
	}
	// Synced, so its pages are clean and the page cache may drop them.
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return dst
}

func loadPath(t testing.TB, path string, opt Options) (*Model, *weights.File) {
	t.Helper()
	f, err := weights.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	m, err := Load(f, opt)
	if err != nil {
		f.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		m.Close()
		f.Close()
	})
	return m, f
}

// residentStreamed counts the pages of streamed (not pinned) groups that
// are in memory, through a fresh mapping of the file: mincore on it
// reports the page cache, which the streamer must have dropped.
func residentStreamed(t *testing.T, path string, m *Model) (resident, total int) {
	t.Helper()
	plan, groups, err := PlanStream(m.File(), weights.StreamOptions{Budget: m.stream.Plan().Budget, Mode: m.stream.Stats().Mode})
	if err != nil {
		t.Fatal(err)
	}
	g, err := weights.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	for i, grp := range groups {
		if plan.Pinned[i] {
			continue
		}
		for _, name := range grp.Tensors {
			tn, _ := g.Tensor(name)
			r, n, err := weights.ResidentPages(tn.Data)
			if err != nil {
				t.Skipf("mincore: %v", err)
			}
			if os.Getenv("DEBUG_PAGES") != "" {
				t.Logf("%s: %d/%d", name, r, n)
			}
			resident += r
			total += n
		}
	}
	return resident, total
}

// pageCacheDrops reports whether this platform really drops a file's
// pages from the page cache when asked. qemu-user (the arm64 tests)
// accepts posix_fadvise and does nothing, so there the page-cache half of
// the budget check cannot be observed; the amd64 run checks it.
func pageCacheDrops(t *testing.T, path string) bool {
	t.Helper()
	if _, err := os.ReadFile(path); err != nil {
		t.Fatal(err)
	}
	if err := weights.DropPageCache(path); err != nil {
		t.Logf("page cache check off: %v", err)
		return false
	}
	g, err := weights.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	var res, tot int
	for _, tn := range g.Tensors {
		r, n, err := weights.ResidentPages(tn.Data)
		if err != nil {
			t.Logf("page cache check off: %v", err)
			return false
		}
		res, tot = res+r, tot+n
	}
	// Parsing the fresh mapping touched the header, which may share a page
	// with the first tensor; a platform that ignores the advice keeps all.
	if res > tot/2 {
		t.Logf("page cache check off: %d pages stay cached after POSIX_FADV_DONTNEED (qemu-user ignores it)", res)
		return false
	}
	return true
}

// TestStreamedTokensMatchResident decodes the reference prompts with the
// weights streamed in every mode and method at the smallest budget, half
// the model and the whole model, and holds the tokens to the resident
// model's, the resident bytes to the budget at all times, and the page
// cache to empty for what was streamed.
func TestStreamedTokensMatchResident(t *testing.T) {
	for _, tc := range []struct{ model, refs string }{
		{"stories260K.gguf", "stories260K.greedy.jsonl"}, // tied head
		{"llama2xs_model.bin", "llama2xs.greedy.jsonl"},  // untied: embedding rows read
	} {
		t.Run(tc.model, func(t *testing.T) {
			// A private copy: other test processes map the shared file
			// (go test runs packages in parallel), and pages another
			// process maps cannot leave the page cache.
			path := privateCopy(t, testutil.Model(t, tc.model))
			// Streaming changes where the bytes come from, not what is
			// computed (the parity tests cover every record): two records
			// per configuration, streaming 64 passes each, are enough, and
			// keep the 24 configurations inside CI's time.
			recs := readRecords(t, tc.refs)[:2]
			if testing.Short() {
				recs = recs[:1]
			}
			// The resident reference maps every page; it is closed before
			// the page cache is checked.
			rf, err := weights.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			ref, err := Load(rf, Options{Threads: 2})
			if err != nil {
				t.Fatal(err)
			}
			refCache, err := ref.NewCache(streamPositions, weights.F32)
			if err != nil {
				t.Fatal(err)
			}
			want := make([][]int32, len(recs))
			for i, r := range recs {
				want[i], _ = greedy(t, ref, refCache, r.PromptIDs)
			}
			plan, _, err := PlanStream(rf, weights.StreamOptions{})
			if err != nil && !errors.Is(err, weights.ErrBudget) {
				t.Fatal(err)
			}
			ref.Close()
			rf.Close()
			cacheDrops := pageCacheDrops(t, path)
			for _, mode := range []weights.StreamMode{weights.StreamStd, weights.StreamPipelined} {
				for _, method := range []weights.IOMethod{weights.IOPread, weights.IOMmap} {
					for _, budget := range []uint64{plan.Min, plan.Total / 2, plan.Total} {
						name := fmt.Sprintf("%s/%s/%d", mode, method, budget)
						t.Run(name, func(t *testing.T) {
							opt := weights.StreamOptions{Budget: budget, Mode: mode, Method: method, ChunkBytes: 64 << 10}
							m, _ := loadStreamed(t, path, opt)
							cache, err := m.NewCache(streamPositions, weights.F32)
							if err != nil {
								t.Fatal(err)
							}
							for i, r := range recs {
								got, _ := greedy(t, m, cache, r.PromptIDs)
								if fmt.Sprint(got) != fmt.Sprint(want[i]) {
									t.Fatalf("record %d: streamed tokens differ\n got %v\nwant %v", i, got, want[i])
								}
							}
							st, _ := m.StreamStats()
							if st.Peak > budget {
								t.Errorf("peak resident %d > budget %d", st.Peak, budget)
							}
							if st.Resident > budget {
								t.Errorf("resident %d > budget %d", st.Resident, budget)
							}
							streamed := m.stream.Plan().Streamed(streamGroups(m.cfg), m.File())
							if budget >= plan.Total {
								if st.BytesRead != 0 || streamed != 0 {
									t.Errorf("everything pinned, yet %d bytes read after warm-up (%d streamed per pass)", st.BytesRead, streamed)
								}
							} else if st.Passes > 0 && st.BytesRead < uint64(st.Passes)*streamed {
								t.Errorf("%d passes read %d bytes, want at least %d per pass", st.Passes, st.BytesRead, streamed)
							}
							if budget < plan.Total && cacheDrops {
								// Let the reader finish its read-ahead, then
								// only the window's bytes may be in memory.
								time.Sleep(20 * time.Millisecond)
								res, tot := residentStreamed(t, path, m)
								limit := int(m.stream.Plan().Window/4096) + 2*len(m.File().Tensors)
								if res > limit {
									t.Errorf("%d of %d streamed pages still in the page cache (window allows %d)", res, tot, limit)
								}
							}
						})
					}
				}
			}
		})
	}
}

func TestStreamBudgetTooSmall(t *testing.T) {
	path := testutil.Model(t, "stories260K.gguf")
	f, err := weights.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	plan, _, err := PlanStream(f, weights.StreamOptions{Budget: 1})
	if !errors.Is(err, weights.ErrBudget) {
		t.Fatalf("budget 1: err %v, want ErrBudget", err)
	}
	if !strings.Contains(err.Error(), "needs at least") || plan.Min == 0 {
		t.Errorf("error %q does not say the minimum (%d)", err, plan.Min)
	}
	_, err = Load(f, Options{Stream: &weights.StreamOptions{Budget: plan.Min - 1}})
	if !errors.Is(err, weights.ErrBudget) {
		t.Fatalf("Load at min-1: err %v, want ErrBudget", err)
	}
}

// TestStreamSurvivesTruncation truncates the model under a streaming
// model: Forward fails with an error naming the change (no SIGBUS), and
// once the file is whole again the same model decodes the same tokens.
func TestStreamSurvivesTruncation(t *testing.T) {
	for _, method := range []weights.IOMethod{weights.IOPread, weights.IOMmap} {
		t.Run(method.String(), func(t *testing.T) {
			checkSurvivesTruncation(t, func(f *weights.File) (*Model, error) {
				return Load(f, Options{Threads: 1, Stream: &weights.StreamOptions{Budget: streamPlan(t, f).Min, Mode: weights.StreamPipelined, Method: method}})
			})
		})
	}
}

// checkSurvivesTruncation loads a copy of stories260K.gguf with load,
// truncates the copy to half before a Forward, which must fail naming
// the change and leave no tentative rows, then restores it and checks the
// same model decodes the reference tokens.
func checkSurvivesTruncation(t *testing.T, load func(*weights.File) (*Model, error)) {
	path, data := testutil.ModelCopy(t, "stories260K.gguf")
	rec := readRecords(t, "stories260K.greedy.jsonl")[0]
	f, err := weights.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := load(f)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	cache := newCache(t, m, 200)
	seq := newSeq(t, cache)
	b := Batch{Tokens: rec.PromptIDs[:1], Pos: []int32{0}, Seq: []int{seq}, Parent: []int{-1}}
	var out Logits
	if err := os.Truncate(path, int64(len(data)/2)); err != nil {
		t.Fatal(err)
	}
	err = m.Forward(&b, cache, &out)
	if err == nil || !strings.Contains(err.Error(), "changed") && !strings.Contains(err.Error(), "truncated") {
		t.Fatalf("forward on a truncated file: err %v, want one saying the file changed", err)
	}
	if cache.Tentative(seq) != 0 {
		t.Errorf("the failed Forward left %d tentative rows", cache.Tentative(seq))
	}
	// Whole again (written in place, as a mapping would see it): the
	// streamer recovers.
	fh, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fh.WriteAt(data[len(data)/2:], int64(len(data)/2)); err != nil {
		t.Fatal(err)
	}
	fh.Close()
	cache.Free(seq)
	got, _ := greedy(t, m, cache, rec.PromptIDs)
	want := rec.GeneratedIDs[:min(20, len(rec.GeneratedIDs))]
	if fmt.Sprint(got[:len(want)]) != fmt.Sprint(want) {
		t.Fatalf("after the file was restored: %v, want %v", got[:len(want)], want)
	}
}

// streamPlan is f's plan at budget 0, which fails but says the smallest
// budget and the total.
func streamPlan(t testing.TB, f *weights.File) weights.StreamPlan {
	t.Helper()
	plan, _, err := PlanStream(f, weights.StreamOptions{})
	if err != nil && !errors.Is(err, weights.ErrBudget) {
		t.Fatal(err)
	}
	return plan
}

// TestStreamThrottle checks the emulated bandwidth is a floor on read
// time (sleeping guarantees at least the emulated duration; nothing here
// bounds it from above).
func TestStreamThrottle(t *testing.T) {
	path := testutil.Model(t, "stories260K.gguf")
	f, err := weights.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	plan, _, err := PlanStream(f, weights.StreamOptions{Mode: weights.StreamStd})
	if err != nil && !errors.Is(err, weights.ErrBudget) {
		t.Fatal(err)
	}
	const bw = 50e6
	lat := 100 * time.Microsecond
	m, err := Load(f, Options{Threads: 1, Stream: &weights.StreamOptions{Budget: plan.Min, Mode: weights.StreamStd,
		Throttle: weights.Throttle{Bandwidth: bw, Latency: lat}}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	cache, _ := m.NewCache(16, weights.F32)
	seq, _ := cache.NewSeq()
	b := Batch{Tokens: []int32{1}, Pos: []int32{0}, Seq: []int{seq}, Parent: []int{-1}}
	var out Logits
	if err := m.Forward(&b, cache, &out); err != nil {
		t.Fatal(err)
	}
	st, _ := m.StreamStats()
	floor := time.Duration(float64(st.BytesRead) / bw * float64(time.Second))
	if st.ReadTime < floor {
		t.Errorf("read %d bytes in %v, emulated %g B/s needs at least %v", st.BytesRead, st.ReadTime, bw, floor)
	}
	if st.Stall < st.ReadTime {
		t.Errorf("std mode: stall %v < read time %v; every read should stall compute", st.Stall, st.ReadTime)
	}
}
