// Models and LoRA adapters: register, upload, load or unload, access, prices.
import { api, getAll } from "../api.js";
import { attempt, card, confirmAction, el, field, fmtNum, fmtTime, isoField, parseIsoMinute, showBanner, statusPill, table } from "../dom.js";

const usdPerM = (micros) => (micros === null || micros === undefined ? "—" : `$${(micros / 1e6).toFixed(4)}`);
const toMicros = (usd) => Math.round(Number(usd || 0) * 1e6);

// A model's prices in force and its batch discount, or the unpriced pill (its usage is
// billed $0 and marked).
function priceCell(m) {
  if (!m.price) return el("span", { class: "status unpriced", title: "usage is billed $0 and marked unpriced until a price is set" }, "unpriced");
  const unit = [m.price.input_price, m.price.cached_input_price, m.price.output_price].map(usdPerM).join(" · ");
  // The discount on a line of its own: a wider cell would push actions out of 1280 px.
  return el("span", {}, unit, el("br"), el("span", { class: "muted" }, `batch lines −${m.price.batch_discount_pct}%`));
}

// The three unit prices and the batch discount (the Batch API's lines cost that much less).
function priceFields(prefix) {
  const discount = field("Batch discount, %", { name: `${prefix}_batch_discount`, type: "number", min: "0", step: "1", value: "50",
    help: "Taken off batch lines' cost; 0 to 100." });
  discount.input.max = "100";
  return [
    field("Input, USD per 1M tokens", { name: `${prefix}_input`, type: "number", min: "0", step: "0.000001", value: "0" }),
    field("Cached input, USD per 1M", { name: `${prefix}_cached`, type: "number", min: "0", step: "0.000001", value: "0" }),
    field("Output, USD per 1M tokens", { name: `${prefix}_output`, type: "number", min: "0", step: "0.000001", value: "0" }),
    discount,
  ];
}

// The discount as typed: a whole number the API checks (0 to 100), sent as it is.
const toPct = (text) => (text === "" ? 50 : Number(text));

function registerForm(reload) {
  const name = field("Model name", { name: "model_name", required: true });
  const source = field("Source (GGUF file or HF folder)", { name: "model_source", required: true });
  const format = field("Format", { name: "model_format", options: ["gguf", "safetensors"] });
  const ctxLen = field("Context length", { name: "context_length", type: "number", min: "1", value: "2048" });
  const prices = priceFields("reg");
  return el("form", { "aria-label": "Register model", onsubmit: async (e) => {
    e.preventDefault();
    name.setError("");
    const m = await attempt(() => api.post("/models", {
      name: name.input.value.trim(), source: source.input.value.trim(), format: format.input.value,
      context_length: Number(ctxLen.input.value), input_price: toMicros(prices[0].input.value),
      cached_input_price: toMicros(prices[1].input.value), output_price: toMicros(prices[2].input.value),
      batch_discount_pct: toPct(prices[3].input.value),
    }), (err) => name.setError(err.message));
    if (m) reload(`Model ${m.name} is registered.`);
  } }, el("div", { class: "row" }, name, source, format, ctxLen, prices, el("button", { type: "submit" }, "Register model")));
}

