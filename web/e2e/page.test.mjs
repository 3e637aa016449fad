// memplan's web page end to end in headless Chromium (Debian's chromium,
// driven by playwright-core): memplan serve on a free loopback port, the
// page loaded with every request off the loopback origin refused (it must
// work offline), the numbers it shows checked against the API's JSON for
// the same request, a what-if control changed and checked again, a
// snapshot from testdata uploaded and its explanation checked, a pack run
// checked, and a screenshot taken; the controls checked to follow the
// chosen recipe and to override it, each time against what the API plans;
// and a page of another origin checked to be unable to make the service
// plan.
//
// Environment: MEMPLAN (the binary; default: go build ./cmd/memplan into a
// temporary directory), CHROMIUM (default /usr/bin/chromium), SCREENSHOT
// (where the PNG goes; default a temporary file; docs/page.png for the
// README).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, execFileSync } from "node:child_process";
import { createServer } from "node:http";
import { readFileSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const root = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");
const snapshotFile = join(root, "testdata/snapshots/Muduard__LayoutEditing__413b2eb4__memory_snapshot.pkl");
const tmp = mkdtempSync(join(tmpdir(), "memplan-e2e-"));
let server, base, browser, page;
const problems = []; // console errors, page errors, refused requests
const refused = []; // URLs the API answered 400

// startServer runs memplan serve on 127.0.0.1:0 and reads the port it got
// from its "serving" log line.
async function startServer() {
  let bin = process.env.MEMPLAN;
  if (!bin) {
    bin = join(tmp, "memplan");
    execFileSync("go", ["build", "-o", bin, "./cmd/memplan"], { cwd: root, stdio: "inherit" });
  }
  server = spawn(bin, ["serve", "--addr", "127.0.0.1:0"], { stdio: ["ignore", "ignore", "pipe"] });
  return new Promise((res, rej) => {
    let buf = "";
    const timer = setTimeout(() => rej(new Error("memplan serve did not log its address in 20 s:\n" + buf)), 20000);
    server.on("exit", (code) => rej(new Error("memplan serve exited with " + code + ":\n" + buf)));
    server.stderr.on("data", (d) => {
      buf += d;
      const m = buf.match(/"msg":"serving","addr":"([^"]+)"/);
      if (m) {
        clearTimeout(timer);
        res("http://" + m[1]);
      }
    });
  });
}

// post sends a request as the page does, retrying busy answers (429, 503
// with Retry-After) on a loaded machine; api expects a 200.
async function post(command, body) {
  for (let attempt = 0; ; attempt++) {
    const resp = await fetch(base + "/v1/" + command, {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
    });
    const wait = Number(resp.headers.get("Retry-After"));
    if (attempt >= 5 || !(resp.status === 429 || resp.status === 503) || !(wait > 0)) {
      return { status: resp.status, doc: await resp.json() };
    }
    await new Promise((r) => setTimeout(r, wait * 1000));
  }
}

async function api(command, body) {
  const { status, doc } = await post(command, body);
  assert.equal(status, 200, command + ": " + JSON.stringify(doc));
  return doc;
}

const GIB = 1024 ** 3;
const gib = (b) => (b / GIB).toFixed(2) + " GiB";
const text = (sel) => page.locator(sel).innerText();
const bytesShown = async (sel) => Number((await text(sel)).replace(/,/g, ""));

// planned waits until the page has shown the plan of a request that has
// want's fields, and returns that request.
async function planned(want) {
  await page.waitForFunction((w) => {
    const b = document.body.dataset;
    if (b.state !== "ready" || !b.planned) return false;
    const got = JSON.parse(b.planned);
    return Object.entries(w).every(([k, v]) => got[k] === v);
  }, want, { timeout: 60000 }).catch(async (e) => {
    const d = await page.evaluate(() => ({ ...document.body.dataset, error: document.getElementById("error").textContent }));
    throw new Error(`waiting for a plan of ${JSON.stringify(want)}: ${e.message}; the page: ${JSON.stringify(d)}`);
  });
  return JSON.parse(await page.evaluate(() => document.body.dataset.planned));
}

