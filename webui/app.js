// strata's web page: a chat over this server's /v1/chat/completions and a live view of where the
// model's experts are routed and where they live (/v1/strata/experts). No libraries, no other hosts.
"use strict";

const $ = (id) => document.getElementById(id);
const KEY_NAME = "strata.apiKey";
const CHAT_NAME = "strata.chat";
const SETTINGS_NAME = "strata.settings";

// ---- API key and requests ------------------------------------------------------------------------

function storedKey() {
  return sessionStorage.getItem(KEY_NAME) || localStorage.getItem(KEY_NAME) || "";
}

let keyPrompt = null;  // one dialog at a time, however many requests were refused
function askForKey(message) {
  if (keyPrompt) return keyPrompt;
  keyPrompt = new Promise((resolve) => {
    const dialog = $("key-dialog");
    $("key-error").textContent = message || "";
    $("key-input").value = "";
    $("key-form").onsubmit = (e) => {
      e.preventDefault();
      const key = $("key-input").value.trim();
      if (!key) return;
      sessionStorage.setItem(KEY_NAME, key);
      if ($("key-remember").checked) localStorage.setItem(KEY_NAME, key);
      dialog.close();
      keyPrompt = null;
      resolve();
    };
    dialog.showModal();
  });
  return keyPrompt;
}

// fetch() with the key; a 401 asks for the key and tries again.
async function api(path, options = {}) {
  for (let attempt = 0; ; ++attempt) {
    const headers = Object.assign({}, options.headers || {});
    const key = storedKey();
    if (key) headers["Authorization"] = "Bearer " + key;
    const res = await fetch(path, Object.assign({}, options, { headers }));
    if (res.status !== 401 || attempt > 3) return res;
    await askForKey(key ? "That key was refused." : "");
  }
}

async function errorText(res) {
  try {
    const j = await res.json();
    if (j.error && j.error.message) return j.error.message;
  } catch (e) { /* not JSON */ }
  return "HTTP " + res.status;
}

// ---- chat ----------------------------------------------------------------------------------------

let conversation = loadJson(localStorage, CHAT_NAME, []);
let controller = null;  // the running request's AbortController
let streaming = false;

function loadJson(store, name, fallback) {
  try {
    const v = JSON.parse(store.getItem(name));
    return v === null ? fallback : v;
  } catch (e) {
    return fallback;
  }
}

function saveConversation() {
  localStorage.setItem(CHAT_NAME, JSON.stringify(conversation));
}

const SETTING_IDS = ["system", "temperature", "top_p", "top_k", "min_p", "max_tokens", "seed", "thinking"];
function loadSettings() {
  const s = loadJson(localStorage, SETTINGS_NAME, {});
  for (const id of SETTING_IDS) {
    const el = $("set-" + id);
    if (!(id in s)) continue;
    if (el.type === "checkbox") el.checked = !!s[id]; else el.value = s[id];
  }
}
function saveSettings() {
  const s = {};
  for (const id of SETTING_IDS) {
    const el = $("set-" + id);
    s[id] = el.type === "checkbox" ? el.checked : el.value;
  }
  localStorage.setItem(SETTINGS_NAME, JSON.stringify(s));
}

// The request's sampling fields; an empty box leaves the server's default.
function samplingFields() {
  const body = {};
  for (const [id, isInt] of [["temperature", false], ["top_p", false], ["top_k", true], ["min_p", false],
                             ["max_tokens", true], ["seed", true]]) {
    const v = $("set-" + id).value.trim();
    if (v === "") continue;
    const n = isInt ? parseInt(v, 10) : parseFloat(v);
    if (!Number.isNaN(n)) body[id] = n;
  }
  body.chat_template_kwargs = { enable_thinking: $("set-thinking").checked };
  return body;
}

