// The irpe playground (docs/ui.md): plain JS, no dependencies. Talks to the server only through
// the public REST routes, by relative URLs (a path prefix such as Ray Serve's route_prefix works).
"use strict";

// Okabe-Ito: eight colours told apart with every common colour-vision deficiency; by class index
const PALETTE = ["#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7",
                 "#000000"];
const POLL_MS = 2000;
const config = JSON.parse(document.getElementById("irpe-config").textContent);
const $ = (id) => document.getElementById(id);
const state = {models: [], image: null, imageUrl: null, answer: null, sent: 0};

function describe(m) {
  return `${m.task} · backend ${m.backend} · precision ${m.precision} · ${m.state}`;
}

function selected() {
  return state.models.find((m) => m.name === $("model").value) || null;
}

async function loadModels() {
  let body;
  try {
    const r = await fetch("v1/models", {headers: {Accept: "application/json"}});
    body = await readBody(r);
    if (!r.ok) return showError(r.status, r.statusText, body);
  } catch (e) {
    return showError(0, "", {error: `could not reach the server (${e.message})`});
  }
  const keep = $("model").value;
  state.models = body;
  const select = $("model");
  select.replaceChildren(...body.map((m) => {
    const o = document.createElement("option");
    o.value = m.name;
    o.textContent = m.state === "ready" ? m.name : `${m.name} (${m.state})`;
    return o;
  }));
  if (body.some((m) => m.name === keep)) select.value = keep;
  select.disabled = false;
  onModel(false);
  if (body.some((m) => m.state === "loading")) setTimeout(loadModels, POLL_MS);
}

function onModel(send) {
  const m = selected();
  if (!m) return;
  $("model-info").textContent = describe(m);
  const detector = m.task === "detection";
  $("topk-field").hidden = detector;
  $("threshold-field").hidden = !detector;
  $("topk").max = String(m.num_classes);
  if (Number($("topk").value) > m.num_classes) $("topk").value = String(m.num_classes);
  if (send && state.image) run();
}

function setImage(file) {
  if (!file) return;
  if (state.imageUrl) URL.revokeObjectURL(state.imageUrl);
  state.image = file;
  state.imageUrl = URL.createObjectURL(file);
  $("file-name").textContent = `${file.name || "pasted image"} (${file.size} bytes)`;
  $("run").disabled = false;
  run();
}

