// Overview: the last hour as charts (requests/s, tokens/s, cache hits, KV, rejections, latency).
import { api } from "../api.js";
import { el } from "../dom.js";
import { chartBox, lineConfig } from "../charts.js";

const round = (v, d = 3) => (v === null || v === undefined ? null : Number(v.toFixed(d)));
const pct = (v) => (v === null || v === undefined ? null : round(v * 100, 1));
const ms = (v) => (v === null || v === undefined ? null : round(v * 1000, 1));

export async function render(ctx) {
  const data = await api.get("/overview", { minutes: 60, step_s: 60 });
  const labels = data.labels.map((l) => l.slice(11, 16));
  const s = data.series;
  const note = ctx.me.role === "tenant-admin"
    ? "Your tenant's traffic over the last hour, per minute."
    : data.engine_stats
      ? "The whole platform over the last hour, per minute."
      : "The whole platform over the last hour, per minute. Engine statistics are not connected, so KV usage is empty and cache hits come from usage records.";
  const charts = [
    chartBox("Requests per second", lineConfig(labels, [{ label: "requests/s", data: s.requests_per_s.map((v) => round(v)) }]), { id: "chart-rps" }),
    chartBox("Tokens per second", lineConfig(labels, [{ label: "tokens/s", data: s.tokens_per_s.map((v) => round(v, 1)) }]), { id: "chart-tps" }),
    chartBox("Prefix-cache hit rate (%)", lineConfig(labels, [{ label: "hit rate %", data: s.prefix_cache_hit_rate.map(pct) }], { yMax: 100 }), { id: "chart-hits" }),
    ctx.me.role === "tenant-admin" ? null
      : chartBox("KV cache usage (%)", lineConfig(labels, [{ label: "KV used %", data: s.kv_cache_usage.map(pct) }], { yMax: 100 }), { id: "chart-kv" }),
    chartBox("Rate-limit rejections per minute", lineConfig(labels, [{ label: "rejections", data: s.rate_limit_rejections }]), { id: "chart-rejections" }),
    chartBox("Latency p95 (ms)", lineConfig(labels, [
      { label: "TTFT p95 ms", data: s.ttft_p95_s.map(ms) },
      { label: "ITL p95 ms", data: s.itl_p95_s.map(ms) },
    ]), { id: "chart-latency" }),
  ];
  return el("div", {}, el("h1", {}, "Overview"), el("p", { class: "muted" }, note),
    data.truncated ? el("p", { class: "muted" }, "Only the newest records were read for this hour.") : null,
    el("div", { class: "grid" }, charts));
}
