//go:build unix

package main

import (
	"bufio"
	"io"
	"net/http"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tandem-llm/tandem/internal/testutil"
)

// TestServeEndToEnd runs the serve verb on a free port, talks to it, then
// stops it with SIGTERM as a service manager would.
func TestServeEndToEnd(t *testing.T) {
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	var out strings.Builder
	go func() {
		done <- run([]string{"serve", "--addr", "127.0.0.1:0", "--model", testutil.Model(t, "stories260K.gguf"),
			"--lanes", "1,1", "--ctx", "256", "--drain-timeout", "2s"}, &out, pw)
		pw.Close()
	}()
	sc := bufio.NewScanner(pr)
	addr := ""
	var log []string
	for sc.Scan() {
		line := sc.Text()
		log = append(log, line)
		if m := regexp.MustCompile(`listening on (http://\S+),`).FindStringSubmatch(line); m != nil {
			addr = m[1]
		}
		if strings.Contains(line, "ready:") {
			break
		}
	}
	go io.Copy(io.Discard, pr)
	if addr == "" {
		t.Fatalf("serve did not start: %v", log)
	}
	if !strings.Contains(log[len(log)-1], "2 lane(s)") {
		t.Errorf("ready line %q", log[len(log)-1])
	}
	resp, err := http.Post(addr+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"stories260K","prompt":"Once upon a time","max_tokens":8,"temperature":0}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"completion_tokens":8`) {
		t.Errorf("completion: %d %s", resp.StatusCode, body)
	}
	resp, err = http.Get(addr + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `"id":"stories260K"`) {
		t.Errorf("models: %s", body)
	}
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("serve exited %d", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not stop on SIGTERM")
	}
	if _, err := http.Get(addr + "/healthz"); err == nil {
		t.Error("still answering after shutdown")
	}
}

func TestServeRefusesDraftForNow(t *testing.T) {
	code, _, stderr := tandem(t, "serve", "--draft", "x.gguf")
	if code != 1 || !strings.Contains(stderr, "not yet") {
		t.Errorf("exit %d: %s", code, stderr)
	}
}
