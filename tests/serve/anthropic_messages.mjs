// The official @anthropic-ai/sdk against `strata serve`'s /v1/messages: a plain answer, the system
// prompt, the streamed event sequence (same text and usage as the plain answer), stop sequences,
// count_tokens, a tool_use / tool_result round trip, and errors in Anthropic's shape.
// The prompts must be the ones /v1/chat/completions renders for the same conversation (/tokenize).
import { anthropicClient, check, httpError, parseArgs, postJson, run } from './common.mjs';

const textOf = (msg) => msg.content.filter((b) => b.type === 'text').map((b) => b.text).join('');

async function expectError(promise, status, type, mention) {
  const err = await httpError(promise, status);
  // The SDK keeps the parsed body: {"type": "error", "error": {"type": ..., "message": ...}}.
  check(err.error?.type === 'error' && err.error?.error?.type === type, `error shape ${JSON.stringify(err.error)}`);
  check(err.error.error.message.includes(mention), `the message mentions ${mention}: ${err.error.error.message}`);
}

run(async () => {
  const args = parseArgs();
  const client = anthropicClient(args);
  const system = 'You are a helpful assistant.';
  const messages = [{ role: 'user', content: 'Say hello.' }];
  const maxTokens = 24;
  const base = { model: args.model, max_tokens: maxTokens, temperature: 0, system, messages };

  // Plain.
  const msg = await client.messages.create(base);
  check(msg.type === 'message' && msg.role === 'assistant' && msg.id.startsWith('msg_'), 'message envelope');
  check(msg.model === args.model, 'model echoed');
  check(Array.isArray(msg.content) && msg.content.every((b) => ['text', 'thinking'].includes(b.type)), 'text/thinking blocks only');
  check(['end_turn', 'max_tokens'].includes(msg.stop_reason), 'stop_reason ' + msg.stop_reason);
  check(msg.stop_sequence === null, 'no stop sequence');
  const u = msg.usage;
  check(u.output_tokens >= 1 && u.output_tokens <= maxTokens, 'output_tokens in [1, max_tokens]');
  if (msg.stop_reason === 'max_tokens') check(u.output_tokens === maxTokens, 'max_tokens => max_tokens generated');

  // The prompt is the chat-completions prompt for the same conversation, and count_tokens says so too.
  const promptTokens = u.input_tokens + u.cache_read_input_tokens;
  const tokenized = await postJson(args.baseURL, '/tokenize', { messages: [{ role: 'system', content: system }, ...messages] }, args.apiKey);
  check(promptTokens === tokenized.tokens.length, `prompt tokens ${promptTokens} == chat prompt ${tokenized.tokens.length}`);
  const counted = await client.messages.countTokens({ model: args.model, system, messages });
  check(counted.input_tokens === promptTokens, `count_tokens ${counted.input_tokens} == usage ${promptTokens}`);
  const blocks = await client.messages.countTokens({ model: args.model, system: [{ type: 'text', text: system }], messages });
  check(blocks.input_tokens === counted.input_tokens, 'system as text blocks == system as a string');
  const bare = await client.messages.countTokens({ model: args.model, messages });
  check(bare.input_tokens < counted.input_tokens, 'the system prompt is part of the prompt');

  // Streamed: Anthropic's event sequence, and the same answer as the plain call (greedy).
  const stream = client.messages.stream(base);
  const types = [];
  const open = new Map();
  for await (const ev of stream) {
    types.push(ev.type);
    if (ev.type === 'content_block_start') {
      check(ev.index === open.size, `block index ${ev.index} follows ${open.size}`);
      open.set(ev.index, 'open');
    } else if (ev.type === 'content_block_delta') {
      check(open.get(ev.index) === 'open', 'delta inside an open block');
      const want = { text_delta: 'text', thinking_delta: 'thinking', input_json_delta: 'tool_use' }[ev.delta.type];
      check(want !== undefined, 'delta type ' + ev.delta.type);
    } else if (ev.type === 'content_block_stop') {
      check(open.get(ev.index) === 'open', 'stop closes an open block');
      open.set(ev.index, 'closed');
    }
  }
  const seq = types.filter((t) => t !== 'ping').join(' ');
  check(/^message_start( content_block_start( content_block_delta)* content_block_stop)* message_delta message_stop$/.test(seq),
        'event order: ' + seq);
  const final = await stream.finalMessage();
  check(final.id.startsWith('msg_') && final.stop_reason === msg.stop_reason, `streamed stop_reason ${final.stop_reason}`);
  check(textOf(final) === textOf(msg), `streamed text ${JSON.stringify(textOf(final))} == ${JSON.stringify(textOf(msg))}`);
  check(final.usage.output_tokens === u.output_tokens, 'streamed output_tokens');
  check(final.usage.input_tokens + final.usage.cache_read_input_tokens === promptTokens, 'streamed input usage');

  // Stop sequences: stop where a piece of the plain answer (thinking off) begins.
  const direct = { ...base, max_tokens: 32, thinking: { type: 'disabled' } };
  const full = textOf(await client.messages.create(direct));
  let at = -1, stop = '';
  for (let k = 1; k + 3 <= full.length && at < 0; ++k) {
    const piece = full.slice(k, k + 3);
    if (piece.trim().length === 3 && full.indexOf(piece) === k) [at, stop] = [k, piece];
  }
  check(at > 0, 'the answer has a piece to stop at: ' + JSON.stringify(full));
  const stopped = await client.messages.create({ ...direct, stop_sequences: ['@@never@@', stop] });
  check(stopped.stop_reason === 'stop_sequence' && stopped.stop_sequence === stop,
        `stop_reason ${stopped.stop_reason} / stop_sequence ${JSON.stringify(stopped.stop_sequence)} == ${JSON.stringify(stop)}`);
  check(textOf(stopped) === full.slice(0, at), `text before the stop sequence: ${JSON.stringify(textOf(stopped))}`);

  // Tools: a named tool is forced; the call (or, from a model too small to write JSON, the forced
  // call's start as text) comes back, then a tool_result goes back.
  const tools = [{
    name: 'get_weather', description: 'Current weather in a city',
    input_schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  }];
  const ask = [{ role: 'user', content: 'What is the weather in Paris?' }];
  const toolReq = { model: args.model, max_tokens: 64, temperature: 0, tools, tool_choice: { type: 'tool', name: 'get_weather' }, messages: ask };
  const called = await client.messages.create(toolReq);
  let use = called.content.find((b) => b.type === 'tool_use');
  if (called.stop_reason === 'tool_use') {
    check(use && use.name === 'get_weather' && use.id.startsWith('toolu_'), 'tool_use block');
    check(typeof use.input === 'object' && use.input !== null, 'tool_use input is an object');
  } else {
    check(!use, 'no tool_use block without stop_reason tool_use');
    check(textOf(called).startsWith('<tool_call>\n{"name": "get_weather", "arguments": '), 'forced call start: ' + JSON.stringify(textOf(called).slice(0, 60)));
    use = { type: 'tool_use', id: 'toolu_0', name: 'get_weather', input: { city: 'Paris' } };
  }
  const toolStream = await client.messages.stream(toolReq).finalMessage();
  check(toolStream.stop_reason === called.stop_reason, 'streamed tool stop_reason');
  check(textOf(toolStream) === textOf(called), 'streamed tool answer text');
  const streamedUse = toolStream.content.find((b) => b.type === 'tool_use');
  if (streamedUse) check(JSON.stringify(streamedUse.input) === JSON.stringify(use.input), 'streamed tool input');

  const result = { type: 'tool_result', tool_use_id: use.id, content: [{ type: 'text', text: '{"temperature_c": 21}' }] };
  const followUp = [...ask, { role: 'assistant', content: [use] }, { role: 'user', content: [result] }];
  const answer = await client.messages.create({ model: args.model, max_tokens: 16, temperature: 0, tools, messages: followUp });
  check(answer.type === 'message' && answer.usage.output_tokens >= 1, 'an answer after the tool result');
  const openaiTools = tools.map((t) => ({ type: 'function', function: { name: t.name, description: t.description, parameters: t.input_schema } }));
  const chatForm = [
    ...ask,
    { role: 'assistant', content: null, tool_calls: [{ id: use.id, type: 'function', function: { name: use.name, arguments: JSON.stringify(use.input) } }] },
    { role: 'tool', tool_call_id: use.id, content: '{"temperature_c": 21}' },
  ];
  const chatTokens = await postJson(args.baseURL, '/tokenize', { messages: chatForm, tools: openaiTools }, args.apiKey);
  check(answer.usage.input_tokens + answer.usage.cache_read_input_tokens === chatTokens.tokens.length,
        'tool round trip renders as the chat-completions conversation');
  const errCount = await client.messages.countTokens({
    model: args.model, tools, messages: [...followUp.slice(0, 2), { role: 'user', content: [{ ...result, is_error: true }] }],
  });
  check(errCount.input_tokens > chatTokens.tokens.length, 'an is_error tool_result tells the model');

  // Errors, in Anthropic's shape.
  await expectError(client.messages.create({ model: args.model, messages }), 400, 'invalid_request_error', 'max_tokens');
  await expectError(client.messages.create({ ...base, model: 'no-such-model' }), 404, 'not_found_error', 'no-such-model');
  await expectError(client.messages.create({ ...base, messages: [{ role: 'system', content: 'x' }] }), 400, 'invalid_request_error', 'role');
  await expectError(client.messages.create({ ...base, messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AA==' } }] }] }),
                    400, 'invalid_request_error', 'image');
  await expectError(client.messages.create({ ...base, temperature: 1.5 }), 400, 'invalid_request_error', 'temperature');
  await expectError(client.messages.create({ ...base, tool_choice: { type: 'tool', name: 'nope' }, tools }), 400, 'invalid_request_error', 'nope');
  await expectError(client.messages.countTokens({ model: args.model, messages: [] }), 400, 'invalid_request_error', 'messages');
  console.log('anthropic_messages: ok');
});