function accessAndPriceForms(models, reload) {
  const names = models.map((m) => m.name);
  const which = field("Model", { name: "access_model", options: names });
  const allowed = field("Allowed tenants (ids)", { name: "allowed_tenants", placeholder: "public: every tenant", help: "Comma-separated tenant ids; empty makes the model public." });
  const fill = () => {
    const m = models.find((x) => x.name === which.input.value);
    allowed.input.value = m && m.allowed_tenants ? m.allowed_tenants.join(", ") : "";
  };
  which.input.addEventListener("change", fill);
  fill();
  const access = el("form", { "aria-label": "Model access", onsubmit: async (e) => {
    e.preventDefault();
    const list = allowed.input.value.split(",").map((s) => s.trim()).filter(Boolean);
    const body = list.length ? { allowed_tenants: list } : { clear_allowed_tenants: true };
    const ok = await attempt(() => api.patch(`/models/${encodeURIComponent(which.input.value)}`, body), (err) => allowed.setError(err.message));
    if (ok) reload(`${ok.name} is now ${ok.allowed_tenants ? "private" : "public"}.`);
  } }, el("div", { class: "row" }, which, allowed, el("button", { type: "submit" }, "Save access")));

  const pmodel = field("Model", { name: "price_model", options: names });
  const prices = priceFields("set");
  // A new price starts from the chosen model's discount in force, so that changing its
  // token prices does not reset the discount by accident.
  const fillDiscount = () => {
    const m = models.find((x) => x.name === pmodel.input.value);
    prices[3].input.value = m && m.price ? String(m.price.batch_discount_pct) : "50";
  };
  pmodel.input.addEventListener("change", fillDiscount);
  fillDiscount();
  const from = isoField("Effective from (UTC)", { name: "effective_from", withTime: true, help: "yyyy-mm-dd hh:mm; empty: now." });
  const price = el("form", { "aria-label": "Set prices", onsubmit: async (e) => {
    e.preventDefault();
    from.setError("");
    const when = parseIsoMinute(from.input.value);
    if (when === undefined) { from.setError("Give a UTC time as yyyy-mm-dd hh:mm."); return; }
    const body = { input_price: toMicros(prices[0].input.value), cached_input_price: toMicros(prices[1].input.value), output_price: toMicros(prices[2].input.value),
      batch_discount_pct: toPct(prices[3].input.value) };
    if (when) body.effective_from = when;
    const ok = await attempt(() => api.post(`/models/${encodeURIComponent(pmodel.input.value)}/prices`, body),
      (err) => (err.message.includes("batch_discount_pct") ? prices[3] : from).setError(err.message));
    if (ok) reload(`New prices for ${ok.name} are saved.`);
  } }, el("div", { class: "row" }, pmodel, prices, from, el("button", { type: "submit" }, "Set prices")));
  return [card("Private or public", access), card("Prices", price), card("Output cap", outputCapForm(models, reload)),
    card("Fallback under overload", fallbackForm(models, reload))];
}

// A model's own max_output_tokens: requests get the smaller of it and their key's cap.
function outputCapForm(models, reload) {
  const which = field("Model", { name: "cap_model", options: models.map((m) => m.name) });
  const cap = field("Max output tokens", { name: "model_max_output_tokens", type: "number", min: "1", step: "1", placeholder: "context length",
    help: "Most output tokens one request may ask of this model; empty: its context length." });
  const fill = () => {
    const m = models.find((x) => x.name === which.input.value);
    cap.input.value = m && m.max_output_tokens !== null && m.max_output_tokens !== undefined ? m.max_output_tokens : "";
    if (m) cap.input.max = String(m.context_length);
  };
  which.input.addEventListener("change", fill);
  fill();
  return el("form", { "aria-label": "Model output cap", onsubmit: async (e) => {
    e.preventDefault();
    cap.setError("");
    const body = { max_output_tokens: cap.input.value === "" ? null : Number(cap.input.value) };
    const ok = await attempt(() => api.patch(`/models/${encodeURIComponent(which.input.value)}`, body), (err) => cap.setError(err.message));
    if (ok) reload(`${ok.name}: max output tokens ${ok.max_output_tokens ?? "= context length"}.`);
  } }, el("div", { class: "row" }, which, cap, el("button", { type: "submit" }, "Save output cap")));
}

// A model's fallback: the gateway retries an interactive request there, once, when this
// model's engine queue refuses it; the API refuses the model itself and cycles.
function fallbackForm(models, reload) {
  const names = models.map((m) => m.name);
  const which = field("Model", { name: "fallback_of", options: names });
  const fallback = field("Fallback model", { name: "fallback_model", options: [["", "none"], ...names],
    help: "Answers this model's requests when its engine is overloaded, if the tenant may use it." });
  const fill = () => {
    const m = models.find((x) => x.name === which.input.value);
    fallback.input.value = (m && m.fallback_model) || "";
  };
  which.input.addEventListener("change", fill);
  fill();
  return el("form", { "aria-label": "Model fallback", onsubmit: async (e) => {
    e.preventDefault();
    fallback.setError("");
    const body = { fallback_model: fallback.input.value || null };
    const ok = await attempt(() => api.patch(`/models/${encodeURIComponent(which.input.value)}`, body), (err) => fallback.setError(err.message));
    if (ok) reload(`${ok.name}: fallback ${ok.fallback_model ?? "none"}.`);
  } }, el("div", { class: "row" }, which, fallback, el("button", { type: "submit" }, "Save fallback")));
}

