// Tenants: list with search, and create (admins).
import { api } from "../api.js";
import { attempt, card, el, field, fmtNum, fmtTime, statusPill, table } from "../dom.js";

function tenantTable(items) {
  return table([
    { title: "Name", render: (t) => el("a", { href: `#/tenants/${encodeURIComponent(t.name)}` }, t.name) },
    { title: "Status", render: (t) => statusPill(t.status) },
    { title: "Isolation", key: "isolation_level" },
    { title: "Weight", num: true, render: (t) => fmtNum(t.weight, 2) },
    { title: "Created", render: (t) => fmtTime(t.created_at) },
  ], items, { empty: "No tenants match.", label: "Tenants" });
}

export async function render(ctx) {
  const list = el("div", { id: "tenant-list" });
  const count = el("p", { class: "muted", "aria-live": "polite" });
  const search = field("Search by name", { name: "search", type: "search", placeholder: "part of a name" });
  const status = field("Status", { name: "status", options: [["", "any"], "active", "suspended"] });

  async function refresh() {
    const page = await attempt(() => api.get("/tenants", { name_contains: search.input.value.trim(), status: status.input.value, limit: 200 }));
    if (!page) return;
    count.textContent = `${page.total} tenant${page.total === 1 ? "" : "s"}${page.total > page.items.length ? `, first ${page.items.length} shown` : ""}`;
    list.replaceChildren(tenantTable(page.items));
  }
  let timer;
  search.input.addEventListener("input", () => { clearTimeout(timer); timer = setTimeout(refresh, 200); });
  status.input.addEventListener("change", refresh);

  let createCard = null;
  if (ctx.canWrite) {
    const name = field("Name", { name: "name", required: true });
    const isolation = field("Cache isolation", { name: "isolation_level", options: [["tenant", "tenant (default)"], ["key", "per key"], ["user", "per end user"]] });
    const weight = field("Scheduling weight", { name: "weight", type: "number", value: "1", min: "0.01", step: "0.01" });
    const form = el("form", { "aria-label": "Create tenant", onsubmit: async (e) => {
      e.preventDefault();
      name.setError("");
      const t = await attempt(() => api.post("/tenants", { name: name.input.value.trim(), isolation_level: isolation.input.value, weight: Number(weight.input.value) }),
        (err) => name.setError(err.message));
      if (t) ctx.navigate(`#/tenants/${encodeURIComponent(t.name)}`);
    } }, el("div", { class: "row" }, name, isolation, weight, el("button", { type: "submit" }, "Create tenant")));
    createCard = card("Create a tenant", form);
  }
  await refresh();
  return el("div", {}, el("h1", {}, "Tenants"), createCard,
    card("All tenants", el("div", { class: "row" }, search, status), count, list));
}
