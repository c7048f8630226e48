// Drives serve's web page in headless Chromium through the DevTools protocol over a pipe
// (--remote-debugging-pipe: no port, no WebSocket client needed): enters the API key the page asks for,
// sends a chat message and watches the reply stream in and finish, then opens the experts view and
// checks one row per layer, one cell per expert, and placements matching /metrics. Saves a screenshot
// of each view. Usage: node drive.mjs BASE_URL API_KEY ARTIFACT_DIR [CHROMIUM]
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync, mkdirSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const [base, apiKey, artifacts, chromiumPath = "chromium"] = process.argv.slice(2);
if (!base || !apiKey || !artifacts) {
  console.error("usage: node drive.mjs BASE_URL API_KEY ARTIFACT_DIR [CHROMIUM]");
  process.exit(2);
}
mkdirSync(artifacts, { recursive: true });
const profile = mkdtempSync(join(tmpdir(), "strata-webui-"));
const browser = spawn(chromiumPath, [
  "--headless=new", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu", "--no-first-run",
  "--disable-extensions", "--disable-background-networking", "--disable-dev-shm-usage",
  "--user-data-dir=" + profile, "about:blank",
], { stdio: ["ignore", "ignore", "pipe", "pipe", "pipe"], detached: true });  // its own group: helpers die with it
let browserLog = "";
browser.stderr.on("data", (d) => { browserLog = (browserLog + d).slice(-4000); });

// ---- the protocol: JSON messages separated by NUL bytes, fd 3 to the browser, fd 4 from it ----
let nextId = 1;
const pending = new Map();
let inbox = Buffer.alloc(0);
browser.stdio[4].on("data", (chunk) => {
  inbox = Buffer.concat([inbox, chunk]);
  let cut;
  while ((cut = inbox.indexOf(0)) >= 0) {
    const msg = JSON.parse(inbox.subarray(0, cut).toString("utf8"));
    inbox = inbox.subarray(cut + 1);
    if (msg.id && pending.has(msg.id)) {
      const { resolve, reject } = pending.get(msg.id);
      pending.delete(msg.id);
      if (msg.error) reject(new Error(JSON.stringify(msg.error))); else resolve(msg.result);
    }
  }
});
function send(method, params = {}, sessionId) {
  const id = nextId++;
  const msg = { id, method, params };
  if (sessionId) msg.sessionId = sessionId;
  browser.stdio[3].write(JSON.stringify(msg) + "\0");
  return new Promise((resolve, reject) => pending.set(id, { resolve, reject }));
}

let session = null;
const page = (method, params) => send(method, params, session);
async function evaluate(expression) {
  const r = await page("Runtime.evaluate", { expression, returnByValue: true, awaitPromise: true });
  if (r.exceptionDetails) throw new Error("page: " + JSON.stringify(r.exceptionDetails).slice(0, 500));
  return r.result.value;
}
async function waitFor(what, expression, seconds) {
  const deadline = Date.now() + seconds * 1000;
  for (;;) {
    const v = await evaluate(expression);
    if (v) return v;
    if (Date.now() > deadline) throw new Error("timed out waiting for " + what);
    await new Promise((r) => setTimeout(r, 50));
  }
}
async function screenshot(name) {
  const r = await page("Page.captureScreenshot", { format: "png" });
  writeFileSync(join(artifacts, name), Buffer.from(r.data, "base64"));
}
function check(ok, message) {
  if (!ok) throw new Error(message);
}

