// Admin API tokens: list, create (the secret shown once, with a copy button), revoke.
import { api, getAll } from "../api.js";
import { attempt, card, confirmAction, el, field, fmtTime, secretBox, showBanner, statusPill, table } from "../dom.js";

const ROLES = [
  ["viewer", "viewer: reads, no writes"],
  ["operator", "operator: runs the platform"],
  ["finance", "finance: usage and billing"],
  ["auditor", "auditor: the audit log"],
  ["tenant-admin", "tenant-admin: one tenant"],
  ["admin", "admin: everything"],
];

export async function render(ctx) {
  const canWrite = ctx.me.role === "admin"; // POST /tokens and revoke are admin-only
  const tenants = await getAll("/tenants");
  const tenantName = new Map(tenants.map((t) => [t.id, t.name]));
  const listSlot = el("div");
  const secretSlot = el("div", { id: "token-secret-slot" });

  const isMine = (t) => ctx.me.actor === `token:${t.id}`;
  const revoke = async (t) => {
    const who = isMine(t) ? "You are signed in with it: you will be signed out." : "Whoever uses it is signed out at once.";
    if (!(await confirmAction(`Revoke admin token ${t.prefix}… (${t.role}${t.name ? `, ${t.name}` : ""})? ${who} This cannot be undone.`, "Revoke token"))) return;
    const ok = await attempt(() => api.post(`/tokens/${encodeURIComponent(t.id)}/revoke`));
    if (ok) {
      showBanner(`Admin token ${t.prefix}… is revoked.`, "info");
      drawList(await getAll("/tokens"));
    }
  };
  const drawList = (items) => {
    const cols = [
      { title: "Name", render: (t) => `${t.name || "—"}${isMine(t) ? " (this sign-in)" : ""}` },
      { title: "Role", key: "role" },
      { title: "Tenant", render: (t) => (t.tenant_id ? tenantName.get(t.tenant_id) || t.tenant_id : "—") },
      { title: "Prefix", render: (t) => el("code", {}, `${t.prefix}…`) },
      { title: "Created", render: (t) => fmtTime(t.created_at) },
      { title: "Status", render: (t) => (t.revoked_at ? el("span", {}, statusPill("revoked"), ` ${fmtTime(t.revoked_at)}`) : statusPill("active")) },
    ];
    if (canWrite) {
      cols.push({ title: "Actions", render: (t) => (t.revoked_at ? "" : el("button", { type: "button", class: "danger", "aria-label": `Revoke token ${t.prefix}`, onclick: () => revoke(t) }, "Revoke")) });
    }
    listSlot.replaceChildren(table(cols, items, { empty: "There are no admin tokens.", label: "Admin tokens" }));
  };
  drawList(await getAll("/tokens"));

  let createCard = null;
  if (canWrite) {
    const name = field("Token name", { name: "token_name", placeholder: "e.g. ci-deploy" });
    const role = field("Role", { name: "token_role", value: "viewer", options: ROLES });
    const tenant = field("Tenant", { name: "token_tenant", options: tenants.map((t) => t.name) });
    const syncTenant = () => { tenant.hidden = role.input.value !== "tenant-admin"; };
    role.input.addEventListener("change", syncTenant);
    syncTenant();
    const form = el("form", { "aria-label": "Create admin token", onsubmit: async (e) => {
      e.preventDefault();
      tenant.setError("");
      const isTenantAdmin = role.input.value === "tenant-admin";
      if (isTenantAdmin && !tenant.input.value) { tenant.setError("A tenant-admin token needs a tenant: create one first."); return; }
      const created = await attempt(() => api.post("/tokens", {
        role: role.input.value,
        tenant: isTenantAdmin ? tenant.input.value : null,
        name: name.input.value.trim() || null,
      }));
      if (!created) return;
      secretSlot.replaceChildren(secretBox("new-token-secret", created.token, `New ${created.role} token — copy it now, it will not be shown again. Anyone holding it acts as this role:`));
      form.reset();
      syncTenant();
      drawList(await getAll("/tokens"));
    } }, el("div", { class: "row" }, name, role, tenant, el("button", { type: "submit" }, "Create token")));
    createCard = card("Create an admin token", form, secretSlot);
  }
  return el("div", {}, el("h1", {}, "Admin tokens"),
    canWrite ? null : el("p", { class: "muted" }, "You can see the admin tokens; only an admin can create or revoke them."),
    createCard, card("Admin tokens by prefix", listSlot));
}
