// encoderlab playground: talks to the JSON API of the server that served it (same origin), nothing else.
"use strict";

const KEY_STORE = "encoderlab-api-key";
let apiKey = sessionStorage.getItem(KEY_STORE) || "";
let health = null;

// ---- helpers ---------------------------------------------------------------------------------------------------
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (name === "class") node.className = value;
    else node.setAttribute(name, value);
  }
  node.append(...children);  // strings become text nodes: model output is never parsed as HTML
  return node;
}

async function api(path, body) {
  const init = { headers: apiKey ? { "X-API-Key": apiKey } : {} };
  if (body !== undefined) {
    init.method = "POST";
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  const data = await response.json().catch(() => ({}));
  if (response.status === 401) {
    document.getElementById("key-form").classList.add("needed");
    throw new Error("this server needs an API key: enter it at the top right");
  }
  if (!response.ok) throw new Error(describe(data.detail) || `HTTP ${response.status}`);
  return data;
}

function describe(detail) {
  if (typeof detail === "string") return detail;
  if (Array.isArray(detail)) return detail.map((e) => `${(e.loc || []).join(".")}: ${e.msg}`).join("; ");
  return "";
}

function percent(p) { return `${(100 * p).toFixed(1)}%`; }

// One labelled probability bar; data-* attributes carry the exact values (the browser tests read them).
function bar(label, value, text = percent(value), data = {}) {
  const width = `${Math.max(0, Math.min(1, value)) * 100}%`;
  const fill = el("span");
  fill.style.width = width;
  return el("div", { class: "row", "data-label": label, "data-score": String(value), ...data },
    el("span", { class: "label", title: label }, label), el("span", { class: "bar" }, fill),
    el("span", { class: "num" }, text));
}

// `text` with the spans [{start, end, cls, tag}] wrapped in <mark>.
function highlight(text, spans) {
  const box = el("div", { class: "text" });
  let at = 0;
  for (const span of [...spans].sort((a, b) => a.start - b.start)) {
    if (span.start < at) continue;  // overlapping spans: the first wins
    box.append(text.slice(at, span.start));
    const mark = el("mark", { class: span.cls, "data-tag": span.tag, "data-start": span.start, "data-end": span.end },
      text.slice(span.start, span.end));
    if (span.tag) mark.append(el("small", {}, span.tag));
    box.append(mark);
    at = span.end;
  }
  box.append(text.slice(at));
  return box;
}

// Run a panel's handler on submit; its result (or error) replaces the panel's output.
function onSubmit(panelId, handler) {
  const panel = document.getElementById(panelId);
  const form = panel.querySelector("form");
  const out = panel.querySelector(".out");
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const button = form.querySelector("button");
    button.disabled = true;
    try {
      out.replaceChildren(...await handler(form));
    } catch (err) {
      out.replaceChildren(el("p", { class: "error" }, err.message));
    } finally {
      button.disabled = false;
      panel.dataset.done = String(Number(panel.dataset.done || 0) + 1);  // tests wait on this counter
    }
  });
}

// ---- panels ----------------------------------------------------------------------------------------------------
async function fillMask(form) {
  const body = { texts: [form.text.value], top_k: Number(form.top_k.value) };
  const result = (await api("/fill-mask", body)).results[0];
  const parts = [el("p", { class: "filled" }, result.filled)];
  result.masks.forEach((mask, n) => {
    parts.push(el("h3", {}, `[MASK] ${n + 1} (token ${mask.position})`));
    const rows = el("div", { class: "mask" });
    for (const p of mask.predictions) rows.append(bar(p.token, p.score));
    parts.push(rows);
  });
  return parts;
}

function cosine(a, b) {
  let dot = 0, na = 0, nb = 0;
  for (let i = 0; i < a.length; i++) { dot += a[i] * b[i]; na += a[i] * a[i]; nb += b[i] * b[i]; }
  return dot / Math.sqrt(na * nb);
}

function lines(text, what) {
  const found = text.split("\n").map((s) => s.trim()).filter(Boolean);
  if (!found.length) throw new Error(`write one ${what} or more, one a line`);
  return found;
}

async function similarity(form) {
  const sentences = lines(form.sentences.value, "sentence");
  const vectors = (await api("/embed", { texts: [form.query.value, ...sentences] })).results.map((r) => r.embedding);
  const ranked = sentences.map((s, i) => ({ text: s, score: cosine(vectors[0], vectors[i + 1]) }))
    .sort((a, b) => b.score - a.score);
  return [el("div", { class: "ranking" }, ...ranked.map((r) => bar(r.text, r.score, r.score.toFixed(3))))];
}