// checkPlan compares what the page shows with the API's plan and compare
// documents for req.
async function checkPlan(req) {
  const [plan, cmp] = await Promise.all([api("plan", req), api("compare", req)]);
  assert.equal(await bytesShown("#peak-bytes"), plan.peak.bytes, "peak bytes");
  assert.equal(await text("#peak-human"), gib(plan.peak.bytes));
  assert.match(await text("#peak-where"), new RegExp(plan.peak.op.replace(/[()[\]*+?.]/g, "\\$&")));
  assert.equal(await text("#fits"), plan.fits ? "fits" : "does not fit");
  assert.equal(await text("#reserved"), gib(plan.reserved.peak_bytes));
  const step = await text("#step-time");
  assert.ok(Math.abs(parseFloat(step) / 1000 - plan.time.step_s) < 1e-4, `step time ${step} vs ${plan.time.step_s} s`);
  for (const [cat, bytes] of Object.entries(plan.ledger)) {
    const shown = await page.locator(`#ledger tr[data-category="${cat}"] td.exact`).innerText();
    assert.equal(Number(shown.replace(/,/g, "")), bytes, "ledger " + cat);
  }
  const rows = await page.locator("#strategies tbody tr").evaluateAll((trs) =>
    trs.map((tr) => [tr.dataset.strategy, Number(tr.dataset.peakBytes), tr.cells[2].innerText]));
  const want = cmp.strategies.filter((s) => s.applies).map((s) => [s.strategy, s.peak_bytes, s.fits ? "fits" : "does not fit"]);
  assert.deepEqual(rows, want, "strategy table");
  return plan;
}

// checkHover checks the op shown under the timeline: the peak's before the
// mouse comes, then, with the mouse over the chart, the plan's op at the
// index shown; and the chart's zoom.
async function checkHover(plan) {
  const atPeak = await text("#hover");
  assert.ok(atPeak.startsWith(`#${plan.peak.op_index} ${plan.peak.op} `) && atPeak.endsWith(gib(plan.peak.bytes)),
    `before hovering the timeline shows the peak's op: ${atPeak}`);
  const over = page.locator("#timeline .u-over");
  const box = await over.boundingBox();
  await page.mouse.move(box.x + box.width * 0.4, box.y + box.height / 2);
  const shown = await text("#hover");
  const m = shown.match(/^#(\d+) (\S+)/);
  assert.ok(m, "hover shows an op: " + shown);
  const ev = plan.timeline.find((e, i) => (e.op_index ?? i) === Number(m[1]));
  assert.equal(m[2], ev.op);
  if (ev.module) assert.ok(shown.includes(" · " + ev.module + " · "), `hover ${shown} lacks module ${ev.module}`);

  // Dragging across the chart zooms into those ops; a double-click shows
  // them all again.
  const xRange = () => page.evaluate(() => [timelinePlot.scales.x.min, timelinePlot.scales.x.max]);
  const [lo, hi] = await xRange();
  await page.mouse.move(box.x + box.width * 0.3, box.y + box.height / 2);
  await page.mouse.down();
  await page.mouse.move(box.x + box.width * 0.5, box.y + box.height / 2, { steps: 5 });
  await page.mouse.up();
  const [zlo, zhi] = await xRange();
  assert.ok(zlo > lo && zhi < hi && zhi - zlo < (hi - lo) / 3, `zoomed to ${zlo}..${zhi} from ${lo}..${hi}`);
  await page.mouse.dblclick(box.x + box.width / 2, box.y + box.height / 2);
  assert.deepEqual(await xRange(), [lo, hi], "double-click resets the zoom");
}

before(async () => {
  base = await startServer();
  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    args: process.getuid && process.getuid() === 0 ? ["--no-sandbox"] : [],
  });
  page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  page.on("console", (m) => {
    if (m.type() !== "error") return;
    // Chromium logs every 4xx answer; the page's only ones are the
    // refused request's (plan and compare), counted there.
    if (/status of 400 \(Bad Request\)/.test(m.text())) refused.push(m.location().url);
    else if (/status of (429|503) /.test(m.text())) return; // busy: the page retries
    else problems.push("console: " + m.text());
  });
  page.on("pageerror", (e) => problems.push("page error: " + e.message));
  await page.route("**/*", (route) => {
    if (route.request().url().startsWith(base + "/")) return route.continue();
    problems.push("refused off-origin request " + route.request().url());
    return route.abort();
  });
});

after(async () => {
  await browser?.close();
  server?.kill();
  rmSync(tmp, { recursive: true, force: true });
});

