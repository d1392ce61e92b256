package server

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tandem-llm/tandem/kernels/cpuset"
	"github.com/tandem-llm/tandem/runtime/sched"
	"github.com/tandem-llm/tandem/runtime/tokenizer"
)

func TestCompletionMatchesReference(t *testing.T) {
	fx := newFixture(t, fixtureOpts{})
	want, n := fx.reference(t, "Once upon a time", 24)
	code, _, body := post(t, fx.http.URL+"/v1/completions",
		map[string]any{"model": "stories260K", "prompt": "Once upon a time", "max_tokens": 24, "temperature": 0})
	if code != 200 {
		t.Fatalf("status %d: %s", code, body)
	}
	c := parse(t, body)
	if c.Object != "text_completion" || len(c.Choices) != 1 || !strings.HasPrefix(c.ID, "cmpl-") {
		t.Fatalf("shape: %s", body)
	}
	if got := c.Choices[0].Text; got != want {
		t.Errorf("text %q\nwant %q", got, want)
	}
	if c.Usage == nil || c.Usage.CompletionTokens != n || c.Usage.PromptTokens == 0 ||
		c.Usage.TotalTokens != c.Usage.PromptTokens+c.Usage.CompletionTokens {
		t.Errorf("usage %+v, want %d completion tokens", c.Usage, n)
	}
	if fr := c.Choices[0].FinishReason; fr == nil || *fr != "length" {
		t.Errorf("finish reason %v, want length", fr)
	}

	// Streaming gives the same text, then a finish chunk, the usage chunk
	// and [DONE].
	resp, err := http.Post(fx.http.URL+"/v1/completions", "application/json", strings.NewReader(
		`{"prompt":"Once upon a time","max_tokens":24,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("content type %q", ct)
	}
	chunks, done := sse(t, resp.Body)
	if !done {
		t.Fatal("stream did not end with [DONE]")
	}
	if got := streamText(chunks); got != want {
		t.Errorf("streamed %q\nwant %q", got, want)
	}
	last := chunks[len(chunks)-1]
	if last.Usage == nil || last.Usage.CompletionTokens != n || len(last.Choices) != 0 {
		t.Errorf("last chunk %+v, want the usage chunk", last)
	}
	if fin := chunks[len(chunks)-2]; fin.Choices[0].FinishReason == nil || *fin.Choices[0].FinishReason != "length" || fin.Tandem == nil {
		t.Errorf("finish chunk %+v", fin)
	}
}

func TestChatCompletion(t *testing.T) {
	fx := newFixture(t, fixtureOpts{})
	msgs := []map[string]any{
		{"role": "system", "content": "You tell short stories."},
		{"role": "user", "content": []map[string]string{{"type": "text", "text": "Tell me about a cat."}}},
	}
	code, _, body := post(t, fx.http.URL+"/v1/chat/completions", map[string]any{"messages": msgs, "max_tokens": 16, "temperature": 0})
	if code != 200 {
		t.Fatalf("status %d: %s", code, body)
	}
	c := parse(t, body)
	if c.Object != "chat.completion" || c.Choices[0].Message == nil || c.Choices[0].Message.Role != "assistant" || !strings.HasPrefix(c.ID, "chatcmpl-") {
		t.Fatalf("shape: %s", body)
	}
	want, _ := fx.reference(t, "You tell short stories.\n\nUser: Tell me about a cat.\nAssistant:", 16)
	if i := strings.Index(want, "\nUser:"); i >= 0 {
		want = want[:i]
	}
	if got := c.Choices[0].Message.Content; got != want {
		t.Errorf("content %q\nwant %q", got, want)
	}
	resp, err := http.Post(fx.http.URL+"/v1/chat/completions", "application/json", strings.NewReader(
		`{"messages":[{"role":"system","content":"You tell short stories."},{"role":"user","content":"Tell me about a cat."}],"max_tokens":16,"temperature":0,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	chunks, done := sse(t, resp.Body)
	if !done || len(chunks) < 2 {
		t.Fatalf("%d chunks, done %v", len(chunks), done)
	}
	if d := chunks[0].Choices[0].Delta; d == nil || d.Role != "assistant" || chunks[0].Object != "chat.completion.chunk" {
		t.Errorf("first chunk %+v, want the assistant role", chunks[0])
	}
	if got := streamText(chunks); got != want {
		t.Errorf("streamed %q\nwant %q", got, want)
	}
	for _, c := range chunks { // every chunk carries the stream's time
		if c.Created != chunks[0].Created || c.Created == 0 {
			t.Errorf("chunk created %d, the first %d", c.Created, chunks[0].Created)
		}
	}
}

func TestChatTakesBackItsOwnAnswer(t *testing.T) {
	// The second turn of a conversation sends the first answer back as
	// the client received it; the Node client's helpers add refusal and
	// parsed, and other clients send the fields OpenAI may fill, empty.
	fx := newFixture(t, fixtureOpts{})
	body := `{"messages":[{"role":"user","content":"Tell me about a cat."},
		{"role":"assistant","content":"A cat sat.","refusal":null,"parsed":null,"annotations":[],"tool_calls":[],"audio":null,"function_call":null},
		{"role":"user","content":"And a dog?"}],"max_tokens":4,"tools":null,"response_format":null,"store":false,"metadata":{},"logprobs":false}`
	if code, _, out := post(t, fx.http.URL+"/v1/chat/completions", body); code != 200 {
		t.Fatalf("status %d: %s", code, out)
	}
	// Clients that spell out the defaults ask for nothing tandem lacks.
	body = `{"messages":[{"role":"user","content":"Hi"}],"max_tokens":2,"response_format":{ "type": "text" },"tool_choice":"none","service_tier":"auto","modalities":["text"],"parallel_tool_calls":true}`
	if code, _, out := post(t, fx.http.URL+"/v1/chat/completions", body); code != 200 {
		t.Fatalf("the defaults spelled out: status %d: %s", code, out)
	}
	// OpenAI's newer name for system is taken, and a role that is not
	// one of them is told every one that is.
	body = `{"messages":[{"role":"developer","content":"Be brief."},{"role":"user","content":"Hi"}],"max_tokens":2}`
	if code, _, out := post(t, fx.http.URL+"/v1/chat/completions", body); code != 200 {
		t.Fatalf("a developer message: status %d: %s", code, out)
	}
	body = `{"messages":[{"role":"wizard","content":"x"}]}`
	if code, _, out := post(t, fx.http.URL+"/v1/chat/completions", body); code != 400 || !strings.Contains(string(out), "want system, developer, user or assistant") {
		t.Errorf("role wizard: status %d: %s; want a 400 naming every role", code, out)
	}
}

// TestChatNextTurnReusesPrefix: a chat's next turn resends the
// conversation, and the lane starts it from the KV rows the first turn
// left (prefix reuse): its prompt and its answer, rendered back as the
// model wrote it, so only the new question is prefilled; the answer is
// the model's own, and /metrics counts the reused tokens.
func TestChatNextTurnReusesPrefix(t *testing.T) {
	fx := newFixture(t, fixtureOpts{})
	turn := []map[string]any{
		{"role": "system", "content": "You tell short stories."},
		{"role": "user", "content": "Tell me about a cat."},
	}
	var answered int // the first answer's tokens
	ask := func() string {
		t.Helper()
		code, _, body := post(t, fx.http.URL+"/v1/chat/completions", map[string]any{"messages": turn, "max_tokens": 24, "temperature": 0})
		if code != 200 {
			t.Fatalf("status %d: %s", code, body)
		}
		c := parse(t, body)
		if answered == 0 {
			answered = c.Usage.CompletionTokens
		}
		return c.Choices[0].Message.Content
	}
	first := ask()
	if !strings.HasPrefix(first, " ") {
		t.Fatalf("first answer %q: the model's answers start with a space after \"Assistant:\"", first)
	}
	before := fx.engines[0].ReusedTokens()
	turn = append(turn, map[string]any{"role": "assistant", "content": first}, map[string]any{"role": "user", "content": "What did the cat do next?"})
	got := ask()
	reused := fx.engines[0].ReusedTokens() - before

	prompt := "You tell short stories.\n\nUser: Tell me about a cat.\nAssistant:" + first + "\nUser: What did the cat do next?\nAssistant:"
	want, _ := fx.reference(t, prompt, 24)
	if i := strings.Index(want, "\nUser:"); i >= 0 {
		want = want[:i]
	}
	if got != want {
		t.Errorf("next turn %q\nwant %q", got, want)
	}
	// The first turn's prompt and answer (but for the answer's last token,
	// never evaluated) come from its rows.
	ids := func(s string) []int32 {
		out, err := fx.tok.Encode(s, tokenizer.EncodeOptions{AddBOS: true})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	p1, p2 := ids("You tell short stories.\n\nUser: Tell me about a cat.\nAssistant:"), ids(prompt)
	shared := 0
	for shared < min(len(p1), len(p2)) && p1[shared] == p2[shared] {
		shared++
	}
	if shared != len(p1) || reused < int64(len(p1)+answered-1) || reused >= int64(len(p2)) {
		t.Errorf("%d of the next turn's %d prompt tokens reused, want the first turn's %d and its answer's %d but one (%d shared)",
			reused, len(p2), len(p1), answered, shared)
	}
	// Both turns done, no KV is in use, but the lane holds the sequence
	// it keeps for reuse, and says so.
	text := scrape(t, fx.http.URL)
	for _, m := range []string{
		fmt.Sprintf("tandem_prefix_reused_tokens_total %d\n", fx.engines[0].ReusedTokens()),
		"tandem_memory_bytes{kind=\"kv\"} 0\n",
		fmt.Sprintf("tandem_memory_bytes{kind=\"kv_held\"} %v\n", float64(fx.engines[0].KVBytesHeld())),
	} {
		if !strings.Contains(text, m) {
			t.Errorf("metrics lack %q", m)
		}
	}
	if fx.engines[0].KVBytesHeld() == 0 {
		t.Error("the lane holds no KV memory after two answers")
	}
}

// TestChatClientsTakingTurnsKeepTheirRows: two chat clients take turns on
// one lane, one request at a time. The second client's first turn, which
// shares only the template's beginning with the first's conversation,
// leaves that conversation's rows alone (the lane's prefix cache has
// room), so each client's next turn reuses its whole first turn.
func TestChatClientsTakingTurnsKeepTheirRows(t *testing.T) {
	fx := newFixture(t, fixtureOpts{})
	type client struct {
		msgs     []map[string]any
		answered int // the first answer's tokens
		prompt   int // the first turn's prompt tokens
	}
	ask := func(c *client) {
		t.Helper()
		code, _, body := post(t, fx.http.URL+"/v1/chat/completions", map[string]any{"messages": c.msgs, "max_tokens": 24, "temperature": 0})
		if code != 200 {
			t.Fatalf("status %d: %s", code, body)
		}
		r := parse(t, body)
		if c.answered == 0 {
			c.answered, c.prompt = r.Usage.CompletionTokens, r.Usage.PromptTokens
		}
		c.msgs = append(c.msgs, map[string]any{"role": "assistant", "content": r.Choices[0].Message.Content},
			map[string]any{"role": "user", "content": "And then?"})
	}
	clients := []*client{
		{msgs: []map[string]any{{"role": "user", "content": "Tell me about a cat."}}},
		{msgs: []map[string]any{{"role": "user", "content": "Tell me about a big red dog."}}},
	}
	for _, c := range clients {
		ask(c)
	}
	for i, c := range clients {
		before := fx.engines[0].ReusedTokens()
		ask(c)
		// The first turn's prompt (BOS included) and answer, but for the
		// answer's last token, never evaluated.
		if reused, want := fx.engines[0].ReusedTokens()-before, int64(c.prompt+c.answered-1); reused < want {
			t.Errorf("client %d's next turn reused %d tokens, want at least its first turn's %d", i, reused, want)
		}
	}
}

// TestChatNextTurnStaysOnItsLane: with two lanes, a chat's next turn is
// routed to the lane that keeps the first turn's rows, however its
// longer prompt scores, and reuses them.
func TestChatNextTurnStaysOnItsLane(t *testing.T) {
	fx := newFixture(t, fixtureOpts{lanes: 2})
	turn := []map[string]any{
		{"role": "system", "content": "You tell short stories to a child before bed, with a happy ending and simple words."},
		{"role": "user", "content": "Tell me about a cat."},
	}
	ask := func() completion {
		t.Helper()
		code, _, body := post(t, fx.http.URL+"/v1/chat/completions", map[string]any{"messages": turn, "max_tokens": 64, "temperature": 0})
		if code != 200 {
			t.Fatalf("status %d: %s", code, body)
		}
		return parse(t, body)
	}
	first := ask()
	turn = append(turn, map[string]any{"role": "assistant", "content": first.Choices[0].Message.Content},
		map[string]any{"role": "user", "content": "What did the cat do next?"})
	next := ask()
	if next.Tandem.Lane != first.Tandem.Lane {
		t.Errorf("the next turn ran on lane %d, the first on lane %d", next.Tandem.Lane, first.Tandem.Lane)
	}
	reused := fx.engines[0].ReusedTokens() + fx.engines[1].ReusedTokens()
	if min := int64(first.Usage.PromptTokens + first.Usage.CompletionTokens - 1); reused < min {
		t.Errorf("%d tokens reused, want the first turn's %d and its answer but one", reused, min)
	}
	if !strings.Contains(scrape(t, fx.http.URL), "tandem_prefix_routed_total 1\n") {
		t.Error("metrics do not count the next turn's routing")
	}
}

func TestChatTemplate(t *testing.T) {
	got, err := renderChat([]chatMessage{
		{Role: "system", Content: json.RawMessage(`"Be brief."`)},
		{Role: "user", Content: json.RawMessage(`"Hi"`)},
		{Role: "assistant", Content: json.RawMessage(`"Hello."`)},
		{Role: "user", Content: json.RawMessage(`[{"type":"text","text":"Bye"}]`)},
		{Role: "assistant", Content: json.RawMessage(`null`), Refusal: ptr("No.")},
		{Role: "user", Content: json.RawMessage(`"Again"`)},
		// As the model wrote it, after "Assistant:": one space, not two.
		{Role: "assistant", Content: json.RawMessage(`" Yes.  Twice."`)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := "Be brief.\n\nUser: Hi\nAssistant: Hello.\nUser: Bye\nAssistant: No.\nUser: Again\nAssistant: Yes.  Twice.\nAssistant:"; got != want {
		t.Errorf("template %q\nwant %q", got, want)
	}
}

func TestBadRequests(t *testing.T) {
	fx := newFixture(t, fixtureOpts{})
	long := strings.Repeat("once upon a time ", 200)
	for _, tc := range []struct {
		name, path, body string
		status           int
		param            string
	}{
		{"malformed json", "/v1/completions", `{"prompt": "x"`, 400, ""},
		{"not json", "/v1/completions", `prompt=x`, 400, ""},
		{"empty body", "/v1/completions", ``, 400, ""},
		{"array body", "/v1/completions", `[1,2]`, 400, ""},
		{"trailing data", "/v1/completions", `{"prompt":"x"} {}`, 400, ""},
		{"unknown field", "/v1/completions", `{"prompt":"x","temprature":0}`, 400, "temprature"},
		{"wrong type", "/v1/completions", `{"prompt":"x","max_tokens":"ten"}`, 400, "max_tokens"},
		{"wrong nested type", "/v1/completions", `{"prompt":"x","utility":{"value":"high"}}`, 400, "utility.value"},
		{"missing prompt", "/v1/completions", `{"max_tokens":5}`, 400, "prompt"},
		{"prompt wrong type", "/v1/completions", `{"prompt":{"a":1}}`, 400, "prompt"},
		{"two prompts", "/v1/completions", `{"prompt":["a","b"]}`, 400, "prompt"},
		{"token outside vocab", "/v1/completions", `{"prompt":[1,99999]}`, 400, "prompt"},
		{"prompt over context", "/v1/completions", `{"prompt":"` + long + `"}`, 400, "prompt"},
		{"max_tokens 0", "/v1/completions", `{"prompt":"x","max_tokens":0}`, 400, "max_tokens"},
		{"max_tokens negative", "/v1/completions", `{"prompt":"x","max_tokens":-3}`, 400, "max_tokens"},
		{"max_tokens huge", "/v1/completions", `{"prompt":"x","max_tokens":100000000}`, 400, "max_tokens"},
		{"max_tokens float", "/v1/completions", `{"prompt":"x","max_tokens":1.5}`, 400, "max_tokens"},
		{"negative deadline", "/v1/completions", `{"prompt":"x","deadline_ms":-5}`, 400, "deadline_ms"},
		{"zero deadline", "/v1/completions", `{"prompt":"x","deadline_ms":0}`, 400, "deadline_ms"},
		{"absurd deadline", "/v1/completions", `{"prompt":"x","deadline_ms":1e15}`, 400, "deadline_ms"},
		{"priority", "/v1/completions", `{"prompt":"x","priority":50}`, 400, "priority"},
		{"min over max", "/v1/completions", `{"prompt":"x","max_tokens":4,"min_tokens":8}`, 400, "min_tokens"},
		{"utility negative", "/v1/completions", `{"prompt":"x","utility":{"value":-1}}`, 400, "utility.value"},
		{"utility unknown", "/v1/completions", `{"prompt":"x","utility":{"weight":1}}`, 400, "utility.weight"},
		{"segment name", "/v1/completions", `{"prompt":"x","segment":"paragraph"}`, 400, "segment"},
		{"segment regex", "/v1/completions", `{"prompt":"x","segment":{"regex":"("}}`, 400, "segment.regex"},
		{"segment empty match", "/v1/completions", `{"prompt":"x","segment":{"regex":"a*"}}`, 400, "segment.regex"},
		{"segment type", "/v1/completions", `{"prompt":"x","segment":5}`, 400, "segment"},
		{"temperature", "/v1/completions", `{"prompt":"x","temperature":5}`, 400, "temperature"},
		{"temperature overflows", "/v1/completions", `{"prompt":"x","temperature":1e400}`, 400, "temperature"},
		{"top_p", "/v1/completions", `{"prompt":"x","top_p":0}`, 400, "top_p"},
		{"n", "/v1/completions", `{"prompt":"x","n":3}`, 400, "n"},
		{"stop type", "/v1/completions", `{"prompt":"x","stop":5}`, 400, "stop"},
		{"long stop string", "/v1/completions", `{"prompt":"x","stop":"` + strings.Repeat("x", 300) + `"}`, 400, "stop"},
		{"empty stop string", "/v1/completions", `{"prompt":"x","stop":""}`, 400, "stop"},
		{"not utf-8", "/v1/completions", "{\"prompt\":\"hi \xff\xfe there\"}", 400, ""},
		{"not utf-8 in a stop", "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[\"\xc3\"]}", 400, ""},
		{"too many stops", "/v1/completions", `{"prompt":"x","stop":["a","b","c","d","e"]}`, 400, "stop"},
		{"logprobs", "/v1/completions", `{"prompt":"x","logprobs":5}`, 400, "logprobs"},
		{"echo", "/v1/completions", `{"prompt":"x","echo":true}`, 400, "echo"},
		{"stream_options alone", "/v1/completions", `{"prompt":"x","stream_options":{"include_usage":true}}`, 400, "stream_options"},
		{"both max fields", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"max_tokens":3,"max_completion_tokens":3}`, 400, "max_completion_tokens"},
		{"no messages", "/v1/chat/completions", `{"messages":[]}`, 400, "messages"},
		{"message unknown field", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"},{"role":"user","content":"y","weight":1}]}`, 400, "messages[1].weight"},
		{"message wrong type", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"},{"role":5,"content":"y"}]}`, 400, "messages[1].role"},
		{"bad role", "/v1/chat/completions", `{"messages":[{"role":"robot","content":"x"}]}`, 400, "messages[0].role"},
		{"tools", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}]}`, 400, "tools"},
		{"response_format", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"}}`, 400, "response_format"},
		{"tool_choice", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"tool_choice":"auto"}`, 400, "tool_choice"},
		{"service_tier", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"service_tier":"flex"}`, 400, "service_tier"},
		{"audio modality", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"modalities":["text","audio"]}`, 400, "modalities"},
		{"message tool calls", "/v1/chat/completions", `{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"1"}]}]}`, 400, "messages[0].tool_calls"},
		{"image part", "/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"image_url","text":""}]}]}`, 400, "messages[0].content[0].type"},
		{"field in another case", "/v1/completions", `{"PROMPT":"x"}`, 400, "PROMPT"},
		{"field twice", "/v1/completions", `{"prompt":"x","max_tokens":3,"max_tokens":4}`, 400, "max_tokens"},
		{"field twice in another case", "/v1/completions", `{"prompt":"x","max_tokens":3,"MAX_TOKENS":4}`, 400, "MAX_TOKENS"},
		{"message field in another case", "/v1/chat/completions", `{"messages":[{"Role":"user","content":"x"}]}`, 400, "messages[0].Role"},
		{"segment regex in another case", "/v1/completions", `{"prompt":"x","segment":{"REGEX":"x"}}`, 400, "segment"},
		{"max_tokens written as a float", "/v1/completions", `{"prompt":"x","max_tokens":3.0}`, 400, "max_tokens"},
		{"user message without content", "/v1/chat/completions", `{"messages":[{"role":"user"}]}`, 400, "messages[0].content"},
		{"system message with null content", "/v1/chat/completions", `{"messages":[{"role":"system","content":null},{"role":"user","content":"x"}]}`, 400, "messages[0].content"},
		{"resume bad deadline", "/v1/resume/cmpl-x", `{"deadline_ms":-1}`, 400, "deadline_ms"},
		{"resume unknown", "/v1/resume/cmpl-nope", `{}`, 404, ""},
		{"unknown route", "/v1/engines", `{}`, 404, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, body := post(t, fx.http.URL+tc.path, tc.body)
			if code != tc.status {
				t.Fatalf("status %d, want %d: %s", code, tc.status, body)
			}
			c := parse(t, body)
			if c.Error == nil || c.Error.Message == "" || c.Error.Type == "" {
				t.Fatalf("no OpenAI-style error body: %s", body)
			}
			if tc.param != "" && (c.Error.Param == nil || *c.Error.Param != tc.param) {
				t.Errorf("param %v, want %q (%s)", c.Error.Param, tc.param, c.Error.Message)
			}
		})
	}
	// A resume's body is optional, also when it comes chunked and empty:
	// an unknown id is then a 404, not a 400 about the body.
	resp, err := http.Post(fx.http.URL+"/v1/resume/cmpl-nope", "application/json", io.MultiReader())
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Errorf("resume with an empty chunked body: %d, want 404", resp.StatusCode)
	}
	// A compressed body is refused by its encoding, not as bad UTF-8.
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte(`{"prompt":"x","max_tokens":1}`))
	zw.Close()
	req, _ := http.NewRequest("POST", fx.http.URL+"/v1/completions", &gz)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Content-Encoding", "gzip")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnsupportedMediaType || !strings.Contains(string(body), `Content-Encoding \"gzip\" is not supported`) {
		t.Errorf("gzip body: %d %s; want 415 naming the encoding", resp.StatusCode, body)
	}
	resp, err = http.Get(fx.http.URL + "/v1/completions")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 405 || resp.Header.Get("Allow") != "POST" {
		t.Errorf("GET /v1/completions: %d, Allow %q", resp.StatusCode, resp.Header.Get("Allow"))
	}
	// Allow lists every method the route takes: DELETE discards a parked
	// request, HEAD reads what GET would.
	for path, allow := range map[string]string{"/v1/resume/x": "POST, DELETE", "/metrics": "GET, HEAD", "/v1/models": "GET, HEAD"} {
		req, _ := http.NewRequest(http.MethodPut, fx.http.URL+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 405 || resp.Header.Get("Allow") != allow {
			t.Errorf("PUT %s: %d, Allow %q; want 405, %q", path, resp.StatusCode, resp.Header.Get("Allow"), allow)
		}
	}
	// Nothing leaked from the refused requests.
	if n := fx.live(); n != 0 {
		t.Errorf("%d sequences live", n)
	}
}

