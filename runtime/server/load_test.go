package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tandem-llm/tandem/kernels/cpuset"
	"github.com/tandem-llm/tandem/runtime/sched"
)

// TestLoadManyClients: hundreds of concurrent clients on loopback, half
// streaming, each checked token for token against the greedy reference;
// afterwards no sequence, goroutine or memory is left behind.
func TestLoadManyClients(t *testing.T) {
	clients := 400
	if testing.Short() {
		clients = 120
	}
	// The second lane is pinned to a CPU, as a phone's little-core lane
	// is: its goroutine and kernel threads are locked to pinned threads.
	allowed, err := cpuset.Allowed()
	if err != nil {
		t.Fatal(err)
	}
	pin := map[int]cpuset.Set{1: {allowed[len(allowed)-1]}}
	fx := newFixture(t, fixtureOpts{lanes: 2, cpus: pin, cfg: sched.Config{MaxQueue: 1024, MaxBatch: 8}})
	prompts := []string{"Once upon a time", "Tom had a red ball.", "The sun was hot", "Lily saw a big dog", "One day, a bird"}
	type ref struct {
		text string
		n    int
	}
	refs := map[string]ref{}
	for _, p := range prompts {
		for _, n := range []int{4, 8, 12} {
			text, k := fx.reference(t, p, n)
			refs[fmt.Sprint(p, n)] = ref{text, k}
		}
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients}}
	run := func(i int) error {
		p, n := prompts[i%len(prompts)], []int{4, 8, 12}[i%3]
		stream := i%2 == 0
		body, _ := json.Marshal(map[string]any{"prompt": p, "max_tokens": n, "temperature": 0, "stream": stream,
			"stream_options": map[string]bool{"include_usage": true}, "deadline_ms": 1000 + 10*i, "priority": i%3 - 1})
		if !stream {
			body, _ = json.Marshal(map[string]any{"prompt": p, "max_tokens": n, "temperature": 0, "deadline_ms": 1000 + 10*i})
		}
		resp, err := client.Post(fx.http.URL+"/v1/completions", "application/json", strings.NewReader(string(body)))
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			data, _ := io.ReadAll(resp.Body)
			return fmt.Errorf("status %d: %s", resp.StatusCode, data)
		}
		want := refs[fmt.Sprint(p, n)]
		var text string
		var tokens int
		if stream {
			chunks, done := sse(t, resp.Body)
			if !done {
				return fmt.Errorf("stream without [DONE]")
			}
			text = streamText(chunks)
			if u := chunks[len(chunks)-1].Usage; u != nil {
				tokens = u.CompletionTokens
			}
		} else {
			data, err := io.ReadAll(resp.Body)
			if err != nil {
				return err
			}
			c := parse(t, data)
			text, tokens = c.Choices[0].Text, c.Usage.CompletionTokens
		}
		if text != want.text || tokens != want.n {
			return fmt.Errorf("prompt %q max %d: got %q (%d tokens), want %q (%d tokens)", p, n, text, tokens, want.text, want.n)
		}
		return nil
	}
	// Warm up (connections, buffers), then take the baseline.
	for i := range 10 {
		if err := run(i); err != nil {
			t.Fatal(err)
		}
	}
	client.CloseIdleConnections()
	baseG, baseHeap := settle()

	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	start := time.Now()
	errs := make(chan error, clients)
	var wg sync.WaitGroup
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- run(i)
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatalf("%d clients not done in 120s", clients)
	}
	close(errs)
	failed := 0
	for err := range errs {
		if err != nil {
			if failed < 5 {
				t.Error(err)
			}
			failed++
		}
	}
	if failed > 0 {
		t.Fatalf("%d of %d clients failed", failed, clients)
	}
	st := fx.sc.Stats()
	t.Logf("%d clients in %v: %d tokens, scheduler %v vs engine %v", clients, time.Since(start).Round(time.Millisecond),
		st.Tokens, st.SchedulerWall.Round(time.Microsecond), st.EngineWall.Round(time.Microsecond))
	if st.Completed != uint64(clients+10) || st.Cancelled+st.Failed != 0 {
		t.Errorf("completed %d, cancelled %d, failed %d; want %d completed", st.Completed, st.Cancelled, st.Failed, clients+10)
	}
	waitUntil(t, "sequences freed", func() bool { return fx.live() == 0 })
	client.CloseIdleConnections()
	g, heap := settle()
	if g > baseG+5 {
		t.Errorf("goroutines: %d before, %d after: a leak", baseG, g)
		buf := make([]byte, 1<<16)
		t.Logf("%s", buf[:runtime.Stack(buf, true)])
	}
	if heap > baseHeap+32<<20 {
		t.Errorf("live heap grew from %d to %d bytes", baseHeap, heap)
	}
}

// settle waits for goroutines to wind down and returns their count and
// the live heap after a collection.
func settle() (int, uint64) {
	g := runtime.NumGoroutine()
	for range 100 {
		time.Sleep(20 * time.Millisecond)
		n := runtime.NumGoroutine()
		if n == g {
			break
		}
		g = n
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return g, ms.HeapAlloc
}
