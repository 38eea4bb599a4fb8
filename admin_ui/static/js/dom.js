// Small DOM helpers: elements, labelled fields, tables, messages, confirmation, downloads.
let fieldSeq = 0;

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (v === true) node.setAttribute(k, "");
    else node.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

// A labelled input or select with an error slot linked by aria-describedby.
export function field(label, { name, type = "text", value = "", options, required, placeholder, min, step, accept, help } = {}) {
  const id = `f-${name || "x"}-${++fieldSeq}`;
  const errId = `${id}-err`;
  let input;
  if (options) {
    input = el("select", { id, name, required });
    for (const o of options) {
      const [v, text] = Array.isArray(o) ? o : [o, o];
      const opt = el("option", { value: v }, text);
      if (String(v) === String(value ?? "")) opt.selected = true;
      input.append(opt);
    }
  } else {
    input = el("input", { id, name, type, required, placeholder, min, step, accept });
    if (type !== "file" && value !== null && value !== undefined) input.value = value;
  }
  input.setAttribute("aria-describedby", errId);
  const error = el("span", { id: errId, class: "error", "aria-live": "polite" });
  const wrap = el("div", { class: "field" }, el("label", { for: id }, label), input,
    help ? el("span", { class: "muted" }, help) : null, error);
  wrap.input = input;
  wrap.setError = (msg) => {
    error.textContent = msg || "";
    if (msg) input.setAttribute("aria-invalid", "true");
    else input.removeAttribute("aria-invalid");
  };
  return wrap;
}

// ISO 8601 dates typed as text: a browser's date picker shows its locale's format
// (mm/dd/yyyy in en-US), which reads wrong next to ISO labels and tables.
const ISO_DAY = /^(\d{4})-(\d{2})-(\d{2})$/;
const ISO_MINUTE = /^(\d{4}-\d{2}-\d{2})(?:[ T](\d{2}:\d{2}))?$/;

// A yyyy-mm-dd field (or yyyy-mm-dd hh:mm with `withTime`), UTC.
export function isoField(label, { name, value = "", withTime = false, help } = {}) {
  const f = field(label, { name, value, placeholder: withTime ? "yyyy-mm-dd hh:mm" : "yyyy-mm-dd", help });
  f.input.setAttribute("inputmode", "numeric");
  f.input.setAttribute("autocomplete", "off");
  f.input.dataset.iso = withTime ? "minute" : "day";
  return f;
}

// A day field's value as a UTC Date; null when empty, undefined when not yyyy-mm-dd.
export function parseIsoDay(text) {
  const t = text.trim();
  if (!t) return null;
  const m = t.match(ISO_DAY);
  if (!m) return undefined;
  const d = new Date(`${t}T00:00:00Z`);
  return Number.isNaN(d.getTime()) || d.getUTCDate() !== Number(m[3]) ? undefined : d;
}

// A yyyy-mm-dd[ hh:mm] field's value as an ISO instant ("…T…:00Z"); null / undefined as above.
export function parseIsoMinute(text) {
  const t = text.trim();
  if (!t) return null;
  const m = t.match(ISO_MINUTE);
  if (!m || !parseIsoDay(m[1])) return undefined;
  const iso = `${m[1]}T${m[2] || "00:00"}:00Z`;
  return Number.isNaN(new Date(iso).getTime()) ? undefined : iso;
}

export function table(columns, rows, { empty = "Nothing to show.", label } = {}) {
  if (!rows.length) return el("p", { class: "muted" }, empty);
  const head = el("tr", {}, columns.map((c) => el("th", { scope: "col", class: c.num ? "num" : null }, c.title)));
  const body = rows.map((r) => el("tr", {}, columns.map((c) => {
    const v = c.render ? c.render(r) : r[c.key];
    return el("td", { class: c.num ? "num" : (c.wrap ? "wrap" : null) }, v instanceof Node ? v : String(v ?? "—"));
  })));
  return el("div", { class: "table-wrap" }, el("table", { "aria-label": label }, el("thead", {}, head), el("tbody", {}, body)));
}

export function showBanner(message, kind = "error") {
  const b = document.getElementById("banner");
  b.textContent = message;
  b.className = kind === "error" ? "banner" : "banner info";
  b.hidden = !message;
}

export function clearBanner() { showBanner(""); }

// Runs an async action; its ApiError becomes the banner (or `onError` gets it).
export async function attempt(fn, onError) {
  try {
    clearBanner();
    return await fn();
  } catch (err) {
    if (onError) onError(err);
    else showBanner(err.message || String(err));
    return undefined;
  }
}

export function confirmAction(text, okLabel = "Confirm") {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent = text;
  document.getElementById("confirm-ok").textContent = okLabel;
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
    dialog.returnValue = "cancel";
    dialog.showModal();
    document.getElementById("confirm-cancel").focus();
  });
}

export function download(filename, text, type) {
  const url = URL.createObjectURL(new Blob([text], { type }));
  const a = el("a", { href: url, download: filename });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 5000);
}

export function statusPill(status) {
  return el("span", { class: `status ${status}` }, status);
}

export function fmtTime(iso) {
  if (!iso) return "—";
  return new Date(iso).toISOString().replace("T", " ").slice(0, 19) + " UTC";
}

export function fmtNum(n, digits = 0) {
  if (n === null || n === undefined) return "—";
  return Number(n).toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: digits });
}

export function card(title, ...children) {
  return el("section", { class: "card", "aria-label": title }, title ? el("h2", {}, title) : null, ...children);
}

async function copyText(text, button) {
  try {
    await navigator.clipboard.writeText(text);
    button.textContent = "Copied";
  } catch {
    // No clipboard (plain HTTP, or permission refused): the secret can still be selected.
    button.textContent = "Select and copy manually";
  }
}

// A secret shown once (a new key or token) under `heading`, with a button that copies it.
export function secretBox(id, secret, heading) {
  const code = el("code", { id }, secret);
  const copy = el("button", { type: "button", class: "secondary", onclick: () => copyText(secret, copy) }, "Copy");
  return el("div", { class: "secret", role: "status" }, el("strong", {}, heading), code, copy);
}