func TestBodyTooLarge(t *testing.T) {
	fx := newFixture(t, fixtureOpts{})
	fx.srv.cfg.MaxBodyBytes = 100
	code, _, body := post(t, fx.http.URL+"/v1/completions", `{"prompt":"`+strings.Repeat("a", 200)+`"}`)
	if code != 413 || !strings.Contains(string(body), "error") {
		t.Errorf("status %d: %s", code, body)
	}
}

func TestNotLoadedIs503(t *testing.T) {
	srv := New(Config{Model: "m"})
	ts := httptest.NewServer(srv)
	defer ts.Close()
	code, hdr, body := post(t, ts.URL+"/v1/completions", `{"prompt":"x"}`)
	if code != 503 || hdr.Get("Retry-After") == "" || !strings.Contains(string(body), "model_not_loaded") {
		t.Errorf("completions before load: %d %q %s", code, hdr.Get("Retry-After"), body)
	}
	resp, err := http.Get(ts.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 {
		t.Errorf("healthz before load: %d", resp.StatusCode)
	}
	resp, err = http.Get(ts.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("models before load: %d", resp.StatusCode)
	}
}

func TestQueueFullIs429(t *testing.T) {
	e := newGateEngine()
	sc, err := sched.New(sched.Config{MaxBatch: 1, MaxQueue: 1}, nil, sched.Lane{Engine: e})
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, fixtureOpts{}) // for a tokenizer only
	srv := New(Config{})
	srv.Ready(sc, f.tok)
	ts := httptest.NewServer(srv)
	defer ts.Close()
	// Deferred after ts.Close, so it runs first: a failed check must not
	// leave the held requests blocking the server's Close.
	defer sc.Shutdown(context.Background())
	release := sync.OnceFunc(func() { close(e.gate) })
	defer release()
	results := make(chan int, 2)
	send := func() {
		code, _, _ := post(t, ts.URL+"/v1/completions", `{"prompt":"a","max_tokens":2}`)
		results <- code
	}
	// One at a time: the first must leave the queue for the batch before
	// the second arrives, or the second finds the queue full.
	go send()
	<-e.stepped // one request runs...
	go send()
	waitUntil(t, "a request queued", func() bool { st := sc.Stats(); return st.Waiting+st.Lanes[0].Waiting == 1 })
	code, hdr, body := post(t, ts.URL+"/v1/completions", `{"prompt":"a","max_tokens":2}`)
	if code != 429 || hdr.Get("Retry-After") == "" || !strings.Contains(string(body), "queue_full") {
		t.Errorf("third request: %d, Retry-After %q: %s", code, hdr.Get("Retry-After"), body)
	}
	release()
	for range 2 {
		if c := <-results; c != 200 {
			t.Errorf("held request finished with %d", c)
		}
	}
}

