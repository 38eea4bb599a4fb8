// A tenant's live KV-cache use per served model: blocks in use against its quota (or the
// pool), its share of the pool, and the preemptions its sequences suffered and caused.
import { api } from "../api.js";
import { card, el, fmtNum, table } from "../dom.js";

const pct = (v) => (v === null || v === undefined ? "—" : `${fmtNum(100 * v, 1)} %`);

// What the bar fills against: the tenant's quota (per engine, so times the replicas) where
// it is set and smaller than the pool, else the pool.
function limitOf(m, quota) {
  const quotaBlocks = quota === null ? null : quota * Math.max(1, m.replicas);
  if (quotaBlocks !== null && (!m.num_blocks || quotaBlocks < m.num_blocks)) return { blocks: quotaBlocks, what: "quota" };
  return { blocks: m.num_blocks, what: "pool" };
}

function useBar(m, quota) {
  const limit = limitOf(m, quota);
  const share = limit.blocks ? Math.min(1, m.blocks_in_use / limit.blocks) : 0;
  const fill = el("span");
  fill.style.width = `${(100 * share).toFixed(1)}%`; // CSSOM: the CSP refuses style attributes
  const state = share >= 1 ? "over" : (share >= 0.8 ? "warning" : "ok");
  return el("div", { class: `budget ${state}` },
    el("div", { class: "meter", role: "meter", "aria-label": `KV blocks in use on ${m.model}`,
      "aria-valuemin": "0", "aria-valuemax": String(limit.blocks || 0), "aria-valuenow": String(m.blocks_in_use) }, fill),
    el("p", { class: "muted" }, limit.blocks ? `${fmtNum(m.blocks_in_use)} of ${fmtNum(limit.blocks)} blocks (${limit.what})` : `${fmtNum(m.blocks_in_use)} blocks`));
}

// The tenant page's read-only "KV cache use" card.
export async function kvCard(t) {
  const data = await api.get(`/tenants/${encodeURIComponent(t.name)}/kv`);
  const quota = data.kv_quota_blocks;
  const intro = el("p", { class: "muted", id: "tenant-kv-quota" },
    `KV quota: ${quota === null ? "none" : `${fmtNum(quota)} blocks per engine`}. Blocks held by this tenant's running requests now, and preemptions since each engine started.`);
  let body;
  if (!data.connected) {
    body = el("p", { class: "muted" }, "This admin service runs apart from the gateway, so it cannot see the engines.");
  } else {
    body = table([
      { title: "Model", key: "model" },
      { title: "Blocks in use", render: (m) => useBar(m, quota) },
      { title: "Pool (blocks)", num: true, render: (m) => (m.num_blocks ? fmtNum(m.num_blocks) : "—") },
      { title: "Share of pool", num: true, render: (m) => pct(m.share_of_pool) },
      { title: "Preemptions suffered", num: true, render: (m) => fmtNum(m.preemptions_suffered) },
      { title: "Preemptions caused", num: true, render: (m) => fmtNum(m.preemptions_caused) },
    ], data.models, { empty: "No model is served.", label: "KV cache use" });
  }
  const box = card("KV cache use", intro, body);
  box.id = "tenant-kv";
  return box;
}
