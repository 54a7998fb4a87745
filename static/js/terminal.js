// Terminal tabs: xterm.js over a WebSocket per terminal. Tabs survive a reload (the server
// keeps the PTY and replays its scrollback when we reattach).
/* global Terminal, FitAddon */
import { api, h, toast, wsUrl } from "./api.js";

const encoder = new TextEncoder();

function themeFor() {
  return {
    background: "#111318",
    foreground: "#e6e8eb",
    cursor: "#e6e8eb",
    selectionBackground: "#3a4a6b",
  };
}

class TerminalTab {
  constructor(manager, info) {
    this.manager = manager;
    this.id = info.id;
    this.url = info.ws_url || `/ws/sandboxes/${manager.sandboxId}/terminals/${info.id}`;
    this.exited = false;
    this.closed = false;
    this.retries = 0;
    this.host = h("div.term-host", { role: "tabpanel", id: `term-${this.id}`, "aria-label": `Terminal ${this.id}` });
    manager.panels.append(this.host);
    this.term = new Terminal({
      cursorBlink: true,
      fontFamily: 'ui-monospace, SFMono-Regular, Menlo, Consolas, "DejaVu Sans Mono", monospace',
      fontSize: 13,
      scrollback: 5000,
      theme: themeFor(),
    });
    this.fit = new FitAddon.FitAddon();
    this.term.loadAddon(this.fit);
    this.term.open(this.host);
    this.term.onData((data) => this.send(encoder.encode(data)));
    this.term.onBinary((data) => this.send(Uint8Array.from(data, (c) => c.charCodeAt(0) & 255)));
    this.term.onResize(({ cols, rows }) => this.sendJson({ type: "resize", cols, rows }));
    this.tab = h(
      "div.tab",
      { role: "tab", tabindex: 0, "aria-controls": this.host.id, dataset: { terminal: this.id }, onclick: () => manager.select(this) },
      h("span", {}, `Terminal ${manager.counter++}`),
      h("button.close", { type: "button", "aria-label": "Close terminal", title: "Close terminal", onclick: (ev) => { ev.stopPropagation(); manager.close(this); } }, "×"),
    );
    this.tab.addEventListener("keydown", (ev) => {
      if (ev.key === "Enter" || ev.key === " ") {
        ev.preventDefault();
        manager.select(this);
      }
    });
    this.connect();
  }

  connect() {
    if (this.closed || this.exited) return;
    const ws = new WebSocket(wsUrl(this.url));
    ws.binaryType = "arraybuffer";
    this.ws = ws;
    ws.onopen = () => {
      this.retries = 0;
      this.fitNow(true);
    };
    ws.onmessage = (ev) => {
      if (typeof ev.data !== "string") {
        this.term.write(new Uint8Array(ev.data));
        return;
      }
      let msg;
      try {
        msg = JSON.parse(ev.data);
      } catch {
        this.term.write(ev.data);
        return;
      }
      if (msg.type === "exit") {
        this.exited = true;
        this.host.classList.add("exited");
        this.host.dataset.exit = `exited (${msg.code ?? "?"})`;
        this.term.write(`\r\n\x1b[2m[process exited with code ${msg.code ?? "?"}]\x1b[0m\r\n`);
      } else if (msg.type === "error") {
        this.term.write(`\r\n\x1b[31m[${msg.message || msg.code || "terminal error"}]\x1b[0m\r\n`);
      } else if (msg.type === "output" && msg.data) {
        this.term.write(msg.data);
      }
    };
    ws.onclose = (ev) => {
      if (this.closed || this.exited) return;
      // 4404: gone (or never ours); 4403: not allowed. Do not retry those.
      if (ev.code === 4404 || ev.code === 4403 || ev.code === 4410) {
        this.exited = true;
        this.term.write(`\r\n\x1b[31m[terminal unavailable${ev.reason ? `: ${ev.reason}` : ""}]\x1b[0m\r\n`);
        return;
      }
      const delay = Math.min(10000, 500 * 2 ** this.retries++);
      this.term.write(`\r\n\x1b[2m[disconnected, retrying in ${Math.round(delay / 1000)}s]\x1b[0m\r\n`);
      this.reconnectTimer = setTimeout(() => this.connect(), delay);
    };
  }