func TestClientDisconnectFreesKV(t *testing.T) {
	fx := newFixture(t, fixtureOpts{})
	req, _ := http.NewRequest("POST", fx.http.URL+"/v1/completions", strings.NewReader(
		`{"prompt":"Once upon a time","max_tokens":400,"temperature":0,"stream":true,"min_tokens":0}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	rd := bufio.NewReader(resp.Body)
	for range 3 { // a few chunks arrive
		if _, err := rd.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	if fx.live() != 1 {
		t.Fatalf("%d sequences live mid-stream, want 1", fx.live())
	}
	if st := fx.sc.Stats(); st.Lanes[0].KVBytes == 0 {
		t.Fatalf("no KV memory in use mid-stream")
	}
	resp.Body.Close() // the client goes away
	waitUntil(t, "KV freed after disconnect", func() bool { return fx.live() == 0 && fx.sc.Stats().Lanes[0].KVBytes == 0 })
	waitUntil(t, "cancel counted", func() bool { return fx.sc.Stats().Cancelled == 1 })
	if st := fx.sc.Stats(); st.Tokens >= 400 {
		t.Errorf("generated %d tokens: the request ran to the end", st.Tokens)
	}
}

func TestClientThatLeavesIsCounted499(t *testing.T) {
	fx := newFixture(t, fixtureOpts{})
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", fx.http.URL+"/v1/completions", strings.NewReader(
		`{"prompt":"Once upon a time","max_tokens":500,"temperature":0}`))
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	waitUntil(t, "request admitted", func() bool { return fx.sc.Stats().Admitted == 1 })
	cancel() // the client goes away before the answer
	<-done
	waitUntil(t, "request cancelled", func() bool { return fx.sc.Stats().Cancelled == 1 })
	// Each scrape counts as a 200 after it: the completion must not.
	scrapes := 0
	var body string
	waitUntil(t, "499 counted", func() bool {
		body = scrape(t, fx.http.URL)
		scrapes++
		return strings.Contains(body, `tandem_http_responses_total{code="499"} 1`)
	})
	if want := fmt.Sprintf(`tandem_http_responses_total{code="200"} %d`, scrapes-1); scrapes > 1 && !strings.Contains(body, want+"\n") ||
		scrapes == 1 && strings.Contains(body, `code="200"`) {
		t.Errorf("after %d scrapes, want %d responses counted 200 (the scrapes before the last):\n%s", scrapes, scrapes-1, body)
	}
}

func TestClientThatLeavesMidStreamIsCounted499(t *testing.T) {
	fx := newFixture(t, fixtureOpts{})
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", fx.http.URL+"/v1/completions", strings.NewReader(
		`{"prompt":"Once upon a time","max_tokens":500,"temperature":0,"stream":true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first line %q, %v", line, err)
	}
	cancel() // the client goes away after the first chunk
	resp.Body.Close()
	waitUntil(t, "request cancelled", func() bool { return fx.sc.Stats().Cancelled == 1 })
	waitUntil(t, "499 counted", func() bool {
		return strings.Contains(scrape(t, fx.http.URL), `tandem_http_responses_total{code="499"} 1`)
	})
}

// scrape returns the server's /metrics text.
func scrape(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return string(body)
}

func TestStalledBodyIs408(t *testing.T) {
	fx := newFixture(t, fixtureOpts{srv: Config{BodyTimeout: 100 * time.Millisecond}})
	conn, err := net.Dial("tcp", strings.TrimPrefix(fx.http.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprint(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\":")
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	status, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil || !strings.Contains(status, " 408 ") {
		t.Errorf("stalled body: status line %q, %v; want 408", status, err)
	}
}

// TestSegmentsResumeOverHTTP: a segmented request returns one statement
// at a time and resuming continues exactly where it stopped.
func TestSegmentsResumeOverHTTP(t *testing.T) {
	fx := newFixture(t, fixtureOpts{})
	want, _ := fx.reference(t, "Once upon a time", 60)
	code, _, body := post(t, fx.http.URL+"/v1/completions",
		map[string]any{"prompt": "Once upon a time", "max_tokens": 60, "temperature": 0, "segment": "statement", "deadline_ms": 60000})
	if code != 200 {
		t.Fatalf("%d %s", code, body)
	}
	var got strings.Builder
	segments := 0
	for {
		c := parse(t, body)
		got.WriteString(c.Choices[0].Text)
		if c.Tandem == nil {
			t.Fatalf("no tandem info: %s", body)
		}
		if !c.Tandem.Resumable {
			break
		}
		segments++
		if c.Tandem.Finish != "segment" || *c.Choices[0].FinishReason != "stop" || c.Tandem.DeadlineMet == nil || !*c.Tandem.DeadlineMet {
			t.Errorf("segment %d: %s", segments, body)
		}
		stream := segments%2 == 0
		resp, err := http.Post(fx.http.URL+"/v1/resume/"+c.Tandem.ID, "application/json",
			strings.NewReader(fmt.Sprintf(`{"deadline_ms":60000,"stream":%v}`, stream)))
		if err != nil {
			t.Fatal(err)
		}
		if stream {
			chunks, done := sse(t, resp.Body)
			resp.Body.Close()
			if !done || len(chunks) == 0 {
				t.Fatal("resumed stream did not finish")
			}
			fin := chunks[len(chunks)-1]
			text := streamText(chunks)
			fin.Choices[0].Text = text
			data, _ := json.Marshal(fin)
			body = data
			continue
		}
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("resume: %d %s", resp.StatusCode, body)
		}
	}
	if segments < 2 {
		t.Errorf("%d segments; want several statements in 60 tokens", segments)
	}
	if got.String() != want {
		t.Errorf("segments joined %q\nwant %q", got.String(), want)
	}
	// The lane frees a finished sequence on its next step, just after
	// the last response is written.
	waitUntil(t, "sequence freed after the last segment", func() bool { return fx.live() == 0 })
	// Discarding a parked request frees it.
	_, _, body = post(t, fx.http.URL+"/v1/completions", `{"prompt":"Once upon a time","max_tokens":60,"temperature":0,"segment":"statement"}`)
	c := parse(t, body)
	req, _ := http.NewRequest("DELETE", fx.http.URL+"/v1/resume/"+c.Tandem.ID, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("delete: %d", resp.StatusCode)
	}
	waitUntil(t, "discarded sequence freed", func() bool { return fx.live() == 0 })
}

// TestHealthReportsAStall: /healthz turns 503 "stalled" once requests
// have waited stallLimit with every lane idle (sched.Stats.Stalled, which
// TestStatsReportAStall makes by hand), so a supervisor can restart the
// server; a shorter wait is still ok.
func TestHealthReportsAStall(t *testing.T) {
	lanes := []sched.LaneStats{{}, {}}
	if code, body := healthOf(sched.Stats{Waiting: 2, Stalled: 4 * time.Second, Lanes: lanes}); code != 200 || body["status"] != "ok" {
		t.Errorf("4 s: %d %v, want 200 ok", code, body)
	}
	code, body := healthOf(sched.Stats{Waiting: 2, Stalled: 6 * time.Second, Lanes: lanes, Policy: "tandem"})
	if code != http.StatusServiceUnavailable || body["status"] != "stalled" || body["stalled_seconds"] != 6.0 || body["waiting"] != 2 || body["lanes"] != 2 {
		t.Errorf("6 s: %d %v, want 503 stalled for 6 s with 2 waiting", code, body)
	}
}

func TestMetricsAndHealth(t *testing.T) {
	allowed, err := cpuset.Allowed()
	if err != nil {
		t.Fatal(err)
	}
	pin := cpuset.Set{allowed[len(allowed)-1]}
	fx := newFixture(t, fixtureOpts{lanes: 2, cpus: map[int]cpuset.Set{1: pin}})
	post(t, fx.http.URL+"/v1/completions", `{"prompt":"Once","max_tokens":5,"deadline_ms":60000}`)
	post(t, fx.http.URL+"/v1/completions", `{"prompt":"Once","max_tokens":0}`)
	resp, err := http.Get(fx.http.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	text := string(data)
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain; version=0.0.4") {
		t.Errorf("content type %q", resp.Header.Get("Content-Type"))
	}
	for _, want := range []string{
		"tandem_up 1", "tandem_queue_depth 0", "tandem_requests_admitted_total 1", "tandem_requests_rejected_total 0",
		"tandem_deadline_hits_total 1", "tandem_deadline_misses_total 0", `tandem_http_responses_total{code="400"} 1`,
		`tandem_lane_utilization{lane="cpu0"}`, `tandem_lane_utilization{lane="cpu1"}`, "tandem_tokens_per_second",
		`tandem_memory_bytes{kind="kv"}`, `tandem_memory_bytes{kind="go_heap"}`, "tandem_tokens_generated_total 5",
		`tandem_requests_finished_total{outcome="completed"} 1`, "tandem_offered_load ", `tandem_lane_batch_cap{lane="cpu0"}`,
		`tandem_lane_waiting{lane="cpu1"} 0`, `tandem_lane_much_slower{lane="cpu0"} 0`, `tandem_lane_much_slower{lane="cpu1"} 0`,
		"tandem_scheduler_stalled_seconds 0", `tandem_lane_info{lane="cpu0",threads="1",cpus=""} 1`,
		`tandem_lane_info{lane="cpu1",threads="1",cpus="` + pin.String() + `"} 1`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if strings.Contains(text, "tandem_lane_spec_") {
		t.Error("lanes that decode with the model alone have speculative metrics")
	}
	// Every line is a comment or "name{labels} value", and by Prometheus'
	// conventions a _total is a counter.
	values := map[string]float64{}
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		if f := strings.Fields(line); len(f) == 4 && f[1] == "TYPE" && strings.HasSuffix(f[2], "_total") && f[3] != "counter" {
			t.Errorf("%s is a %s, want a counter", f[2], f[3])
		}
		if strings.HasPrefix(line, "# HELP ") || strings.HasPrefix(line, "# TYPE ") {
			continue
		}
		var name string
		var v float64
		if _, err := fmt.Sscanf(strings.Replace(line, " ", "\t", 1), "%s\t%g", &name, &v); err != nil {
			t.Errorf("bad metric line %q: %v", line, err)
		}
		values[name] = v
	}
	// The lanes' part of the scheduler's time is positive (they delivered
	// and planned the request's steps) and below the total, which also
	// counts the intake's scoring and queueing.
	total := values["tandem_scheduler_seconds_total"]
	l0, ok0 := values[`tandem_lane_scheduler_seconds_total{lane="cpu0"}`]
	l1, ok1 := values[`tandem_lane_scheduler_seconds_total{lane="cpu1"}`]
	if !ok0 || !ok1 || l0+l1 <= 0 || l0+l1 >= total {
		t.Errorf("scheduler seconds: total %g, lanes %g and %g (listed: %v, %v); want lanes > 0 and below the total", total, l0, l1, ok0, ok1)
	}
	// The five tokens of the one completion followed its prompt and the
	// answer before each: 5·prompt + 0+1+2+3+4.
	if a := values["tandem_attended_tokens_total"]; a <= 10 || int(a-10)%5 != 0 {
		t.Errorf("attended tokens %g, want 5·prompt tokens + 10", a)
	}
	// The lanes' tokens add up to the total.
	if t0, t1 := values[`tandem_lane_tokens_generated_total{lane="cpu0"}`], values[`tandem_lane_tokens_generated_total{lane="cpu1"}`]; t0+t1 != values["tandem_tokens_generated_total"] {
		t.Errorf("lane tokens %g + %g, want the total %g", t0, t1, values["tandem_tokens_generated_total"])
	}
	resp, err = http.Get(fx.http.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	data, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(data), `"status":"ok"`) {
		t.Errorf("healthz %d %s", resp.StatusCode, data)
	}
	resp, err = http.Get(fx.http.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	data, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(data), `"id":"stories260K"`) {
		t.Errorf("models: %s", data)
	}
}

func TestGracefulShutdown(t *testing.T) {
	fx := newFixture(t, fixtureOpts{})
	short := make(chan int)
	go func() {
		code, _, _ := post(t, fx.http.URL+"/v1/completions", `{"prompt":"Once","max_tokens":3}`)
		short <- code
	}()
	resp, err := http.Post(fx.http.URL+"/v1/completions", "application/json",
		strings.NewReader(`{"prompt":"Once upon a time","max_tokens":500,"stream":true,"temperature":0}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	if _, err := rd.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	if c := <-short; c != 200 {
		t.Errorf("short request: %d", c)
	}
	// Greedy, the long request runs 341 tokens before its end of text:
	// past a millisecond on any machine (it once had 30 ms, which faster
	// kernels made enough to finish it).
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	if err := fx.srv.Shutdown(ctx); err == nil {
		t.Error("shutdown reported a full drain, but a 500-token request was running")
	}
	rest, _ := io.ReadAll(rd)
	if !strings.Contains(string(rest), "shutting_down") || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Errorf("stream after shutdown ends %q", tail(string(rest), 200))
	}
	code, _, body := post(t, fx.http.URL+"/v1/completions", `{"prompt":"x"}`)
	if code != 503 {
		t.Errorf("after shutdown: %d %s", code, body)
	}
	if fx.live() != 0 {
		t.Errorf("%d sequences live after shutdown", fx.live())
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