test("the page shows the API's numbers, re-plans, explains, packs", async () => {
  await page.goto(base + "/");
  const first = await planned({ model: "llama-3.2-1b", gpu: "h100-sxm", recipe: "hf" });
  assert.deepEqual(first, { model: "llama-3.2-1b", gpu: "h100-sxm", recipe: "hf" });
  const plan = await checkPlan(first);
  await checkHover(plan);

  await page.fill("#micro_batch", "4");
  const second = await planned({ micro_batch: 4 });
  assert.deepEqual(second, { ...first, micro_batch: 4 });
  const plan4 = await checkPlan(second);
  assert.ok(plan4.peak.bytes > plan.peak.bytes, "micro-batch 4 peaks higher than 1");

  // A request the API refuses: its error, naming the field, is shown and
  // the last plan is marked stale; the next valid change plans again.
  await page.selectOption("#zero", "3");
  await page.waitForFunction(() => document.body.dataset.state === "error", null, { timeout: 60000 });
  const { status: badStatus, doc: badDoc } = await post("plan", { ...second, zero: 3 });
  assert.equal(badStatus, 400);
  assert.equal(badDoc.field, "zero");
  assert.match(await text("#error"), new RegExp("^(plan|compare): " + badDoc.error.replace(/[()[\]*+?.]/g, "\\$&") + " \\(field zero\\)$"));
  await page.fill("#dp", "2");
  const third = await planned({ zero: 3, dp: 2 });
  assert.deepEqual(third, { ...second, zero: 3, dp: 2 });
  assert.equal(await page.locator("#error").isHidden(), true, "the error is gone once a plan works");
  assert.deepEqual(refused.sort(), [base + "/v1/compare", base + "/v1/plan"], "the 400s the page met");
  await checkPlan(third);

  await page.setInputFiles("#snapshot", snapshotFile);
  await page.locator("#explain").waitFor({ state: "visible", timeout: 60000 });
  const ex = await api("explain", { snapshot: readFileSync(snapshotFile).toString("base64") });
  assert.equal(await text("#explain-summary"), ex.summary);
  for (const [id, rows] of [["#explain-cats", ex.peak_allocated.by_category], ["#explain-sites", ex.peak_allocated.by_site]]) {
    const shownRows = await page.locator(id + " tbody tr").evaluateAll((trs) => trs.map((tr) => [tr.cells[0].innerText, tr.cells[1].innerText]));
    assert.deepEqual(shownRows, rows.map((r) => [r.name, gib(r.bytes)]), id);
  }

  await page.click("#pack-run");
  await page.locator("#pack").waitFor({ state: "visible", timeout: 60000 });
  const pk = await api("pack", { jobs: await page.inputValue("#jobs"), gpus: await page.inputValue("#pool") });
  const shown = await page.locator("#policies tbody tr").evaluateAll((trs) =>
    trs.map((tr) => [tr.dataset.policy, Number(tr.cells[1].innerText), Number(tr.cells[4].innerText)]));
  assert.deepEqual(shown, pk.policies.map((p) => [p.policy, p.gpus_needed, p.oom_gpus]));
  const curve = pk.policies.find((p) => p.policy === "curve");
  assert.equal(await page.locator("#assignment tbody tr").count(), curve.assignment.length);

  await page.evaluate(() => window.scrollTo(0, 0));
  const shot = process.env.SCREENSHOT || join(tmp, "page.png");
  await page.screenshot({ path: shot, fullPage: true });
  assert.deepEqual(problems, []);
});

// controls reads the select controls a request may carry.
const controls = () => page.evaluate(() =>
  Object.fromEntries(["precision", "optimizer", "attention", "checkpoint", "offload"].map((k) => [k, document.getElementById(k).value])));

// checkFollows waits for the plan of a request with want's fields and
// checks that the API plans it with what the controls show: the plan's
// precision, optimizer, attention, checkpoint and offload are the
// controls' (a recipe's precision "checkpoint" resolves to a precision).
async function checkFollows(want) {
  const req = await planned(want);
  const [shown, plan] = [await controls(), await api("plan", req)];
  const got = { precision: plan.precision, optimizer: plan.optimizer, attention: plan.attention, checkpoint: plan.checkpoint, offload: plan.offload || "none" };
  if (shown.precision === "checkpoint") shown.precision = got.precision;
  assert.deepEqual(got, shown, `the plan of ${JSON.stringify(req)} against the controls`);
  assert.ok((await text("#status")).endsWith(`precision ${got.precision}, optimizer ${got.optimizer}, attention ${got.attention}, checkpoint ${got.checkpoint}, offload ${got.offload}`),
    "the status line says what was planned: " + (await text("#status")));
  return req;
}

