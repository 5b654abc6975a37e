// The official `openai` client against a running server (BASE_URL, API_KEY): every call must
// parse without error and carry the right usage.
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const client = new OpenAI({ baseURL: `${process.env.BASE_URL}/v1`, apiKey: process.env.API_KEY });
const model = process.env.MODEL;
const messages = [
  { role: 'system', content: 'You complete Python code.' },
  { role: 'user', content: [{ type: 'text', text: 'def add(a, b):' }] },
];

const models = await client.models.list();
assert.equal(models.data[0].id, model);

const chat = await client.chat.completions.create({
  model, messages, max_tokens: 8, temperature: 0, seed: 1,
});
assert.equal(chat.object, 'chat.completion');
assert.equal(chat.choices[0].message.role, 'assistant');
assert.equal(typeof chat.choices[0].message.content, 'string');
assert.ok(['stop', 'length'].includes(chat.choices[0].finish_reason));
assert.ok(chat.usage.prompt_tokens > 0);
assert.equal(chat.usage.total_tokens, chat.usage.prompt_tokens + chat.usage.completion_tokens);

const stream = await client.chat.completions.create({
  model, messages, max_tokens: 8, temperature: 0, seed: 1, stream: true,
  stream_options: { include_usage: true },
});
let streamed = '';
let usage = null;
let finish = null;
for await (const chunk of stream) {
  if (chunk.usage) usage = chunk.usage;
  for (const choice of chunk.choices) {
    streamed += choice.delta.content ?? '';
    finish = choice.finish_reason ?? finish;
  }
}
assert.equal(streamed, chat.choices[0].message.content);
assert.equal(finish, chat.choices[0].finish_reason);
assert.deepEqual(usage.prompt_tokens, chat.usage.prompt_tokens);
assert.deepEqual(usage.completion_tokens, chat.usage.completion_tokens);

const tools = [{
  type: 'function',
  function: { name: 'run', description: 'Run code', parameters: { type: 'object', properties: { code: { type: 'string' } } } },
}];
const withTools = await client.chat.completions.create({
  model, messages, tools, tool_choice: 'auto', max_tokens: 6, temperature: 0,
});
assert.equal(withTools.choices.length, 1);  // this model's template has no tool section
assert.ok(withTools.usage.completion_tokens > 0);

const completion = await client.completions.create({
  model, prompt: 'def fibonacci(n):', max_tokens: 6, temperature: 0, logprobs: 2,
});
assert.equal(completion.object, 'text_completion');
assert.equal(completion.usage.completion_tokens, 6);
let text = '';
for await (const chunk of await client.completions.create({
  model, prompt: 'def fibonacci(n):', max_tokens: 6, temperature: 0, stream: true,
})) {
  text += chunk.choices[0]?.text ?? '';
}
assert.equal(text, completion.choices[0].text);

const response = await client.responses.create({
  model, instructions: 'You complete Python code.', input: 'def add(a, b):',
  max_output_tokens: 8, temperature: 0,
});
assert.equal(response.object, 'response');
assert.ok(['completed', 'incomplete'].includes(response.status));
assert.equal(response.output[0].type, 'message');
assert.equal(typeof response.output_text, 'string');
assert.ok(response.usage.input_tokens > 0 && response.usage.output_tokens > 0);
const events = [];
let deltas = '';
for await (const event of await client.responses.create({
  model, instructions: 'You complete Python code.', input: 'def add(a, b):',
  max_output_tokens: 8, temperature: 0, stream: true,
})) {
  events.push(event.type);
  if (event.type === 'response.output_text.delta') deltas += event.delta;
  if (event.type === 'response.completed') {
    assert.equal(event.response.output_text ?? event.response.output[0].content[0].text, response.output_text);
    assert.equal(event.response.usage.output_tokens, response.usage.output_tokens);
  }
}
assert.equal(events[0], 'response.created');
assert.equal(events.at(-1), 'response.completed');
assert.equal(deltas, response.output_text);
const helper = client.responses.stream({
  model, input: [{ role: 'user', content: [{ type: 'input_text', text: 'def add(a, b):' }] }],
  max_output_tokens: 8, temperature: 0,
});
const finalResponse = await helper.finalResponse();
assert.equal(finalResponse.status, response.status);

await assert.rejects(
  new OpenAI({ baseURL: `${process.env.BASE_URL}/v1`, apiKey: 'wrong' }).models.list(),
  (error) => error.status === 401);
await assert.rejects(
  client.chat.completions.create({ model: 'no-such-model', messages }),
  (error) => error.status === 404 && error.error?.type === 'not_found_error');
await assert.rejects(
  client.chat.completions.create({ model, messages, max_tokens: 1_000_000 }),
  (error) => error.status === 400 && /maximum context length/.test(error.message));
console.log('openai client: all calls parsed');
