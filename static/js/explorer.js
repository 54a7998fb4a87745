// File explorer: a lazily loaded tree of the workspace that follows file events live.
// Keyboard: ↑/↓ move, → expand, ← collapse, Enter open, F2 rename, Delete remove.
import { api, h, toast } from "./api.js";
import { zipBlob } from "./zip.js";

// A folder downloads as a zip built in the browser from its files; past these it is refused
// (with the reason) rather than filling the tab's memory.
const ZIP_MAX_FILES = 1000;
const ZIP_MAX_BYTES = 100 * 1024 * 1024;

const parentOf = (path) => (path.includes("/") ? path.slice(0, path.lastIndexOf("/")) : "");
const baseName = (path) => path.slice(path.lastIndexOf("/") + 1);
const join = (dir, name) => (dir ? `${dir}/${name}` : name);

export class Explorer {
  constructor({ sandboxId, host, pane, errorHost, buttons, onOpen, onRenamed, onDeleted }) {
    Object.assign(this, { sandboxId, host, pane, errorHost, onOpen, onRenamed, onDeleted });
    this.dirs = new Map(); // loaded dir path ("" = root) → Map(name → entry)
    this.expanded = new Set([""]);
    this.selected = null;
    this.flash = new Set();
    buttons.newFile.addEventListener("click", () => this.newEntry("file"));
    buttons.newFolder.addEventListener("click", () => this.newEntry("dir"));
    buttons.refresh.addEventListener("click", () => this.reload());
    buttons.download.addEventListener("click", () => {
      const e = this.selected && this.entry(this.selected);
      if (e && e.type === "file") this.download(e);
      else if (e && e.type === "dir") this.downloadFolder(e);
      else toast("Select a file or folder to download first.");
    });
    buttons.upload.addEventListener("change", (ev) => {
      this.upload([...ev.target.files], this.targetDir());
      ev.target.value = "";
    });
    this.setupDrop();
    host.addEventListener("keydown", (ev) => this.onKey(ev));
  }

  base() {
    return `sandboxes/${this.sandboxId}/files`;
  }

  async load(dir) {
    const { entries } = await api(this.base(), { query: { path: dir || "." } });
    const map = new Map();
    for (const e of entries) map.set(e.name, e);
    this.dirs.set(dir, map);
  }

  /** Show the top level from entries already at hand (the listing the page came with). */
  show(entries) {
    const map = new Map();
    for (const e of entries) map.set(e.name, e);
    this.dirs.clear();
    this.dirs.set("", map);
    this.errorHost.replaceChildren();
    this.render();
  }

  async reload() {
    try {
      const loaded = [...this.dirs.keys()].filter((d) => d === "" || this.expanded.has(d));
      this.dirs.clear();
      for (const dir of loaded.length ? loaded : [""]) {
        try {
          await this.load(dir);
        } catch (err) {
          if (dir === "") throw err;
          this.expanded.delete(dir);
        }
      }
      this.errorHost.replaceChildren();
      this.render();
    } catch (err) {
      this.errorHost.replaceChildren(h("div.alert", { role: "alert" }, err.message, err.code ? h("span.code", {}, err.code) : null));
    }
  }

  targetDir() {
    if (!this.selected) return "";
    const entry = this.entry(this.selected);
    return entry && entry.type === "dir" ? this.selected : parentOf(this.selected);
  }

  entry(path) {
    const dir = this.dirs.get(parentOf(path));
    return dir ? dir.get(baseName(path)) : undefined;
  }

  // --- live events -------------------------------------------------------------------------