function uploadForm(models, tenants, reload) {
  const file = field("PEFT adapter (.zip)", { name: "adapter_zip", type: "file", accept: ".zip,application/zip", required: true });
  const name = field("Adapter name", { name: "adapter_name", required: true });
  const base = field("Base model", { name: "adapter_base", options: models.map((m) => m.name) });
  const owner = field("Visibility", { name: "adapter_owner", options: [["", "public"], ...tenants.map((t) => [t.name, `private to ${t.name}`])] });
  return el("form", { "aria-label": "Upload adapter", onsubmit: async (e) => {
    e.preventDefault();
    file.setError(""); name.setError("");
    const f = file.input.files[0];
    if (!f) { file.setError("Choose a .zip file."); return; }
    const a = await attempt(() => api.upload("/adapters/upload", f, { name: name.input.value.trim(), base_model: base.input.value, owner_tenant: owner.input.value }),
      (err) => (err.status === 409 ? name : file).setError(err.message));
    if (a) reload(`Adapter ${a.name} is uploaded.`);
  } }, el("div", { class: "row" }, file, name, base, owner, el("button", { type: "submit" }, "Upload adapter")));
}

function toggle(kind, item, reload) {
  const loaded = item.status === "loaded";
  return el("button", { type: "button", class: "secondary", "aria-label": `${loaded ? "Unload" : "Load"} ${item.name}`, onclick: async () => {
    const ok = await attempt(() => api.patch(`/${kind}/${encodeURIComponent(item.name)}`, { status: loaded ? "registered" : "loaded" }));
    if (ok) reload(`${item.name} is ${loaded ? "unloaded" : "loaded"}.`);
  } }, loaded ? "Unload" : "Load");
}

// A prefix's length: its token ids, or the text the engine tokenizes when it is pushed.
const prefixLength = (p) => (p.token_ids ? `${fmtNum(p.token_ids.length)} tokens` : `text, ${fmtNum(p.text.length)} characters`);

// The engines count prefix-cache hits per tenant cache domain (a request reusing a published
// prefix is a hit of its own tenant's domain), so no hit count per prefix exists to show;
// what the public domain does report is how many published-prefix blocks are cached now.
function publicBlocks(engines) {
  if (!engines || !engines.connected) return "The engines are not visible from this admin service.";
  const parts = engines.models.map((m) => {
    const known = m.replicas.filter((r) => r.public_cached_blocks !== null);
    if (!known.length) return `${m.model}: not reported by its engine servers`;
    const blocks = known.reduce((n, r) => n + r.public_cached_blocks, 0);
    return `${m.model}: ${fmtNum(blocks)} blocks (${fmtNum(blocks * known[0].block_size)} tokens)`;
  });
  return `Published-prefix blocks in the KV cache now — ${parts.join("; ")}.`;
}

function withdraw(p, reload) {
  return el("button", { type: "button", class: "secondary", "aria-label": `Withdraw ${p.name}`, onclick: async () => {
    if (!(await confirmAction(`Withdraw the shared prefix ${p.name}? Engines stop sharing it within the refresh interval.`, "Withdraw"))) return;
    const ok = await attempt(() => api.del(`/prefixes/${encodeURIComponent(p.name)}`));
    if (ok) reload(`Prefix ${p.name} is withdrawn.`);
  } }, "Withdraw");
}

function prefixesCard(ctx, prefixes, engines, reload) {
  const cols = [
    { title: "Name", key: "name" }, { title: "Model", key: "model" },
    { title: "Length", render: prefixLength, num: true }, { title: "Created", render: (p) => fmtTime(p.created_at) },
  ];
  if (ctx.canWrite) cols.push({ title: "Actions", render: (p) => withdraw(p, reload) });
  return card("Published prefixes",
    el("p", { class: "muted" }, "Shared prefixes every tenant's requests may reuse from the KV cache. Hits are not counted per prefix: the engines count them in the requesting tenant's cache domain (see Engines for each engine's hit rate)."),
    el("p", { id: "public-blocks" }, publicBlocks(engines)),
    table(cols, prefixes, { empty: "No prefix is published.", label: "Published prefixes" }));
}

