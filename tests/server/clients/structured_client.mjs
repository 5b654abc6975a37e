// Structured output end to end: the official `openai` and `@anthropic-ai/sdk` clients ask a
// Qwen3 checkpoint (random weights: only the constraint makes its output JSON) for JSON Schema
// answers, strict tool arguments, regex, choice and grammar output, whole and streamed, and
// every answer is checked with a validator (ajv) or the pattern it had to match.
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import Ajv from 'ajv';
import OpenAI from 'openai';

const model = process.env.MODEL;
const openai = new OpenAI({ baseURL: `${process.env.BASE_URL}/v1`, apiKey: process.env.API_KEY });
const anthropic = new Anthropic({ baseURL: process.env.BASE_URL, apiKey: process.env.API_KEY });
const ajv = new Ajv({ strict: true, allErrors: true });
const messages = [{ role: 'user', content: 'Plan a trip.' }];

const schema = {
  type: 'object',
  properties: {
    city: { type: 'string', maxLength: 12 },
    days: { type: 'integer', minimum: 1, maximum: 14 },
    mode: { enum: ['train', 'car', 'plane'] },
    stops: { type: 'array', items: { type: 'string', maxLength: 6 }, maxItems: 3 },
  },
  required: ['city', 'days', 'mode'],
  additionalProperties: false,
};
const valid = ajv.compile(schema);

function expectValid(text, where) {
  let value;
  try {
    value = JSON.parse(text);
  } catch (error) {
    assert.fail(`${where}: not JSON: ${JSON.stringify(text)}`);
  }
  assert.ok(valid(value), `${where}: ${JSON.stringify(text)} ${ajv.errorsText(valid.errors)}`);
}

// Room for the white space a random model puts between the parts (runs of at most 48 bytes).
const sampling = { max_tokens: 2000, temperature: 0 };
const responseFormat = { type: 'json_schema', json_schema: { name: 'trip', schema, strict: true } };

// Chat Completions, whole and streamed.
const chat = await openai.chat.completions.create({
  model, messages, ...sampling, response_format: responseFormat,
});
assert.equal(chat.choices[0].finish_reason, 'stop');
expectValid(chat.choices[0].message.content, 'chat');

const chatStream = await openai.chat.completions.create({
  model, messages, ...sampling, response_format: responseFormat, stream: true,
});
let streamed = '';
for await (const chunk of chatStream) streamed += chunk.choices[0]?.delta?.content ?? '';
expectValid(streamed, 'chat stream');

// Completions.
const completion = await openai.completions.create({
  model, prompt: 'Trip:', ...sampling, response_format: responseFormat,
});
assert.equal(completion.choices[0].finish_reason, 'stop');
expectValid(completion.choices[0].text, 'completions');

// Responses: text.format puts name and schema beside the type.
const textFormat = { format: { type: 'json_schema', name: 'trip', schema, strict: true } };
const response = await openai.responses.create({
  model, input: messages, max_output_tokens: 2000, temperature: 0, text: textFormat,
});
assert.equal(response.status, 'completed');
expectValid(response.output_text, 'responses');

// A forced strict tool: its arguments follow the parameters schema.
const tools = [{
  type: 'function', function: { name: 'plan_trip', description: 'Plan a trip', parameters: schema, strict: true },
}];
const forced = await openai.chat.completions.create({
  model, messages, ...sampling, tools, tool_choice: { type: 'function', function: { name: 'plan_trip' } },
});
const call = forced.choices[0].message.tool_calls?.[0];
assert.ok(call, `no tool call: ${JSON.stringify(forced.choices[0].message)}`);
assert.equal(call.function.name, 'plan_trip');
expectValid(call.function.arguments, 'strict tool');

