// Streams a chat completion from `myriad serve` through the official OpenAI
// Node.js SDK and prints the text. Also lists models, makes one
// non-streamed call and checks that an unknown model surfaces as the SDK's
// NotFoundError. Environment: MYRIAD_URL (http://host:port), MYRIAD_MODEL,
// MYRIAD_API_KEY (optional). Exit 0 only if the stream finished with text.
import OpenAI from 'openai';

const url = process.env.MYRIAD_URL;
const model = process.env.MYRIAD_MODEL;
if (!url || !model) {
  console.error('stream_chat.mjs: set MYRIAD_URL and MYRIAD_MODEL');
  process.exit(2);
}
const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: process.env.MYRIAD_API_KEY || 'none', maxRetries: 0 });

const models = await client.models.list();
const ids = models.data.map((m) => m.id);
if (!ids.includes(model)) throw new Error(`models.list() gave ${JSON.stringify(ids)}, expected ${model}`);

// Short: the tiny test model's context is 64 tokens.
const messages = [{ role: 'user', content: 'Status of a function?' }];
const stream = await client.chat.completions.create({
  model, messages, stream: true, stream_options: { include_usage: true },
  max_tokens: 24, temperature: 0.8, seed: 11,
});
let text = '';
let finish = null;
let usage = null;
let chunks = 0;
for await (const chunk of stream) {
  chunks++;
  if (chunk.usage) usage = chunk.usage;
  for (const choice of chunk.choices) {
    if (choice.delta?.content) text += choice.delta.content;
    if (choice.finish_reason) finish = choice.finish_reason;
  }
}
process.stdout.write(`${text}\n`);

const once = await client.chat.completions.create({ model, messages, max_tokens: 24, temperature: 0.8, seed: 11 });

let notFound = false;
try {
  await client.chat.completions.create({ model: 'no-such-model', messages });
} catch (e) {
  notFound = e instanceof OpenAI.NotFoundError && e.status === 404;
}

const report = {
  chunks, finish, usage, text_chars: text.length,
  same_as_non_streamed: once.choices[0].message.content === text,
  non_streamed_finish: once.choices[0].finish_reason,
  not_found_error: notFound,
};
console.error(`stream_chat: ${JSON.stringify(report)}`);
const ok = text.length > 0 && (finish === 'stop' || finish === 'length') && usage && usage.completion_tokens > 0 &&
  report.same_as_non_streamed && notFound;
process.exit(ok ? 0 : 1);
