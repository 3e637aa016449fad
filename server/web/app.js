// memplan's web page: plain JavaScript over the service's own API (POST
// /v1/plan, /v1/compare, /v1/explain, /v1/pack; GET /v1/catalog), charts by
// the vendored uPlot. No build step.
"use strict";

const CATEGORIES = [
  ["parameters", "#4e79a7"], ["gradients", "#f28e2b"], ["optimizer_state", "#59a14f"],
  ["activations", "#e15759"], ["temporaries", "#b07aa1"], ["kv_cache", "#76b7b2"], ["other", "#9c755f"],
];
const GIB = 1024 * 1024 * 1024;
const $ = (id) => document.getElementById(id);

function gib(b) { return (b / GIB).toFixed(2) + " GiB"; }
function exact(b) { return Number(b).toLocaleString("en-US"); }
function seconds(s) { return s < 1 ? (s * 1000).toFixed(1) + " ms" : s.toFixed(3) + " s"; }
function cell(tr, text, cls) {
  const td = tr.insertCell();
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}

// api posts a request; a busy answer (429, or 503 with Retry-After: the
// queue was full or the wait for a place ran out) is retried after the
// seconds it asks, up to 5 times.
async function api(command, body) {
  let resp;
  for (let attempt = 0; ; attempt++) {
    resp = await fetch("/v1/" + command, {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
    });
    const wait = Number(resp.headers.get("Retry-After"));
    if (attempt >= 5 || !(resp.status === 429 || resp.status === 503) || !(wait > 0)) break;
    $("status").textContent = command + ": the service is busy, retrying in " + wait + " s";
    await new Promise((r) => setTimeout(r, wait * 1000));
  }
  const doc = await resp.json();
  // 422 with a document is an answer: nothing fits (Memplan-Exit-Status 4),
  // and compare's table says what each strategy would need.
  if (!resp.ok && !(resp.status === 422 && doc.schema)) {
    throw new Error(command + ": " + doc.error + (doc.field ? " (field " + doc.field + ")" : ""));
  }
  return doc;
}

function showError(err) {
  const e = $("error");
  e.hidden = !err;
  e.textContent = err ? String(err.message || err) : "";
}

// --- the job and its what-if controls --------------------------------------

// RECIPE_CONTROLS are the controls a recipe may set: its switches that a
// request field also sets (/v1/catalog's recipes[].fields).
const RECIPE_CONTROLS = ["precision", "optimizer", "attention", "checkpoint"];
// CHOICES are the select controls a request carries when they differ from
// what would be planned without them.
const CHOICES = [...RECIPE_CONTROLS, "offload"];
let recipeFields = {}; // recipe name → the request fields it sets, with its values

async function loadCatalog() {
  const resp = await fetch("/v1/catalog");
  if (!resp.ok) throw new Error("GET /v1/catalog: " + resp.status);
  const cat = await resp.json();
  fill($("model"), cat.models.map((m) => [m.name, m.name + " (" + (m.params / 1e9).toFixed(2) + "B)"]), "llama-3.2-1b");
  fill($("gpu"), cat.gpus.map((g) => [g.name, g.name + " (" + gib(g.memory_bytes) + ")"]), "h100-sxm");
  fill($("recipe"), cat.recipes.map((r) => [r.name, r.name + " — " + r.framework]), "hf");
  recipeFields = Object.fromEntries(cat.recipes.map((r) => [r.name, r.fields || {}]));
}

// commandDefault is a control's value as the page is served: the
// command's default (the page's test checks them against /openapi.json).
function commandDefault(select) {
  return ([...select.options].find((o) => o.defaultSelected) || select.options[0]).value;
}

// planDefault is what a control's field is planned as when the request
// leaves it out: the chosen recipe's value, else the command's default.
function planDefault(k) {
  return recipeFields[$("recipe").value]?.[k] ?? commandDefault($(k));
}

// applyRecipe shows the chosen recipe's values in the controls it may set
// (the command's defaults where it sets none), so the controls describe
// what is planned; a control changed after that overrides the recipe. A
// value a control does not list (hf5's precision "checkpoint": the dtype
// the model's checkpoint loads in) is listed while the recipe is chosen.
function applyRecipe() {
  const name = $("recipe").value;
  for (const k of RECIPE_CONTROLS) {
    const select = $(k);
    for (const o of [...select.options]) if (o.dataset.recipe) o.remove();
    const v = planDefault(k);
    if (![...select.options].some((o) => o.value === v)) {
      const o = new Option(v + " (" + name + ")", v);
      o.dataset.recipe = name;
      select.add(o);
    }
    select.value = v;
  }
  followAttention();
}

