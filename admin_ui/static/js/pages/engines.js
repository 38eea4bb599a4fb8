// Engines: each served model's engines (replicas) now: device, dtype, KV pool, load, cache.
import { api } from "../api.js";
import { card, el, fmtNum, statusPill, table } from "../dom.js";

const pct = (v) => (v === null || v === undefined ? "—" : `${(v * 100).toFixed(1)} %`);

// blocks × block size = tokens; an engine that did not report its pool shows a dash.
function capacity(r) {
  if (!r.num_blocks) return "—";
  return `${fmtNum(r.num_blocks)} × ${fmtNum(r.block_size)} = ${fmtNum(r.kv_capacity_tokens)} tokens`;
}

// A count with its batch-class part (Batch API lines, service_tier flex), when there is one.
const withBatch = (all, batch) => (batch ? `${fmtNum(all)} (${fmtNum(batch)} batch)` : fmtNum(all));

// Speculative decoding: "off", or the share of draft tokens accepted and the tokens one
// verify step emits on average (accepted drafts + the one the model adds).
function speculative(r) {
  const s = r.speculative;
  if (!s) return "off";
  if (s.acceptance_rate === null || s.acceptance_rate === undefined) return "on, no draft yet";
  const mean = s.mean_accepted_length === null ? "—" : s.mean_accepted_length.toFixed(2);
  return `${pct(s.acceptance_rate)} · ${mean} tok/step`;
}

const columns = [
  { title: "Replica", key: "replica", wrap: true },
  { title: "State", render: (r) => statusPill(r.alive ? "serving" : "down") },
  { title: "Device · dtype", render: (r) => [r.device, r.dtype].filter(Boolean).join(" · ") || "—" },
  { title: "KV capacity (blocks × size)", render: capacity },
  { title: "Running", render: (r) => withBatch(r.num_running, r.num_batch_running), num: true },
  { title: "Waiting", render: (r) => withBatch(r.num_waiting, r.num_batch_waiting), num: true },
  { title: "KV used", render: (r) => pct(r.kv_cache_usage), num: true },
  { title: "Prefix-cache hits", render: (r) => pct(r.prefix_hit_rate), num: true },
  { title: "Speculative decoding", render: speculative },
];

// The KV tiers under the device pool (issue 41), one row per replica and tier, from
// GET /engines' kv_tiers (engine.kv_cache.host_tier.TierStats as the gateway reads it).
const TIER_NAMES = { CPU_HOST: "L2 host memory", DISK: "L3 disk" };
const tierName = (t) => (TIER_NAMES[t.medium] ? `${TIER_NAMES[t.medium]} (${t.medium})` : t.medium);

// Binary units, as the engine's start-up log gives the tiers' sizes (MiB).
function fmtBytes(n) {
  if (n === null || n === undefined) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = n;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  return i === 0 ? `${fmtNum(v)} B` : `${v.toFixed(1)} ${units[i]}`;
}

// Lookups that found at least one block in the tier, of those that went on into it.
function tierHits(t) {
  if (!t.lookups) return "—";
  return `${pct(t.hit_rate)} (${fmtNum(t.hits)} of ${fmtNum(t.lookups)})`;
}

const tierColumns = [
  { title: "Replica", key: "replica", wrap: true },
  { title: "Tier", render: tierName },
  { title: "Blocks (held / capacity)", render: (t) => `${fmtNum(t.blocks)} / ${fmtNum(t.capacity_blocks)}`, num: true },
  { title: "Bytes (held / capacity)", render: (t) => `${fmtBytes(t.bytes)} / ${fmtBytes(t.capacity_bytes)}`, num: true },
  { title: "Hit rate (lookups)", render: tierHits, num: true },
  { title: "Loads", render: (t) => fmtNum(t.loads), num: true },
  { title: "Write-backs", render: (t) => fmtNum(t.write_backs), num: true },
  { title: "Recomputed instead", render: (t) => fmtNum(t.recomputed_instead), num: true },
];

// The tiers of a model's replicas, or nothing when none of them has a tier on.
function tiers(m) {
  const rows = m.replicas.flatMap((r) => (r.kv_tiers || []).map((t) => ({ ...t, replica: r.replica })));
  if (!rows.length) return null;
  return stacked(table(tierColumns, rows, { label: `KV tiers of ${m.model}` }));
}

// Each cell names its column, so the phone layout (table.stack in console.css) can label it.
function stacked(wrap) {
  const table = wrap.querySelector("table");
  if (!table) return wrap;
  const titles = [...table.querySelectorAll("thead th")].map((th) => th.textContent);
  table.classList.add("stack");
  for (const tr of table.querySelectorAll("tbody tr")) {
    [...tr.children].forEach((td, i) => td.setAttribute("data-label", titles[i]));
  }
  return wrap;
}

export async function render() {
  const data = await api.get("/engines");
  const intro = el("p", { class: "muted" },
    "The engines serving each model, as the gateway last saw them. Prefix-cache hits are the share of looked-up prompt tokens served from the cache since the engine started; speculative decoding shows the share of draft tokens accepted, then the tokens a verify step emits on average (tok/step). Where KV tiers are on under the device pool (host memory, disk), each tier's hit rate is the share of the lookups that went on into it and found blocks there; loads are blocks copied back into the device pool, write-backs blocks written down to the tier, and recomputed instead blocks found there but recomputed, that being cheaper.");
  if (!data.connected) {
    return el("div", {}, el("h1", {}, "Engines"),
      el("p", { class: "muted" }, "This admin service runs apart from the gateway, so it cannot see the engines. Open the console of cloister serve (or the gateway) to see them."));
  }
  const cards = data.models.map((m) => card(`Model ${m.model}`,
    stacked(table(columns, m.replicas, { empty: "No engine replica is up.", label: `Engines of ${m.model}` })),
    tiers(m)));
  return el("div", {}, el("h1", {}, "Engines"), intro,
    cards.length ? cards : el("p", { class: "muted" }, "No model is served."));
}
