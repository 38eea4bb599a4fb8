// The admin API client: the signed-in bearer token and errors in plain words.
const API = "/admin/api/v1";
const TOKEN_KEY = "cloister.admin.token";

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export function getToken() {
  return sessionStorage.getItem(TOKEN_KEY);
}

export function setToken(token) {
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  else sessionStorage.removeItem(TOKEN_KEY);
}

// Every error of the admin API is in OpenAI's format, whichever command serves it.
function detailText(body) {
  if (body && body.error && typeof body.error.message === "string") return body.error.message;
  return "";
}

// Why a credential was refused, from the API's 401 detail (admin/identity.py's words).
function unauthenticatedWords(detail) {
  const d = (detail || "").toLowerCase();
  if (d.includes("expired")) return "Your sign-in has expired. Please sign in again.";
  if (d.includes("revoked")) return "That token has been revoked. Ask an admin for a new one.";
  if (d.includes("no admin credential")) return "You are not signed in. Please sign in.";
  return "That token is not valid. Check that you pasted all of it, or create one with: cloister admin create-token.";
}

// The API's own sentence, capitalised and ended with a full stop.
function sentence(detail) {
  const d = (detail || "").trim();
  return d ? `${d[0].toUpperCase()}${d.slice(1)}${/[.!?]$/.test(d) ? "" : "."}` : "";
}

// One sentence an operator can act on, from an HTTP status and the API's detail.
export function plainWords(status, detail) {
  switch (status) {
    case 0: return "Cannot reach the Cloister server. Check that it is running and try again.";
    case 400: return `Please check the values: ${detail || "invalid input"}.`;
    case 401: return unauthenticatedWords(detail);
    case 403: return "Your role does not allow this action.";
    case 404: return "Not found: it does not exist, or you are not allowed to see it.";
    case 409: return sentence(detail) || "That already exists.";
    case 413: return "The upload is too large.";
    default:
      if (status >= 500) return "The server failed to complete the request. Try again in a moment.";
      return `The request failed (${status}): ${detail}`;
  }
}

async function call(method, path, { body, raw, query, contentType } = {}) {
  const url = new URL(API + path, location.origin);
  for (const [k, v] of Object.entries(query || {})) {
    if (v !== undefined && v !== null && v !== "") url.searchParams.set(k, v);
  }
  const headers = {};
  const token = getToken();
  if (token) headers.Authorization = `Bearer ${token}`;
  let payload;
  if (body instanceof Blob || body instanceof ArrayBuffer) {
    payload = body;
    headers["Content-Type"] = contentType || "application/octet-stream";
  } else if (body !== undefined) {
    payload = JSON.stringify(body);
    headers["Content-Type"] = "application/json";
  }
  let res;
  try {
    res = await fetch(url, { method, headers, body: payload });
  } catch {
    throw new ApiError(0, plainWords(0));
  }
  if (!res.ok) {
    let parsed = null;
    try { parsed = await res.json(); } catch { parsed = null; }
    const err = new ApiError(res.status, plainWords(res.status, detailText(parsed)));
    if (res.status === 401) window.dispatchEvent(new CustomEvent("cloister:unauthenticated", { detail: err.message }));
    throw err;
  }
  if (raw) return res.text();
  if (res.status === 204) return null;
  return res.json();
}

export const api = {
  get: (path, query) => call("GET", path, { query }),
  text: (path, query) => call("GET", path, { query, raw: true }),
  post: (path, body, query) => call("POST", path, { body, query }),
  put: (path, body, query) => call("PUT", path, { body, query }),
  patch: (path, body) => call("PATCH", path, { body }),
  del: (path) => call("DELETE", path),
  upload: (path, blob, query) => call("POST", path, { body: blob, query, contentType: "application/zip" }),
};

// Every page of a list endpoint (the API caps a page at 500).
export async function getAll(path, query = {}) {
  const items = [];
  for (let offset = 0; ; offset += 500) {
    const page = await api.get(path, { ...query, limit: 500, offset });
    items.push(...page.items);
    if (items.length >= page.total || page.items.length === 0) return items;
  }
}
