package server

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// nodeClientDir is where `make openai-node` installs the official OpenAI
// Node library, pinned by its package-lock.json.
const nodeClientDir = "testdata/openai-node"

// needNodeClient skips the test where Node.js or the library is missing,
// or fails it when TANDEM_REQUIRE_NODE=1 (as CI sets it, after
// installing them).
func needNodeClient(t *testing.T) {
	t.Helper()
	_, nodeErr := exec.LookPath("node")
	_, libErr := os.Stat(filepath.Join(nodeClientDir, "node_modules", "openai", "package.json"))
	if nodeErr == nil && libErr == nil {
		return
	}
	msg := "the official OpenAI Node library is not installed: run `make openai-node` (needs Node.js 18 or later and npm)"
	if os.Getenv("TANDEM_REQUIRE_NODE") == "1" {
		t.Fatalf("%s (TANDEM_REQUIRE_NODE=1)", msg)
	}
	t.Skip(msg)
}

// TestOfficialOpenAINodeClient drives the server with the official OpenAI
// Node library, unchanged but for the base URL (testdata/openai-node/
// client.mjs), and checks what each call returned.
func TestOfficialOpenAINodeClient(t *testing.T) {
	needNodeClient(t)
	fx := newFixture(t, fixtureOpts{})
	want, n := fx.reference(t, "Once upon a time", 20)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "client.mjs", fx.http.URL+"/v1", "stories260K")
	cmd.Dir = nodeClientDir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	if err != nil {
		t.Fatalf("node client.mjs: %v\n%s", err, stderr.Bytes())
	}
	type text struct {
		Text, Content, Finish string
		Tokens                int
	}
	var got struct {
		Models                                   []string
		Completion, Streamed, Chat, ChatStreamed text
		NextTurn                                 text
		BadRequest                               struct {
			Thrown, APIError bool
			Status           int
			Param, Type      string
		}
		Aborted struct{ Chunks int }
	}
	if err := json.Unmarshal(stdout, &got); err != nil {
		t.Fatalf("the client's report %q: %v", stdout, err)
	}

	if len(got.Models) != 1 || got.Models[0] != "stories260K" {
		t.Errorf("models %v, want [stories260K]", got.Models)
	}
	if c := got.Completion; c.Text != want || c.Tokens != n || c.Finish != "length" {
		t.Errorf("completion %q (%d tokens, %s), want %q (%d, length)", c.Text, c.Tokens, c.Finish, want, n)
	}
	if s := got.Streamed; s.Text != want || s.Tokens != n {
		t.Errorf("streamed %q (%d tokens), want %q (%d)", s.Text, s.Tokens, want, n)
	}
	if c := got.Chat; c.Content == "" || c.Tokens == 0 {
		t.Errorf("chat %+v, want an answer", c)
	}
	if got.ChatStreamed.Content != got.Chat.Content {
		t.Errorf("the stream helper's chat %q, the plain call's %q", got.ChatStreamed.Content, got.Chat.Content)
	}
	if got.NextTurn.Content == "" || got.NextTurn.Tokens == 0 {
		t.Errorf("a next turn sending back the helper's message: %+v", got.NextTurn)
	}
	if b := got.BadRequest; !b.Thrown || !b.APIError || b.Status != 400 || b.Param != "max_tokens" || b.Type != "invalid_request_error" {
		t.Errorf("max_tokens 0: %+v, want the library's BadRequestError (400, max_tokens, invalid_request_error)", b)
	}

	// The aborted stream had 341 tokens to go before its story's end:
	// only the disconnect ends it.
	if got.Aborted.Chunks < 2 {
		t.Errorf("the aborted stream gave %d chunks before the abort, want 2", got.Aborted.Chunks)
	}
	waitUntil(t, "the aborted stream's sequence freed", func() bool { return fx.live() == 0 })
	if st := fx.sc.Stats(); st.Cancelled != 1 {
		t.Errorf("%d requests cancelled, want the aborted one", st.Cancelled)
	}
}