function headers() {
  const h = {Accept: "application/json"};
  const key = $("key").value.trim();
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

async function readBody(r) {
  const text = await r.text();
  try { return JSON.parse(text); } catch (e) { return {error: text.trim() || "(empty body)"}; }
}

async function run() {
  const m = selected();
  if (!m || !state.image) return;
  const seq = ++state.sent;
  if (state.image.size > config.max_body_bytes) {
    return showError(0, "", {error: `the image is ${state.image.size} bytes, over this ` +
      `server's limit of ${config.max_body_bytes} bytes (max_body_bytes); nothing was sent`});
  }
  const detector = m.task === "detection";
  const query = detector ? "threshold=0&max_detections=100"
                         : `top_k=${Math.max(1, Math.floor(Number($("topk").value) || 5))}`;
  const form = new FormData();
  form.append("file", state.image, state.image.name || "pasted");
  $("status").textContent = `Sending to ${m.name}...`;
  $("run").disabled = true;
  const start = performance.now();
  let r, body;
  try {
    r = await fetch(`v1/models/${encodeURIComponent(m.name)}/${detector ? "detect" : "classify"}` +
                    `?${query}`, {method: "POST", body: form, headers: headers()});
    body = await readBody(r);
  } catch (e) {
    body = {error: `the request failed before an answer came (${e.message})`};
  } finally {
    $("run").disabled = false;
  }
  if (seq !== state.sent) return;  // a newer request was sent meanwhile
  const ms = performance.now() - start;
  if (r && r.ok && !Array.isArray(body.results)) body = {error: "the answer has no results"};
  if (!r || !r.ok || body.error !== undefined) {
    showError(r ? r.status : 0, r ? r.statusText : "", body);
    return reveal();
  }
  state.answer = {model: m, body, ms, url: state.imageUrl, image: state.image.name || "pasted"};
  render();
  reveal();
}

function showError(status, statusText, body) {
  const e = $("error");
  const message = body && typeof body.error === "string" ? body.error : JSON.stringify(body);
  e.replaceChildren();
  const head = document.createElement("strong");
  head.textContent = status ? `HTTP ${status}${statusText ? " " + statusText : ""}` : "Error";
  const text = document.createElement("span");
  text.className = "error-message";
  text.textContent = message;
  e.append(head, ": ", text);
  if (status === 401) {
    const hint = document.createElement("p");
    hint.className = "error-hint";
    hint.textContent = $("key").value.trim()
      ? "The server refused this API key: check it in the API key field."
      : "This server needs an API key: enter it in the API key field, then send again.";
    e.append(hint);
  }
  e.dataset.status = String(status);
  e.hidden = false;
  $("result").hidden = true;
  state.answer = null;
  $("status").textContent = "No answer.";
}

function render() {
  const {model, body, ms, url} = state.answer;
  $("error").hidden = true;
  $("result").hidden = false;
  $("result").dataset.model = model.name;  // what this answer is for (tests wait on it)
  $("result").dataset.image = state.answer.image;
  $("preview").src = url;
  $("meta").textContent = `${model.name} · ${Math.round(ms)} ms round trip (browser) · ` +
    `backend ${model.backend} · precision ${model.precision}`;
  $("meta").dataset.latencyMs = ms.toFixed(1);
  const detector = model.task === "detection";
  $("classes").hidden = detector;
  $("detections").hidden = !detector;
  $("boxes").replaceChildren();
  if (detector) return drawBoxes();
  renderClasses(body.results[0]);
}

function reveal() {  // one column (phones): bring the answer into view
  $("answer-title").scrollIntoView({block: "nearest"});
}

function score(value) {
  return value.toFixed(3);
}

function renderClasses(result) {
  const items = result.labels.map((label, i) => {
    const li = document.createElement("li");
    li.dataset.label = label;
    li.dataset.score = String(result.scores[i]);
    const name = document.createElement("span");
    name.className = "label";
    name.textContent = label;
    const bar = document.createElement("span");
    bar.className = "bar";
    const fill = document.createElement("span");
    fill.className = "fill";
    fill.style.width = `${(result.scores[i] * 100).toFixed(2)}%`;
    bar.append(fill);
    const value = document.createElement("span");
    value.className = "score";
    value.textContent = score(result.scores[i]);
    li.append(name, bar, value);
    return li;
  });
  $("classes").replaceChildren(...items);
  const best = result.labels[0];
  $("status").textContent = `${best}: ${score(result.scores[0])}`;
}

// redraws from the answer in memory: the slider never sends a request
function drawBoxes() {
  if (!state.answer || state.answer.model.task !== "detection") return;
  const threshold = Number($("threshold").value);
  const image = state.answer.body.results[0];
  const shown = image.detections.filter((d) => d.score >= threshold);
  $("boxes").replaceChildren(...shown.map((d, i) => box(d, image, i, shown.length)));
  $("detections").tBodies[0].replaceChildren(...shown.map(row));
  $("detections-caption").textContent =
    `${shown.length} of ${image.detections.length} detections with score >= ${threshold.toFixed(2)}`;
  $("status").textContent = `${shown.length} boxes at threshold ${threshold.toFixed(2)}`;
}

// black or white, whichever contrasts more with the background colour (WCAG luminance)
function textOn(hex) {
  const [r, g, b] = [1, 3, 5].map((i) => {
    const c = parseInt(hex.slice(i, i + 2), 16) / 255;
    return c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4;
  });
  const luminance = 0.2126 * r + 0.7152 * g + 0.0722 * b;
  return (luminance + 0.05) / 0.05 >= 1.05 / (luminance + 0.05) ? "#000" : "#fff";
}

function box(d, image, rank, count) {
  const [x0, y0, x1, y1] = d.box;
  const colour = PALETTE[d.index % PALETTE.length];
  const el = document.createElement("div");
  el.className = "box";
  el.dataset.label = d.label;
  el.dataset.score = String(d.score);
  el.style.left = `${(100 * x0) / image.width}%`;
  el.style.top = `${(100 * y0) / image.height}%`;
  el.style.width = `${(100 * (x1 - x0)) / image.width}%`;
  el.style.height = `${(100 * (y1 - y0)) / image.height}%`;
  el.style.borderColor = colour;
  el.style.zIndex = String(count - rank);  // the best box (and its tag) on top
  const tag = document.createElement("span");
  tag.className = "tag";
  tag.textContent = `${d.label} ${score(d.score)}`;
  tag.style.background = colour;
  tag.style.color = textOn(colour);
  if (y0 < 0.1 * image.height) tag.classList.add("inside");  // no room above the box
  if (x0 > 0.6 * image.width) tag.classList.add("right");  // nor right of its left edge
  el.append(tag);
  return el;
}

function row(d) {
  const tr = document.createElement("tr");
  tr.dataset.label = d.label;
  tr.dataset.score = String(d.score);
  const swatch = document.createElement("span");
  swatch.className = "swatch";
  swatch.style.background = PALETTE[d.index % PALETTE.length];
  const cells = [d.label, score(d.score), d.box.map((v) => v.toFixed(1)).join(", ")];
  cells.forEach((text, i) => {
    const td = document.createElement("td");
    if (i === 0) td.append(swatch);
    td.append(text);
    tr.append(td);
  });
  return tr;
}

function firstImage(items) {
  for (const item of items || []) {
    if (item.kind === "file" && item.type.startsWith("image/")) return item.getAsFile();
  }
  return null;
}

function wire() {
  if (config.auth) $("key-field").hidden = false;
  $("model").addEventListener("change", () => onModel(true));
  $("file").addEventListener("change", (e) => setImage(e.target.files[0]));
  $("run").addEventListener("click", run);
  $("topk").addEventListener("change", () => state.image && run());
  $("threshold").addEventListener("input", () => {
    $("threshold-value").textContent = Number($("threshold").value).toFixed(2);
    drawBoxes();
  });
  $("key").addEventListener("keydown", (e) => { if (e.key === "Enter") run(); });
  const drop = $("drop");
  drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (e) => {
    e.preventDefault();
    drop.classList.remove("over");
    setImage(e.dataTransfer.files[0]);
  });
  document.addEventListener("paste", (e) => {
    const file = firstImage(e.clipboardData && e.clipboardData.items);
    if (file) { e.preventDefault(); setImage(file); }
  });
  loadModels();
}

wire();