  send(bytes) {
    if (this.ws && this.ws.readyState === WebSocket.OPEN) this.ws.send(bytes);
  }

  sendJson(obj) {
    if (this.ws && this.ws.readyState === WebSocket.OPEN) this.ws.send(JSON.stringify(obj));
  }

  fitNow(force = false) {
    if (this.host.hidden || !this.host.offsetWidth) return;
    const before = `${this.term.cols}x${this.term.rows}`;
    try {
      this.fit.fit();
    } catch {
      return;
    }
    // onResize only fires on a change; after (re)connecting the server still needs the size.
    if (force && before === `${this.term.cols}x${this.term.rows}`) {
      this.sendJson({ type: "resize", cols: this.term.cols, rows: this.term.rows });
    }
  }

  dispose() {
    this.closed = true;
    clearTimeout(this.reconnectTimer);
    if (this.ws) this.ws.close();
    this.term.dispose();
    this.host.remove();
    this.tab.remove();
  }
}

export class TerminalTabs {
  constructor({ sandboxId, tabs, panels, newButton, errorHost, planBlocked = null }) {
    this.sandboxId = sandboxId;
    // (err) => element shown instead of the error when the plan does not include terminals.
    this.planBlocked = planBlocked;
    this.tabsEl = tabs;
    this.panels = panels;
    this.errorHost = errorHost;
    this.items = [];
    this.counter = 1;
    newButton.addEventListener("click", () => this.create({ focus: true }));
    let timer;
    new ResizeObserver(() => {
      clearTimeout(timer);
      timer = setTimeout(() => this.current && this.current.fitNow(), 60);
    }).observe(panels);
  }

  base() {
    return `sandboxes/${this.sandboxId}/terminals`;
  }

  /** Reattach to the sandbox's terminals, or open a first one. */
  async start() {
    try {
      const listing = await api(this.base());
      const existing = Array.isArray(listing) ? listing : listing.results || [];
      const live = existing.filter((t) => t.running !== false && t.exit_code == null);
      if (live.length) {
        for (const info of live) this.add(info);
        return;
      }
    } catch (err) {
      if (err.status !== 404) this.showError(err);
      if (err.status === 404 || err.status === 501) return;
    }
    await this.create();
  }

  showError(err) {
    if (err.code === "premium_required" && this.planBlocked) {
      this.errorHost.replaceChildren(this.planBlocked(err));
      return;
    }
    this.errorHost.replaceChildren(h("div.alert", { role: "alert" }, `Terminal: ${err.message}`, err.code ? h("span.code", {}, err.code) : null));
  }

  add(info) {
    const tab = new TerminalTab(this, info);
    this.items.push(tab);
    this.tabsEl.append(tab.tab);
    this.select(tab);
    return tab;
  }

  /** Open a terminal; `focus` only when the person asked for it (the first terminal the page
   * opens by itself must not take the keyboard from someone already typing in the editor). */
  async create({ focus = false } = {}) {
    const size = this.current ? { cols: this.current.term.cols, rows: this.current.term.rows } : { cols: 100, rows: 24 };
    try {
      const info = await api(this.base(), { method: "POST", body: size });
      this.errorHost.replaceChildren();
      const tab = this.add(info);
      if (focus) tab.term.focus();
      return tab;
    } catch (err) {
      this.showError(err);
      return null;
    }
  }

  select(tab) {
    this.current = tab;
    for (const t of this.items) {
      const on = t === tab;
      t.host.hidden = !on;
      t.tab.setAttribute("aria-selected", on ? "true" : "false");
    }
    requestAnimationFrame(() => tab.fitNow());
  }

  async close(tab) {
    this.items = this.items.filter((t) => t !== tab);
    tab.dispose();
    if (this.current === tab) {
      this.current = null;
      if (this.items.length) this.select(this.items[this.items.length - 1]);
    }
    try {
      await api(`${this.base()}/${tab.id}`, { method: "DELETE" });
    } catch (err) {
      if (err.status !== 404) toast(err, { error: true });
    }
  }

  /** The sandbox is gone: stop reconnecting. */
  stopAll(message) {
    for (const t of this.items) {
      t.exited = true;
      clearTimeout(t.reconnectTimer);
      if (t.ws) t.ws.close();
      if (message) t.term.write(`\r\n\x1b[31m[${message}]\x1b[0m\r\n`);
    }
  }
}
