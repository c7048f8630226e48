// The prompt cache through the official openai SDK: usage.prompt_tokens_details.cached_tokens is the
// length of the longest snapshot the server keeps that prefixes the prompt (every 256 tokens, one before
// a prompt's end, a request's end), whichever slot ran it: 0 for a new prompt, all but the last token for
// the same prompt again, the block boundary for a shared start, at least the previous prompt for the
// next turn, 0 with penalties (such requests run their whole prompt). Exits 0 when every check holds.
import { check, client, parseArgs, postJson, run } from './common.mjs';

const kBlock = 256;

function commonPrefix(a, b) {
  let i = 0;
  while (i < a.length && i < b.length && a[i] === b[i]) ++i;
  return i;
}

run(async () => {
  const args = parseArgs();
  const openai = client(args);
  const tokens = async (messages) => (await postJson(args.baseURL, '/tokenize', { messages }, args.apiKey)).tokens;
  const cached = (r) => r.usage.prompt_tokens_details.cached_tokens;
  const ask = (messages, extra = {}) =>
    openai.chat.completions.create({ model: args.model, messages, max_tokens: 4, temperature: 0, ...extra });

  // A start no other test sends, long enough to cross a block boundary.
  const nonce = `${Date.now()}-${Math.random()}`;
  const rules = Array.from({ length: 40 }, (_, i) => `Rule ${i}: answer tool call ${i} with the file path first.`).join(' ');
  const system = { role: 'system', content: `Session ${nonce}. ${rules}` };
  const a = [system, { role: 'user', content: 'List the files in src.' }];
  const ta = await tokens(a);
  check(ta.length > kBlock + 8 && ta.length < 900, `prompt of ${ta.length} tokens crosses one block and fits --ctx 1024`);

  const first = await ask(a);
  check(first.usage.prompt_tokens === ta.length, 'prompt_tokens is the tokenized prompt');
  check(cached(first) === 0, `a new prompt has nothing cached, got ${cached(first)}`);

  const again = await ask(a);
  check(cached(again) === ta.length - 1, `the same prompt again: all but its last token cached, got ${cached(again)} of ${ta.length}`);

  // Streamed, the usage chunk says the same.
  const stream = await openai.chat.completions.create({
    model: args.model, messages: a, max_tokens: 4, temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  let usage = null;
  for await (const chunk of stream) if (chunk.usage) usage = chunk.usage;
  check(usage && usage.prompt_tokens_details.cached_tokens === ta.length - 1, 'streamed usage reports the cached tokens');

  // Another question after the same system prompt: the snapshot at the last block boundary they share.
  const b = [system, { role: 'user', content: 'Which tests cover the parser?' }];
  const tb = await tokens(b);
  const shared = Math.min(commonPrefix(ta, tb), tb.length - 1);
  check(shared >= kBlock, `the two prompts share ${shared} tokens`);
  const other = await ask(b);
  check(cached(other) === Math.floor(shared / kBlock) * kBlock,
        `a shared start: ${Math.floor(shared / kBlock) * kBlock} cached (block boundary of ${shared} shared), got ${cached(other)}`);

  // The next turn of the first conversation starts at least where its previous prompt ended.
  const turn2 = [...a, { role: 'assistant', content: first.choices[0].message.content ?? '' },
    { role: 'user', content: 'Open the first one.' }];
  const t2 = await tokens(turn2);
  const carried = commonPrefix(ta, t2);
  const floor = carried >= ta.length - 1 ? ta.length - 1 : Math.floor(carried / kBlock) * kBlock;
  const next = await ask(turn2);
  check(cached(next) >= floor && cached(next) <= t2.length - 1,
        `next turn: cached ${cached(next)} in [${floor}, ${t2.length - 1}]`);

  // Penalties: the whole prompt runs.
  const pen = await ask(a, { frequency_penalty: 0.5 });
  check(cached(pen) === 0, `a request with penalties reads no cache, got ${cached(pen)}`);

  console.log(`prompt cache: new 0, same ${cached(again)}/${ta.length}, shared start ${cached(other)}, next turn ${cached(next)}/${t2.length}`);
});
