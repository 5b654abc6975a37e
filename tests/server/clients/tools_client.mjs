// Tool calls end to end: a model that emits Qwen/Hermes <tool_call> tags (a scripted
// checkpoint, see tests/support/make_scripted_model.cpp) behind the real server, read by the
// official `openai` and `@anthropic-ai/sdk` clients, whole and streamed.
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';

const model = process.env.MODEL;
const openai = new OpenAI({ baseURL: `${process.env.BASE_URL}/v1`, apiKey: process.env.API_KEY });
const anthropic = new Anthropic({ baseURL: process.env.BASE_URL, apiKey: process.env.API_KEY });
const expected = { city: 'Paris' };
const parameters = { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] };
const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];

function checkUsage(usage) {
  assert.ok(usage.prompt_tokens > 0);
  assert.ok(usage.completion_tokens > 10);
  assert.equal(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens);
}

// Chat Completions.
const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather by city', parameters } }];
const chat = await openai.chat.completions.create({ model, messages, tools, max_tokens: 40 });
const choice = chat.choices[0];
assert.equal(choice.finish_reason, 'tool_calls');
assert.ok(!choice.message.content);
assert.equal(choice.message.tool_calls.length, 1);
assert.equal(choice.message.tool_calls[0].type, 'function');
assert.equal(choice.message.tool_calls[0].function.name, 'get_weather');
assert.deepEqual(JSON.parse(choice.message.tool_calls[0].function.arguments), expected);
checkUsage(chat.usage);

const stream = await openai.chat.completions.create({
  model, messages, tools, max_tokens: 40, stream: true, stream_options: { include_usage: true },
});
const calls = [];
let finish = null;
let usage = null;
let content = '';
for await (const chunk of stream) {
  if (chunk.usage) usage = chunk.usage;
  for (const c of chunk.choices) {
    content += c.delta.content ?? '';
    finish = c.finish_reason ?? finish;
    for (const delta of c.delta.tool_calls ?? []) {
      calls[delta.index] ??= { id: '', name: '', arguments: '' };
      calls[delta.index].id += delta.id ?? '';
      calls[delta.index].name += delta.function?.name ?? '';
      calls[delta.index].arguments += delta.function?.arguments ?? '';
    }
  }
}
assert.equal(finish, 'tool_calls');
assert.equal(content, '');
assert.equal(calls.length, 1);
assert.ok(calls[0].id.length > 0);
assert.equal(calls[0].name, 'get_weather');
assert.deepEqual(JSON.parse(calls[0].arguments), expected);
checkUsage(usage);

// Without tools in the request the same output is plain text.
const noTools = await openai.chat.completions.create({ model, messages, max_tokens: 40 });
assert.equal(noTools.choices[0].finish_reason, 'stop');
assert.equal(noTools.choices[0].message.tool_calls, undefined);
assert.ok(noTools.choices[0].message.content.startsWith('<tool_call>{"name":"get_weather"'));

// Responses.
const responseTools = [{ type: 'function', name: 'get_weather', description: 'Weather by city', parameters }];
const response = await openai.responses.create({ model, input: messages, tools: responseTools, max_output_tokens: 40 });
assert.equal(response.status, 'completed');
const functionCall = response.output.find((item) => item.type === 'function_call');
assert.equal(functionCall.name, 'get_weather');
assert.deepEqual(JSON.parse(functionCall.arguments), expected);
assert.ok(response.usage.output_tokens > 10);

const responseStream = openai.responses.stream({ model, input: messages, tools: responseTools, max_output_tokens: 40 });
const types = new Set();
for await (const event of responseStream) types.add(event.type);
const final = await responseStream.finalResponse();
assert.ok(types.has('response.completed'));
const streamedCall = final.output.find((item) => item.type === 'function_call');
assert.deepEqual(JSON.parse(streamedCall.arguments), expected);

// Anthropic Messages: tool_use blocks with object input, then a tool_result turn.
const anthropicTools = [{ name: 'get_weather', description: 'Weather by city', input_schema: parameters }];
const message = await anthropic.messages.create({ model, max_tokens: 40, messages, tools: anthropicTools });
assert.equal(message.stop_reason, 'tool_use');
const toolUse = message.content.find((block) => block.type === 'tool_use');
assert.equal(toolUse.name, 'get_weather');
assert.deepEqual(toolUse.input, expected);
assert.ok(message.usage.input_tokens > 0 && message.usage.output_tokens > 10);

const followUp = [...messages,
  { role: 'assistant', content: message.content },
  { role: 'user', content: [{ type: 'tool_result', tool_use_id: toolUse.id, content: 'Sunny, 21 C' }] }];
const messageStream = anthropic.messages.stream({ model, max_tokens: 40, messages: followUp, tools: anthropicTools });
const finalMessage = await messageStream.finalMessage();
assert.equal(finalMessage.stop_reason, 'tool_use');
assert.deepEqual(finalMessage.content.find((block) => block.type === 'tool_use').input, expected);
assert.ok(finalMessage.usage.input_tokens > message.usage.input_tokens);

console.log('tool calls: chat, chat stream, responses, responses stream, messages, messages stream ok');