// Choosing a recipe shows its switches in the controls (GET /v1/catalog's
// fields), and what the controls show is what /v1/plan plans; a control
// changed afterwards overrides the recipe. Checkpoint selective is offered
// only under eager attention, and then plans.
test("the controls follow the recipe, and a control overrides it", async () => {
  await page.goto(base + "/");
  await planned({ recipe: "hf" });
  const spec = (await (await fetch(base + "/openapi.json")).json()).paths["/v1/plan"].post.requestBody.content["application/json"].schema.properties;
  const defaults = await controls();
  for (const [k, v] of Object.entries(defaults)) {
    // A flag a recipe switch mirrors names the recipe's default, the page's under --recipe hf.
    assert.match(spec[k].description, new RegExp(`\\((default ${v}|default: the --recipe's; ${v} with --recipe hf)\\)$`), `the page's ${k} shows the command's default`);
  }
  const cat = await (await fetch(base + "/v1/catalog")).json();
  const fields = Object.fromEntries(cat.recipes.map((r) => [r.name, r.fields]));
  for (const name of ["torchtune", "torchtitan", "litgpt", "hf5", "megatron", "hf"]) {
    await page.selectOption("#recipe", name);
    const req = await checkFollows({ recipe: name });
    const shown = await controls();
    for (const k of ["precision", "optimizer", "attention", "checkpoint"]) {
      assert.equal(shown[k], fields[name][k] ?? defaults[k], `recipe ${name}'s ${k}`);
      assert.equal(req[k], undefined, `recipe ${name}: ${k} equal to the recipe's is left to it`);
    }
  }
  assert.equal(await page.inputValue("#precision"), "amp-bf16", "hf sets no precision: the command's default again");

  // The reported cases: torchtune with amp-bf16, torchtitan without
  // checkpointing, litgpt with amp-bf16, hf5 with amp-bf16.
  for (const [name, k, v] of [["torchtune", "precision", "amp-bf16"], ["torchtitan", "checkpoint", "none"],
    ["litgpt", "precision", "amp-bf16"], ["hf5", "precision", "amp-bf16"]]) {
    await page.selectOption("#recipe", name);
    await planned({ recipe: name });
    await page.selectOption("#" + k, v);
    const req = await checkFollows({ recipe: name, [k]: v });
    assert.equal(req[k], v, `${name} with ${k} ${v} sends it`);
  }

  await page.selectOption("#recipe", "hf");
  await planned({ recipe: "hf", precision: undefined });
  const selective = page.locator('#checkpoint option[value="selective"]');
  assert.equal(await selective.isDisabled(), true, "checkpoint selective is not offered under sdpa");
  await page.selectOption("#attention", "eager");
  await checkFollows({ attention: "eager" });
  assert.equal(await selective.isDisabled(), false, "checkpoint selective is offered under eager attention");
  await page.selectOption("#checkpoint", "selective");
  await checkFollows({ attention: "eager", checkpoint: "selective" });
  assert.equal(await page.locator("#error").isHidden(), true);
  assert.deepEqual(problems, []);
});

// requestsTotal is memplan_http_requests_total for a route and status.
async function requestsTotal(route, status) {
  const m = (await (await fetch(base + "/metrics")).text())
    .match(new RegExp(`^memplan_http_requests_total\\{route="${route}",status="${status}"\\} (\\d+)$`, "m"));
  return m ? Number(m[1]) : 0;
}

// A page of another origin (a second loopback server's) cannot make the
// service plan: the POST a browser sends without asking (text/plain,
// no-cors) is refused 415 before it is parsed, and a JSON one never leaves
// the browser, its preflight refused.
test("another origin's page cannot make the service plan", async () => {
  const other = createServer((req, res) => res.writeHead(200, { "Content-Type": "text/html" }).end("<!doctype html><title>evil</title>"));
  await new Promise((res) => other.listen(0, "127.0.0.1", res));
  const ctx = await browser.newContext();
  try {
    const evil = await ctx.newPage();
    await evil.goto(`http://127.0.0.1:${other.address().port}/`);
    const before = { ok: await requestsTotal("/v1/plan", 200), refused: await requestsTotal("/v1/plan", 415) };
    const body = JSON.stringify({ model: "gpt2", seq: 7, no_timeline: true });
    const got = await evil.evaluate(async ({ url, body }) => {
      const simple = await fetch(url, { method: "POST", mode: "no-cors", headers: { "Content-Type": "text/plain" }, body });
      let json = "sent";
      try {
        await fetch(url, { method: "POST", headers: { "Content-Type": "application/json" }, body });
      } catch (e) {
        json = e.name;
      }
      return { simple: simple.type, json };
    }, { url: base + "/v1/plan", body });
    assert.deepEqual(got, { simple: "opaque", json: "TypeError" }, "the simple request goes out, the JSON one is stopped");
    assert.equal(await requestsTotal("/v1/plan", 415), before.refused + 1, "the simple request is refused 415");
    assert.equal(await requestsTotal("/v1/plan", 200), before.ok, "nothing is planned for another origin");
  } finally {
    await ctx.close();
    other.close();
  }
});
