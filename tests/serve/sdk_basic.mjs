// The official openai SDK against `strata serve`: models, chat (plain and streamed, with usage in the
// last chunk), completions (plain and streamed). Exits 0 when every check holds.
import { check, client, parseArgs, postJson, run } from './common.mjs';

run(async () => {
  const args = parseArgs();
  const openai = client(args);

  const models = await openai.models.list();
  check(models.data.length === 1 && models.data[0].id === args.model, 'models list names the served model');

  const messages = [
    { role: 'system', content: 'You are a helpful assistant.' },
    { role: 'user', content: 'Say hello.' },
  ];
  const maxTokens = 24;
  const chat = await openai.chat.completions.create({ model: args.model, messages, max_tokens: maxTokens, temperature: 0 });
  check(chat.object === 'chat.completion', 'object is chat.completion');
  const choice = chat.choices[0];
  check(choice.message.role === 'assistant', 'assistant role');
  check(typeof choice.message.content === 'string', 'content is a string');
  check(['stop', 'length'].includes(choice.finish_reason), 'finish_reason stop/length: ' + choice.finish_reason);
  // The prompt's token count, independently: the server's tokenizer over the same messages.
  const tokenized = await postJson(args.baseURL, '/tokenize', { messages }, args.apiKey);
  check(chat.usage.prompt_tokens === tokenized.tokens.length,
        `prompt_tokens ${chat.usage.prompt_tokens} == tokenized prompt ${tokenized.tokens.length}`);
  check(chat.usage.completion_tokens >= 1 && chat.usage.completion_tokens <= maxTokens, 'completion_tokens in [1, max_tokens]');
  if (choice.finish_reason === 'length') check(chat.usage.completion_tokens === maxTokens, 'length => max_tokens generated');
  check(chat.usage.total_tokens === chat.usage.prompt_tokens + chat.usage.completion_tokens, 'total = prompt + completion');

  // Streaming, greedy: the same text and usage as the plain call.
  const stream = await openai.chat.completions.create({
    model: args.model, messages, max_tokens: maxTokens, temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  let content = '', reasoning = '', finish = null, usage = null, chunks = 0;
  for await (const chunk of stream) {
    check(chunk.object === 'chat.completion.chunk', 'chunk object');
    if (chunk.usage) usage = chunk.usage;
    if (chunk.choices.length === 0) continue;
    chunks++;
    const d = chunk.choices[0].delta;
    if (d.content) content += d.content;
    if (d.reasoning_content) reasoning += d.reasoning_content;
    if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
  }
  check(usage !== null, 'usage arrives in the last chunk with include_usage');
  check(finish === choice.finish_reason, `streamed finish_reason ${finish} == ${choice.finish_reason}`);
  check(usage.prompt_tokens === chat.usage.prompt_tokens, 'streamed prompt_tokens');
  check(usage.completion_tokens === chat.usage.completion_tokens, `streamed completion_tokens ${usage.completion_tokens} == ${chat.usage.completion_tokens}`);
  check(content === choice.message.content, `streamed content ${JSON.stringify(content)} == ${JSON.stringify(choice.message.content)}`);
  check(reasoning === (choice.message.reasoning_content ?? ''), 'streamed reasoning == plain reasoning');
  check(chunks >= 2, 'at least a role chunk and a finish chunk');

  // Stop strings and seeds go through the SDK too.
  const seeded = { model: args.model, messages, max_tokens: 16, temperature: 0.9, seed: 1234 };
  const s1 = await openai.chat.completions.create(seeded);
  const s2 = await openai.chat.completions.create(seeded);
  check(s1.choices[0].message.content === s2.choices[0].message.content, 'same seed, same answer');

  // Completions.
  const prompt = 'The quick brown fox';
  const comp = await openai.completions.create({ model: args.model, prompt, max_tokens: 8, temperature: 0 });
  check(comp.object === 'text_completion', 'object is text_completion');
  check(typeof comp.choices[0].text === 'string', 'completion text');
  const ptoks = await postJson(args.baseURL, '/tokenize', { content: prompt }, args.apiKey);
  check(comp.usage.prompt_tokens === ptoks.tokens.length, 'completion prompt_tokens == tokenized prompt');
  check(comp.usage.completion_tokens >= 1 && comp.usage.completion_tokens <= 8, 'completion_tokens in [1, 8]');
  let ctext = '', cusage = null;
  const cstream = await openai.completions.create({
    model: args.model, prompt, max_tokens: 8, temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  for await (const chunk of cstream) {
    if (chunk.usage) cusage = chunk.usage;
    if (chunk.choices.length) ctext += chunk.choices[0].text;
  }
  check(ctext === comp.choices[0].text, `streamed completion ${JSON.stringify(ctext)} == ${JSON.stringify(comp.choices[0].text)}`);
  check(cusage && cusage.completion_tokens === comp.usage.completion_tokens, 'streamed completion usage');

  // Detokenize inverts tokenize on plain text.
  const back = await postJson(args.baseURL, '/detokenize', { tokens: ptoks.tokens }, args.apiKey);
  check(back.content === prompt, 'detokenize(tokenize(x)) == x');

  // An unknown model is a 404 through the SDK.
  let status = 0;
  try {
    await openai.chat.completions.create({ model: 'no-such-model', messages, max_tokens: 4 });
  } catch (e) {
    status = e.status;
  }
  check(status === 404, 'unknown model -> 404, got ' + status);
  console.log('sdk_basic: ok');
});
