//go:build cuda && unix

package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/tandem-llm/tandem/internal/testutil"
)

// TestServeGPULanes is `tandem serve --lanes cuda,1` end to end, as a
// Jetson robot runs it: a GPU lane and a CPU lane behind the HTTP API.
// Concurrent greedy completions get the reference text whichever lane
// serves them, a streamed completion arrives as server-sent events whose
// pieces add up to the same text, /metrics counts the GPU lane's tokens
// and the lanes' tokens add up to the total, and SIGTERM stops it
// cleanly. Without a GPU this binary has no tests to run
// (kernels/cuda/internal/cuinit).
func TestServeGPULanes(t *testing.T) {
	const n, copies = 40, 4
	prompts, want := greedyAnswers(t, 3, n)
	addr, log, done, _ := startServe(t, "--model", testutil.Model(t, "stories260K.gguf"), "--lanes", "cuda,1", "--ctx", "256")
	if ready := log[len(log)-1]; !strings.Contains(ready, "2 lane(s)") {
		t.Errorf("ready line %q", ready)
	}
	checkCompletions(t, addr, prompts, want, n, copies)

	body := fmt.Sprintf(`{"model":"stories260K","prompt":%q,"max_tokens":%d,"temperature":0,"stream":true}`, prompts[0], n)
	resp, err := http.Post(addr+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	events := 0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var ev struct{ Choices []struct{ Text string } }
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatalf("event %q: %v", data, err)
		}
		for _, ch := range ev.Choices {
			text.WriteString(ch.Text)
		}
		events++
	}
	resp.Body.Close()
	if text.String() != want[0] || events < 2 {
		t.Errorf("streamed %d events, text %q; want several adding up to %q", events, text.String(), want[0])
	}

	resp, err = http.Get(addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	values := map[string]float64{}
	for _, line := range strings.Split(string(metrics), "\n") {
		var name string
		var v float64
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if _, err := fmt.Sscanf(strings.Replace(line, " ", "\t", 1), "%s\t%g", &name, &v); err == nil {
			values[name] = v
		}
	}
	gpu, cpu, total := values[`tandem_lane_tokens_generated_total{lane="cuda0"}`], values[`tandem_lane_tokens_generated_total{lane="cpu1"}`], values["tandem_tokens_generated_total"]
	if served := float64((copies*len(prompts) + 1) * n); gpu <= 0 || gpu+cpu != total || total != served {
		t.Errorf("tokens: cuda0 %g + cpu1 %g, total %g; want the GPU lane's above 0 and the lanes' adding up to the total, %g", gpu, cpu, total, served)
	}
	stopServe(t, addr, done)
}
