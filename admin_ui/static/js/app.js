// The console shell: sign-in, role, navigation and the hash router.
import { api, getToken, setToken } from "./api.js";
import { attempt, clearBanner, el, field, showBanner } from "./dom.js";
import * as overview from "./pages/overview.js";
import * as tenants from "./pages/tenants.js";
import * as tenant from "./pages/tenant.js";
import * as keys from "./pages/keys.js";
import * as models from "./pages/models.js";
import * as engines from "./pages/engines.js";
import * as usage from "./pages/usage.js";
import * as audit from "./pages/audit.js";
import * as tokens from "./pages/tokens.js";

const main = document.getElementById("main");
let me = null;
let renderSeq = 0; // a render that a newer navigation overtook must not draw over it

// Who may open each section: the admin API's role matrix (admin/roles.py), so that no
// role is shown a page whose every call it would be refused.
const PLATFORM = ["admin", "operator", "viewer"];
const ROUTES = [
  { re: /^\/overview$/, page: overview, nav: "overview", roles: [...PLATFORM, "tenant-admin"] },
  { re: /^\/tenants$/, page: tenants, nav: "tenants", roles: PLATFORM },
  { re: /^\/tenants\/([^/]+)$/, page: tenant, nav: "tenants", roles: [...PLATFORM, "tenant-admin"] },
  { re: /^\/keys(?:\/([^/]+))?$/, page: keys, nav: "keys", roles: [...PLATFORM, "tenant-admin"] },
  { re: /^\/models$/, page: models, nav: "models", roles: PLATFORM },
  { re: /^\/engines$/, page: engines, nav: "engines", roles: PLATFORM },
  { re: /^\/usage$/, page: usage, nav: "usage", roles: [...PLATFORM, "finance", "tenant-admin"] },
  { re: /^\/audit$/, page: audit, nav: "audit", roles: ["admin", "viewer", "auditor"] },
  { re: /^\/tokens$/, page: tokens, nav: "tokens", roles: ["admin", "viewer"] },
];
// Where each role lands when the address names no section.
const HOME = { finance: "/usage", auditor: "/audit" };

function navItems() {
  if (me.role === "tenant-admin") {
    return [["overview", "Overview"], [`tenants/${encodeURIComponent(me.tenant_name)}`, "My tenant", "tenants"],
      ["keys", "Keys"], ["usage", "Usage & billing"]];
  }
  const items = [["overview", "Overview"], ["tenants", "Tenants"], ["keys", "Keys"], ["models", "Models & adapters"],
    ["engines", "Engines"], ["usage", "Usage & billing"], ["audit", "Audit log"], ["tokens", "Admin tokens"]];
  return items.filter(([path]) => ROUTES.find((r) => r.nav === path).roles.includes(me.role));
}

function renderNav(active) {
  const nav = document.getElementById("nav");
  nav.replaceChildren(...navItems().map(([path, label, key]) =>
    el("a", { href: `#/${path}`, "aria-current": (key || path) === active ? "page" : null }, label)));
  nav.hidden = false;
  document.getElementById("who-text").textContent =
    `${me.actor} · ${me.role}${me.tenant_name ? ` (${me.tenant_name})` : ""}`;
  document.getElementById("who").hidden = false;
}

function ctxFor(params) {
  return {
    me,
    params,
    canWrite: me.role === "admin" || me.role === "operator",
    canManageKeys: ["admin", "operator", "tenant-admin"].includes(me.role),
    navigate: (hash) => { location.hash = hash; },
  };
}

// A section the role cannot use says so once, instead of an error it cannot act on.
function notForRole() {
  return el("div", {}, el("h1", {}, "Not available"),
    el("p", {}, "This section is for the platform's admins. Ask them if you need something from it."));
}

async function route() {
  if (!me) return;
  const home = HOME[me.role] || "/overview";
  const path = decodeURIComponent(location.hash.replace(/^#/, ""));
  if (!path) { location.hash = `#${home}`; return; } // the hashchange draws it
  const match = ROUTES.map((r) => ({ r, m: path.match(r.re) })).find((x) => x.m);
  if (!match) { location.hash = `#${home}`; return; }
  const seq = ++renderSeq;
  renderNav(match.r.nav);
  clearBanner();
  delete main.dataset.rendered;
  main.replaceChildren(el("p", { class: "muted" }, "Loading…"));
  const params = match.m.slice(1).filter((p) => p !== undefined);
  const allowed = !match.r.roles || match.r.roles.includes(me.role);
  const node = allowed ? await attempt(() => match.r.page.render(ctxFor(params))) : notForRole();
  if (seq !== renderSeq) return;
  main.replaceChildren(node || el("p", { class: "muted" }, "This page could not be shown."));
  main.dataset.rendered = path; // tests and scripts wait for this, not for a spinner to go
  main.focus({ preventScroll: true });
}

async function loadIdentity() {
  const who = await api.get("/whoami");
  let tenantName = null;
  if (who.role === "tenant-admin") {
    const page = await api.get("/tenants", { limit: 1 });
    tenantName = page.items[0] ? page.items[0].name : null;
  }
  me = { ...who, tenant_name: tenantName };
  return me;
}

function signOut(message) {
  setToken(null);
  me = null;
  delete main.dataset.rendered;
  document.getElementById("nav").hidden = true;
  document.getElementById("who").hidden = true;
  renderSignIn();
  if (message) showBanner(message, "info");
}

async function renderSignIn() {
  const tokenField = field("Admin token", { name: "token", type: "password", required: true, help: "Create one with: cloister admin create-token --role admin" });
  const form = el("form", { class: "card signin", "aria-label": "Sign in", onsubmit: async (e) => {
    e.preventDefault();
    tokenField.setError("");
    setToken(tokenField.input.value.trim());
    const ok = await attempt(loadIdentity, (err) => { setToken(null); tokenField.setError(err.message); });
    if (ok) {
      if (location.hash === "#/") history.replaceState(null, "", "/admin");
      await route(); // an empty hash goes to the role's home
    }
  } },
  el("h1", {}, "Sign in"),
  el("div", { id: "oidc-slot" }),
  tokenField,
  el("div", { class: "row" }, el("button", { type: "submit" }, "Sign in with token")));
  main.replaceChildren(form);
  const config = await attempt(() => api.get("/console/config"));
  if (config && config.oidc) {
    form.querySelector("#oidc-slot").replaceChildren(
      el("p", {}, el("a", { href: "/admin/api/v1/auth/login", class: "button" }, "Sign in with your organisation (OIDC)")),
      el("p", { class: "muted" }, "Or use an admin token:"));
  }
  tokenField.input.focus();
}

// The OIDC provider redirects to /admin/oidc?code=…&state=…; the API's callback checks
// the state cookie and returns a session token.
async function finishOidc() {
  const q = new URLSearchParams(location.search);
  const token = await attempt(async () => (await api.get("/auth/callback", { code: q.get("code"), state: q.get("state") })).token);
  history.replaceState(null, "", "/admin"); // the role's home, once it is known
  if (token) setToken(token);
}

async function start() {
  document.getElementById("sign-out").addEventListener("click", () => signOut("You are signed out."));
  window.addEventListener("cloister:unauthenticated", (e) => { if (me) signOut(e.detail); });
  window.addEventListener("hashchange", route);
  if (location.pathname === "/admin/oidc") await finishOidc();
  if (getToken()) {
    const ok = await attempt(loadIdentity, () => setToken(null));
    if (ok) { await route(); return; }
  }
  renderSignIn();
}

start();
