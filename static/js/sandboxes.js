// Sandboxes dashboard: list the organization's sandboxes, create one, destroy one.
import { ago, api, apiAll, h, showError, stateClass, toast } from "./api.js";

const listHost = document.getElementById("sandbox-list");
const listError = document.getElementById("sandbox-list-error");
const form = document.getElementById("create-form");
const formError = document.getElementById("create-error");
const progress = document.getElementById("create-progress");
const providerSelect = document.getElementById("provider");
const showAll = document.getElementById("show-destroyed");

let sandboxes = [];

async function loadProviders() {
  try {
    const { results } = await api("providers");
    providerSelect.replaceChildren(
      ...results.map((p) =>
        h("option", { value: p.name, selected: p.default }, `${p.name}${p.isolation === "gvisor" ? " (gVisor)" : ""}${p.health && !p.health.ok ? " (unhealthy)" : ""}`),
      ),
    );
    const current = results.find((p) => p.default) || results[0];
    const limits = document.getElementById("limits");
    if (current && current.limits && limits) {
      limits.textContent = `Up to ${current.limits.max_concurrent_sandboxes} live sandboxes; commands time out after ${current.limits.max_command_timeout_s}s.`;
    }
  } catch (err) {
    showError(formError, err);
  }
}

// The template menu: the default environment and every ready template (built-ins first).
async function loadTemplates() {
  const select = document.getElementById("template");
  try {
    const templates = await api("templates");
    const ready = templates.filter((t) => t.state === "ready");
    select.replaceChildren(
      h("option", { value: "default" }, "default"),
      ...ready.map((t) => h("option", { value: t.name, title: t.description }, `${t.name}${t.languages.length ? ` (${t.languages.join(", ")})` : ""}`)),
    );
  } catch (err) {
    showError(formError, err);
  }
}

function row(sb) {
  const live = sb.state === "running" || sb.state === "creating";
  const openable = live || sb.state === "paused" || sb.state === "archived"; // resumed from its page
  const mem = sb.resources && sb.resources.memory_mb ? `${sb.resources.memory_mb} MB` : "—";
  return h(
    "tr",
    { dataset: { id: sb.id } },
    h("td", {}, openable ? h("a.mono", { href: `/sandboxes/${sb.id}/` }, sb.id) : h("span.mono", {}, sb.id)),
    h("td", {}, h("span", { class: stateClass(sb.state), title: sb.error_message || sb.destroy_reason || "" }, sb.state)),
    h("td", {}, sb.isolation === "gvisor" ? `${sb.provider} (gVisor)` : sb.provider),
    h("td.hide-sm", {}, sb.template),
    h("td.hide-sm", {}, mem, sb.network ? " · net" : ""),
    h("td", { title: sb.created_at }, ago(sb.created_at)),
    h("td", { title: sb.last_activity_at }, live ? ago(sb.last_activity_at) : "—"),
    h(
      "td.actions",
      {},
      openable ? h("a", { href: `/sandboxes/${sb.id}/`, class: "open-link" }, "Open") : null,
      " ",
      sb.state !== "destroyed"
        ? h("button.small.danger", { type: "button", onclick: () => destroy(sb), "aria-label": `Destroy ${sb.id}` }, "Destroy")
        : h("span.muted.small", {}, sb.destroy_reason || ""),
    ),
  );
}

function render() {
  if (!sandboxes.length) {
    listHost.replaceChildren(h("tr", {}, h("td.empty", { colspan: 8 }, "No sandboxes yet. Create one above.")));
    return;
  }
  listHost.replaceChildren(...sandboxes.map(row));
}

async function refresh() {
  try {
    sandboxes = await apiAll("sandboxes", showAll.checked ? { all: "true" } : undefined);
    listError.replaceChildren();
    render();
  } catch (err) {
    showError(listError, err);
  }
}

async function destroy(sb) {
  if (!confirm(`Destroy ${sb.id}? Its files and processes are lost.`)) return;
  try {
    await api(`sandboxes/${sb.id}`, { method: "DELETE" });
    toast(`Destroyed ${sb.id}`);
  } catch (err) {
    toast(err, { error: true });
  }
  refresh();
}

form.addEventListener("submit", async (ev) => {
  ev.preventDefault();
  formError.replaceChildren();
  const data = new FormData(form);
  const body = { provider: data.get("provider") || undefined, template: data.get("template") || "default", network: data.get("network") === "on" };
  const memory = Number(data.get("memory_mb"));
  const cpus = Number(data.get("cpu_count"));
  const resources = {};
  if (memory) resources.memory_mb = memory;
  if (cpus) resources.cpu_count = cpus;
  if (Object.keys(resources).length) body.resources = resources;
  const timeout = Number(data.get("timeout_s"));
  if (timeout) body.timeout_s = timeout * 60;
  const button = form.querySelector("button[type=submit]");
  button.disabled = true;
  progress.hidden = false;
  const status = document.getElementById("create-status");
  status.textContent = `Starting a ${body.provider || "default"} sandbox…`;
  const started = performance.now();
  try {
    const sb = await api("sandboxes", { method: "POST", body });
    const ms = Math.round(performance.now() - started);
    status.replaceChildren(`Sandbox ${sb.id} is ${sb.state} (${ms} ms). `, h("a", { href: `/sandboxes/${sb.id}/`, id: "open-new" }, "Open playground →"));
    await refresh();
  } catch (err) {
    status.textContent = "";
    showError(formError, err);
  } finally {
    button.disabled = false;
    progress.hidden = true;
  }
});

showAll.addEventListener("change", refresh);
loadProviders();
loadTemplates();
refresh();
setInterval(() => {
  if (!document.hidden) refresh();
}, 10000);
