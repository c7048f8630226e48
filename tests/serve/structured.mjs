// Structured output through the openai SDK against the bundled tiny model: response_format
// json_schema and json_object answers are JSON (schema-valid), plain and streamed alike; a schema
// the server cannot honour is a 400 naming the keyword; tool_choice "required" returns a tool call
// whose arguments match the tool's parameters.
import { check, client, parseArgs, run } from './common.mjs';

run(async () => {
  const args = parseArgs();
  const openai = client(args);
  const messages = [{ role: 'user', content: 'Describe a person as JSON.' }];
  // Every part bounded, so even greedy decoding of a tiny model ends well within max_tokens.
  const schema = {
    type: 'object',
    properties: {
      name: { type: 'string', maxLength: 12 },
      age: { type: 'integer' },
      role: { enum: ['admin', 'user', 'guest'] },
      tags: { type: 'array', items: { type: 'string', maxLength: 6 }, maxItems: 3 },
      address: { type: ['object', 'null'], properties: { city: { type: 'string', maxLength: 10 } }, required: ['city'], additionalProperties: false },
    },
    required: ['name', 'age', 'role', 'tags', 'address'],
    additionalProperties: false,
  };
  const request = {
    model: args.model, messages, max_tokens: 400, temperature: 0,
    response_format: { type: 'json_schema', json_schema: { name: 'person', strict: true, schema } },
  };
  const res = await openai.chat.completions.create(request);
  const choice = res.choices[0];
  check(choice.finish_reason === 'stop', 'json_schema answer finished: ' + choice.finish_reason);
  const value = JSON.parse(choice.message.content);
  check(typeof value.name === 'string' && value.name.length <= 12, 'name');
  check(Number.isInteger(value.age), 'age');
  check(['admin', 'user', 'guest'].includes(value.role), 'role');
  check(Array.isArray(value.tags) && value.tags.length <= 3 && value.tags.every((t) => typeof t === 'string'), 'tags');
  check(value.address === null || typeof value.address.city === 'string', 'address');
  check(Object.keys(value).every((k) => k in schema.properties), 'no other properties');
  // Streamed: the same text.
  const stream = await openai.chat.completions.create({ ...request, stream: true });
  let streamed = '';
  for await (const chunk of stream) streamed += chunk.choices[0]?.delta?.content ?? '';
  check(streamed === choice.message.content, 'streamed json_schema answer == plain');

  // json_object: any object, sampled.
  const obj = await openai.chat.completions.create({
    model: args.model, messages, max_tokens: 600, temperature: 0.7, seed: 7, frequency_penalty: 0.5,
    response_format: { type: 'json_object' },
  });
  check(obj.choices[0].finish_reason === 'stop', 'json_object answer finished: ' + obj.choices[0].finish_reason);
  const parsed = JSON.parse(obj.choices[0].message.content);
  check(typeof parsed === 'object' && parsed !== null && !Array.isArray(parsed), 'json_object gives an object');

  // Refused schemas are a 400 naming the keyword.
  for (const [bad, word] of [[{ type: 'string', pattern: '^a+$' }, 'pattern'], [{ type: 'integer', minimum: 1 }, 'minimum']]) {
    let status = 0, message = '';
    try {
      await openai.chat.completions.create({
        model: args.model, messages, max_tokens: 8,
        response_format: { type: 'json_schema', json_schema: { name: 'x', schema: bad } },
      });
    } catch (e) {
      status = e.status;
      message = e.message;
    }
    check(status === 400 && message.includes(word), `schema with ${word}: ${status} ${message}`);
  }

  // tool_choice "required": one of the tools is called, with arguments matching its parameters.
  const tools = [
    { type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 16 }, unit: { enum: ['c', 'f'] } }, required: ['city', 'unit'], additionalProperties: false } } },
    { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: { zone: { type: 'string', maxLength: 8 } }, required: ['zone'], additionalProperties: false } } },
  ];
  const call = await openai.chat.completions.create({
    model: args.model, messages: [{ role: 'user', content: 'Weather in Paris?' }], tools, tool_choice: 'required',
    max_tokens: 200, temperature: 0,
  });
  const tc = call.choices[0];
  check(tc.finish_reason === 'tool_calls', 'required tool call made: ' + tc.finish_reason + ' ' + JSON.stringify(tc.message));
  const fn = tc.message.tool_calls[0].function;
  const a = JSON.parse(fn.arguments);
  if (fn.name === 'get_weather') check(typeof a.city === 'string' && ['c', 'f'].includes(a.unit), 'get_weather arguments');
  else check(fn.name === 'get_time' && typeof a.zone === 'string', 'get_time arguments');
  console.log('structured: ok', choice.message.content, JSON.stringify(parsed).slice(0, 80), fn.name, fn.arguments);
});
