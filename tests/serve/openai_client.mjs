// The official `openai` npm client against `linearize serve` (run by tests/test_serve_http.cpp):
// completions, chat, and both streamed; exits non-zero with a message on the first mismatch.
// Environment: OPENAI_BASE_URL (http://127.0.0.1:PORT/v1), MODEL (the served name), EXPECTED (the greedy
// completion of PROMPT for 8 tokens, from `linearize generate`), PROMPT.
import OpenAI from "openai";

const client = new OpenAI({ baseURL: process.env.OPENAI_BASE_URL, apiKey: "unused" });
const model = process.env.MODEL;
const fail = (what) => { console.error("FAIL: " + what); process.exit(1); };

const c = await client.completions.create({ model, prompt: process.env.PROMPT, max_tokens: 8, temperature: 0 });
if (c.object !== "text_completion") fail("completion object " + c.object);
if (c.choices[0].text !== process.env.EXPECTED) fail(`completion text ${JSON.stringify(c.choices[0].text)} != ${JSON.stringify(process.env.EXPECTED)}`);
if (c.usage.completion_tokens < 1 || c.usage.total_tokens !== c.usage.prompt_tokens + c.usage.completion_tokens) fail("usage " + JSON.stringify(c.usage));

let streamed = "";
for await (const chunk of await client.completions.create({ model, prompt: process.env.PROMPT, max_tokens: 8, temperature: 0, stream: true }))
  streamed += chunk.choices[0]?.text ?? "";
if (streamed !== c.choices[0].text) fail(`streamed completion ${JSON.stringify(streamed)} != ${JSON.stringify(c.choices[0].text)}`);

const messages = [{ role: "system", content: "be brief" }, { role: "user", content: "the cat" }];
const chat = await client.chat.completions.create({ model, messages, max_tokens: 10, temperature: 0 });
if (chat.choices[0].message.role !== "assistant") fail("chat role " + chat.choices[0].message.role);
let chatStreamed = "", roles = 0, usage = null;
for await (const chunk of await client.chat.completions.create({ model, messages, max_tokens: 10, temperature: 0, stream: true, stream_options: { include_usage: true } })) {
  if (chunk.usage) usage = chunk.usage;
  const d = chunk.choices[0]?.delta;
  if (d?.role) roles++;
  chatStreamed += d?.content ?? "";
}
if (chatStreamed !== chat.choices[0].message.content) fail(`streamed chat ${JSON.stringify(chatStreamed)} != ${JSON.stringify(chat.choices[0].message.content)}`);
if (roles !== 1) fail("the role came in " + roles + " chunks");
if (!usage || usage.completion_tokens !== chat.usage.completion_tokens) fail("stream usage " + JSON.stringify(usage));

try {
  await client.completions.create({ model: "no-such-model", prompt: "x", max_tokens: 2 });
  fail("an unknown model was accepted");
} catch (e) {
  if (!(e instanceof OpenAI.BadRequestError) || e.param !== "model") fail("unknown model gave " + e);
}
const models = await client.models.list();
if (models.data.length !== 1 || models.data[0].id !== model) fail("models " + JSON.stringify(models.data));
console.log("openai client: completions, chat, streaming, errors and models all agree");
