// The official `@anthropic-ai/sdk` client against a running server (BASE_URL, API_KEY):
// messages whole and streamed, with a tool-use exchange in the history; errors in
// Anthropic's shape.
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';

const client = new Anthropic({ baseURL: process.env.BASE_URL, apiKey: process.env.API_KEY });
const model = process.env.MODEL;
const request = {
  model, max_tokens: 8, temperature: 0, system: 'You complete Python code.',
  messages: [{ role: 'user', content: [{ type: 'text', text: 'def add(a, b):' }] }],
};

const message = await client.messages.create(request);
assert.equal(message.type, 'message');
assert.equal(message.role, 'assistant');
assert.equal(message.content[0].type, 'text');
assert.ok(['end_turn', 'max_tokens', 'stop_sequence'].includes(message.stop_reason));
assert.ok(message.usage.input_tokens > 0);
assert.ok(message.usage.output_tokens > 0 && message.usage.output_tokens <= 8);

const stream = client.messages.stream(request);
const seen = new Set();
let text = '';
for await (const event of stream) {
  seen.add(event.type);
  if (event.type === 'content_block_delta') text += event.delta.text;
}
const final = await stream.finalMessage();
for (const type of ['message_start', 'content_block_start', 'content_block_delta',
  'content_block_stop', 'message_delta', 'message_stop']) {
  assert.ok(seen.has(type), `stream lacks ${type}`);
}
assert.equal(text, message.content[0].text);
assert.equal(final.content[0].text, message.content[0].text);
assert.equal(final.stop_reason, message.stop_reason);
assert.equal(final.usage.output_tokens, message.usage.output_tokens);

const withTools = await client.messages.create({
  ...request,
  tools: [{ name: 'run', description: 'Run code', input_schema: { type: 'object', properties: { code: { type: 'string' } } } }],
  messages: [
    { role: 'user', content: 'Run print(1)' },
    { role: 'assistant', content: [{ type: 'tool_use', id: 'toolu_1', name: 'run', input: { code: 'print(1)' } }] },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: '1' }] },
  ],
});
assert.ok(withTools.usage.input_tokens > 0);

await assert.rejects(
  new Anthropic({ baseURL: process.env.BASE_URL, apiKey: 'wrong' }).messages.create(request),
  (error) => error.status === 401 && error.error?.error?.type === 'authentication_error');
await assert.rejects(
  client.messages.create({ ...request, max_tokens: 20_000 }),  // over the 4096 context
  (error) => error.status === 400 && error.error?.error?.type === 'invalid_request_error');
console.log('anthropic client: all calls parsed');
