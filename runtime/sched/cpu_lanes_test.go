package sched

import (
	"context"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tandem-llm/tandem/internal/testutil"
	"github.com/tandem-llm/tandem/kernels/cpuset"
	"github.com/tandem-llm/tandem/runtime/model"
	"github.com/tandem-llm/tandem/runtime/spec"
	"github.com/tandem-llm/tandem/weights"
)

// TestLoadLanesStreamed: CPU lanes whose weights stream under the smallest
// budget give the resident model's greedy tokens, each lane with its own
// streamer.
func TestLoadLanesStreamed(t *testing.T) {
	f, tok := realModel(t)
	opt := weights.StreamOptions{Mode: weights.StreamPipelined}
	probe, _, err := model.PlanStream(f, opt)
	if probe.Min == 0 {
		t.Fatalf("no minimum budget: %v", err)
	}
	opt.Budget = probe.Min
	lanes, closeLanes, err := LoadLanes(f, LaneOptions{Lanes: CPULaneSpecs(1, 1), MaxSeqs: 2, Context: 256, Stream: &opt})
	if err != nil {
		t.Fatal(err)
	}
	defer closeLanes()
	if len(lanes) != 2 || lanes[0].Name != "cpu0" || lanes[1].Name != "cpu1" {
		t.Fatalf("lanes %+v", lanes)
	}
	s, err := New(Config{}, nil, lanes...)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	const n = 12
	ids := encode(t, tok, testPrompts[1])
	want := reference(t, loadModel(t, f), ids, n)
	st, err := s.Submit(context.Background(), Request{Prompt: ids, MaxTokens: n})
	if err != nil {
		t.Fatal(err)
	}
	var got []int32
	for {
		ev, err := st.Recv(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ev.Tokens...)
		if ev.Done {
			break
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("streamed lanes: %v\nresident: %v", got, want)
	}
}

// TestLoadLanesPipelinedSpec: speculative lanes whose target streams
// (slowed like flash) keep drafting while it waits for weights, each lane
// on its own spec.Lane shared by its decoders, and give the target's
// greedy tokens: for requests sharing the lanes, and for a next turn that
// adopts a conversation's rows. Resident lanes turn the pipeline off.
func TestLoadLanesPipelinedSpec(t *testing.T) {
	f, _ := realModel(t)
	draft, err := weights.Open(testutil.Model(t, "llama2xs_model.bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer draft.Close()
	opt := weights.StreamOptions{Mode: weights.StreamPipelined, Throttle: weights.Throttle{Latency: 2 * time.Millisecond}}
	probe, _, err := model.PlanStream(f, opt)
	if probe.Min == 0 {
		t.Fatalf("no minimum budget: %v", err)
	}
	opt.Budget = probe.Min
	const n = 40
	recs := greedyRecords(t, 2*n)
	for _, stream := range []*weights.StreamOptions{&opt, nil} {
		lanes, closeLanes, err := LoadLanes(f, LaneOptions{Lanes: CPULaneSpecs(1, 1), MaxSeqs: 4, Context: specContext, Stream: stream,
			Draft: draft, Spec: spec.Config{Method: spec.Tree, Pipeline: true}})
		if err != nil {
			t.Fatal(err)
		}
		defer closeLanes()
		s, err := New(Config{}, nil, lanes...)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Shutdown(context.Background())
		var streams []*Stream
		for _, r := range recs[:4] {
			st, err := s.Submit(context.Background(), Request{Prompt: r.PromptIDs, MaxTokens: n})
			if err != nil {
				t.Fatal(err)
			}
			streams = append(streams, st)
		}
		for i, st := range streams {
			if got, _, _ := collect(t, st); !slices.Equal(got, recs[i].GeneratedIDs[:n]) {
				t.Errorf("streamed %v: request %d got %v\nwant %v", stream != nil, i, got, recs[i].GeneratedIDs[:n])
			}
		}
		reused := func() (n int64) {
			for _, l := range lanes {
				n += l.Engine.(*SpecEngine).ReusedTokens()
			}
			return n
		}
		before := reused()
		turn := slices.Concat(recs[0].PromptIDs, recs[0].GeneratedIDs[:n])
		st, err := s.Submit(context.Background(), Request{Prompt: turn, MaxTokens: n})
		if err != nil {
			t.Fatal(err)
		}
		if got, _, _ := collect(t, st); !slices.Equal(got, recs[0].GeneratedIDs[n:2*n]) || reused() == before {
			t.Errorf("streamed %v: next turn got %v with %d tokens reused\nwant %v with the conversation's rows", stream != nil, got, reused()-before, recs[0].GeneratedIDs[n:2*n])
		}
		pipelined := 0
		for _, l := range lanes {
			pipelined += l.Engine.(*SpecEngine).Stats().PipelineSteps
		}
		if stream != nil && pipelined == 0 {
			t.Error("streamed lanes never drafted while their targets waited for weights")
		}
		if stream == nil && pipelined != 0 {
			t.Errorf("resident lanes drafted %d steps during IO they never wait on", pipelined)
		}
	}
}

func TestLoadLanesErrors(t *testing.T) {
	f, _ := realModel(t)
	for _, tc := range []struct {
		name string
		opt  LaneOptions
		want string
	}{
		{"no lanes", LaneOptions{}, "no lanes"},
		{"budget below the minimum", LaneOptions{Lanes: CPULaneSpecs(1), Stream: &weights.StreamOptions{Mode: weights.StreamPipelined, Budget: 1}}, "lane cpu0"},
		{"bad kv type", LaneOptions{Lanes: CPULaneSpecs(1), KVType: weights.Q4_0}, "engine cpu0"},
		{"negative threads", LaneOptions{Lanes: CPULaneSpecs(1, -1)}, "lane cpu1"},
		{"absurd threads", LaneOptions{Lanes: CPULaneSpecs(MaxLaneThreads + 1)}, "at most 256"},
		{"unknown device", LaneOptions{Lanes: []LaneSpec{{Device: "tpu"}}}, "unknown device"},
		{"pinned GPU lane", LaneOptions{Lanes: []LaneSpec{{Device: "cuda", CPUs: cpuset.Set{0}}}}, "not pinned"},
		{"more threads than CPUs", LaneOptions{Lanes: []LaneSpec{{Threads: 2, CPUs: cpuset.Set{0}}}}, "take turns"},
		{"one thread per CPU past the bound", LaneOptions{Lanes: []LaneSpec{{CPUs: cpuRange(300)}}}, "300 threads, one per CPU of 0-299; a lane takes at most 256"},
		{"written threads past the bound", LaneOptions{Lanes: []LaneSpec{{Threads: 300, CPUs: cpuRange(400)}}}, "300 threads; a lane takes at most 256"},
		{"a CPU the process may not use", LaneOptions{Lanes: []LaneSpec{{Threads: 1, CPUs: cpuset.Set{cpuset.MaxCPU}}}}, "may use only"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lanes, closeLanes, err := LoadLanes(f, tc.opt)
			if err == nil {
				closeLanes()
				t.Fatalf("accepted: %d lanes", len(lanes))
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
		})
	}
}

// cpuRange is the set of CPUs 0 to n-1.
func cpuRange(n int) cpuset.Set {
	s := make(cpuset.Set, n)
	for i := range s {
		s[i] = i
	}
	return s
}

// TestLoadLanesWithoutCUDA: in a binary built without -tags cuda, a GPU
// lane, first or after a CPU lane, fails to load with the model's own
// error saying to rebuild, under the lane's name (cuda_lanes_test.go runs
// GPU lanes in a cuda build).
func TestLoadLanesWithoutCUDA(t *testing.T) {
	f, _ := realModel(t)
	m, merr := model.Load(f, model.Options{Threads: 1, Device: "cuda"})
	if merr == nil {
		m.Close()
		t.Skip("this binary computes on a GPU")
	}
	if !strings.Contains(merr.Error(), "-tags cuda") {
		t.Skipf("the model's GPU error is not the missing build tag: %v", merr)
	}
	for _, tc := range []struct {
		lanes []LaneSpec
		name  string
	}{
		{[]LaneSpec{{Device: "cuda"}, {Threads: 1}}, "lane cuda0"},
		{[]LaneSpec{{Threads: 1}, {Device: "cuda:0"}}, "lane cuda1"},
	} {
		lanes, closeLanes, err := LoadLanes(f, LaneOptions{Lanes: tc.lanes, MaxSeqs: 1})
		if err == nil {
			closeLanes()
			t.Fatalf("%v: loaded %d lanes", tc.lanes, len(lanes))
		}
		if !strings.Contains(err.Error(), tc.name) || !strings.Contains(err.Error(), merr.Error()) {
			t.Errorf("%v: error %q, want %q with the model's %q", tc.lanes, err, tc.name, merr)
		}
	}
}

func TestLaneSpec(t *testing.T) {
	for _, tc := range []struct {
		l    LaneSpec
		gpu  bool
		text string
	}{
		{LaneSpec{Threads: 4}, false, "4"},
		{LaneSpec{Device: "cpu", Threads: 2}, false, "2"},
		{LaneSpec{Device: "cuda"}, true, "cuda"},
		{LaneSpec{Device: "cuda:1"}, true, "cuda:1"},
	} {
		if tc.l.GPU() != tc.gpu || tc.l.String() != tc.text {
			t.Errorf("%#v: GPU %v, String %q; want %v, %q", tc.l, tc.l.GPU(), tc.l.String(), tc.gpu, tc.text)
		}
	}
}

// TestPinnedLanes: lanes pinned to CPUs (a phone's big and little cores)
// compute there, kernel threads and lane goroutine alike, give the
// model's greedy tokens, and report their CPUs.
func TestPinnedLanes(t *testing.T) {
	f, tok := realModel(t)
	m := loadModel(t, f)
	baseG := runtime.NumGoroutine()
	allowed, err := cpuset.Allowed()
	if err != nil {
		t.Fatal(err)
	}
	// The first lane takes a thread per CPU of its set (one); the second
	// has worker threads besides its goroutine where there are CPUs.
	sets := []cpuset.Set{{allowed[0]}, allowed}
	threads := []int{1, len(allowed)}
	lanes, closeLanes, err := LoadLanes(f, LaneOptions{Lanes: []LaneSpec{{CPUs: sets[0]}, {Threads: threads[1], CPUs: sets[1]}}, MaxSeqs: 4, Context: 256})
	if err != nil {
		t.Fatal(err)
	}
	recs := make([]*whereEngine, len(lanes))
	for i := range lanes {
		if got := lanes[i].Engine.Info(); got.Threads != threads[i] || !slices.Equal(got.CPUs, sets[i]) {
			t.Fatalf("lane %d: %d threads on %v, want %d on %v", i, got.Threads, got.CPUs, threads[i], sets[i])
		}
		recs[i] = &whereEngine{Engine: lanes[i].Engine, ran: map[string]int{}}
		lanes[i].Engine = recs[i]
	}
	s, err := New(Config{}, nil, lanes...)
	if err != nil {
		closeLanes()
		t.Fatal(err)
	}
	// New returns once each lane goroutine has pinned itself.
	for i, l := range s.Stats().Lanes {
		if !slices.Equal(l.CPUs, sets[i]) {
			t.Errorf("lane %d right after New: CPUs %v, want %v", i, l.CPUs, sets[i])
		}
	}
	const n = 12
	var wg sync.WaitGroup
	for i := range 6 {
		ids := encode(t, tok, testPrompts[i%len(testPrompts)])
		want := reference(t, m, ids, n)
		st, err := s.Submit(context.Background(), Request{Prompt: ids, MaxTokens: n})
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			got, _, res := collect(t, st)
			if !slices.Equal(got, want) {
				t.Errorf("request %d on lane %d: %v, want %v", i, res.Lane, got, want)
			}
		})
	}
	wg.Wait()
	for i, r := range recs {
		r.mu.Lock()
		if want := sets[i].String(); len(r.ran) > 1 || len(r.ran) == 1 && r.ran[want] == 0 {
			t.Errorf("lane %d pinned to %s stepped on %v", i, want, r.ran)
		}
		r.mu.Unlock()
		if got := s.Stats().Lanes[i].CPUs; !slices.Equal(got, sets[i]) {
			t.Errorf("lane %d stats: CPUs %v, want %v", i, got, sets[i])
		}
	}
	if recs[0].ran[sets[0].String()] == 0 {
		t.Error("the primary lane never stepped")
	}
	// The pinned goroutines end with the scheduler and the lanes.
	if err := s.Shutdown(context.Background()); err != nil {
		t.Error(err)
	}
	if err := closeLanes(); err != nil {
		t.Error(err)
	}
	for start := time.Now(); runtime.NumGoroutine() > baseG; time.Sleep(time.Millisecond) {
		if time.Since(start) > 30*time.Second { // turns a leak into a failure; it times nothing
			t.Fatalf("goroutines: %d before the lanes, %d after they closed", baseG, runtime.NumGoroutine())
		}
	}
}

// whereEngine counts the CPU sets its Steps ran on.
type whereEngine struct {
	Engine
	mu  sync.Mutex
	ran map[string]int
}

func (e *whereEngine) Step(ctx context.Context, members []Member, out []StepOut) error {
	where := ""
	if cpus, err := cpuset.Current(); err != nil {
		where = err.Error()
	} else {
		where = cpus.String()
	}
	e.mu.Lock()
	e.ran[where]++
	e.mu.Unlock()
	return e.Engine.Step(ctx, members, out)
}