async function main() {
  const { targetInfos } = await send("Target.getTargets");
  const target = targetInfos.find((t) => t.type === "page");
  check(target, "no page target in the browser");
  ({ sessionId: session } = await send("Target.attachToTarget", { targetId: target.targetId, flatten: true }));
  await page("Page.enable");
  await page("Runtime.enable");
  await page("Emulation.setDeviceMetricsOverride", { width: 1280, height: 860, deviceScaleFactor: 1, mobile: false });
  await page("Page.navigate", { url: base + "/" });
  await waitFor("the page to load", "document.readyState === 'complete' && !!document.getElementById('composer')", 30);

  // The model list needs the key: the page asks for it once.
  await waitFor("the key dialog", "document.getElementById('key-dialog').open", 30);
  await evaluate(`document.getElementById('key-input').value = ${JSON.stringify(apiKey)};
                  document.getElementById('key-form').requestSubmit(); true`);
  await waitFor("the model name", "document.getElementById('model-name').textContent.length > 0", 30);

  // Record the reply's text every time it changes while it is still streaming.
  await evaluate(`window.__seen = [];
    new MutationObserver(() => {
      const m = document.querySelector('#messages .msg.assistant.streaming .content');
      if (m) window.__seen.push(m.textContent.length);
    }).observe(document.getElementById('messages'), { subtree: true, childList: true, characterData: true });
    document.getElementById('set-max_tokens').value = '48';
    document.getElementById('set-thinking').checked = false;
    document.getElementById('input').value = 'Write a short poem about the sea.';
    document.getElementById('composer').requestSubmit(); true`);
  await waitFor("the reply to finish", "!!document.querySelector('#messages .msg.assistant.done')", 120);
  const reply = await evaluate(`(() => {
    const m = document.querySelector('#messages .msg.assistant.done');
    return { text: m.querySelector('.content').textContent, stats: m.querySelector('.stats').textContent,
             seen: window.__seen, stopDisabled: document.getElementById('stop').disabled,
             stored: JSON.parse(localStorage.getItem('strata.chat') || '[]').length };
  })()`);
  check(reply.text.length > 0, "the reply is empty");
  const growing = new Set(reply.seen.filter((n) => n > 0));
  check(growing.size >= 2, "the reply did not stream (text lengths seen while streaming: " + JSON.stringify(reply.seen) + ")");
  check(/tokens\/s/.test(reply.stats) && /cached/.test(reply.stats), "no speed or cached-token figures: " + reply.stats);
  check(!/error/.test(reply.stats), "the reply ended in an error: " + reply.stats);
  check(reply.stopDisabled, "the stop button stays enabled after the reply");
  check(reply.stored === 2, "the conversation was not kept in localStorage");
  await screenshot("webui-chat.png");

  // The experts view against the server's own figures.
  await evaluate("document.getElementById('tab-experts').click(); true");
  await waitFor("the experts view", "document.body.dataset.experts === 'ready'", 30);
  const auth = { headers: { Authorization: "Bearer " + apiKey } };
  const experts = await (await fetch(base + "/v1/strata/experts", auth)).json();
  const metrics = await (await fetch(base + "/metrics", auth)).text();
  const grid = await evaluate(`(() => {
    const rows = [...document.querySelectorAll('#heatmap .hm-row')];
    const where = {};
    for (const c of document.querySelectorAll('#heatmap .hm-cell')) where[c.dataset.where] = (where[c.dataset.where] || 0) + 1;
    return { rows: rows.length, cells: rows.map((r) => r.querySelectorAll('.hm-cell').length), where,
             summary: document.getElementById('experts-summary').textContent };
  })()`);
  check(grid.rows === experts.n_layer, `${grid.rows} heatmap rows for ${experts.n_layer} layers`);
  check(grid.cells.every((n) => n === experts.n_expert), `rows of ${JSON.stringify(grid.cells)} cells for ${experts.n_expert} experts`);
  check(experts.tokens > 0, "no routes were counted for the reply");
  const total = experts.n_layer * experts.n_expert;
  let placedSum = 0;
  for (const w of ["gpu", "cache", "cpu"]) {
    const m = metrics.match(new RegExp(`^strata_experts_placed\\{where="${w}"\\} (\\d+)$`, "m"));
    const fromMetrics = m ? Number(m[1]) : 0;
    placedSum += fromMetrics;
    check((grid.where[w] || 0) === fromMetrics, `${grid.where[w] || 0} cells marked ${w}, /metrics says ${fromMetrics}`);
  }
  check((grid.where.none || 0) === total - placedSum, `${grid.where.none || 0} unplaced cells, expected ${total - placedSum}`);
  if (experts.placement === null) check(/routing only/.test(grid.summary), "the CPU backend's view does not say it shows routing only");
  await screenshot("webui-experts.png");
  console.log(JSON.stringify({ ok: true, layers: grid.rows, experts: experts.n_expert, where: grid.where,
                               streamed_updates: reply.seen.length, stats: reply.stats }));
}

// SIGKILL to the browser's whole process group (it was started detached, as a group leader).
function killBrowser() {
  try {
    process.kill(-browser.pid, "SIGKILL");
  } catch {
    // the group is gone already
  }
}

const watchdog = setTimeout(() => {
  console.error("drive.mjs: gave up after 240 s\n" + browserLog);
  killBrowser();
  process.exit(1);
}, 240000);
let code = 0;
try {
  await main();
} catch (e) {
  console.error("drive.mjs: " + e.message);
  code = 1;
}
clearTimeout(watchdog);
if (browser.exitCode === null && browser.signalCode === null) {
  const exited = new Promise((r) => browser.once("exit", r));
  killBrowser();
  await exited;
} else {
  killBrowser();  // helper processes may outlive the browser itself
}
// A helper process that was still exiting may write the profile for a moment longer: retry, and never let the
// clean-up of a temporary directory decide the test.
try {
  rmSync(profile, { recursive: true, force: true, maxRetries: 10, retryDelay: 100 });
} catch (e) {
  console.error("drive.mjs: could not remove " + profile + ": " + e.message);
}
process.exit(code);
