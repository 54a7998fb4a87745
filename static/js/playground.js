// The playground page: wires the editor, runner, terminals and explorer together, follows the
// sandbox's events socket (files, ports, status) and polls its resource gauges.
import { api, ago, bytes, h, pageData, toast, wsUrl } from "./api.js";
import { Editor } from "./editor.js";
import { Explorer } from "./explorer.js";
import { Lifecycle } from "./lifecycle.js";
import { planNotice } from "./plan.js";
import { Runner } from "./run.js";
import { TerminalTabs } from "./terminal.js";

const data = pageData("playground-data");
const sandboxId = data.sandbox.id;
const $ = (id) => document.getElementById(id);

const editor = new Editor({
  sandboxId,
  host: $("editor-host"),
  languageSelect: $("language"),
  pathLabel: $("editor-path"),
  saveButton: $("save-file"),
});

const runner = new Runner({
  sandboxId,
  editor,
  output: $("output"),
  runButton: $("run"),
  stopButton: $("stop"),
  clearButton: $("clear-output"),
  stdin: $("stdin"),
  streamPath: data.exec_ws_path || null,
});

const explorer = new Explorer({
  sandboxId,
  host: $("tree"),
  pane: $("explorer-pane"),
  errorHost: $("explorer-error"),
  buttons: { newFile: $("new-file"), newFolder: $("new-folder"), refresh: $("refresh-files"), upload: $("upload-input"), download: $("download-file") },
  onOpen: (path) => editor.open(path),
  onRenamed: (from, to) => editor.renamed(from, to),
  onDeleted: (path) => editor.closedExternally(path),
});

// The file input is hidden; this button opens its picker (a listener, not onclick=, for the CSP).
$("upload-button").addEventListener("click", () => $("upload-input").click());

const terminals = new TerminalTabs({
  sandboxId,
  tabs: $("terminal-tabs"),
  panels: $("terminal-panels"),
  newButton: $("new-terminal"),
  errorHost: $("terminal-error"),
  planBlocked: () => planNotice(data.plan, "Terminals"),
});

// --- status --------------------------------------------------------------------------------

let state = data.sandbox.state;
let gone = false;
const startedRunning = ["running", "creating"].includes(state);

const lifecycle = new Lifecycle({
  sandboxId,
  pauseButton: $("pause"),
  resumeButton: $("resume"),
  forkButton: $("fork"),
  onState: (next) => {
    // A page opened on a paused sandbox never connected its live parts: start them afresh.
    if (next === "running" && !startedRunning) window.location.reload();
    else setState(next);
  },
});

function setState(next, reason) {
  if (next === "gone") {
    next = "destroyed";
    reason ||= "stopped or reaped";
  }
  state = next;
  const pill = $("sandbox-state");
  pill.textContent = next;
  pill.className = `pill ${next}`;
  lifecycle.render(next);
  if (["stopped", "destroyed", "error"].includes(next) && !gone) {
    gone = true;
    const why = reason ? ` (${reason.replace(/_/g, " ")})` : "";
    const text = next === "error" ? `This sandbox failed${why}.` : `This sandbox was ${next}${why}. Its terminals, processes and files are no longer available.`;
    $("gone").replaceChildren(h("div.gone-banner", { role: "alert" }, text, h("a", { href: "/" }, "Back to sandboxes")));
    terminals.stopAll(`sandbox ${next}`);
    ports.clear();
    renderPorts();
    const dot = $("live-dot");
    dot.className = "pill";
    dot.textContent = "ended";
    dot.title = "The sandbox is no longer running";
    for (const id of ["cpu-text", "mem-text", "proc-text", "uptime-text"]) $(id).textContent = "—";
    $("cpu-meter").value = 0;
    $("mem-meter").value = 0;
    for (const b of document.querySelectorAll(".needs-live")) b.disabled = true;
    clearInterval(statsTimer);
  }
}

// The language menu lists what this sandbox runs (its template's languages).
api(`sandboxes/${sandboxId}/languages`)
  .then((res) => editor.setLanguages(res.results))
  .catch(() => {
    /* an ended sandbox keeps the built-in menu */
  });

