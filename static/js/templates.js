// Templates page: list the organization's templates (built-ins first), build one from a
// Dockerfile, and follow a build: progress bar from the template's state, live log from the
// chunked GET /api/v1/templates/{id}/log.
import { ago, api, bytes, csrfToken, h, showError, stateClass, toast } from "./api.js";

const listHost = document.getElementById("tpl-list");
const listError = document.getElementById("tpl-list-error");
const form = document.getElementById("tpl-form");
const formError = document.getElementById("tpl-create-error");
const buildCard = document.getElementById("tpl-build");
const bar = document.getElementById("tpl-progress");
const statusLine = document.getElementById("tpl-build-status");
const logHost = document.getElementById("tpl-log");

let following = null;

function stateOf(t) {
  return t.state === "ready" ? "running" : t.state === "failed" ? "error" : "creating";
}

function row(t) {
  return h(
    "tr",
    { dataset: { id: t.id } },
    h("td", {}, h("strong", {}, t.name), t.builtin ? h("span.pill.small", {}, " built-in") : null, t.description ? h("div.muted.small", {}, t.description) : null),
    h("td", {}, h("span", { class: stateClass(stateOf(t)), title: t.error_message || "" }, t.state === "building" ? `building ${t.progress.percent}%` : t.state)),
    h("td.hide-sm", {}, t.languages.join(", ") || "—"),
    h("td.hide-sm", {}, t.size_bytes ? bytes(t.size_bytes) : "—"),
    h("td.hide-sm", { title: t.built_at || "" }, t.built_at ? ago(t.built_at) : "—"),
    h(
      "td.actions",
      {},
      t.builtin ? null : h("button.small", { type: "button", onclick: () => follow(t) }, "Log"),
      " ",
      t.builtin ? null : h("button.small.danger", { type: "button", onclick: () => remove(t), "aria-label": `Delete ${t.name}` }, "Delete"),
    ),
  );
}

async function refresh() {
  try {
    const templates = await api("templates");
    listHost.replaceChildren(...templates.map(row));
    if (!templates.length) listHost.replaceChildren(h("tr", {}, h("td.empty", { colspan: 6 }, "No templates yet.")));
    listError.replaceChildren();
    return templates;
  } catch (err) {
    showError(listError, err);
    return [];
  }
}

function showProgress(t) {
  const percent = t.progress.percent;
  bar.firstElementChild.style.width = `${percent}%`;
  bar.setAttribute("aria-valuenow", String(percent));
  const step = t.progress.steps ? ` — step ${t.progress.step} of ${t.progress.steps}` : "";
  statusLine.textContent = t.state === "failed" ? `Failed: ${t.error_message}` : `${t.progress.phase}${step} (${percent}%)`;
  statusLine.className = t.state === "failed" ? "small error" : "small";
}

// Follow one build: stream its log into the page and poll its state for the progress bar.
async function follow(t) {
  if (following) following.abort();
  const controller = new AbortController();
  following = controller;
  buildCard.hidden = false;
  document.getElementById("tpl-build-name").textContent = t.name;
  logHost.textContent = "";
  showProgress(t);
  const poll = setInterval(async () => {
    try {
      const current = await api(`templates/${t.id}`);
      showProgress(current);
      if (current.state === "ready" || current.state === "failed") {
        clearInterval(poll);
        refresh();
      }
    } catch {
      clearInterval(poll);
    }
  }, 1000);
  try {
    const response = await fetch(`/api/v1/templates/${t.id}/log`, { signal: controller.signal, headers: { "X-CSRFToken": csrfToken() } });
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      const atBottom = logHost.scrollTop + logHost.clientHeight >= logHost.scrollHeight - 4;
      logHost.textContent += decoder.decode(value, { stream: true });
      if (atBottom) logHost.scrollTop = logHost.scrollHeight;
    }
  } catch (err) {
    if (err.name !== "AbortError") showError(formError, err);
  }
}

async function remove(t) {
  if (!confirm(`Delete template ${t.name}? Its image and files are removed.`)) return;
  try {
    await api(`templates/${t.id}`, { method: "DELETE" });
    toast(`Deleted ${t.name}`);
  } catch (err) {
    toast(err, { error: true });
  }
  refresh();
}

form.addEventListener("submit", async (ev) => {
  ev.preventDefault();
  formError.replaceChildren();
  const data = new FormData(form);
  const body = { name: data.get("name"), description: data.get("description") || "", dockerfile: data.get("dockerfile") };
  if (data.get("network") === "on") body.network = true;
  const button = form.querySelector("button[type=submit]");
  button.disabled = true;
  try {
    const t = await api("templates", { method: "POST", body });
    toast(`Building ${t.name}`);
    await refresh();
    follow(t);
  } catch (err) {
    showError(formError, err);
  } finally {
    button.disabled = false;
  }
});

refresh().then((templates) => {
  const building = templates.find((t) => !t.builtin && (t.state === "building" || t.state === "queued"));
  if (building) follow(building);
});
