// Overview: summary tiles and charts over a chosen range (1 h to 7 d), refreshed on a timer.
import { api } from "../api.js";
import { el, field, fmtNum } from "../dom.js";
import { chartBox, lineConfig } from "../charts.js";
import { usd } from "../usage_data.js";

const round = (v, d = 3) => (v === null || v === undefined ? null : Number(v.toFixed(d)));
const pct = (v) => (v === null || v === undefined ? null : round(v * 100, 1));
const ms = (v) => (v === null || v === undefined ? null : round(v * 1000, 1));
const pctText = (v) => (v === null || v === undefined ? "—" : `${fmtNum(100 * v, 1)} %`);

// [value, label, minutes, step_s]: the step keeps each range near 60-170 points.
export const RANGES = [["1h", "Last 1 h", 60, 60], ["6h", "Last 6 h", 360, 300], ["24h", "Last 24 h", 1440, 900], ["7d", "Last 7 d", 10080, 3600]];
const REFRESH = [["0", "Off"], ["10", "Every 10 s"], ["30", "Every 30 s"]];
const PREFS_KEY = "cloister.overview"; // the range and refresh survive reloads and sign-ins
let timer = null; // one refresh timer for the whole console: a new render replaces it

function loadPrefs() {
  let p = {};
  try { p = JSON.parse(localStorage.getItem(PREFS_KEY) || "{}"); } catch { p = {}; }
  return {
    range: RANGES.some(([v]) => v === p.range) ? p.range : "1h",
    refresh: REFRESH.some(([v]) => v === p.refresh) ? p.refresh : "0",
  };
}

function tile(id, label, value, sub) {
  return el("section", { class: "card tile", "aria-label": label, id },
    el("h2", {}, label), el("p", { class: "kpi" }, value), sub ? el("p", { class: "muted" }, sub) : null);
}

function tiles(ctx, sm, rangeLabel) {
  const plural = (n, word) => `${fmtNum(n)} ${word}${n === 1 ? "" : "s"}`;
  const period = (p) => `${plural(p.requests, "request")} · ${plural(p.tokens, "token")}`;
  const engine = sm.engine;
  const list = [
    tile("tile-requests", `Requests (${rangeLabel})`, fmtNum(sm.requests), `${fmtNum(sm.errors)} with an error`),
    tile("tile-tokens", `Tokens (${rangeLabel})`, fmtNum(sm.tokens), "prompt + completion"),
    tile("tile-error-rate", "Error rate", pctText(sm.error_rate), "HTTP 4xx/5xx, refusals included"),
    tile("tile-hit-rate", "Prefix-cache hit rate", pctText(sm.prefix_cache_hit_rate), "cached / prompt tokens"),
    tile("tile-spend-today", "Spend today (UTC)", usd(sm.today.cost_pico_usd), period(sm.today)),
    tile("tile-spend-month", "Spend this month", usd(sm.month.cost_pico_usd), period(sm.month)),
  ];
  if (engine) {
    const sampled = engine.sampled_at !== null;
    list.push(
      tile("tile-queue", "Queue (waiting / running)",
        sampled && engine.num_waiting !== null ? `${fmtNum(engine.num_waiting)} / ${fmtNum(engine.num_running)}` : "—",
        sampled ? "now, all engines" : "engine statistics not connected"),
      tile("tile-kv", "KV cache usage", pctText(engine.kv_cache_usage), sampled ? "now, mean of engines" : "engine statistics not connected"));
  }
  return el("div", { class: "tiles", id: "overview-tiles" }, list);
}

