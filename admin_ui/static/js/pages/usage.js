// Usage and billing: filters, a chart and a table, CSV and JSON-lines exports.
import { api, getAll } from "../api.js";
import { attempt, card, download, el, field, fmtNum, isoField, parseIsoDay, table } from "../dom.js";
import { barConfig, chartBox, tokenSeries } from "../charts.js";
import { dayLabels, daysBack, isoDay, pivot, totals, unpricedByModel, usd } from "../usage_data.js";

// Unpriced usage is billed $0 but never silently: one line per model without a price.
function unpricedNotice(items) {
  const rows = unpricedByModel(items);
  if (!rows.length) return null;
  return el("div", { class: "banner warn", id: "usage-unpriced", role: "status" },
    ...rows.map(([m, n]) => el("div", {}, `${fmtNum(n)} request${n === 1 ? "" : "s"} of model ${m} ${n === 1 ? "has" : "have"} no price (billed $0 until one is set).`)));
}

// Batch lines (the Batch API) are listed apart from the same model's interactive ones and
// billed at its batch discount: marked in the price column (a column more is wider).
const priceBadges = (b) => el("span", {},
  b.batch ? el("span", { class: "status batch", title: "a batch line: billed at the model's batch discount" }, "batch") : null,
  b.batch && b.unpriced ? " " : null,
  b.unpriced ? el("span", { class: "status unpriced" }, "unpriced") : null);

export async function render(ctx) {
  const pinned = ctx.me.role === "tenant-admin";
  const tenants = pinned ? [] : await getAll("/tenants");
  // A tenant-admin sees its tenant's name, never the raw id.
  const names = pinned ? new Map([[ctx.me.tenant_id, ctx.me.tenant_name]]) : new Map(tenants.map((t) => [t.id, t.name]));
  const range = daysBack(14);
  const tenant = pinned ? null : field("Tenant", { name: "usage_tenant", options: [["", "all tenants"], ...tenants.map((t) => [t.id, t.name])] });
  const model = field("Model", { name: "usage_model", placeholder: "all models" });
  const from = isoField("From (UTC day)", { name: "usage_from", value: isoDay(range.start) });
  const to = isoField("To (UTC day, inclusive)", { name: "usage_to", value: isoDay(new Date(range.end.getTime() - 86400000)) });
  const results = el("div", { id: "usage-results" });

  async function refresh() {
    from.setError("");
    to.setError("");
    const start = parseIsoDay(from.input.value);
    const last = parseIsoDay(to.input.value);
    if (!start) { from.setError("Give a day as yyyy-mm-dd, e.g. 2026-11-05."); return; }
    if (!last) { to.setError("Give a day as yyyy-mm-dd, e.g. 2026-11-30."); return; }
    const end = new Date(last);
    end.setUTCDate(end.getUTCDate() + 1);
    if (end <= start) {
      from.setError("Choose a start day on or before the end day.");
      return;
    }
    const data = await attempt(() => api.get("/usage", {
      start: start.toISOString(), end: end.toISOString(), granularity: "day",
      tenant_id: tenant ? tenant.input.value : null, model: model.input.value.trim(),
    }));
    if (!data) return;
    const labels = dayLabels(start, end);
    const items = data.items;
    const sum = totals(items);
    const series = (label, value) => pivot(items, labels, () => label, value).map((d) => tokenSeries(label, d.data));
    const datasets = [
      ...series("uncached prompt tokens", (b) => b.prompt_tokens - b.cached_tokens),
      ...series("cached prompt tokens", (b) => b.cached_tokens),
      ...series("completion tokens", (b) => b.completion_tokens),
    ];
    results.replaceChildren(
      ...[unpricedNotice(items)].filter(Boolean),
      chartBox("Tokens per day", barConfig(labels, datasets.length ? datasets : [{ label: "tokens", data: labels.map(() => 0) }]), { id: "chart-usage" }),
      card(`Usage by day (${fmtNum(sum.requests)} request${sum.requests === 1 ? "" : "s"}, ${usd(sum.cost_pico_usd)})`, table([
        { title: "Day", render: (b) => b.start.slice(0, 10) },
        { title: "Tenant", render: (b) => names.get(b.tenant_id) || b.tenant_id },
        { title: "Model", key: "model" }, { title: "Adapter", render: (b) => b.adapter || "—" },
        { title: "Status", num: true, render: (b) => String(b.status) },
        { title: "Requests", num: true, render: (b) => fmtNum(b.requests) },
        { title: "Prompt", num: true, render: (b) => fmtNum(b.prompt_tokens) },
        { title: "Cached", num: true, render: (b) => fmtNum(b.cached_tokens) },
        { title: "Completion", num: true, render: (b) => fmtNum(b.completion_tokens) },
        { title: "Cost", num: true, render: (b) => usd(b.cost_pico_usd) },
        { title: "Price", render: priceBadges },
      ], items, { empty: "No usage in this period.", label: "Usage" })));
  }

  const period = field("Billing period", { name: "billing_period", value: new Date().toISOString().slice(0, 7), placeholder: "YYYY-MM or YYYY-MM-DD" });
  const exportAs = (format) => async () => {
    period.setError("");
    const p = period.input.value.trim();
    const text = await attempt(() => api.text("/billing/export", { period: p, format, tenant_id: tenant ? tenant.input.value : null }),
      (err) => period.setError(err.message));
    if (text !== undefined) download(`cloister-billing-${p}.${format}`, text, format === "csv" ? "text/csv" : "application/x-ndjson");
  };
  const filters = el("form", { "aria-label": "Usage filters", onsubmit: (e) => { e.preventDefault(); refresh(); } },
    el("div", { class: "row" }, tenant, model, from, to, el("button", { type: "submit" }, "Show usage")));
  await refresh();
  return el("div", {}, el("h1", {}, "Usage and billing"), card("Filters", filters), results,
    card("Billing export", el("div", { class: "row" }, period,
      el("button", { type: "button", id: "export-csv", onclick: exportAs("csv") }, "Download CSV"),
      el("button", { type: "button", id: "export-jsonl", class: "secondary", onclick: exportAs("jsonl") }, "Download JSON lines")),
    el("p", { class: "muted" }, "A period header, then one line per tenant, model, adapter, status, kind (batch lines, at the model's batch discount, apart from interactive ones) and unit prices, in three sections: billable, unpriced (no price in force: $0, listed apart) and not billed (refused or failed, status 400 and up). Then a total per tenant and per section; the billable total is the grand total. Money in USD: totals with 12 decimals, unit prices per million tokens.")));
}