// followAttention offers checkpoint selective only under eager attention:
// it recomputes eager attention's score matrices, and the API refuses it
// with sdpa.
function followAttention() {
  $("checkpoint").querySelector('option[value="selective"]').disabled = $("attention").value !== "eager";
}

function fill(select, options, preferred) {
  for (const [value, label] of options) select.add(new Option(label, value));
  if (options.some(([v]) => v === preferred)) select.value = preferred;
}

// request is the plan/compare request the controls describe: only fields
// that differ from what the API would plan without them (the recipe's
// value, else the command's default), so it means what the CLI's flags
// mean and repeats hit the cache; a control showing another value than
// the recipe's is sent and wins over it.
function request() {
  const r = { model: $("model").value, gpu: $("gpu").value, recipe: $("recipe").value };
  const ints = { micro_batch: 1, seq: 0, accum: 1, dp: 1, zero: 0, tp: 1 };
  for (const [k, def] of Object.entries(ints)) {
    const v = parseInt($(k).value, 10);
    if (Number.isFinite(v) && v !== def) r[k] = v;
  }
  for (const k of CHOICES) {
    if ($(k).value !== planDefault(k)) r[k] = $(k).value;
  }
  return r;
}

// plannedAs names the switches a plan ran with, as its document says.
function plannedAs(p) {
  return "precision " + p.precision + ", optimizer " + p.optimizer + ", attention " + p.attention +
    ", checkpoint " + p.checkpoint + ", offload " + (p.offload || "none");
}

let generation = 0;

async function replan() {
  const gen = ++generation;
  const req = request();
  $("status").textContent = "planning " + JSON.stringify(req) + " …";
  document.body.dataset.state = "planning";
  try {
    const [plan, cmp] = await Promise.all([api("plan", req), api("compare", req)]);
    if (gen !== generation) return; // a newer request is on its way
    showError(null);
    showPlan(plan);
    showStrategies(cmp);
    document.body.dataset.planned = JSON.stringify(req);
    $("status").textContent = plan.model + " on " + plan.gpu + ": " + plan.ops + " ops · " + plannedAs(plan);
    document.body.dataset.state = "ready";
  } catch (err) {
    if (gen !== generation) return;
    showError(err);
    $("status").textContent = "the plan below is the last one that worked";
    document.body.dataset.state = "error";
  }
}

let timer = 0;
function replanSoon() {
  clearTimeout(timer);
  timer = setTimeout(replan, 150);
}

// --- the plan: summary, timeline, ledger -----------------------------------

function showPlan(p) {
  $("peak-human").textContent = gib(p.peak.bytes);
  $("peak-bytes").textContent = exact(p.peak.bytes);
  $("peak-where").textContent = p.peak.phase + " · " + p.peak.op + (p.peak.module ? " in " + p.peak.module : "");
  $("fits").textContent = p.fits ? "fits" : "does not fit";
  $("fits").className = "big " + (p.fits ? "ok" : "bad");
  $("capacity").textContent = gib(p.capacity_bytes);
  $("margin").textContent = p.fits ? gib(p.headroom_bytes) + " headroom" : gib(p.shortfall_bytes) + " short";
  $("reserved").textContent = p.reserved ? gib(p.reserved.peak_bytes) : "—";
  $("step-time").textContent = p.time ? seconds(p.time.step_s) : "—";
  $("throughput").textContent = p.time ? Math.round(p.time.tokens_per_s).toLocaleString("en-US") + " tokens/s · MFU " + (p.time.mfu * 100).toFixed(1) + "%" : "";
  showLedger(p.ledger, p.peak.bytes);
  drawTimeline(p);
}

function showLedger(ledger, peak) {
  const body = $("ledger").tBodies[0];
  body.replaceChildren();
  for (const [cat, color] of CATEGORIES) {
    const tr = body.insertRow();
    tr.dataset.category = cat;
    const name = cell(tr, cat.replace("_", " "));
    name.style.borderLeft = "6px solid " + color;
    cell(tr, gib(ledger[cat]), "num");
    cell(tr, exact(ledger[cat]), "num exact");
    cell(tr, peak > 0 ? (100 * ledger[cat] / peak).toFixed(1) + "%" : "", "num");
  }
}