const forcedStream = await openai.chat.completions.create({
  model, messages, ...sampling, tools, stream: true,
  tool_choice: { type: 'function', function: { name: 'plan_trip' } },
});
let streamedArguments = '';
let streamedName = '';
let streamedFinish = null;
for await (const chunk of forcedStream) {
  const choice = chunk.choices[0];
  for (const delta of choice?.delta?.tool_calls ?? []) {
    streamedName += delta.function?.name ?? '';
    streamedArguments += delta.function?.arguments ?? '';
  }
  streamedFinish = choice?.finish_reason ?? streamedFinish;
}
assert.equal(streamedName, 'plan_trip');
assert.equal(streamedFinish, 'tool_calls');
expectValid(streamedArguments, 'strict tool stream');

// vLLM's structured_outputs (passed through the client's body): regex, choice and grammar.
const regex = await openai.completions.create({
  model, prompt: 'Date:', ...sampling, structured_outputs: { regex: '20[0-9]{2}-(0[1-9]|1[0-2])' },
});
assert.match(regex.choices[0].text, /^20[0-9]{2}-(0[1-9]|1[0-2])$/);
const choice = await openai.chat.completions.create({
  model, messages, ...sampling, structured_outputs: { choice: ['yes', 'no', 'maybe'] },
});
assert.ok(['yes', 'no', 'maybe'].includes(choice.choices[0].message.content));
const grammar = 'root ::= "(" item ("," item)* ")"\nitem ::= [a-c] | root';
const grammarCompletion = await openai.completions.create({
  model, prompt: 'List:', ...sampling, structured_outputs: { grammar },
});
const nested = grammarCompletion.choices[0].text;
assert.equal(grammarCompletion.choices[0].finish_reason, 'stop');
assert.match(nested, /^[(),a-c]+$/);
let depth = 0;
for (const c of nested) {
  depth += c === '(' ? 1 : c === ')' ? -1 : 0;
  assert.ok(depth >= 0, nested);
}
assert.equal(depth, 0, nested);

// Anthropic Messages: output_config.format, whole and streamed.
const outputConfig = { format: { type: 'json_schema', schema } };
const message = await anthropic.messages.create({
  model, max_tokens: 2000, temperature: 0, messages, output_config: outputConfig,
});
assert.equal(message.stop_reason, 'end_turn');
expectValid(message.content.find((block) => block.type === 'text').text, 'messages');

const messageStream = anthropic.messages.stream({
  model, max_tokens: 2000, temperature: 0, messages, output_config: outputConfig,
});
const final = await messageStream.finalMessage();
expectValid(final.content.find((block) => block.type === 'text').text, 'messages stream');

// Anthropic tools: a forced strict tool's input follows its input_schema, whole and streamed.
const anthropicTools = [{ name: 'plan_trip', description: 'Plan a trip', input_schema: schema, strict: true }];
const toolUse = await anthropic.messages.create({
  model, max_tokens: 2000, temperature: 0, messages, tools: anthropicTools,
  tool_choice: { type: 'tool', name: 'plan_trip' },
});
assert.equal(toolUse.stop_reason, 'tool_use');
const useBlock = toolUse.content.find((block) => block.type === 'tool_use');
assert.ok(useBlock, JSON.stringify(toolUse.content));
assert.equal(useBlock.name, 'plan_trip');
expectValid(JSON.stringify(useBlock.input), 'anthropic tool');

const toolStream = anthropic.messages.stream({
  model, max_tokens: 2000, temperature: 0, messages, tools: anthropicTools,
  tool_choice: { type: 'tool', name: 'plan_trip' },
});
const toolFinal = await toolStream.finalMessage();
const streamedUse = toolFinal.content.find((block) => block.type === 'tool_use');
assert.ok(streamedUse, JSON.stringify(toolFinal.content));
expectValid(JSON.stringify(streamedUse.input), 'anthropic tool stream');

console.log('structured: chat, chat stream, completions, responses, strict tool (whole, streamed), regex, choice, grammar, messages, messages stream, anthropic tool (whole, streamed) ok');
