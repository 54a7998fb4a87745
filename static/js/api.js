// Shared helpers: calling the REST API with the session cookie + CSRF header, rendering the
// API's {"error": {"code", "message"}} shape, tiny DOM and formatting helpers.

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export function csrfToken() {
  const match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
  return match ? decodeURIComponent(match[1]) : "";
}

async function errorFrom(response) {
  let code = `http_${response.status}`;
  let message = response.statusText || "Request failed";
  try {
    const body = await response.json();
    if (body && body.error) {
      code = body.error.code || code;
      message = body.error.message || message;
    }
  } catch {
    /* not JSON: keep the status text */
  }
  if (response.status === 403 && code === "http_403") message = "You are not allowed to do this.";
  return new ApiError(response.status, code, message);
}

/** Call the API. `body` objects are sent as JSON; Blob/ArrayBuffer/string as raw bytes.
 *  Resolves to parsed JSON, a Blob (raw: true), or null (204). Rejects with ApiError. */
export async function api(path, { method = "GET", body, query, raw = false, signal, headers = {} } = {}) {
  let url = path.startsWith("/") ? path : `/api/v1/${path}`;
  if (query) {
    const params = new URLSearchParams();
    for (const [k, v] of Object.entries(query)) if (v !== undefined && v !== null) params.set(k, v);
    url += (url.includes("?") ? "&" : "?") + params.toString();
  }
  const init = { method, credentials: "same-origin", headers: { Accept: "application/json", ...headers }, signal };
  if (method !== "GET" && method !== "HEAD") init.headers["X-CSRFToken"] = csrfToken();
  if (body !== undefined) {
    if (body instanceof Blob || body instanceof ArrayBuffer || typeof body === "string") {
      init.body = body;
      init.headers["Content-Type"] ||= "application/octet-stream";
    } else {
      init.body = JSON.stringify(body);
      init.headers["Content-Type"] = "application/json";
    }
  }
  let response;
  try {
    response = await fetch(url, init);
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new ApiError(0, "network_error", "Could not reach the server. Check your connection.");
  }
  if (!response.ok) throw await errorFrom(response);
  if (response.status === 204) return null;
  if (raw) return response.blob();
  const type = response.headers.get("Content-Type") || "";
  return type.includes("json") ? response.json() : response.text();
}

/** Fetch every page of a paginated list ({results, next}). */
export async function apiAll(path, query) {
  const first = await api(path, { query });
  if (!first || !Array.isArray(first.results)) return first;
  const results = [...first.results];
  let next = first.next;
  while (next) {
    const page = await api(new URL(next, location.href).pathname + new URL(next, location.href).search);
    results.push(...page.results);
    next = page.next;
  }
  return results;
}

export function wsUrl(path) {
  if (/^wss?:\/\//.test(path)) return path;
  return `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}${path}`;
}

// --- DOM ------------------------------------------------------------------------------------

/** h("button.primary", {onclick}, "text", child) — a tiny element builder. */
export function h(tag, attrs = {}, ...children) {
  const [name, ...classes] = tag.split(".");
  const el = document.createElement(name || "div");
  if (classes.length) el.className = classes.join(" ");
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (k === "class") el.className = [el.className, v].filter(Boolean).join(" ");
    else if (k in el && typeof v !== "string") el[k] = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

/** Show an error (ApiError or any Error) inside `host` as an alert; returns the element. */
export function showError(host, err, { replace = true } = {}) {
  const el = h("div.alert", { role: "alert" }, err.message || String(err));
  if (err.code) el.append(h("span.code", {}, err.code));
  if (host) {
    if (replace) host.replaceChildren(el);
    else host.prepend(el);
  }
  return el;
}

let toastHost;
export function toast(message, { error = false, timeout = 5000 } = {}) {
  if (!toastHost) {
    toastHost = h("div.toast-host", { role: "status", "aria-live": "polite" });
    document.body.append(toastHost);
  }
  const text = message instanceof Error ? `${message.message}${message.code ? ` (${message.code})` : ""}` : message;
  const el = h(`div.toast${error || message instanceof Error ? ".error" : ""}`, {}, text);
  toastHost.append(el);
  setTimeout(() => el.remove(), timeout);
  return el;
}

export async function copyText(text) {
  try {
    await navigator.clipboard.writeText(text);
    return true;
  } catch {
    const area = h("textarea", { style: "position:fixed;opacity:0" });
    area.value = text;
    document.body.append(area);
    area.select();
    const ok = document.execCommand("copy");
    area.remove();
    return ok;
  }
}

// --- formatting ---------------------------------------------------------------------------

export function ago(iso, now = Date.now()) {
  if (!iso) return "—";
  const s = Math.max(0, Math.round((now - Date.parse(iso)) / 1000));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
  return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
}

export function bytes(n) {
  if (n === null || n === undefined) return "—";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i++;
  }
  return `${n.toFixed(i && n < 10 ? 1 : 0)} ${units[i]}`;
}

export function money(cents, currency = "usd") {
  if (cents === null || cents === undefined) return "—";
  return new Intl.NumberFormat(undefined, { style: "currency", currency: currency.toUpperCase() }).format(Number(cents) / 100);
}

export function num(n) {
  return n === null || n === undefined ? "—" : new Intl.NumberFormat().format(n);
}

export function dateTime(iso) {
  return iso ? new Date(iso).toLocaleString() : "—";
}

export function date(iso) {
  return iso ? new Date(iso).toLocaleDateString() : "—";
}

export function stateClass(state) {
  return `pill ${state || ""}`;
}

/** Read JSON embedded with Django's json_script. */
export function pageData(id) {
  const el = document.getElementById(id);
  return el ? JSON.parse(el.textContent) : {};
}
