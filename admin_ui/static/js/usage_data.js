// Usage series helpers shared by the tenant and usage pages.
export function isoDay(d) { return d.toISOString().slice(0, 10); }

export function daysBack(n) {
  const end = new Date();
  end.setUTCHours(0, 0, 0, 0);
  end.setUTCDate(end.getUTCDate() + 1);
  const start = new Date(end);
  start.setUTCDate(start.getUTCDate() - n);
  return { start, end };
}

export function dayLabels(start, end) {
  const out = [];
  for (const d = new Date(start); d < end; d.setUTCDate(d.getUTCDate() + 1)) out.push(isoDay(d));
  return out;
}

// Sums `value(bucket)` per (label, group(bucket)) into one dataset per group.
export function pivot(items, labels, group, value) {
  const groups = new Map();
  for (const b of items) {
    const g = group(b);
    if (!groups.has(g)) groups.set(g, new Array(labels.length).fill(0));
    const i = labels.indexOf(b.start.slice(0, 10));
    if (i >= 0) groups.get(g)[i] += value(b);
  }
  return [...groups.entries()].map(([label, data]) => ({ label, data }));
}

export function totals(items) {
  const t = { requests: 0, prompt_tokens: 0, cached_tokens: 0, completion_tokens: 0, cost_pico_usd: 0 };
  for (const b of items) for (const k of Object.keys(t)) t[k] += b[k];
  return t;
}

// Requests that used tokens while their model had no price, per model: [[model, n], ...].
export function unpricedByModel(items) {
  const out = new Map();
  for (const b of items) if (b.unpriced_requests) out.set(b.model, (out.get(b.model) || 0) + b.unpriced_requests);
  return [...out.entries()].sort((a, b) => a[0].localeCompare(b[0]));
}

export function usd(pico) { return `$${(pico / 1e12).toFixed(6)}`; }
