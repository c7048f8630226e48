// A tool-call round trip through the openai SDK: the model is asked (tool_choice naming the function)
// to call a tool, the call comes back parsed into tool_calls (plain and streamed alike), the client
// answers with a tool message, and the server renders that conversation and answers it.
import { check, client, parseArgs, postJson, run } from './common.mjs';

run(async () => {
  const args = parseArgs();
  const openai = client(args);
  const tools = [{
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'Current weather in a city',
      parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
    },
  }];
  const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];
  const request = {
    model: args.model, messages, tools, tool_choice: { type: 'function', function: { name: 'get_weather' } },
    max_tokens: 64, temperature: 0,
  };
  const res = await openai.chat.completions.create(request);
  const choice = res.choices[0];
  let call;
  if (choice.finish_reason === 'tool_calls') {
    call = choice.message.tool_calls[0];
    check(call.type === 'function' && call.function.name === 'get_weather', 'the named function is called');
    const parsedArgs = JSON.parse(call.function.arguments);
    check(typeof parsedArgs === 'object' && parsedArgs !== null && !Array.isArray(parsedArgs), 'arguments are a JSON object');
    check(typeof call.id === 'string' && call.id.length > 0, 'tool call id');
    // Streamed: the SDK's accumulated message carries the same tool call.
    const stream = openai.beta.chat.completions.stream({ ...request, stream: true });
    const final = await stream.finalChatCompletion();
    const scall = final.choices[0].message.tool_calls?.[0];
    check(scall && scall.function.name === 'get_weather', 'streamed tool call name');
    check(scall.function.arguments === call.function.arguments, 'streamed tool call arguments == plain');
  } else {
    // A model too small to write JSON arguments (the bundled tiny one): the forced call's start, which
    // the server wrote into the answer, must still be there, unparsed, as content.
    const content = choice.message.content ?? '';
    check(content.startsWith('<tool_call>\n{"name": "get_weather", "arguments": '),
          'the named call was forced: ' + JSON.stringify(content.slice(0, 80)));
    call = { id: 'call_0', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris"}' } };
  }
  // Round trip: the tool's answer goes back.
  const followUp = [
    ...messages,
    { role: 'assistant', content: null, tool_calls: [call] },
    { role: 'tool', tool_call_id: call.id, content: JSON.stringify({ city: 'Paris', temperature_c: 21 }) },
  ];
  const answer = await openai.chat.completions.create({ model: args.model, messages: followUp, tools, max_tokens: 16, temperature: 0 });
  check(typeof answer.choices[0].message.content === 'string' || answer.choices[0].message.tool_calls, 'an answer after the tool result');
  const tokenized = await postJson(args.baseURL, '/tokenize', { messages: followUp, tools }, args.apiKey);
  check(answer.usage.prompt_tokens === tokenized.tokens.length, 'follow-up prompt_tokens == tokenized conversation');
  console.log('tools: ok', call.function.arguments);
});