// POST /rerank's ranking, best first. A reranker's score is a sigmoid in [0, 1] and draws as it is; a regression
// cross-encoder's (an STS model's) may lie anywhere, so its bars span its own lowest to highest score.
async function rerank(form) {
  const passages = lines(form.passages.value, "passage");
  const ranking = (await api("/rerank", { items: [{ query: form.query.value, passages }] })).results[0].ranking;
  const scores = ranking.map((r) => r.score);
  const low = Math.min(0, ...scores), high = Math.max(1, ...scores);
  const rows = ranking.map((r) => bar(r.passage, (r.score - low) / (high - low), r.score.toFixed(3),
    { "data-score": String(r.score), "data-index": String(r.index) }));
  return [el("div", { class: "ranking" }, ...rows)];
}

// POST /search's hits for one query, best first: the title, the text's first SNIPPET characters, the id and score.
const SNIPPET = 200;

function snippet(text) {
  const flat = text.split(/\s+/).join(" ").trim();
  return flat.length > SNIPPET ? `${flat.slice(0, SNIPPET)}…` : flat;
}

async function search(form) {
  const body = { query: form.query.value, mode: form.mode.value, top_k: Number(form.top_k.value),
    rerank: form.rerank.checked };
  const hits = (await api("/search", body)).results[0].hits;
  if (!hits.length) return [el("p", { class: "hint" }, "no hits")];
  return [el("ol", { class: "hits" }, ...hits.map((hit) => el("li", { class: "hit", "data-id": hit.id,
    "data-score": String(hit.score) },
    el("div", { class: "hit-head" }, el("b", { class: "title" }, hit.title || hit.id),
      el("code", { class: "id" }, hit.id), el("span", { class: "num" }, hit.score.toFixed(4))),
    el("p", { class: "snippet" }, snippet(hit.text)))))];
}

// POST /splade: the heaviest TERMS terms, each a bar scaled to the heaviest.
const TERMS = 30;

async function splade(form) {
  const result = (await api("/splade", { texts: [form.text.value], top_k: TERMS })).results[0];
  if (!result.tokens.length) return [el("p", { class: "hint" }, "no term has a weight")];
  const top = result.values[0];
  return [el("div", { class: "terms" }, ...result.tokens.map((token, i) =>
    bar(token, result.values[i] / top, result.values[i].toFixed(2))))];
}

// POST /colbert: the token vectors' count and the first DIMS dimensions of each.
const DIMS = 6;

async function colbert(form) {
  const result = (await api("/colbert", { texts: [form.text.value], query: form.query.checked })).results[0];
  const rows = result.vectors.map((v, i) => el("li", {}, el("code", {}, `${i}: ` +
    v.slice(0, DIMS).map((x) => x.toFixed(3)).join(" ") + " …")));
  return [el("p", {}, `${result.tokens} token vectors of ${result.vectors[0].length} dimensions`),
    el("ol", { class: "vectors" }, ...rows)];
}

async function ner(form) {
  const text = form.text.value;
  const result = (await api("/ner", { texts: [text] })).results[0];
  const spans = result.entities.map((e) => ({ start: e.start, end: e.end, cls: e.entity, tag: e.entity }));
  const list = el("div", {}, ...result.entities.map((e) => bar(`${e.text} (${e.entity})`, e.score)));
  return [highlight(text, spans), result.entities.length ? list : el("p", { class: "hint" }, "no entities found")];
}

async function qa(form) {
  const context = form.context.value;
  const result = (await api("/qa", { items: [{ question: form.question.value, context }] })).results[0];
  if (!result.answer) return [el("p", { class: "hint" }, "no answer found in the context"), highlight(context, [])];
  const span = { start: result.start, end: result.end, cls: "answer", tag: "" };
  return [el("p", {}, "Answer: ", el("b", { class: "answer-text" }, result.answer), ` (score ${result.score.toFixed(3)})`),
    highlight(context, [span])];
}

async function classify(form) {
  const pair = form.pair.value.trim();
  const result = (await api("/classify", { texts: [pair ? [form.text.value, pair] : form.text.value] })).results[0];
  if (!result.scores) return [el("p", { class: "regression", "data-score": String(result.score) },
    `score: ${result.score.toFixed(4)}`)];
  const ranked = Object.entries(result.scores).sort((a, b) => b[1] - a[1]);
  return [el("div", { class: "classes" }, ...ranked.map(([label, p]) => bar(label, p)))];
}

// ---- attention -------------------------------------------------------------------------------------------------
const VIRIDIS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];  // matplotlib's stops

function colour(value) {
  const x = Math.max(0, Math.min(1, value)) * (VIRIDIS.length - 1);
  const i = Math.min(Math.floor(x), VIRIDIS.length - 2), f = x - i;
  const [r, g, b] = VIRIDIS[i].map((c, k) => Math.round(c + f * (VIRIDIS[i + 1][k] - c)));
  return `rgb(${r},${g},${b})`;
}

