// A tenant's Batch API batches: status, lines done and failed against the total (a progress
// meter), and the tokens their finished lines consumed.
import { api } from "../api.js";
import { card, el, fmtNum, fmtTime, table } from "../dom.js";

function progress(b) {
  const done = b.completed_lines + b.failed_lines;
  const share = b.total_lines ? Math.min(1, done / b.total_lines) : 0;
  const fill = el("span");
  fill.style.width = `${(100 * share).toFixed(1)}%`; // CSSOM: the CSP refuses style attributes
  const state = b.failed_lines ? "warning" : "ok";
  return el("div", { class: `budget ${state}` },
    el("div", { class: "meter", role: "meter", "aria-label": `Lines done of batch ${b.id}`,
      "aria-valuemin": "0", "aria-valuemax": String(b.total_lines), "aria-valuenow": String(done) }, fill),
    el("p", { class: "muted" },
      `${fmtNum(b.completed_lines)} done, ${fmtNum(b.failed_lines)} failed, of ${fmtNum(b.total_lines)} lines`));
}

// The tenant page's read-only "Batches" card (the newest 20).
export async function batchesCard(t) {
  const data = await api.get(`/tenants/${encodeURIComponent(t.name)}/batches?limit=20`);
  const body = table([
    { title: "Batch", key: "id" },
    { title: "Status", key: "status" },
    { title: "Endpoint", key: "endpoint" },
    { title: "Progress", render: progress },
    { title: "Input tokens", num: true, render: (b) => fmtNum(b.prompt_tokens) },
    { title: "Output tokens", num: true, render: (b) => fmtNum(b.completion_tokens) },
    { title: "Created", render: (b) => fmtTime(b.created_at) },
    { title: "Ended", render: (b) => (b.ended_at ? fmtTime(b.ended_at) : "—") },
  ], data.items, { empty: "No batches yet.", label: "Batches" });
  const intro = el("p", { class: "muted" },
    "Batches this tenant sent through the Batch API (/v1/batches), newest first. Their lines run in the engines' batch class, in capacity interactive requests leave, and are billed at each model's batch price.");
  const box = card("Batches", intro, body);
  box.id = "tenant-batches";
  return box;
}
