// Audit log: chain verification first, then filters, records and export.
import { api } from "../api.js";
import { attempt, card, download, el, field, isoField, parseIsoMinute, table } from "../dom.js";

async function verifyBanner() {
  try {
    const r = await api.get("/audit/verify");
    if (r.ok) {
      return el("div", { class: "verify ok", id: "chain-status", role: "status" },
        `✔ Chain verified: ${r.records} records, ${r.checkpoints} signed checkpoints, no tampering found.`);
    }
    return el("div", { class: "verify bad", id: "chain-status", role: "alert" },
      `✖ Chain verification FAILED at record ${r.first_bad_seq}: ${r.reason}`);
  } catch (err) {
    return el("div", { class: "verify unknown", id: "chain-status", role: "status" },
      `Chain not verified: ${err.message}`);
  }
}

const PAGE = 50;

export async function render() {
  const actor = field("Actor", { name: "audit_actor", placeholder: "token:adm_…" });
  const tenant = field("Tenant id", { name: "audit_tenant", placeholder: "ten_…" });
  const action = field("Action", { name: "audit_action", placeholder: "e.g. key. or tenant.create" });
  const since = isoField("Since (UTC)", { name: "audit_since", withTime: true });
  const until = isoField("Until (UTC)", { name: "audit_until", withTime: true });
  const results = el("div", { id: "audit-results" });
  let offset = 0;

  async function refresh() {
    const bounds = [since, until].map((f) => {
      f.setError("");
      const iso = parseIsoMinute(f.input.value);
      if (iso === undefined) f.setError("Give a UTC time as yyyy-mm-dd hh:mm (or only the day).");
      return iso;
    });
    if (bounds.includes(undefined)) return;
    const page = await attempt(() => api.get("/audit/search", {
      actor: actor.input.value.trim(), tenant_id: tenant.input.value.trim(), action: action.input.value.trim(),
      since: bounds[0], until: bounds[1],
      limit: PAGE, offset,
    }));
    if (!page) return;
    const prev = el("button", { type: "button", class: "secondary", disabled: offset === 0, onclick: () => { offset = Math.max(0, offset - PAGE); refresh(); } }, "Newer");
    const next = el("button", { type: "button", class: "secondary", disabled: offset + PAGE >= page.total, onclick: () => { offset += PAGE; refresh(); } }, "Older");
    results.replaceChildren(
      el("p", { class: "muted" }, `${page.total} records${page.total ? `, showing ${offset + 1}–${offset + page.items.length}` : ""}`),
      table([
        { title: "#", key: "seq", num: true }, { title: "Time (UTC)", render: (r) => r.at.replace("T", " ").slice(0, 19) },
        { title: "Actor", key: "actor" }, { title: "Role", key: "role" }, { title: "Tenant", key: "tenant_id" },
        { title: "Action", key: "action" }, { title: "Resource", key: "resource" }, { title: "Outcome", key: "outcome" },
      ], page.items, { empty: "No records match.", label: "Audit records" }),
      el("div", { class: "row" }, prev, next));
  }
  const filters = el("form", { "aria-label": "Audit filters", onsubmit: (e) => { e.preventDefault(); offset = 0; refresh(); } },
    el("div", { class: "row" }, actor, tenant, action, since, until, el("button", { type: "submit" }, "Filter")));
  const exportButton = el("button", { type: "button", class: "secondary", id: "audit-export", onclick: async () => {
    const text = await attempt(() => api.text("/audit/export"));
    if (text !== undefined) download("cloister-audit.jsonl", text, "application/x-ndjson");
  } }, "Export (signed JSON lines)");
  const status = await verifyBanner();
  await refresh();
  return el("div", {}, el("h1", {}, "Audit log"), status,
    card("Records", filters, results, el("div", { class: "row" }, exportButton)));
}
