// One tenant: status, isolation, weight and cache policy, spend and budget, limits, usage.
import { api } from "../api.js";
import { attempt, card, confirmAction, el, field, fmtNum, showBanner, statusPill, table } from "../dom.js";
import { barConfig, chartBox, tokenSeries } from "../charts.js";
import { dayLabels, daysBack, pivot, totals } from "../usage_data.js";
import { keyUsageCard, spendCard } from "./tenant_spend.js";
import { kvCard } from "./tenant_kv.js";
import { batchesCard } from "./tenant_batches.js";

const LIMITS = [
  ["rpm", "Requests per minute"], ["tpm", "Tokens per minute"], ["max_concurrent", "Concurrent requests"],
  ["token_budget", "Token budget"], ["max_output_tokens", "Max output tokens"], ["max_prompt_tokens", "Max prompt tokens"],
  ["max_tokens_in_flight", "Tokens in flight"],
];

function limitsForm(ctx, name, limits) {
  if (!ctx.canWrite) {
    return table([{ title: "Limit", key: "label" }, { title: "Value", key: "value" }],
      [...LIMITS.map(([k, label]) => ({ label, value: limits[k] ?? "unlimited" })),
        { label: "Budget period", value: limits.budget_period },
        { label: "Allowed models", value: limits.allowed_models ? limits.allowed_models.join(", ") : "all" }], { label: "Limits" });
  }
  const fields = LIMITS.map(([k, label]) => [k, field(label, { name: k, type: "number", min: "0", value: limits[k] ?? "", placeholder: "unlimited" })]);
  const period = field("Budget period", { name: "budget_period", options: ["month", "day"], value: limits.budget_period });
  const models = field("Allowed models", { name: "allowed_models", value: (limits.allowed_models || []).join(", "), placeholder: "all models", help: "Comma-separated; empty allows all." });
  const saved = el("span", { class: "muted", "aria-live": "polite" });
  return el("form", { "aria-label": "Limits", onsubmit: async (e) => {
    e.preventDefault();
    saved.textContent = "";
    const body = { budget_period: period.input.value };
    for (const [k, f] of fields) {
      f.setError("");
      body[k] = f.input.value === "" ? null : Number(f.input.value);
    }
    const list = models.input.value.split(",").map((m) => m.trim()).filter(Boolean);
    body.allowed_models = list.length ? list : null;
    const ok = await attempt(() => api.put(`/tenants/${encodeURIComponent(name)}/limits`, body));
    if (ok) saved.textContent = "Limits saved.";
  } }, el("div", { class: "row" }, fields.map(([, f]) => f), period, models),
  el("div", { class: "row" }, el("button", { type: "submit" }, "Save limits"), saved));
}

function floorText(t) {
  if (t.cache_floor_blocks !== null) return `${t.cache_floor_blocks} blocks`;
  if (t.cache_floor_share !== null) return `${fmtNum(100 * t.cache_floor_share, 1)} % of the pool`;
  return "none";
}

const DEFAULT_FLAG = [["", "engine default"], ["true", "yes"], ["false", "no"]];
const flagValue = (v) => (v === null || v === undefined ? "" : String(v));
const numberOrNull = (input) => (input.value === "" ? null : Number(input.value));

function settingsForm(ctx, t, rerender) {
  const policy = `cache floor: ${floorText(t)} · retention TTL: ${t.retention_ttl_s === null ? "engine default" : `${fmtNum(t.retention_ttl_s, 1)} s`}` +
    ` · scrub freed blocks: ${t.scrub_on_free === null ? "engine default" : (t.scrub_on_free ? "yes" : "no")} · never cache: ${t.never_cache ? "yes" : "no"}` +
    ` · KV quota: ${t.kv_quota_blocks === null ? "none" : `${t.kv_quota_blocks} blocks`}` +
    ` · stream cadence: ${t.stream_cadence}`;
  if (!ctx.canWrite) {
    return el("div", {},
      el("p", {}, `Cache isolation: ${t.isolation_level} · scheduling weight: ${fmtNum(t.weight, 2)}`),
      el("p", { id: "tenant-cache-policy" }, policy));
  }
  const isolation = field("Cache isolation", { name: "isolation_level", value: t.isolation_level, options: [["tenant", "tenant"], ["key", "per key"], ["user", "per end user"]] });
  const weight = field("Scheduling weight", { name: "weight", type: "number", min: "0.01", step: "0.01", value: t.weight });
  const unit = t.cache_floor_share !== null ? "share" : "blocks";
  const floor = field("Cache floor", { name: "cache_floor", type: "number", min: "0", step: "any", placeholder: "none",
    value: unit === "share" ? t.cache_floor_share : (t.cache_floor_blocks ?? ""), help: "KV kept for this tenant whatever others send; empty: none." });
  const floorUnit = field("Cache floor unit", { name: "cache_floor_unit", value: unit, options: [["blocks", "blocks"], ["share", "share of the pool (0-1)"]] });
  const ttl = field("Retention TTL (s)", { name: "retention_ttl_s", type: "number", min: "0", step: "any", placeholder: "engine default", value: t.retention_ttl_s ?? "" });
  const scrub = field("Scrub freed blocks", { name: "scrub_on_free", value: flagValue(t.scrub_on_free), options: DEFAULT_FLAG });
  const never = field("Never cache", { name: "never_cache", value: String(t.never_cache), options: [["false", "no"], ["true", "yes"]] });
  const quota = field("KV quota (blocks)", { name: "kv_quota_blocks", type: "number", min: "1", step: "1", placeholder: "none",
    value: t.kv_quota_blocks ?? "", help: "Most KV blocks this tenant's running requests may hold; empty: no quota." });
  // Free text, checked by the server ("token" or "fixed:N"), whose message shows below.
  const cadence = field("Stream cadence", { name: "stream_cadence", value: t.stream_cadence, placeholder: "token",
    help: "token: text as the engine emits it; fixed:N: N tokens a chunk (1-64), hiding how many tokens each step produced." });
  const error = el("span", { class: "error", role: "alert", id: "tenant-settings-error" });
  return el("form", { "aria-label": "Tenant settings", onsubmit: async (e) => {
    e.preventDefault();
    weight.setError("");
    error.textContent = "";
    const amount = numberOrNull(floor.input);
    const share = floorUnit.input.value === "share";
    const body = {
      isolation_level: isolation.input.value,
      weight: Number(weight.input.value),
      cache_floor_blocks: share ? null : amount,
      cache_floor_share: share ? amount : null,
      retention_ttl_s: numberOrNull(ttl.input),
      scrub_on_free: scrub.input.value === "" ? null : scrub.input.value === "true",
      never_cache: never.input.value === "true",
      kv_quota_blocks: numberOrNull(quota.input),
      stream_cadence: cadence.input.value.trim() || "token",
    };
    const ok = await attempt(() => api.patch(`/tenants/${encodeURIComponent(t.name)}/settings`, body),
      (err) => { error.textContent = err.message; });
    if (ok) { rerender(); showBanner("Settings saved.", "info"); }
  } }, el("div", { class: "row" }, isolation, weight),
  el("div", { class: "row" }, floor, floorUnit, ttl, scrub, never, quota, cadence),
  el("div", { class: "row" }, el("button", { type: "submit" }, "Save settings"), error));
}