// A heat-map of one head (T x T) on a canvas; with labels, token names run down the left and along the top.
function heatmap(matrix, tokens, vmax, cell, labels) {
  const T = tokens.length, margin = labels ? 90 : 0;
  const canvas = el("canvas", { width: margin + T * cell, height: margin + T * cell });
  const ctx = canvas.getContext("2d");
  matrix.forEach((row, q) => row.forEach((p, k) => {
    ctx.fillStyle = colour(p / vmax);
    ctx.fillRect(margin + k * cell, margin + q * cell, cell, cell);
  }));
  if (labels) {
    ctx.fillStyle = "#1d2330";
    ctx.font = `${Math.min(12, cell)}px ui-monospace, monospace`;
    ctx.textBaseline = "middle";
    tokens.forEach((token, i) => {
      const short = token.length > 11 ? `${token.slice(0, 10)}…` : token;
      ctx.textAlign = "right";
      ctx.fillText(short, margin - 4, margin + (i + 0.5) * cell);
      ctx.save();
      ctx.translate(margin + (i + 0.5) * cell, margin - 4);
      ctx.rotate(-Math.PI / 2);
      ctx.textAlign = "left";
      ctx.fillText(short, 0, 0);
      ctx.restore();
    });
  }
  return canvas;
}

// The strongest query -> key weights over the heads shown, best first.
function strongestLinks(maps, heads, plain, count) {
  const links = [];
  maps.forEach((matrix, h) => matrix.forEach((row, q) => row.forEach((p, k) => {
    const last = row.length - 1;
    if (plain && (q === k || q === 0 || k === 0 || q === last || k === last)) return;
    links.push({ head: heads[h], query: q, key: k, p });
  })));
  return links.sort((a, b) => b.p - a.p).slice(0, count);
}

// Queries on the left, keys on the right, a line for each strong link (thicker = stronger).
function linkDiagram(tokens, links) {
  const ns = "http://www.w3.org/2000/svg", step = 18, width = 320;
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("width", width);
  svg.setAttribute("height", tokens.length * step + 10);
  const top = links.length ? links[0].p : 1;
  for (const link of links) {
    const line = document.createElementNS(ns, "line");
    const attrs = { x1: 110, y1: (link.query + 0.5) * step + 5, x2: width - 110, y2: (link.key + 0.5) * step + 5,
      stroke: "#2f6fdf", "stroke-width": 1 + 4 * link.p / top, "stroke-opacity": 0.25 + 0.75 * link.p / top };
    for (const [name, value] of Object.entries(attrs)) line.setAttribute(name, value);
    svg.append(line);
  }
  tokens.forEach((token, i) => {
    for (const [x, anchor] of [[104, "end"], [width - 104, "start"]]) {
      const text = document.createElementNS(ns, "text");
      text.setAttribute("x", x);
      text.setAttribute("y", (i + 0.5) * step + 9);
      text.setAttribute("text-anchor", anchor);
      text.textContent = token;
      svg.append(text);
    }
  });
  return svg;
}

function fillOptions(select, values, chosen, extra = []) {
  select.replaceChildren(...extra, ...values.map((v) => el("option", { value: String(v) }, String(v))));
  select.value = String(chosen);
}

async function attention(form) {
  const head = form.head.value === "all" ? null : Number(form.head.value);
  const body = { text: form.text.value, layer: Number(form.layer.value), head, task: form.task.value };
  const data = await api("/attention", body);
  const heads = head === null ? [...Array(data.num_heads).keys()] : [head];
  fillOptions(form.layer, [...Array(data.num_layers).keys()], data.layer);
  fillOptions(form.head, heads.length > 1 ? heads : [...Array(data.num_heads).keys()], head === null ? "all" : head,
    [el("option", { value: "all" }, "all")]);
  const T = data.tokens.length, vmax = Math.max(...data.maps.flat(2), 1e-9);  // one colour scale for all heads
  const readout = el("p", { class: "readout" }, "point at a cell");
  let pictures;
  if (head === null) {
    pictures = el("div", { class: "heads" }, ...data.maps.map((m, h) => {
      const figure = el("figure", { "data-head": h }, heatmap(m, data.tokens, vmax, Math.max(2, Math.floor(150 / T)),
        false), el("figcaption", {}, `head ${h}`));
      figure.addEventListener("click", () => { form.head.value = String(h); form.requestSubmit(); });
      return figure;
    }));
  } else {
    const cell = Math.max(6, Math.min(26, Math.floor(420 / T)));
    pictures = heatmap(data.maps[0], data.tokens, vmax, cell, true);
    pictures.addEventListener("mousemove", (e) => {
      const k = Math.floor((e.offsetX - 90) / cell), q = Math.floor((e.offsetY - 90) / cell);
      if (q >= 0 && k >= 0 && q < T && k < T) {
        readout.textContent = `${data.tokens[q]} → ${data.tokens[k]}: ${data.maps[0][q][k].toFixed(4)}`;
      }
    });
  }
  const links = strongestLinks(data.maps, heads, form.plain.checked, 12);
  const list = el("ol", { class: "link-list" }, ...links.map((l) => el("li", { "data-head": l.head,
    "data-query": l.query, "data-key": l.key, "data-score": String(l.p) },
    `${data.tokens[l.query]} → ${data.tokens[l.key]} ${l.p.toFixed(3)}${head === null ? ` (head ${l.head})` : ""}`)));
  const title = `layer ${data.layer} of 0..${data.num_layers - 1}, ${head === null ? `all ${data.num_heads} heads (click one)` : `head ${head}`}` +
    (data.truncated ? " (input truncated to the model's maximum length)" : "");
  return [el("h3", {}, title), pictures, readout, el("h3", {}, "strongest links (query → key)"),
    el("div", { class: "links" }, linkDiagram(data.tokens, links), list)];
}

