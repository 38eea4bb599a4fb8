// Keys of one tenant: create (secret shown once, with a copy button), list, revoke.
import { api, getAll } from "../api.js";
import { attempt, card, confirmAction, el, field, fmtTime, secretBox, showBanner, statusPill, table } from "../dom.js";

function keyStatus(k) {
  if (k.revoked_at) return "revoked";
  if (k.expires_at && new Date(k.expires_at) < new Date()) return "expired";
  return "active";
}

export async function render(ctx) {
  let tenantName = ctx.params[0];
  if (ctx.me.role === "tenant-admin") tenantName = tenantName || ctx.me.tenant_name;
  const tenants = ctx.me.role === "tenant-admin" ? [{ name: ctx.me.tenant_name }] : await getAll("/tenants");
  if (!tenantName && tenants.length) tenantName = tenants[0].name;
  const picker = field("Tenant", { name: "tenant", value: tenantName, options: tenants.map((t) => t.name) });
  picker.input.addEventListener("change", () => ctx.navigate(`#/keys/${encodeURIComponent(picker.input.value)}`));
  if (!tenantName) {
    return el("div", {}, el("h1", {}, "Keys"), card(null, el("p", {}, "There are no tenants yet. Create one first.")));
  }
  const path = `/tenants/${encodeURIComponent(tenantName)}/keys`;
  const keys = await getAll(path);
  const secretSlot = el("div", { id: "secret-slot" });
  const listSlot = el("div");

  const revoke = async (k) => {
    if (!(await confirmAction(`Revoke key ${k.prefix}…? Calls with it fail at once. This cannot be undone.`, "Revoke key"))) return;
    const ok = await attempt(() => api.post(`${path}/${encodeURIComponent(k.id)}/revoke`));
    if (ok) {
      showBanner(`Key ${k.prefix}… is revoked.`, "info");
      drawList(await getAll(path));
    }
  };
  const drawList = (items) => {
    const cols = [
      { title: "Prefix", render: (k) => el("code", {}, `${k.prefix}…`) },
      { title: "Name", key: "name" },
      { title: "Status", render: (k) => statusPill(keyStatus(k)) },
      { title: "Last used", render: (k) => (k.last_used_at ? fmtTime(k.last_used_at) : "never") },
      { title: "Created", render: (k) => fmtTime(k.created_at) },
      { title: "Expires", render: (k) => (k.expires_at ? fmtTime(k.expires_at) : "never") },
    ];
    if (ctx.canManageKeys) {
      cols.push({ title: "Actions", render: (k) => (k.revoked_at ? "" : el("button", { type: "button", class: "danger", "aria-label": `Revoke key ${k.prefix}`, onclick: () => revoke(k) }, "Revoke")) });
    }
    listSlot.replaceChildren(table(cols, items, { empty: "This tenant has no keys yet.", label: "Keys" }));
  };
  drawList(keys);

  let createCard = null;
  if (ctx.canManageKeys) {
    const name = field("Key name", { name: "key_name", placeholder: "e.g. production" });
    const models = field("Allowed models", { name: "key_models", placeholder: "all models", help: "Comma-separated; empty allows the tenant's models." });
    const expires = field("Expires in days", { name: "expires", type: "number", min: "1", placeholder: "never" });
    const form = el("form", { "aria-label": "Create key", onsubmit: async (e) => {
      e.preventDefault();
      const list = models.input.value.split(",").map((m) => m.trim()).filter(Boolean);
      const created = await attempt(() => api.post(path, {
        name: name.input.value.trim() || null,
        allowed_models: list.length ? list : null,
        expires_in_days: expires.input.value ? Number(expires.input.value) : null,
      }));
      if (!created) return;
      secretSlot.replaceChildren(secretBox("new-key-secret", created.secret, "New key — copy it now, it will not be shown again:"));
      form.reset();
      drawList(await getAll(path));
    } }, el("div", { class: "row" }, name, models, expires, el("button", { type: "submit" }, "Create key")));
    createCard = card("Create a key", form, secretSlot);
  }
  return el("div", {}, el("h1", {}, `Keys of ${tenantName}`),
    ctx.me.role === "tenant-admin" ? null : card(null, el("div", { class: "row" }, picker)),
    createCard, card("Keys by prefix", listSlot));
}