// Where the serving engines hold an adapter (GET /adapters/runtime), in words.
const ENGINE_STATE = { device: "loaded on the device", host: "in host memory", disk: "loaded (weights on disk)", loaded: "loaded", not_loaded: "not loaded" };

// An adapter is loaded by the server once registered and unloaded once retired, so its
// action retires it (or brings a retired one back), never loads it by hand.
function retireToggle(a, reload) {
  const retired = a.status === "retired";
  return el("button", { type: "button", class: "secondary", "aria-label": `${retired ? "Restore" : "Retire"} ${a.name}`, onclick: async () => {
    const ok = await attempt(() => api.patch(`/adapters/${encodeURIComponent(a.name)}`, { status: retired ? "registered" : "retired" }));
    if (ok) reload(`${a.name} is ${retired ? "registered again" : "retired"}.`);
  } }, retired ? "Restore" : "Retire");
}

export async function render(ctx) {
  const [models, adapters, tenants, prefixes, engines, runtime] = await Promise.all([getAll("/models"), getAll("/adapters"),
    ctx.canWrite ? getAll("/tenants") : [], getAll("/prefixes"), api.get("/engines"),
    api.get("/adapters/runtime").catch(() => ({}))]);
  const byId = new Map(tenants.map((t) => [t.id, t.name]));
  const reload = (msg) => { window.dispatchEvent(new HashChangeEvent("hashchange")); if (msg) setTimeout(() => showBanner(msg, "info"), 0); };
  // Thirteen columns overflowed 1280 px: the source wraps, device and dtype share a
  // column and so do the three prices, so prices and actions stay in view.
  const modelCols = [
    // The fallback under the name, wrapping: a column more overflowed 1280 px.
    { title: "Name", render: (m) => (m.fallback_model ? el("span", {}, m.name, el("br"), el("span", { class: "muted cell-note" }, `fallback: ${m.fallback_model}`)) : m.name) },
    { title: "Format", key: "format" },
    { title: "Source", key: "source", wrap: true },
    // The output cap shares the context's column (a column more overflowed 1280 px).
    { title: "Context · max output", num: true, render: (m) => `${m.context_length} · ${m.max_output_tokens ?? "context"}` },
    { title: "Status", render: (m) => statusPill(m.status) },
    { title: "Device", render: (m) => [m.device, m.dtype].filter(Boolean).join(" · ") || "—" },
    { title: "Access", render: (m) => (m.allowed_tenants ? `private (${m.allowed_tenants.length})` : "public") },
    { title: "USD per 1M tokens (input · cached · output)", render: priceCell },
  ];
  const adapterCols = [
    { title: "Name", key: "name" }, { title: "Base model", key: "base_model" }, { title: "Rank", key: "rank", num: true },
    { title: "Status", render: (a) => statusPill(a.status) },
    { title: "On the engine", render: (a) => ENGINE_STATE[(runtime[a.name] || {}).state || "not_loaded"] || runtime[a.name].state },
    { title: "Owner", render: (a) => (a.owner_tenant_id ? byId.get(a.owner_tenant_id) || a.owner_tenant_id : "—") },
    { title: "Visibility", render: (a) => (a.owner_tenant_id ? "private" : "public") },
    { title: "Requests", num: true, render: (a) => String((runtime[a.name] || {}).requests || 0) },
    { title: "Created", render: (a) => fmtTime(a.created_at) },
  ];
  if (ctx.canWrite) {
    modelCols.push({ title: "Actions", render: (m) => (m.status === "retired" ? "" : toggle("models", m, reload)) });
    adapterCols.push({ title: "Actions", render: (a) => retireToggle(a, reload) });
  }
  return el("div", {}, el("h1", {}, "Models and adapters"),
    card("Models", table(modelCols, models, { empty: "No models registered.", label: "Models" })),
    ctx.canWrite ? card("Register a model", registerForm(reload)) : null,
    ctx.canWrite && models.length ? accessAndPriceForms(models, reload) : [],
    prefixesCard(ctx, prefixes, engines, reload),
    card("LoRA adapters", table(adapterCols, adapters, { empty: "No adapters yet.", label: "Adapters" })),
    ctx.canWrite && models.length ? card("Upload a PEFT adapter", uploadForm(models, tenants, reload)) : null);
}