// Text with ``` fenced blocks and `inline code`, built as DOM nodes (never as HTML).
function renderMarkdownish(container, text) {
  container.textContent = "";
  const parts = text.split("```");
  parts.forEach((part, i) => {
    if (i % 2 === 1) {
      const nl = part.indexOf("\n");
      const lang = nl > 0 ? part.slice(0, nl).trim() : "";
      const code = nl >= 0 ? part.slice(nl + 1) : part;
      const pre = document.createElement("pre");
      if (lang && /^[\w+#.-]+$/.test(lang)) {
        const tag = document.createElement("span");
        tag.className = "code-lang";
        tag.textContent = lang;
        pre.appendChild(tag);
      }
      const c = document.createElement("code");
      c.textContent = code.replace(/\n$/, "");
      pre.appendChild(c);
      container.appendChild(pre);
      return;
    }
    if (!part) return;
    const p = document.createElement("p");
    part.split(/(`[^`\n]+`)/).forEach((bit) => {
      if (bit.length > 1 && bit.startsWith("`") && bit.endsWith("`")) {
        const c = document.createElement("code");
        c.textContent = bit.slice(1, -1);
        p.appendChild(c);
      } else if (bit) {
        p.appendChild(document.createTextNode(bit));
      }
    });
    container.appendChild(p);
  });
}

function statsText(s) {
  if (!s) return "";
  if (s.error) return s.error;
  const bits = [];
  if (s.completion_tokens !== undefined) bits.push(s.completion_tokens + " tokens");
  if (s.tokens_per_second) bits.push(s.tokens_per_second.toFixed(1) + " tokens/s");
  if (s.ttft_ms !== undefined) bits.push("first token " + Math.round(s.ttft_ms) + " ms");
  if (s.prompt_tokens !== undefined) bits.push("prompt " + s.prompt_tokens + " tokens (" + (s.cached_tokens || 0) + " cached)");
  if (s.finish_reason) bits.push("finish: " + s.finish_reason);
  return bits.join(" \u00b7 ");
}

function messageNode(m) {
  const div = document.createElement("div");
  div.className = "msg " + m.role;
  if (m.role === "user") {
    div.textContent = m.content;
    return div;
  }
  const think = document.createElement("details");
  think.className = "thinking";
  think.innerHTML = "<summary>Thinking</summary><div></div>";
  const content = document.createElement("div");
  content.className = "content";
  const stats = document.createElement("div");
  stats.className = "stats";
  div.append(think, content, stats);
  updateAssistant(div, m);
  return div;
}

function updateAssistant(div, m) {
  const think = div.querySelector(".thinking");
  think.hidden = !m.reasoning;
  think.querySelector("div").textContent = m.reasoning || "";
  renderMarkdownish(div.querySelector(".content"), m.content || "");
  div.querySelector(".stats").textContent = statsText(m.stats);
  div.querySelector(".stats").classList.toggle("error", !!(m.stats && m.stats.error));
}

function renderConversation() {
  const box = $("messages");
  box.textContent = "";
  for (const m of conversation) box.appendChild(messageNode(m)).classList.add("done");
  box.scrollTop = box.scrollHeight;
}

function setStreaming(on) {
  streaming = on;
  $("send").disabled = on;
  $("stop").disabled = !on;
  $("new-chat").disabled = on;
  if (on) pollExperts();
}

// Reads a server-sent-event stream, calling onData with each event's parsed JSON.
async function readEvents(res, onData) {
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        onData(JSON.parse(data));
      }
    }
  }
}

async function send(text) {
  const user = { role: "user", content: text };
  conversation.push(user);
  const reply = { role: "assistant", content: "", reasoning: "", stats: null };
  conversation.push(reply);
  saveConversation();
  const box = $("messages");
  box.appendChild(messageNode(user)).classList.add("done");
  const node = box.appendChild(messageNode(reply));
  node.classList.add("streaming");
  box.scrollTop = box.scrollHeight;

  const messages = [];
  const system = $("set-system").value.trim();
  if (system) messages.push({ role: "system", content: system });
  for (const m of conversation.slice(0, -1)) messages.push({ role: m.role, content: m.content });
  const body = Object.assign({ messages, stream: true, stream_options: { include_usage: true } }, samplingFields());

  controller = new AbortController();
  setStreaming(true);
  const started = performance.now();
  let first = 0;
  let usage = null, finish = null;
  try {
    const res = await api("v1/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    if (!res.ok) throw new Error(await errorText(res));
    await readEvents(res, (j) => {
      if (j.error) throw new Error(j.error.message || "the server reported an error");
      if (j.usage) usage = j.usage;
      for (const c of j.choices || []) {
        const d = c.delta || {};
        if (d.reasoning_content || d.content) {
          if (!first) first = performance.now();
          reply.reasoning += d.reasoning_content || "";
          reply.content += d.content || "";
        }
        if (c.finish_reason) finish = c.finish_reason;
      }
      updateAssistant(node, reply);
      box.scrollTop = box.scrollHeight;
    });
    reply.stats = { finish_reason: finish || "stop" };
  } catch (e) {
    reply.stats = { error: e.name === "AbortError" ? "stopped" : "error: " + e.message };
  }
  const end = performance.now();
  if (usage) {
    reply.stats.prompt_tokens = usage.prompt_tokens;
    reply.stats.completion_tokens = usage.completion_tokens;
    reply.stats.cached_tokens = (usage.prompt_tokens_details || {}).cached_tokens || 0;
    if (first && end > first && usage.completion_tokens > 1)
      reply.stats.tokens_per_second = (usage.completion_tokens - 1) / ((end - first) / 1000);
  }
  if (first) reply.stats.ttft_ms = first - started;
  controller = null;
  saveConversation();
  updateAssistant(node, reply);
  node.classList.remove("streaming");
  node.classList.add("done");
  setStreaming(false);
  pollExperts();
}

// ---- experts view --------------------------------------------------------------------------------

// The heat colour of v in [0, 1] (dark blue, blue, orange, yellow); the SVG plot uses the same stops.
const HEAT_STOPS = [[0, 13, 27, 42], [0.35, 31, 78, 121], [0.7, 194, 65, 12], [1, 250, 204, 21]];
function heat(v) {
  v = Math.max(0, Math.min(1, v));
  for (let i = 1; i < HEAT_STOPS.length; ++i) {
    const [p1, r1, g1, b1] = HEAT_STOPS[i];
    const [p0, r0, g0, b0] = HEAT_STOPS[i - 1];
    if (v <= p1) {
      const t = (v - p0) / (p1 - p0);
      return "rgb(" + Math.round(r0 + t * (r1 - r0)) + "," + Math.round(g0 + t * (g1 - g0)) + "," + Math.round(b0 + t * (b1 - b0)) + ")";
    }
  }
  return "rgb(250,204,21)";
}

const WHERE_TEXT = { gpu: "on the GPU (hot set)", cache: "in the GPU cache", cpu: "on the CPU (cold)", none: "routing only" };

function renderLegend(hasPlacement) {
  const legend = $("legend");
  if (legend.dataset.placement === String(hasPlacement)) return;
  legend.dataset.placement = String(hasPlacement);
  legend.textContent = "";
  const scale = document.createElement("span");
  scale.className = "scale";
  scale.style.background = "linear-gradient(to right," + [0, 0.35, 0.7, 1].map(heat).join(",") + ")";
  legend.append("picks, relative to the layer's hottest: 0", scale, "1");
  if (!hasPlacement) return;
  for (const w of ["gpu", "cache", "cpu"]) {
    const item = document.createElement("span");
    const mark = document.createElement("span");
    mark.className = "mark where-" + w;
    item.append(mark, WHERE_TEXT[w]);
    legend.append(item);
  }
}

// Builds the grid once per shape, then only recolours it.
function renderHeatmap(d) {
  const map = $("heatmap");
  const shape = d.n_layer + "x" + d.n_expert;
  if (map.dataset.shape !== shape) {
    map.textContent = "";
    map.dataset.shape = shape;
    for (let l = 0; l < d.n_layer; ++l) {
      const row = document.createElement("div");
      row.className = "hm-row";
      row.dataset.layer = l;
      const label = document.createElement("span");
      label.className = "hm-label";
      label.textContent = l;
      row.appendChild(label);
      for (let e = 0; e < d.n_expert; ++e) {
        const cell = document.createElement("span");
        cell.className = "hm-cell";
        cell.dataset.expert = e;
        row.appendChild(cell);
      }
      map.appendChild(row);
    }
  }
  const tokens = d.tokens || 0;
  map.querySelectorAll(".hm-row").forEach((row, l) => {
    const counts = d.counts[l] || [];
    const most = Math.max(1, ...counts);
    const homes = d.placement ? d.placement[l] : null;
    row.querySelectorAll(".hm-cell").forEach((cell, e) => {
      const n = counts[e] || 0;
      const where = homes ? (homes[e] || "none") : "none";
      cell.style.background = heat(n / most);
      cell.className = "hm-cell where-" + where;
      cell.dataset.where = where;
      cell.title = "layer " + l + ", expert " + e + ": " + n + " picks" +
        (tokens ? " (" + (n / tokens).toFixed(3) + " per token)" : "") + ", " + WHERE_TEXT[where];
    });
  });
}

// A line chart of values (null: a gap) as an inline SVG.
function lineChart(el, values, fixedMax, format) {
  const w = 300, h = 70, pad = 4;
  const nums = values.filter((v) => v !== null);
  const max = fixedMax || Math.max(1e-9, ...nums);
  let path = "", pen = false;
  values.forEach((v, i) => {
    if (v === null) { pen = false; return; }
    const x = pad + (i * (w - 2 * pad)) / Math.max(1, values.length - 1);
    const y = h - pad - (v / max) * (h - 2 * pad - 12);
    path += (pen ? "L" : "M") + x.toFixed(1) + " " + y.toFixed(1);
    pen = true;
  });
  const last = nums.length ? format(nums[nums.length - 1]) : "no data";
  el.innerHTML = '<svg viewBox="0 0 ' + w + " " + h + '" preserveAspectRatio="none">' +
    '<path d="' + path + '" fill="none" stroke="#4e9cf5" stroke-width="1.5"/>' +
    '<text x="' + (w - pad) + '" y="12" fill="#8b949e" font-size="11" text-anchor="end">' + last +
    " (max " + format(max) + ")</text></svg>";
}

function renderExperts(d) {
  renderLegend(!!d.placement);
  renderHeatmap(d);
  const bits = [d.n_layer + " layers \u00d7 " + d.n_expert + " experts, " + d.n_expert_used + " picked per token",
                d.tokens + " tokens routed since the server started", "backend: " + d.backend];
  if (!d.counting) bits.push("routing counts unavailable: " + d.counting_error);
  if (d.placement) {
    bits.push("placed: " + d.placed.gpu + " on the GPU, " + d.placed.cache + " in the GPU cache, " + d.placed.cpu + " on the CPU");
    bits.push("cold-hit rate " + (100 * d.cold_hit_rate).toFixed(1) + "%");
  } else {
    bits.push("every expert lives in host memory: routing only");
  }
  $("experts-summary").textContent = bits.join(" \u00b7 ");
  lineChart($("chart-tps"), d.history.tokens_per_second, 0, (v) => v.toFixed(1) + " tok/s");
  lineChart($("chart-cold"), d.history.cold_hit_rate, 1, (v) => (100 * v).toFixed(1) + "%");
  $("receipt-box").hidden = !d.receipt;
  $("receipt").textContent = d.receipt || "";
  document.body.dataset.experts = "ready";
}

let pollTimer = null;
let polling = false;
async function pollExperts() {
  clearTimeout(pollTimer);
  if ($("view-experts").hidden || polling) return;
  polling = true;
  try {
    const res = await api("v1/strata/experts");
    if (res.ok) {
      renderExperts(await res.json());
      $("status").textContent = "";
    } else {
      $("status").textContent = "experts: " + (await errorText(res));
    }
  } catch (e) {
    $("status").textContent = "experts: " + e.message;
  }
  polling = false;
  // Faster while a reply streams, so the picture moves with it.
  pollTimer = setTimeout(pollExperts, streaming ? 500 : 2000);
}

// ---- wiring --------------------------------------------------------------------------------------

function showView(name) {
  for (const v of ["chat", "experts"]) {
    $("view-" + v).hidden = v !== name;
    $("tab-" + v).classList.toggle("active", v === name);
  }
  if (name === "experts") pollExperts();
}

async function loadModelName() {
  try {
    const res = await api("v1/models");
    if (res.ok) {
      const j = await res.json();
      $("model-name").textContent = j.data && j.data[0] ? j.data[0].id : "";
    } else {
      $("status").textContent = await errorText(res);
    }
  } catch (e) {
    $("status").textContent = e.message;
  }
}

function init() {
  document.querySelectorAll(".tab").forEach((b) => b.addEventListener("click", () => showView(b.dataset.view)));
  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    const text = $("input").value.trim();
    if (!text || streaming) return;
    $("input").value = "";
    send(text);
  });
  $("input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) {
      e.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => controller && controller.abort());
  $("new-chat").addEventListener("click", () => {
    conversation = [];
    saveConversation();
    renderConversation();
  });
  $("toggle-settings").addEventListener("click", () => { $("settings").hidden = !$("settings").hidden; });
  for (const id of SETTING_IDS) $("set-" + id).addEventListener("change", saveSettings);
  $("forget-key").addEventListener("click", () => {
    sessionStorage.removeItem(KEY_NAME);
    localStorage.removeItem(KEY_NAME);
  });
  loadSettings();
  renderConversation();
  loadModelName();
}

init();
