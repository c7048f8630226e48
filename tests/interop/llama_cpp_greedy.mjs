// Greedy continuation of a token-id prompt by llama.cpp: the prebuilt CPU build that the node-llama-cpp
// npm package ships (scripts/fetch-test-node-deps installs it into build-data/node). The interop tests
// (tests/test_llama_cpp_interop.cpp) compare strata's synth files and output against it.
// usage: STRATA_NODE_MODULES=DIR node llama_cpp_greedy.mjs MODEL IDS N
//   IDS: comma-separated prompt token ids; prints "tokens: t1,t2,..." (N greedy tokens).
import { availableParallelism } from 'node:os';
import { pathToFileURL } from 'node:url';

const modules = process.env.STRATA_NODE_MODULES;
if (!modules) throw new Error('STRATA_NODE_MODULES is not set');
const [modelPath, idsText, nText] = process.argv.slice(2);
if (!modelPath || !idsText || !nText) throw new Error('usage: node llama_cpp_greedy.mjs MODEL IDS N');
const prompt = idsText.split(',').map(Number);
const n = Number(nText);

// The package is an ES module whose entry point is dist/index.js; importing it by path needs no
// package resolution from this file's directory.
const { getLlama, LlamaLogLevel } = await import(pathToFileURL(`${modules}/node-llama-cpp/dist/index.js`).href);
// build: 'never' = the prebuilt binary or a loud failure (never a source build).
const llama = await getLlama({ gpu: false, build: 'never', logLevel: LlamaLogLevel.error });
const model = await llama.loadModel({ modelPath });
// An explicit thread count: the package's default oversubscribes a small machine (seconds per token of a
// tiny model on 2 cores).
const context = await model.createContext({
  contextSize: Math.max(64, prompt.length + n + 8),
  batchSize: 16,
  threads: Math.min(4, availableParallelism()),
});
const sequence = context.getSequence();
const out = [];
for await (const token of sequence.evaluate(prompt, { temperature: 0 })) {
  out.push(token);
  if (out.length >= n) break;
}
console.log(`tokens: ${out.join(',')}`);
process.exit(0);  // disposing the native objects takes seconds and checks nothing
