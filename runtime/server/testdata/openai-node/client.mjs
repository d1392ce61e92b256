// Drives a tandem server with the official OpenAI Node library, unchanged
// but for the base URL, and prints what each call returned as one JSON
// object for TestOfficialOpenAINodeClient to check. Usage:
// node client.mjs BASE_URL MODEL
import OpenAI from "openai";

const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0 });
const out = {};

const models = await client.models.list();
out.models = models.data.map((m) => m.id);

const params = { model, prompt: "Once upon a time", max_tokens: 20, temperature: 0 };
const c = await client.completions.create(params);
out.completion = {
	text: c.choices[0].text,
	tokens: c.usage.completion_tokens,
	finish: c.choices[0].finish_reason,
};

// tandem's extension fields go in the body as they are: the library sends
// what it is given.
const stream = await client.completions.create({
	...params,
	stream: true,
	stream_options: { include_usage: true },
	deadline_ms: 30000,
	priority: 2,
});
out.streamed = { text: "", tokens: 0 };
for await (const chunk of stream) {
	for (const choice of chunk.choices) {
		out.streamed.text += choice.text;
	}
	if (chunk.usage) {
		out.streamed.tokens = chunk.usage.completion_tokens;
	}
}

const messages = [
	{ role: "system", content: "You tell stories." },
	{ role: "user", content: "A story about a dog." },
];
const chat = { model, messages, max_tokens: 16, temperature: 0 };
const cc = await client.chat.completions.create(chat);
out.chat = { content: cc.choices[0].message.content, tokens: cc.usage.completion_tokens };

// The library's stream helper accumulates the deltas into a message with
// its own fields added (refusal, parsed), which a next turn sends back.
const helper = client.chat.completions.stream(chat);
const final = await helper.finalChatCompletion();
const answer = final.choices[0].message;
out.chatStreamed = { content: answer.content };
const next = await client.chat.completions.create({
	...chat,
	messages: [...messages, answer, { role: "user", content: "And a cat?" }],
});
out.nextTurn = { content: next.choices[0].message.content, tokens: next.usage.completion_tokens };

// A bad request arrives as the library's typed error.
try {
	await client.completions.create({ ...params, max_tokens: 0 });
	out.badRequest = { thrown: false };
} catch (err) {
	out.badRequest = {
		thrown: true,
		apiError: err instanceof OpenAI.BadRequestError,
		status: err.status,
		param: err.param ?? null,
		type: err.type ?? null,
	};
}

// A client that stops reading aborts the request: the server is to free
// its sequence (the test watches the engines' live sequences).
const long = await client.completions.create({ ...params, max_tokens: 400, stream: true });
let seen = 0;
for await (const chunk of long) {
	seen += chunk.choices.length;
	if (seen >= 2) {
		long.controller.abort();
		break;
	}
}
out.aborted = { chunks: seen };

console.log(JSON.stringify(out));
