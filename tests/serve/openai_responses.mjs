// The official openai SDK's responses.create against `strata serve`'s /v1/responses: a plain answer
// (instructions + input), the streamed event sequence (same text and usage as the plain answer),
// function calls and a function_call_output follow-up, and refused requests.
// The prompts must be the ones /v1/chat/completions renders for the same conversation (/tokenize).
import { check, client, httpError, parseArgs, postJson, run } from './common.mjs';

const outputText = (resp) => resp.output.filter((i) => i.type === 'message')
  .flatMap((i) => i.content).filter((c) => c.type === 'output_text').map((c) => c.text).join('');

async function expectError(promise, status, mention) {
  const err = await httpError(promise, status);
  check(err.error?.type === 'invalid_request_error', 'OpenAI error shape: ' + JSON.stringify(err.error));
  check(err.error.message.includes(mention), `the message mentions ${mention}: ${err.error.message}`);
}

function checkUsage(resp, promptTokens, maxTokens) {
  const u = resp.usage;
  check(u.input_tokens === promptTokens, `input_tokens ${u.input_tokens} == chat prompt ${promptTokens}`);
  check(u.output_tokens >= 1 && u.output_tokens <= maxTokens, 'output_tokens in [1, max_output_tokens]');
  check(u.total_tokens === u.input_tokens + u.output_tokens, 'total = input + output');
  check(typeof u.input_tokens_details.cached_tokens === 'number', 'cached_tokens');
  if (resp.status === 'incomplete') {
    check(resp.incomplete_details?.reason === 'max_output_tokens', 'incomplete => max_output_tokens');
    check(u.output_tokens === maxTokens, 'incomplete => max_output_tokens generated');
  } else {
    check(resp.status === 'completed' && resp.incomplete_details === null, 'status ' + resp.status);
  }
}

