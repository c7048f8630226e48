// Load: CLIENTS concurrent clients each make REQUESTS streamed chat requests one after another.
// mode "complete": every stream must finish with usage that matches the prompt's token count and
// the max_tokens limit, and the server's token counters must grow by exactly what the clients saw.
// mode "disconnect": clients abort their streams at random points; afterwards every slot must be
// free and the queue empty within a few seconds.
// Usage: node load.mjs BASE_URL MODEL CLIENTS REQUESTS MAX_TOKENS MODE
import { check, client, metric, postJson, run } from './common.mjs';

run(async () => {
  const [baseURL, model, clients, requests, maxTokensArg, mode] = process.argv.slice(2);
  const nClients = Number(clients), nRequests = Number(requests), maxTokens = Number(maxTokensArg);
  const openai = client({ baseURL, apiKey: 'none' });
  const prompts = ['Tell me a story.', 'What is 2+2?', 'Name a color.', 'Write a haiku about rain.'];
  const conv = (i) => [{ role: 'user', content: prompts[i % prompts.length] }];
  const promptTokens = [];
  for (let i = 0; i < prompts.length; i++) {
    promptTokens.push((await postJson(baseURL, '/tokenize', { messages: conv(i) })).tokens.length);
  }
  const before = await metric(baseURL, 'strata_completion_tokens_total');
  const cancelledBefore = await metric(baseURL, 'strata_requests_cancelled_total');
  let seenCompletion = 0, completed = 0, aborted = 0;

  async function oneRequest(c, r) {
    const k = c * nRequests + r;
    const controller = new AbortController();
    // Disconnect mode: abort after 0-3 chunks or after a random delay, whichever comes first.
    const abortAfterChunks = mode === 'disconnect' ? Math.floor(Math.random() * 4) : Infinity;
    let timer = null;
    if (mode === 'disconnect') timer = setTimeout(() => controller.abort(), Math.floor(Math.random() * 150));
    try {
      const stream = await openai.chat.completions.create(
        { model, messages: conv(k), max_tokens: maxTokens, temperature: 0.7, seed: k, stream: true,
          stream_options: { include_usage: true } },
        { signal: controller.signal });
      let usage = null, finish = null, contentChunks = 0;
      for await (const chunk of stream) {
        if (chunk.usage) usage = chunk.usage;
        if (chunk.choices.length) {
          if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
          const d = chunk.choices[0].delta;
          if (d.content || d.reasoning_content) contentChunks++;
        }
        if (contentChunks >= abortAfterChunks) controller.abort();
      }
      check(usage !== null, `request ${k}: usage in the last chunk`);
      check(usage.prompt_tokens === promptTokens[k % prompts.length], `request ${k}: prompt_tokens ${usage.prompt_tokens} == ${promptTokens[k % prompts.length]}`);
      check(usage.completion_tokens >= 1 && usage.completion_tokens <= maxTokens, `request ${k}: completion_tokens ${usage.completion_tokens} in [1, ${maxTokens}]`);
      if (finish === 'length') check(usage.completion_tokens === maxTokens, `request ${k}: length => ${maxTokens} tokens`);
      check(contentChunks <= usage.completion_tokens, `request ${k}: no more text chunks than tokens`);
      seenCompletion += usage.completion_tokens;
      completed++;
    } catch (e) {
      if (mode === 'disconnect' && (e.name === 'AbortError' || e.constructor?.name === 'APIUserAbortError' || controller.signal.aborted)) {
        aborted++;
        return;
      }
      throw e;
    } finally {
      if (timer) clearTimeout(timer);
    }
  }

  const workers = [];
  for (let c = 0; c < nClients; c++) {
    workers.push((async () => { for (let r = 0; r < nRequests; r++) await oneRequest(c, r); })());
  }
  await Promise.all(workers);

  if (mode === 'complete') {
    check(completed === nClients * nRequests, `all ${nClients * nRequests} requests completed (${completed})`);
    const after = await metric(baseURL, 'strata_completion_tokens_total');
    check(after - before === seenCompletion, `server counted ${after - before} completion tokens, clients saw ${seenCompletion}`);
  } else {
    check(aborted > 0, 'some requests were aborted');
  }
  // Every slot frees up and the queue drains (a vanished client must not hold a slot).
  const deadline = Date.now() + 10000;
  let busy = -1, queued = -1;
  while (Date.now() < deadline) {
    busy = await metric(baseURL, 'strata_slots_busy');
    queued = await metric(baseURL, 'strata_queue_depth');
    if (busy === 0 && queued === 0) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  check(busy === 0 && queued === 0, `slots free after the round (busy ${busy}, queued ${queued})`);
  if (mode === 'disconnect') {
    // The server noticed the vanished clients and stopped their generations.
    const cancelled = (await metric(baseURL, 'strata_requests_cancelled_total')) - cancelledBefore;
    check(cancelled > 0, 'the server cancelled generations of vanished clients');
  }
  const health = await fetch(baseURL + '/health');
  check(health.status === 200, 'healthy after the round');
  console.log(`load ${mode}: ${completed} completed, ${aborted} aborted`);
});