async function checkState() {
  try {
    const sb = await api(`sandboxes/${sandboxId}`);
    setState(sb.state, sb.destroy_reason || sb.error_message);
  } catch (err) {
    if (err.status === 404) setState("destroyed");
  }
}

// --- gauges --------------------------------------------------------------------------------

const memLimit = (data.sandbox.resources && data.sandbox.resources.memory_mb ? data.sandbox.resources.memory_mb : 512) * 1024 * 1024;
let statsTimer;

async function pollStats() {
  if (document.hidden || gone) return;
  try {
    const s = await api(`sandboxes/${sandboxId}/stats`);
    const cpu = Math.max(0, Math.min(100, s.cpu_percent || 0));
    $("cpu-meter").value = cpu;
    $("cpu-text").textContent = `${cpu.toFixed(0)}%`;
    $("mem-meter").value = Math.min(1, (s.memory_bytes || 0) / memLimit);
    $("mem-text").textContent = `${bytes(s.memory_bytes)} / ${bytes(memLimit)}`;
    $("proc-text").textContent = s.process_count ?? "—";
    $("uptime-text").textContent = s.uptime_s ? ago(new Date(Date.now() - s.uptime_s * 1000).toISOString()) : "—";
  } catch (err) {
    if ([404, 409, 410].includes(err.status) || err.code === "sandbox_not_running") checkState();
  }
}

// --- ports ---------------------------------------------------------------------------------

const ports = new Map();

function renderPorts() {
  const host = $("ports");
  if (!ports.size) {
    host.replaceChildren(h("span.muted", {}, "No open ports"));
    return;
  }
  host.replaceChildren(
    h("span.muted", {}, "Ports:"),
    ...[...ports.values()].sort((a, b) => a.port - b.port).map((p) =>
      ownOrigin(p)
        ? // Its own origin: a new tab. The preview cookie is SameSite=Lax, and under *.localhost
          // Sandpit and the preview are different sites, so a frame here would carry none.
          h(
            "span.pill.ok",
            { dataset: { port: p.port } },
            h("a", { href: p.url, target: "_blank", rel: "noopener", class: "port-link", title: `Open ${p.url} in a new tab`, onclick: (ev) => openOwnOrigin(p, ev) }, `:${p.port} ↗`),
          )
        : h(
            "span.pill.ok",
            { dataset: { port: p.port } },
            h("a", { href: p.url, target: "_blank", rel: "noopener", class: "port-link", title: `Open port ${p.port} in a new tab` }, `:${p.port} ↗`),
            " ",
            h("button.link.small", { type: "button", class: "preview-btn", onclick: () => openPreview(p), "aria-label": `Preview port ${p.port}` }, "preview"),
          ),
    ),
  );
}

function ownOrigin(p) {
  return /^https?:\/\//.test(p.url);
}

// A preview on its own host gets no Sandpit cookie: the first visit carries a short-lived
// token with the 'ports' scope, which the preview exchanges for its own cookie.
async function openOwnOrigin(p, ev) {
  ev.preventDefault();
  const tab = window.open("about:blank", "_blank"); // now, while the click still allows it
  if (tab) tab.opener = null;
  try {
    const minted = await api(`sandboxes/${sandboxId}/tokens`, { method: "POST", body: { scopes: ["ports"], ttl_s: 3600 } });
    const url = new URL(p.url);
    url.searchParams.set("token", minted.token);
    if (tab) tab.location.href = url.href;
    else toast("Allow pop-ups for this page to open the preview", { error: true });
  } catch (err) {
    if (tab) tab.close();
    toast(err, { error: true });
  }
}

function openPreview(p) {
  const dialog = $("preview");
  $("preview-title").textContent = `Port ${p.port} — ${p.url}`;
  $("preview-open").href = p.url;
  $("preview-frame").src = p.url;
  dialog.showModal();
}

$("preview-close").addEventListener("click", () => {
  $("preview").close();
});
$("preview").addEventListener("close", () => ($("preview-frame").src = "about:blank"));

function portUrl(ev) {
  return ev.url || ev.preview_url || `/sandboxes/${sandboxId}/ports/${ev.port}/`;
}

