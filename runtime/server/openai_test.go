package server

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// TestOfficialOpenAIClient drives the server with the official OpenAI Go
// library, unchanged: only the base URL points at tandem.
func TestOfficialOpenAIClient(t *testing.T) {
	fx := newFixture(t, fixtureOpts{})
	client := openai.NewClient(option.WithBaseURL(fx.http.URL+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	ctx := context.Background()

	models, err := client.Models.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(models.Data) != 1 || models.Data[0].ID != "stories260K" {
		t.Errorf("models %+v", models.Data)
	}

	want, n := fx.reference(t, "Once upon a time", 20)
	params := openai.CompletionNewParams{
		Model:       "stories260K",
		Prompt:      openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")},
		MaxTokens:   openai.Int(20),
		Temperature: openai.Float(0),
	}
	c, err := client.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Choices) != 1 || c.Choices[0].Text != want || c.Usage.CompletionTokens != int64(n) || string(c.Choices[0].FinishReason) != "length" {
		t.Errorf("completion %q (%d tokens, %s), want %q (%d)", c.Choices[0].Text, c.Usage.CompletionTokens, c.Choices[0].FinishReason, want, n)
	}

	// Streaming, with tandem's extensions set through the client's own
	// escape hatch for extra JSON fields.
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := client.Completions.NewStreaming(ctx, params, option.WithJSONSet("deadline_ms", 30000), option.WithJSONSet("priority", 2))
	var text strings.Builder
	var usage int64
	for stream.Next() {
		ch := stream.Current()
		for _, choice := range ch.Choices {
			text.WriteString(choice.Text)
		}
		if ch.Usage.CompletionTokens > 0 {
			usage = ch.Usage.CompletionTokens
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if text.String() != want || usage != int64(n) {
		t.Errorf("streamed %q (%d tokens), want %q (%d)", text.String(), usage, want, n)
	}

	chat := openai.ChatCompletionNewParams{
		Model:       "stories260K",
		Messages:    []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("You tell stories."), openai.UserMessage("A story about a dog.")},
		MaxTokens:   openai.Int(16),
		Temperature: openai.Float(0),
	}
	cc, err := client.Chat.Completions.New(ctx, chat)
	if err != nil {
		t.Fatal(err)
	}
	if len(cc.Choices) != 1 || cc.Choices[0].Message.Content == "" || cc.Usage.CompletionTokens == 0 {
		t.Fatalf("chat %+v", cc)
	}
	acc := openai.ChatCompletionAccumulator{}
	cs := client.Chat.Completions.NewStreaming(ctx, chat)
	for cs.Next() {
		acc.AddChunk(cs.Current())
	}
	if err := cs.Err(); err != nil {
		t.Fatal(err)
	}
	if len(acc.Choices) != 1 || acc.Choices[0].Message.Content != cc.Choices[0].Message.Content {
		t.Errorf("streamed chat %q, non-streamed %q", acc.Choices[0].Message.Content, cc.Choices[0].Message.Content)
	}

	// Errors arrive as the client's typed API error.
	params.MaxTokens = openai.Int(0)
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{}
	_, err = client.Completions.New(ctx, params, option.WithJSONSet("max_tokens", 0))
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Param != "max_tokens" {
		t.Errorf("bad request: %v", err)
	}
}
