// Shared helpers for the server test clients. The openai and @anthropic-ai/sdk SDKs come from
// build-data/node (scripts/fetch-test-node-deps); STRATA_NODE_MODULES points at its node_modules.
import { createRequire } from 'node:module';

const modules = process.env.STRATA_NODE_MODULES;
if (!modules) throw new Error('STRATA_NODE_MODULES is not set');
const require = createRequire(modules.replace(/\/?$/, '/'));
const mod = require('openai');
export const OpenAI = mod.OpenAI ?? mod.default ?? mod;

export function anthropicClient({ baseURL, apiKey }) {
  const a = require('@anthropic-ai/sdk');
  const Anthropic = a.Anthropic ?? a.default ?? a;
  return new Anthropic({ baseURL, apiKey, maxRetries: 0, timeout: 120000 });
}

export function parseArgs() {
  const [baseURL, model, apiKey] = process.argv.slice(2);
  if (!baseURL || !model) throw new Error('usage: node script.mjs BASE_URL MODEL [API_KEY]');
  return { baseURL, model, apiKey: apiKey ?? 'none' };
}

export function client({ baseURL, apiKey }) {
  // No retries: a 503 must show up as a failure, not be hidden by the SDK.
  return new OpenAI({ baseURL: baseURL + '/v1', apiKey, maxRetries: 0, timeout: 120000 });
}

export function check(cond, message) {
  if (!cond) throw new Error('check failed: ' + message);
}

// POST to a strata extension route (/tokenize) and return the parsed JSON.
export async function postJson(baseURL, path, body, apiKey) {
  const res = await fetch(baseURL + path, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: 'Bearer ' + (apiKey ?? 'none') },
    body: JSON.stringify(body),
  });
  const json = await res.json();
  if (res.status !== 200) throw new Error(`${path}: HTTP ${res.status}: ${JSON.stringify(json)}`);
  return json;
}

// Awaits a request that must fail with HTTP `status`; returns the SDK's error (its parsed body in .error).
export async function httpError(promise, status) {
  let err = null;
  try {
    await promise;
  } catch (e) {
    err = e;
  }
  check(err !== null, `expected HTTP ${status}, the request succeeded`);
  check(err.status === status, `expected HTTP ${status}, got ${err.status}: ${err.message}`);
  return err;
}

export async function metric(baseURL, name) {
  const text = await (await fetch(baseURL + '/metrics')).text();
  const line = text.split('\n').find((l) => l.startsWith(name + ' '));
  if (!line) throw new Error(`metric ${name} missing`);
  return Number(line.split(' ')[1]);
}

export function run(main) {
  main().then(
    () => process.exit(0),
    (e) => {
      console.error(e?.stack ?? String(e));
      process.exit(1);
    },
  );
}