// ---- start -----------------------------------------------------------------------------------------------------
// Why a panel is not offered, or "" where it is.
function missing(task, loaded) {
  if (task === "search") return health.index ? "" : "This server has no index (serve --index DIR).";
  const served = task === "attention" ? loaded.size > 0 : loaded.has(task);
  if (!served) return `Not loaded on this server: ${health.unavailable[task] || "no such model was given to serve"}`;
  // A reranker is a one-score sequence classifier, so /classify loads it too (TEI's /predict asks it there), and
  // that panel would show one unnamed class: its panel is Rerank's.
  if (task === "classify" && loaded.has("rerank") && health.models.classify === health.models.rerank) {
    return "This model is a reranker (one relevance score a pair): the Rerank panel reads it.";
  }
  return "";
}

function showPanels() {
  const loaded = new Set(health.tasks);
  for (const panel of document.querySelectorAll(".panel")) {
    const why = missing(panel.dataset.task, loaded);
    panel.classList.toggle("unloaded", why !== "");
    panel.querySelector(".missing").textContent = why;
  }
  showSearch();
  const models = new Map();  // model -> the first task it serves: attention can look into any loaded model
  for (const [task, model] of Object.entries(health.models)) if (!models.has(model)) models.set(model, task);
  const select = document.querySelector("#panel-attention select[name=task]");
  select.replaceChildren(...[...models].map(([model, task]) => el("option", { value: task, title: model },
    `${model.split(/[\\/]/).filter(Boolean).pop()} (${task})`)));
}

// The Search panel only where the server has an index: its modes (BM25 where it was built with one), and the
// rerank box where the server has a cross-encoder.
function showSearch() {
  const panel = document.getElementById("panel-search");
  panel.classList.toggle("served", Boolean(health.index));
  if (!health.index) return;
  const form = panel.querySelector("form");
  const modes = health.index.modes;
  fillOptions(form.mode, modes, modes.includes(form.mode.value) ? form.mode.value : "dense");
  panel.querySelector(".rerank-option").hidden = !health.index.reranker;
  if (!health.index.reranker) form.rerank.checked = false;
}

function resetLayers() {  // another model: its own layer and head counts
  const form = document.querySelector("#panel-attention form");
  fillOptions(form.layer, [], -1, [el("option", { value: "-1" }, "last")]);
  fillOptions(form.head, [], "all", [el("option", { value: "all" }, "all")]);
}

async function connect() {
  const status = document.getElementById("status");
  try {
    health = await api("/health");
  } catch (err) {
    status.textContent = err.message;
    document.body.dataset.ready = "error";
    return;
  }
  status.textContent = "";
  document.getElementById("key-form").classList.remove("needed");
  const index = health.index ? ` · index of ${health.index.documents} documents` : "";
  document.getElementById("server").textContent = `model ${health.model} · endpoints: ${health.tasks.join(", ")}${index}`;
  showPanels();
  document.body.dataset.ready = "yes";  // tests wait for this
}

document.getElementById("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  apiKey = document.getElementById("api-key").value.trim();
  sessionStorage.setItem(KEY_STORE, apiKey);
  connect();
});
document.querySelector("#panel-attention select[name=task]").addEventListener("change", resetLayers);
onSubmit("panel-search", search);
onSubmit("panel-fill-mask", fillMask);
onSubmit("panel-attention", attention);
onSubmit("panel-similarity", similarity);
onSubmit("panel-rerank", rerank);
onSubmit("panel-splade", splade);
onSubmit("panel-colbert", colbert);
onSubmit("panel-ner", ner);
onSubmit("panel-qa", qa);
onSubmit("panel-classify", classify);
connect();