run(async () => {
  const args = parseArgs();
  const openai = client(args);
  const instructions = 'You are a helpful assistant.';
  const maxTokens = 24;
  const base = { model: args.model, instructions, input: 'Say hello.', max_output_tokens: maxTokens, temperature: 0 };
  const tokenized = await postJson(args.baseURL, '/tokenize',
    { messages: [{ role: 'system', content: instructions }, { role: 'user', content: 'Say hello.' }] }, args.apiKey);

  // Plain.
  const resp = await openai.responses.create(base);
  check(resp.object === 'response' && resp.id.startsWith('resp_') && resp.model === args.model, 'response envelope');
  check(resp.instructions === instructions && resp.max_output_tokens === maxTokens, 'request settings echoed');
  check(resp.output.length >= 1 && resp.output.every((i) => ['message', 'reasoning'].includes(i.type)), 'message/reasoning items');
  const message = resp.output.find((i) => i.type === 'message');
  check(message.role === 'assistant' && message.id.startsWith('msg_'), 'assistant message item');
  check(resp.output_text === outputText(resp), 'the SDK reads output_text');
  checkUsage(resp, tokenized.tokens.length, maxTokens);

  // The same conversation as an item list, with a developer message: the same prompt.
  const items = await openai.responses.create({
    model: args.model, max_output_tokens: 4, temperature: 0,
    input: [{ role: 'developer', content: instructions }, { type: 'message', role: 'user', content: [{ type: 'input_text', text: 'Say hello.' }] }],
  });
  check(items.usage.input_tokens === tokenized.tokens.length, 'item-list input == string input');

  // Streamed.
  const stream = await openai.responses.create({ ...base, stream: true });
  const events = [];
  for await (const ev of stream) events.push(ev);
  const types = events.map((e) => e.type);
  check(types[0] === 'response.created' && types[1] === 'response.in_progress', 'starts: ' + types.slice(0, 2));
  const last = events[events.length - 1];
  check(['response.completed', 'response.incomplete'].includes(last.type), 'ends with completed/incomplete: ' + last.type);
  events.forEach((e, i) => check(e.sequence_number === i, `sequence_number ${e.sequence_number} == ${i}`));
  const added = new Map();
  let text = '';
  for (const e of events) {
    if (e.type === 'response.output_item.added') added.set(e.output_index, { id: e.item.id, deltas: '' });
    if (e.type === 'response.output_text.delta' || e.type === 'response.reasoning_text.delta') {
      check(added.has(e.output_index) && added.get(e.output_index).id === e.item_id, 'delta belongs to an added item');
      added.get(e.output_index).deltas += e.delta;
      if (e.type === 'response.output_text.delta') text += e.delta;
    }
    if (e.type === 'response.output_text.done' || e.type === 'response.reasoning_text.done') {
      check(e.text === added.get(e.output_index).deltas, 'done text == its deltas');
    }
    if (e.type === 'response.output_item.done') {
      check(added.get(e.output_index)?.id === e.item.id, 'item done after added');
      check(JSON.stringify(last.response.output[e.output_index]) === JSON.stringify(e.item), 'final output holds the done item');
    }
  }
  for (const t of ['response.content_part.added', 'response.output_text.delta', 'response.output_text.done', 'response.content_part.done']) {
    check(types.includes(t), 'has ' + t);
  }
  check(text === resp.output_text, `streamed text ${JSON.stringify(text)} == ${JSON.stringify(resp.output_text)}`);
  check(last.response.status === resp.status, 'streamed status');
  checkUsage(last.response, tokenized.tokens.length, maxTokens);
  check(last.response.usage.output_tokens === resp.usage.output_tokens, 'streamed output_tokens');

  // Function calls: a named function is forced; the call (or, from a model too small to write JSON,
  // the forced call's start as text) comes back; then a function_call_output goes back.
  const tools = [{
    type: 'function', name: 'get_weather', description: 'Current weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  }];
  const ask = { role: 'user', content: 'What is the weather in Paris?' };
  const toolReq = { model: args.model, input: [ask], tools, tool_choice: { type: 'function', name: 'get_weather' }, max_output_tokens: 64, temperature: 0 };
  const called = await openai.responses.create(toolReq);
  let call = called.output.find((i) => i.type === 'function_call');
  if (call) {
    check(call.name === 'get_weather' && call.call_id.startsWith('call_') && call.status === 'completed', 'function_call item');
    JSON.parse(call.arguments);
  } else {
    check(called.output_text.startsWith('<tool_call>\n{"name": "get_weather", "arguments": '), 'forced call start: ' + called.output_text.slice(0, 60));
    call = { type: 'function_call', call_id: 'call_0', name: 'get_weather', arguments: '{"city": "Paris"}' };
  }
  const streamed = [];
  for await (const ev of await openai.responses.create({ ...toolReq, stream: true })) streamed.push(ev);
  const streamedFinal = streamed[streamed.length - 1].response;
  check(JSON.stringify(streamedFinal.output.map((i) => i.type)) === JSON.stringify(called.output.map((i) => i.type)), 'streamed tool output items');
  const streamedCall = streamedFinal.output.find((i) => i.type === 'function_call');
  if (streamedCall) {
    const args2 = streamed.filter((e) => e.type === 'response.function_call_arguments.delta').map((e) => e.delta).join('');
    check(args2 === streamedCall.arguments && streamedCall.arguments === call.arguments, 'streamed arguments');
  }
  const followUp = await openai.responses.create({
    model: args.model, tools, max_output_tokens: 16, temperature: 0,
    input: [ask, { type: 'function_call', call_id: call.call_id, name: call.name, arguments: call.arguments },
            { type: 'function_call_output', call_id: call.call_id, output: '{"temperature_c": 21}' }],
  });
  const chatForm = [
    ask,
    { role: 'assistant', content: null, tool_calls: [{ id: call.call_id, type: 'function', function: { name: call.name, arguments: call.arguments } }] },
    { role: 'tool', tool_call_id: call.call_id, content: '{"temperature_c": 21}' },
  ];
  const chatTools = tools.map((t) => ({ type: 'function', function: { name: t.name, description: t.description, parameters: t.parameters } }));
  const chatTokens = await postJson(args.baseURL, '/tokenize', { messages: chatForm, tools: chatTools }, args.apiKey);
  checkUsage(followUp, chatTokens.tokens.length, 16);

  // Structured output: text.format json_schema decodes under the schema's grammar.
  const schema = { type: 'object', properties: { city: { type: 'string', maxLength: 12 }, days: { type: 'integer' } },
                   required: ['city', 'days'], additionalProperties: false };
  const structured = await openai.responses.create({ model: args.model, input: 'Plan a trip.', max_output_tokens: 256,
    temperature: 0, text: { format: { type: 'json_schema', name: 'trip', schema, strict: true } } });
  const trip = JSON.parse(structured.output_text);
  check(typeof trip.city === 'string' && trip.city.length <= 12 && Number.isInteger(trip.days) && Object.keys(trip).length === 2,
        'schema-valid JSON: ' + structured.output_text);
  check(structured.text.format.type === 'json_schema', 'text.format echoed');

  // Refused, with OpenAI's error shape.
  await expectError(openai.responses.create({ ...base, previous_response_id: resp.id }), 400, 'previous_response_id');
  await expectError(openai.responses.create({ model: args.model, max_output_tokens: 4 }), 400, 'input');
  await expectError(openai.responses.create({ ...base, tools: [{ type: 'web_search_preview' }] }), 400, 'web_search_preview');
  await expectError(openai.responses.create({ ...base, input: [{ type: 'item_reference', id: 'x' }] }), 400, 'item_reference');
  await expectError(openai.responses.create({ ...base, max_output_tokens: 0 }), 400, 'max_output_tokens');
  await expectError(openai.responses.create({ ...base, text: { format: { type: 'json_schema', name: 'n', schema: { type: 'integer', minimum: 3 } } } }), 400, 'minimum');
  console.log('openai_responses: ok');
});