let timelinePlot = null;

// drawTimeline stacks the categories op by op: series i is the sum of the
// first i categories, drawn top first so each fill covers the ones above
// it only where it reaches; the legend and hover show each category's own
// bytes.
function drawTimeline(p) {
  const tl = p.timeline || [];
  // A timeline of more ops than its events gives each event's op_index
  // (the highest op of the run it stands for); absent, event i is op i.
  const xs = tl.map((e, i) => e.op_index ?? i);
  const peakAt = Math.max(0, xs.indexOf(p.peak.op_index));
  const cats = CATEGORIES.filter(([c]) => tl.some((e) => e[c] > 0));
  const sums = [];
  let acc = tl.map(() => 0);
  for (const [c] of cats) {
    acc = acc.map((v, i) => v + tl[i][c]);
    sums.push(acc);
  }
  const series = [{ label: "op" }];
  const data = [xs];
  for (let k = cats.length - 1; k >= 0; k--) {
    const [c, color] = cats[k];
    series.push({
      label: c.replace("_", " "), stroke: color, fill: color, width: 0,
      value: (u, v, si, idx) => (idx == null ? "—" : gib(tl[idx][c])),
    });
    data.push(sums[k]);
  }
  series.push({ label: "capacity", stroke: "#d00", dash: [6, 4], width: 1.5, value: () => gib(p.capacity_bytes) });
  data.push(xs.map(() => p.capacity_bytes));
  const opts = {
    width: Math.max(600, $("timeline").clientWidth), height: 340, series,
    scales: { x: { time: false } },
    axes: [{ label: "op" }, gibAxis()],
    cursor: { drag: { x: true, y: false } },
    hooks: { setCursor: [(u) => hover(tl, u.cursor.idx == null ? peakAt : u.cursor.idx)] },
  };
  if (timelinePlot) timelinePlot.destroy();
  timelinePlot = new uPlot(opts, data, $("timeline"));
  hover(tl, peakAt);
}

// gibAxis is a y axis in whole GiB steps.
function gibAxis() {
  return {
    size: 70, incrs: [1, 2, 4, 5, 10, 20, 40, 50, 100, 200, 500].map((g) => g * GIB),
    values: (u, ticks) => ticks.map((t) => (t / GIB).toFixed(0) + " GiB"),
  };
}

function hover(tl, idx) {
  const e = idx == null ? null : tl[idx];
  $("hover").textContent = e
    ? "#" + (e.op_index ?? idx) + " " + e.op + (e.module ? " · " + e.module : "") + " · " + e.phase +
      (e.micro_step ? " (micro-step " + e.micro_step + ")" : "") + (e.recompute ? " · recompute" : "") + " · " + gib(e.total)
    : "\u00a0";
}

// --- compare -----------------------------------------------------------------

function showStrategies(c) {
  const body = $("strategies").tBodies[0];
  body.replaceChildren();
  for (const s of c.strategies) {
    if (!s.applies) continue;
    const tr = body.insertRow();
    tr.dataset.strategy = s.strategy;
    tr.dataset.peakBytes = s.peak_bytes;
    cell(tr, s.strategy);
    cell(tr, gib(s.peak_bytes), "num");
    cell(tr, s.fits ? "fits" : "does not fit", s.fits ? "ok" : "bad");
    cell(tr, s.step_s ? seconds(s.step_s) : "—", "num");
    cell(tr, s.throughput_ratio ? (100 * s.throughput_ratio).toFixed(0) + "%" : "—", "num");
    cell(tr, s.changes, "small");
  }
}

// --- explain -----------------------------------------------------------------

function readBase64(file) {
  return new Promise((resolve, reject) => {
    const r = new FileReader();
    r.onload = () => resolve(String(r.result).replace(/^data:[^,]*,/, ""));
    r.onerror = () => reject(r.error);
    r.readAsDataURL(file);
  });
}

async function explain() {
  const file = $("snapshot").files[0];
  if (!file) return;
  $("status").textContent = "explaining " + file.name + " …";
  try {
    const doc = await api("explain", { snapshot: await readBase64(file) });
    showError(null);
    showExplain(doc);
    $("status").textContent = "explained " + file.name;
  } catch (err) {
    showError(err);
  }
}