// The model names are the point of this chart, so its legend shows even for one model.
function withLegend(config) {
  return { ...config, options: { ...config.options, plugins: { legend: { display: true } } } };
}

async function usageSection(t) {
  const { start, end } = daysBack(14);
  const labels = dayLabels(start, end);
  const data = await api.get("/usage", { tenant_id: t.id, start: start.toISOString(), end: end.toISOString(), granularity: "day" });
  const items = data.items;
  const sum = totals(items);
  const hit = sum.prompt_tokens ? (100 * sum.cached_tokens) / sum.prompt_tokens : null;
  const byModel = pivot(items, labels, (b) => b.model + (b.adapter ? ` + ${b.adapter}` : ""), (b) => b.prompt_tokens + b.completion_tokens);
  const series = (label, value) => tokenSeries(label, (pivot(items, labels, () => label, value)[0] || { data: labels.map(() => 0) }).data);
  const cacheSplit = [
    series("uncached prompt tokens", (b) => b.prompt_tokens - b.cached_tokens),
    series("cached prompt tokens", (b) => b.cached_tokens),
  ];
  return el("div", {},
    el("div", { class: "grid" },
      card("Prompt-cache hit rate (14 days)",
        el("p", { class: "kpi", id: "tenant-hit-rate" }, hit === null ? "no traffic yet" : `${hit.toFixed(1)} %`),
        el("p", { class: "muted" }, `${fmtNum(sum.requests)} request${sum.requests === 1 ? "" : "s"} · ${fmtNum(sum.prompt_tokens)} prompt tokens (${fmtNum(sum.cached_tokens)} cached) · ${fmtNum(sum.completion_tokens)} completion tokens`)),
      chartBox("Tokens by model per day", withLegend(barConfig(labels, byModel.length ? byModel : [{ label: "tokens", data: labels.map(() => 0) }])), { id: "chart-tenant-tokens" }),
      chartBox("Cached vs uncached prompt tokens", barConfig(labels, cacheSplit), { id: "chart-tenant-cache" })));
}

export async function render(ctx) {
  const name = ctx.params[0];
  const t = await api.get(`/tenants/${encodeURIComponent(name)}`);
  const limits = await api.get(`/tenants/${encodeURIComponent(name)}/limits`);
  const rerender = () => { window.dispatchEvent(new HashChangeEvent("hashchange")); };
  let statusButton = null;
  if (ctx.canWrite) {
    const suspend = t.status === "active";
    statusButton = el("button", { type: "button", class: suspend ? "danger" : "", onclick: async () => {
      if (suspend && !(await confirmAction(`Suspend ${t.name}? Its keys stop working until it is resumed.`, "Suspend"))) return;
      const ok = await attempt(() => api.patch(`/tenants/${encodeURIComponent(t.name)}`, { status: suspend ? "suspended" : "active" }));
      if (ok) { rerender(); showBanner(`${t.name} is now ${suspend ? "suspended" : "active"}.`, "info"); }
    } }, suspend ? "Suspend tenant" : "Resume tenant");
  }
  // Fetched first: a chart draws only on a canvas already in the page (charts.js), so
  // nothing may be awaited after the usage section's charts are made.
  const [spend, keyUsage] = [await spendCard(t), await keyUsageCard(t)];
  const kvUse = await kvCard(t);
  const batches = await batchesCard(t);
  return el("div", {},
    el("h1", {}, `Tenant ${t.name} `, statusPill(t.status)),
    card("Settings", ctx.me.role === "tenant-admin" ? null : el("p", { class: "muted" }, `id ${t.id}`), settingsForm(ctx, t, rerender),
      el("div", { class: "row" }, statusButton, el("a", { href: `#/keys/${encodeURIComponent(t.name)}` }, "Manage keys →"))),
    spend,
    card("Limits", limitsForm(ctx, t.name, limits)),
    kvUse,
    batches,
    await usageSection(t),
    keyUsage);
}
