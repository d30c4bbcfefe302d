// Drives a running evoke-serve with the official openai npm client (the
// version pinned in package-lock.json), as a user's program would:
//
//   node tests/serve_js/openai_client.mjs http://127.0.0.1:PORT/v1
//
// Checks listing models, a completion that answers a fact, a chat (whole and
// streamed, with usage), a returning conversation served from cache, and
// that the client's own error classes carry evoke-serve's errors. Exits 1
// with a line per failure, 0 when all hold.
import OpenAI from "openai";

const baseURL = process.argv[2];
if (!baseURL) {
  console.error("usage: openai_client.mjs BASE_URL");
  process.exit(2);
}
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0, timeout: 60_000 });
const failures = [];
const check = (ok, what) => {
  if (!ok) failures.push(what);
};
const fact =
  "the code for red fox is 4 2 7 . the code for blue cat is 9 1 3 . question : what is the " +
  "code for red fox ? answer :";

const models = await client.models.list();
check(models.data.length === 1 && models.data[0].id === "evoke-recall", "models.list: evoke-recall");

const completion = await client.completions.create({
  model: "evoke-recall", prompt: fact, max_tokens: 4, temperature: 0,
});
check(completion.choices[0].text === " 4 2 7 .", `completion text: '${completion.choices[0].text}'`);
check(completion.usage.completion_tokens === 4, "completion usage");

// The same prompt again: the slot still holds it.
const again = await client.completions.create({
  model: "evoke-recall", prompt: fact, max_tokens: 4, temperature: 0,
});
check(again.choices[0].text === " 4 2 7 .", "completion again: same answer");
check(again.usage.prompt_tokens_details?.cached_tokens === again.usage.prompt_tokens - 1,
      `completion again: cached ${again.usage.prompt_tokens_details?.cached_tokens} of ` +
      `${again.usage.prompt_tokens}`);

const chat = await client.chat.completions.create({
  model: "evoke-recall", messages: [{ role: "user", content: fact }], max_tokens: 5,
  temperature: 0,
});
check(chat.object === "chat.completion", "chat object");
check(chat.choices[0].message.role === "assistant", "chat role");
check(typeof chat.choices[0].message.content === "string" && chat.choices[0].message.content.length > 0,
      "chat content");

const stream = await client.chat.completions.create({
  model: "evoke-recall", messages: [{ role: "user", content: fact }], max_tokens: 5,
  temperature: 0, stream: true, stream_options: { include_usage: true },
});
let streamed = "";
let finish = null;
let usage = null;
for await (const chunk of stream) {
  if (chunk.usage) usage = chunk.usage;
  for (const choice of chunk.choices) {
    streamed += choice.delta?.content ?? "";
    if (choice.finish_reason) finish = choice.finish_reason;
  }
}
check(streamed === chat.choices[0].message.content,
      `stream text '${streamed}' == whole '${chat.choices[0].message.content}'`);
check(finish === "length", `stream finish_reason ${finish}`);
check(usage?.completion_tokens === 5, "stream usage");

try {
  await client.chat.completions.create({ model: "gpt-9", messages: [{ role: "user", content: "x" }] });
  check(false, "unknown model: no error");
} catch (e) {
  check(e instanceof OpenAI.NotFoundError && e.code === "model_not_found",
        `unknown model: ${e.constructor.name} ${e.code}`);
}
try {
  await client.completions.create({ model: "evoke-recall", prompt: "x", max_tokens: -1 });
  check(false, "max_tokens -1: no error");
} catch (e) {
  check(e instanceof OpenAI.BadRequestError && e.param === "max_tokens",
        `max_tokens -1: ${e.constructor.name} ${e.param}`);
}

if (failures.length > 0) {
  for (const f of failures) console.error(`FAILED: ${f}`);
  process.exit(1);
}
console.log("openai client: all checks passed");