  /** Apply a file event from the events socket: {type, path, is_dir?, old_path?}. */
  applyEvent(ev) {
    const path = (ev.path || "").replace(/^\/+/, "").replace(/^workspace\//, "");
    if (!path) return;
    if (ev.type === "created" || ev.type === "modified") {
      this.upsert(path, ev.is_dir, ev.size);
      if (ev.type === "modified") this.flash.add(path);
    } else if (ev.type === "deleted") {
      this.remove(path);
      if (this.onDeleted) this.onDeleted(path);
    } else if (ev.type === "moved") {
      const from = (ev.old_path || ev.src_path || ev.from || "").replace(/^\/+/, "");
      if (from) {
        const old = this.entry(from);
        this.remove(from);
        this.upsert(path, old ? old.type === "dir" : ev.is_dir);
        if (this.onRenamed) this.onRenamed(from, path);
      } else this.upsert(path, ev.is_dir);
    }
    this.scheduleRender();
  }

  upsert(path, isDir, size) {
    const dir = this.dirs.get(parentOf(path));
    if (!dir) return; // parent not loaded: it is listed when expanded
    const name = baseName(path);
    const prev = dir.get(name);
    dir.set(name, { ...(prev || {}), name, path, type: isDir ? "dir" : prev ? prev.type : "file", size: size ?? prev?.size ?? 0 });
    if (!prev) this.flash.add(path);
  }

  remove(path) {
    const dir = this.dirs.get(parentOf(path));
    if (dir) dir.delete(baseName(path));
    for (const key of [...this.dirs.keys()]) if (key === path || key.startsWith(`${path}/`)) this.dirs.delete(key);
    if (this.selected === path) this.selected = null;
  }

  scheduleRender() {
    if (this.renderPending) return;
    this.renderPending = true;
    requestAnimationFrame(() => {
      this.renderPending = false;
      this.render();
    });
  }

  // --- rendering ---------------------------------------------------------------------------

  render() {
    const hadFocus = this.host.contains(document.activeElement) ? document.activeElement.dataset.path : null;
    const root = this.dirs.get("");
    if (!root) return;
    const tree = this.renderDir("", 0);
    tree.setAttribute("role", "tree");
    tree.setAttribute("aria-label", "Workspace files");
    if (!root.size) tree.append(h("li.empty.small", {}, "Empty workspace. Create a file, or drop files here."));
    this.host.replaceChildren(tree);
    this.flash.clear();
    if (hadFocus) {
      const el = this.host.querySelector(`[data-path="${CSS.escape(hadFocus)}"]`);
      if (el) el.focus();
    }
  }

  renderDir(dir, depth) {
    const ul = h(depth ? "ul" : "ul.tree", { role: depth ? "group" : undefined });
    const entries = [...(this.dirs.get(dir) || new Map()).values()].sort(
      (a, b) => (a.type === "dir" ? 0 : 1) - (b.type === "dir" ? 0 : 1) || a.name.localeCompare(b.name),
    );
    for (const e of entries) {
      const isDir = e.type === "dir";
      const open = isDir && this.expanded.has(e.path);
      const node = h(
        `div.node${this.selected === e.path ? ".selected" : ""}${this.flash.has(e.path) ? ".flash" : ""}`,
        {
          role: "treeitem",
          tabindex: this.selected === e.path || (!this.selected && e === entries[0] && !depth) ? 0 : -1,
          "aria-expanded": isDir ? String(open) : undefined,
          "aria-selected": String(this.selected === e.path),
          dataset: { path: e.path, type: e.type },
          title: isDir ? e.path : `${e.path} · ${e.size ?? 0} bytes`,
          onclick: () => this.activate(e),
          oncontextmenu: (ev) => {
            ev.preventDefault();
            this.select(e.path);
            this.menu(e, ev);
          },
        },
        h("span.icon", { "aria-hidden": "true" }, isDir ? (open ? "▾" : "▸") : "·"),
        h("span.name", {}, e.name),
      );
      const li = h("li", {}, node);
      if (open && this.dirs.has(e.path)) li.append(this.renderDir(e.path, depth + 1));
      ul.append(li);
    }
    return ul;
  }

  select(path) {
    this.selected = path;
    for (const n of this.host.querySelectorAll(".node")) {
      const on = n.dataset.path === path;
      n.classList.toggle("selected", on);
      n.setAttribute("aria-selected", String(on));
      n.tabIndex = on ? 0 : -1;
    }
  }

  async activate(e) {
    this.select(e.path);
    if (e.type === "dir") await this.toggle(e.path);
    else if (this.onOpen) this.onOpen(e.path);
  }

  async toggle(path, open) {
    const want = open ?? !this.expanded.has(path);
    if (want) {
      this.expanded.add(path);
      if (!this.dirs.has(path)) {
        try {
          await this.load(path);
        } catch (err) {
          toast(err, { error: true });
          this.expanded.delete(path);
        }
      }
    } else this.expanded.delete(path);
    this.render();
  }

  onKey(ev) {
    const nodes = [...this.host.querySelectorAll(".node")];
    const i = nodes.indexOf(document.activeElement);
    if (i < 0) return;
    const path = nodes[i].dataset.path;
    const e = this.entry(path);
    const focus = (n) => {
      if (!n) return;
      this.select(n.dataset.path);
      n.focus();
    };
    switch (ev.key) {
      case "ArrowDown":
        focus(nodes[i + 1]);
        break;
      case "ArrowUp":
        focus(nodes[i - 1]);
        break;
      case "ArrowRight":
        if (e && e.type === "dir") this.toggle(path, true);
        break;
      case "ArrowLeft":
        if (e && e.type === "dir" && this.expanded.has(path)) this.toggle(path, false);
        else focus(this.host.querySelector(`[data-path="${CSS.escape(parentOf(path))}"]`));
        break;
      case "Enter":
        if (e) this.activate(e);
        break;
      case "F2":
        if (e) this.rename(e);
        break;
      case "Delete":
        if (e) this.delete(e);
        break;
      default:
        return;
    }
    ev.preventDefault();
  }

  menu(e, ev) {
    document.querySelector(".tree-menu")?.remove();
    const close = () => menu.remove();
    const item = (label, fn) => h("button.small", { type: "button", role: "menuitem", onclick: () => { close(); fn(); } }, label);
    const menu = h(
      "div.tree-menu.card",
      { role: "menu", style: `position:fixed;left:${ev.clientX}px;top:${ev.clientY}px;z-index:60;padding:.3rem;display:flex;flex-direction:column;gap:.2rem` },
      e.type === "file" ? item("Open", () => this.onOpen(e.path)) : null,
      item(e.type === "dir" ? "Download as zip" : "Download", () => (e.type === "dir" ? this.downloadFolder(e) : this.download(e))),
      item("Rename…", () => this.rename(e)),
      item("Delete", () => this.delete(e)),
    );
    document.body.append(menu);
    menu.querySelector("button").focus();
    setTimeout(() => document.addEventListener("click", close, { once: true }), 0);
    menu.addEventListener("keydown", (k) => k.key === "Escape" && close());
  }

  // --- actions -----------------------------------------------------------------------------

  async newEntry(type) {
    const dir = this.targetDir();
    const name = prompt(type === "dir" ? `New folder in /${dir}` : `New file in /${dir}`, type === "dir" ? "folder" : "untitled.py");
    if (!name) return;
    const path = join(dir, name.replace(/^\/+/, ""));
    try {
      if (type === "dir") await api(`${this.base()}/mkdir`, { method: "POST", body: { path } });
      else await api(`${this.base()}/content`, { method: "PUT", query: { path }, body: new Blob([]) });
      this.upsert(path, type === "dir", 0);
      if (dir) this.expanded.add(dir);
      this.selected = path;
      this.render();
      if (type === "file" && this.onOpen) this.onOpen(path);
    } catch (err) {
      toast(err, { error: true });
    }
  }

  async rename(e) {
    const to = prompt(`Rename or move ${e.path} to:`, e.path);
    if (!to || to === e.path) return;
    try {
      await api(`${this.base()}/move`, { method: "POST", body: { from: e.path, to: to.replace(/^\/+/, "") } });
      this.applyEvent({ type: "moved", path: to.replace(/^\/+/, ""), old_path: e.path, is_dir: e.type === "dir" });
    } catch (err) {
      toast(err, { error: true });
    }
  }

  async delete(e) {
    if (!confirm(`Delete ${e.path}${e.type === "dir" ? " and everything in it" : ""}?`)) return;
    try {
      await api(this.base(), { method: "DELETE", query: { path: e.path, recursive: e.type === "dir" ? "true" : undefined } });
      this.applyEvent({ type: "deleted", path: e.path });
    } catch (err) {
      toast(err, { error: true });
    }
  }

  async download(e) {
    try {
      const blob = await api(`${this.base()}/content`, { query: { path: e.path }, raw: true });
      this.save(blob, e.name);
    } catch (err) {
      toast(err, { error: true });
    }
  }

  /** The folder's files (recursively) as <folder>.zip, paths inside relative to the folder. */
  async downloadFolder(e) {
    try {
      const { entries } = await api(this.base(), { query: { path: e.path, recursive: "true" } });
      const files = entries.filter((x) => x.type === "file");
      const total = files.reduce((n, x) => n + (x.size || 0), 0);
      if (files.length > ZIP_MAX_FILES || total > ZIP_MAX_BYTES) {
        toast(`${e.name} is too big to zip in the browser (${files.length} files, ${Math.round(total / 1048576)} MB; at most ${ZIP_MAX_FILES} files and ${ZIP_MAX_BYTES / 1048576} MB). Use a terminal: tar czf ${e.name}.tgz ${e.path}`, { error: true, timeout: 10000 });
        return;
      }
      toast(`Zipping ${files.length} ${files.length === 1 ? "file" : "files"} from ${e.name}…`);
      const prefix = `${e.path.replace(/^\/+|\/+$/g, "")}/`;
      const items = [];
      for (const f of files) {
        const full = (f.path || "").replace(/^\/+/, "").replace(/^workspace\//, "");
        const inside = full.startsWith(prefix) ? full.slice(prefix.length) : full;
        const blob = await api(`${this.base()}/content`, { query: { path: full }, raw: true });
        items.push({ path: `${e.name}/${inside}`, data: new Uint8Array(await blob.arrayBuffer()), mtime: f.mtime ? new Date(f.mtime * 1000) : undefined });
      }
      this.save(zipBlob(items), `${e.name}.zip`);
    } catch (err) {
      toast(err, { error: true });
    }
  }

  save(blob, name) {
    const url = URL.createObjectURL(blob);
    const a = h("a", { href: url, download: name, style: "display:none" });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  }

  async upload(files, dir) {
    for (const file of files) {
      const path = join(dir, file.name);
      try {
        await api(`${this.base()}/content`, { method: "PUT", query: { path }, body: file });
        this.upsert(path, false, file.size);
        toast(`Uploaded ${path} (${file.size} bytes)`);
      } catch (err) {
        toast(err, { error: true });
      }
    }
    this.render();
  }

  setupDrop() {
    let depth = 0;
    const pane = this.pane;
    pane.addEventListener("dragenter", (ev) => {
      if (!ev.dataTransfer || ![...ev.dataTransfer.types].includes("Files")) return;
      depth++;
      pane.classList.add("dragging");
    });
    pane.addEventListener("dragleave", () => {
      if (--depth <= 0) {
        depth = 0;
        pane.classList.remove("dragging");
      }
    });
    pane.addEventListener("dragover", (ev) => {
      ev.preventDefault();
      if (ev.dataTransfer) ev.dataTransfer.dropEffect = "copy";
    });
    pane.addEventListener("drop", (ev) => {
      ev.preventDefault();
      depth = 0;
      pane.classList.remove("dragging");
      const files = [...(ev.dataTransfer?.files || [])];
      if (!files.length) return;
      const target = ev.target.closest && ev.target.closest(".node");
      let dir = this.targetDir();
      if (target) dir = target.dataset.type === "dir" ? target.dataset.path : parentOf(target.dataset.path);
      this.upload(files, dir);
    });
  }
}
