package server

import (
	"fmt"
	"strings"
)

// The chat template. tandem's test models (stories260K and the like) have
// no chat template, and tandem does not run the Jinja templates some GGUF
// files carry, so chat requests use one plain transcript format:
//
//	{system message}\n\n
//	User: {user message}\n
//	Assistant: {assistant message}\n
//	...
//	Assistant:
//
// and generation stops at "\nUser:" so the model does not write the
// user's next turn.
const (
	chatUser      = "User: "
	chatAssistant = "Assistant:"
	chatStop      = "\nUser:"
)

// renderChat applies the template; roles other than system, user and
// assistant (and developer, OpenAI's newer name for system) are refused.
func renderChat(msgs []chatMessage) (string, *apiError) {
	if len(msgs) == 0 {
		return "", badRequest("messages", "messages is empty; send at least one message")
	}
	if len(msgs) > maxMessages {
		return "", badRequest("messages", "%d messages, at most %d", len(msgs), maxMessages)
	}
	var b strings.Builder
	for i, m := range msgs {
		if err := m.check(i); err != nil {
			return "", err
		}
		text, err := messageText(i, m.Content)
		if err != nil {
			return "", err
		}
		if text == "" && m.Refusal != nil {
			text = *m.Refusal
		}
		if absent(m.Content) && m.Refusal == nil && m.Role != "assistant" && m.Role != "" {
			// As OpenAI: only an assistant's turn may come without text
			// (it called tools instead, which tandem refuses above).
			return "", badRequest(fmt.Sprintf("messages[%d].content", i), "content is required in a %s message", m.Role)
		}
		if b.Len()+len(text) > maxContentSize {
			return "", badRequest("messages", "the conversation is over %d bytes", maxContentSize)
		}
		switch m.Role {
		case "system", "developer":
			b.WriteString(text)
			b.WriteString("\n\n")
		case "user":
			b.WriteString(chatUser)
			b.WriteString(text)
			b.WriteString("\n")
		case "assistant":
			// An answer starts with the space the model wrote after
			// "Assistant:" (" Cat sat."), or without it when the client
			// trimmed it: either way one space, so the transcript is
			// what the model generated, and its next turn reads its own
			// words and reuses their KV rows (prefix reuse).
			b.WriteString(chatAssistant)
			b.WriteString(" ")
			b.WriteString(strings.TrimPrefix(text, " "))
			b.WriteString("\n")
		case "":
			return "", badRequest(fmt.Sprintf("messages[%d].role", i), "role is required")
		default:
			return "", badRequest(fmt.Sprintf("messages[%d].role", i), "role %q: want system, developer, user or assistant", m.Role)
		}
	}
	b.WriteString(chatAssistant)
	return b.String(), nil
}
