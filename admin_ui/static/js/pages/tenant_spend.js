// A tenant's spend (today, this month), its token budget against the limit, and usage per key.
import { api, getAll } from "../api.js";
import { card, el, field, fmtNum, table } from "../dom.js";
import { usd } from "../usage_data.js";

const plural = (n, word) => `${fmtNum(n)} ${word}${n === 1 ? "" : "s"}`;
const STATE_WORDS = { ok: "within budget", warning: "near the limit (80 % or more used)", over: "over the limit" };

function budgetBox(b) {
  if (!b) return el("p", { class: "muted", id: "tenant-budget" }, "No token budget is set.");
  const bar = el("span");
  bar.style.width = `${(100 * Math.min(1, b.used_share)).toFixed(1)}%`; // CSSOM: the CSP refuses style attributes
  return el("div", { class: `budget ${b.state}`, id: "tenant-budget", role: b.state === "ok" ? null : "status" },
    el("strong", {}, `Token budget: ${fmtNum(100 * b.used_share, 1)} % used — ${STATE_WORDS[b.state]}`),
    el("div", { class: "meter", "aria-hidden": "true" }, bar),
    el("p", { class: "muted" }, `${fmtNum(b.used_tokens)} of ${fmtNum(b.token_budget)} tokens this ${b.period} (since ${b.period_start.slice(0, 10)})`));
}

// The tenant's spend card: today and this month in UTC, and the budget bar.
export async function spendCard(t) {
  const s = await api.get(`/tenants/${encodeURIComponent(t.name)}/spend`);
  const figure = (id, label, p) => el("section", { class: "card", id, "aria-label": label },
    el("h2", {}, label), el("p", { class: "kpi" }, usd(p.cost_pico_usd)),
    el("p", { class: "muted" }, `${plural(p.requests, "request")} · ${plural(p.tokens, "token")}`));
  return card("Spend and budget",
    el("div", { class: "tiles" }, figure("tenant-spend-today", "Spend today (UTC)", s.today), figure("tenant-spend-month", "Spend this month", s.month)),
    budgetBox(s.budget));
}

const PERIODS = [["today", "Today (UTC)"], ["month", "This month (UTC)"], ["14d", "Last 14 days"]];

function periodBounds(period) {
  const now = new Date();
  const end = new Date(Date.UTC(now.getUTCFullYear(), now.getUTCMonth(), now.getUTCDate() + 1));
  if (period === "today") return { start: new Date(end.getTime() - 86400e3), end };
  if (period === "month") return { start: new Date(Date.UTC(now.getUTCFullYear(), now.getUTCMonth(), 1)), end };
  return { start: new Date(end.getTime() - 14 * 86400e3), end };
}

// Usage per key over a chosen period (the usage API's by_key), named by the tenant's keys.
export async function keyUsageCard(t) {
  const keys = new Map((await getAll(`/tenants/${encodeURIComponent(t.name)}/keys`)).map((k) => [k.id, k]));
  const picker = field("Key usage period", { name: "key_usage_period", value: "14d", options: PERIODS });
  const slot = el("div", { id: "key-usage" });
  const draw = async () => {
    const { start, end } = periodBounds(picker.input.value);
    const data = await api.get("/usage", { tenant_id: t.id, start: start.toISOString(), end: end.toISOString(), granularity: "day", by_key: true });
    const rows = new Map();
    for (const b of data.items) {
      const r = rows.get(b.key_id) || { key_id: b.key_id, requests: 0, tokens: 0, cost: 0 };
      r.requests += b.requests;
      r.tokens += b.prompt_tokens + b.completion_tokens;
      r.cost += b.cost_pico_usd;
      rows.set(b.key_id, r);
    }
    const list = [...rows.values()].sort((a, b) => b.tokens - a.tokens);
    slot.replaceChildren(table([
      { title: "Key", render: (r) => { const k = keys.get(r.key_id); return k ? el("span", {}, el("code", {}, `${k.prefix}…`), k.name ? ` ${k.name}` : "") : (r.key_id || "—"); } },
      { title: "Requests", num: true, render: (r) => fmtNum(r.requests) },
      { title: "Tokens", num: true, render: (r) => fmtNum(r.tokens) },
      { title: "Spend", num: true, render: (r) => usd(r.cost) },
    ], list, { empty: "No usage by any key in this period.", label: "Usage per key" }));
  };
  picker.input.addEventListener("change", draw);
  await draw();
  const box = card("Usage per key", el("div", { class: "row" }, picker), slot);
  box.id = "key-usage-card"; // spaced from the charts' grid above it (console.css)
  return box;
}