function showExplain(doc) {
  $("explain").hidden = false;
  $("explain-summary").textContent = doc.summary;
  const peak = doc.peak_allocated;
  for (const [id, rows] of [["explain-cats", peak.by_category], ["explain-sites", peak.by_site]]) {
    const body = $(id).tBodies[0];
    body.replaceChildren();
    for (const r of rows || []) {
      const tr = body.insertRow();
      cell(tr, r.name);
      cell(tr, gib(r.bytes), "num");
    }
  }
}

// --- pack --------------------------------------------------------------------

let packPlot = null;

async function pack() {
  $("status").textContent = "packing …";
  try {
    const doc = await api("pack", { jobs: $("jobs").value, gpus: $("pool").value });
    showError(null);
    showPack(doc);
    $("status").textContent = "packed " + doc.envelopes.length + " processes on " + doc.gpus + " × " + doc.gpu;
  } catch (err) {
    showError(err);
  }
}

function showPack(doc) {
  $("pack").hidden = false;
  const body = $("policies").tBodies[0];
  body.replaceChildren();
  for (const p of doc.policies) {
    const tr = body.insertRow();
    tr.dataset.policy = p.policy;
    cell(tr, p.policy);
    cell(tr, p.gpus_needed, "num");
    cell(tr, (p.unplaced || []).join(", ") || "—");
    cell(tr, p.at_risk_gpus, "num");
    cell(tr, p.oom_gpus, "num " + (p.oom_gpus ? "bad" : "ok"));
  }
  const curve = doc.policies.find((p) => p.policy === "curve") || doc.policies[doc.policies.length - 1];
  showAssignment(curve.assignment || []);
  drawPack(curve.assignment || [], doc.capacity_bytes);
}

function showAssignment(gpus) {
  const body = $("assignment").tBodies[0];
  body.replaceChildren();
  for (const g of gpus) {
    const tr = body.insertRow();
    cell(tr, g.gpu, "num");
    cell(tr, g.jobs.join(", "));
    cell(tr, gib(g.reach_bytes), "num");
    cell(tr, gib(g.margin_bytes), "num");
    cell(tr, g.status, g.status === "ok" ? "ok" : "bad");
  }
}

function drawPack(gpus, capacity) {
  const palette = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1", "#76b7b2", "#9c755f", "#edc948"];
  const curves = gpus.map((g) => [g.combined_curve.map((pt) => pt.t_s * 1000), g.combined_curve.map((pt) => pt.bytes)]);
  const data = curves.length ? uPlot.join(curves) : [[]];
  const series = [{ label: "ms" }];
  gpus.forEach((g, i) => series.push({ label: "GPU " + g.gpu, stroke: palette[i % palette.length], spanGaps: true, value: (u, v) => (v == null ? "—" : gib(v)) }));
  series.push({ label: "capacity", stroke: "#d00", dash: [6, 4], value: () => gib(capacity) });
  data.push(data[0].map(() => capacity));
  const opts = {
    width: Math.max(600, $("pack-chart").clientWidth), height: 260, series,
    scales: { x: { time: false }, y: { range: (u, min, max) => [0, Math.max(max, capacity) * 1.05] } },
    axes: [{ label: "ms into the period" }, gibAxis()],
  };
  if (packPlot) packPlot.destroy();
  packPlot = new uPlot(opts, data, $("pack-chart"));
}

// --- start ---------------------------------------------------------------------

async function start() {
  try {
    await loadCatalog();
  } catch (err) {
    showError(new Error("loading the catalog: " + err.message));
    return;
  }
  applyRecipe();
  $("recipe").addEventListener("change", applyRecipe);
  $("attention").addEventListener("change", followAttention);
  $("controls").addEventListener("change", replanSoon);
  $("controls").addEventListener("input", (e) => { if (e.target.type === "number") replanSoon(); });
  $("controls").addEventListener("submit", (e) => e.preventDefault());
  $("snapshot").addEventListener("change", explain);
  $("pack-run").addEventListener("click", pack);
  window.addEventListener("resize", () => {
    if (timelinePlot) timelinePlot.setSize({ width: Math.max(600, $("timeline").clientWidth), height: 340 });
    if (packPlot) packPlot.setSize({ width: Math.max(600, $("pack-chart").clientWidth), height: 260 });
  });
  await replan();
}

document.addEventListener("DOMContentLoaded", start);