// --- events socket -------------------------------------------------------------------------

let eventsRetry = 0;
let eventsConnected = false;

function connectEvents() {
  if (gone) return;
  const ws = new WebSocket(wsUrl(data.events_ws_path));
  const dot = $("live-dot");
  ws.onopen = () => {
    eventsRetry = 0;
    dot.className = "pill ok";
    dot.textContent = "live";
    dot.title = "Receiving live events";
    ws.send(JSON.stringify({ type: "watch", id: "explorer", path: ".", recursive: true, ignore: ["node_modules", ".git", "__pycache__", "*.pyc"] }));
    // Anything that happened while disconnected: relist (the first connection follows the
    // listing the page came with, so it has nothing to catch up on).
    if (eventsConnected) explorer.reload();
    eventsConnected = true;
  };
  ws.onmessage = (ev) => {
    let msg;
    try {
      msg = JSON.parse(ev.data);
    } catch {
      return;
    }
    switch (msg.type) {
      case "created":
      case "modified":
      case "deleted":
      case "moved":
        explorer.applyEvent(msg);
        if (msg.type === "modified") editor.externalChange(msg.path);
        break;
      case "files":
        for (const e of msg.events || []) explorer.applyEvent(e);
        break;
      case "port_open":
        ports.set(msg.port, { port: msg.port, url: portUrl(msg) });
        renderPorts();
        toast(`Port ${msg.port} is open`);
        break;
      case "port_closed":
        ports.delete(msg.port);
        renderPorts();
        break;
      case "ports":
        ports.clear();
        for (const p of msg.ports || []) ports.set(p.port, { port: p.port, url: portUrl(p) });
        renderPorts();
        break;
      case "status":
        setState(msg.state, msg.reason);
        break;
      case "ready":
        if (msg.state) setState(msg.state);
        // Without the ports signal the plan (or the session) does not include previews.
        if (!(msg.signals || []).includes("ports") && msg.state === "running" && data.plan && data.plan.plan !== "premium") {
          $("ports").replaceChildren(planNotice(data.plan, "Port previews"));
        }
        break;
      case "error":
        if (msg.code === "free_allowance_exhausted" || msg.code === "premium_required" || msg.status === 402) {
          $("explorer-notice").replaceChildren(
            msg.code === "premium_required" ? planNotice(data.plan, "Live file updates") : h("div.alert.warn.small", { role: "status" }, msg.message),
          );
        } else toast(`Events: ${msg.message || msg.code}`, { error: true });
        break;
      default:
        break;
    }
  };
  ws.onclose = (ev) => {
    if (gone) return;
    dot.className = "pill warn";
    dot.textContent = "offline";
    dot.title = "Live events disconnected; reconnecting";
    if (ev.code === 4404 || ev.code === 4410) {
      checkState();
      return;
    }
    const delay = Math.min(15000, 1000 * 2 ** eventsRetry++);
    setTimeout(() => {
      checkState().then(connectEvents);
    }, delay);
  };
}

// --- start ---------------------------------------------------------------------------------

$("destroy").addEventListener("click", async () => {
  if (!confirm(`Destroy ${sandboxId}? Its files and processes are lost.`)) return;
  try {
    await api(`sandboxes/${sandboxId}`, { method: "DELETE" });
    setState("destroyed", "destroyed by you");
  } catch (err) {
    toast(err, { error: true });
  }
});

renderPorts();
if (["running", "creating"].includes(state)) {
  // The page's own background reads are not executions: the first file listing comes with the
  // page, open ports arrive on the events socket (port_open for each on connect), and the
  // gauges read stats, which is never counted (README, Billing).
  if (Array.isArray(data.files)) explorer.show(data.files);
  else explorer.reload();
  terminals.start();
  connectEvents();
  pollStats();
  statsTimer = setInterval(pollStats, data.stats_interval_ms || 5000);
} else {
  gone = false;
  setState(state, data.sandbox.destroy_reason);
}
window.addEventListener("resize", () => editor.refresh());
// For tests and debugging from the console.
window.sandpit = { editor, runner, explorer, terminals };