function charts(ctx, data) {
  const long = data.summary.minutes > 1440; // over a day: the labels need the date
  const labels = data.labels.map((l) => (long ? `${l.slice(5, 10)} ${l.slice(11, 16)}` : l.slice(11, 16)));
  const s = data.series;
  return el("div", { class: "grid" },
    chartBox("Requests per second", lineConfig(labels, [{ label: "requests/s", data: s.requests_per_s.map((v) => round(v)) }]), { id: "chart-rps" }),
    chartBox("Tokens per second", lineConfig(labels, [{ label: "tokens/s", data: s.tokens_per_s.map((v) => round(v, 1)) }]), { id: "chart-tps" }),
    chartBox("Prefix-cache hit rate (%)", lineConfig(labels, [{ label: "hit rate %", data: s.prefix_cache_hit_rate.map(pct) }], { yMax: 100 }), { id: "chart-hits" }),
    ctx.me.role === "tenant-admin" ? null
      : chartBox("KV cache usage (%)", lineConfig(labels, [{ label: "KV used %", data: s.kv_cache_usage.map(pct) }], { yMax: 100 }), { id: "chart-kv" }),
    chartBox("Rate-limit rejections per step", lineConfig(labels, [{ label: "rejections", data: s.rate_limit_rejections }]), { id: "chart-rejections" }),
    chartBox("Latency p95 (ms)", lineConfig(labels, [
      { label: "TTFT p95 ms", data: s.ttft_p95_s.map(ms) },
      { label: "ITL p95 ms", data: s.itl_p95_s.map(ms) },
    ]), { id: "chart-latency" }));
}

function note(ctx, data, rangeLabel) {
  const step = data.step_s >= 3600 ? `${data.step_s / 3600} h` : `${Math.round(data.step_s / 60)} min`;
  const what = ctx.me.role === "tenant-admin" ? "Your tenant's traffic" : "The whole platform";
  const extra = ctx.me.role !== "tenant-admin" && !data.engine_stats
    ? " Engine statistics are not connected, so KV usage is empty and cache hits come from usage records." : "";
  return `${what}, ${rangeLabel.toLowerCase()}, one point per ${step}.${extra}`;
}

export async function render(ctx) {
  if (timer) { clearInterval(timer); timer = null; }
  const prefs = loadPrefs();
  const body = el("div", { id: "overview-body", "aria-live": "off" });
  const updated = el("span", { class: "muted", id: "overview-updated" });
  const rangeField = field("Time range", { name: "range", value: prefs.range, options: RANGES.map(([v, label]) => [v, label]) });
  const refreshField = field("Auto-refresh", { name: "refresh", value: prefs.refresh, options: REFRESH });
  const root = el("div", {}, el("h1", {}, "Overview"),
    el("div", { class: "row toolbar" }, rangeField, refreshField, updated), body);

  const draw = async () => {
    const [, label, minutes, step] = RANGES.find(([v]) => v === prefs.range);
    const data = await api.get("/overview", { minutes, step_s: step });
    for (const c of body.querySelectorAll("canvas")) if (c.chart) c.chart.destroy();
    body.replaceChildren(...[
      tiles(ctx, data.summary, label.replace("Last ", "")),
      el("p", { class: "muted" }, note(ctx, data, label)),
      data.truncated ? el("p", { class: "muted" }, "Only the newest records were read for this range.") : null,
      charts(ctx, data)].filter(Boolean)); // replaceChildren would print a null as "null"
    updated.textContent = `Updated ${new Date().toISOString().slice(11, 19)} UTC`;
  };
  const schedule = () => {
    if (timer) { clearInterval(timer); timer = null; }
    const every = Number(prefs.refresh);
    if (!every) return;
    timer = setInterval(async () => {
      // Another page replaced this one: stop instead of fetching for nobody.
      if (!root.isConnected) { clearInterval(timer); timer = null; return; }
      try { await draw(); } catch (err) { updated.textContent = `Refresh failed: ${err.message}`; }
    }, every * 1000);
  };
  const save = () => localStorage.setItem(PREFS_KEY, JSON.stringify(prefs));
  rangeField.input.addEventListener("change", async () => {
    prefs.range = rangeField.input.value;
    save();
    try { await draw(); } catch (err) { updated.textContent = `Could not load: ${err.message}`; }
  });
  refreshField.input.addEventListener("change", () => {
    prefs.refresh = refreshField.input.value;
    save();
    schedule();
  });
  await draw();
  schedule();
  return root;
}
