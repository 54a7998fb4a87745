// The code editor: CodeMirror 5 with a language picker, open/save of sandbox files.
/* global CodeMirror */
import { api, toast } from "./api.js";

export const LANGUAGES = {
  python: { mode: "python", label: "Python", ext: ["py"], sample: 'import sys\n\nname = sys.stdin.readline().strip() or "world"\nprint(f"Hello, {name}!")\n' },
  node: { mode: "javascript", label: "Node.js", ext: ["js", "mjs", "cjs"], sample: 'const os = require("os");\nconsole.log(`Hello from Node ${process.version} on ${os.platform()}`);\n' },
  bash: { mode: "shell", label: "Bash", ext: ["sh", "bash"], sample: 'echo "Hello from $(uname -s)"\nls -la\n' },
};

export function languageForPath(path) {
  const ext = (path.split(".").pop() || "").toLowerCase();
  for (const [name, lang] of Object.entries(LANGUAGES)) if (lang.ext.includes(ext)) return name;
  return null;
}

const darkScheme = window.matchMedia("(prefers-color-scheme: dark)");

const MODE_BY_EXT = { json: { name: "javascript", json: true }, ts: "javascript", md: null, txt: null };

export class Editor {
  constructor({ sandboxId, host, languageSelect, pathLabel, saveButton }) {
    this.sandboxId = sandboxId;
    this.languageSelect = languageSelect;
    this.pathLabel = pathLabel;
    this.path = null;
    this.dirty = false;
    this.cm = CodeMirror(host, {
      value: localStorage.getItem(`sandpit:scratch:${sandboxId}`) || LANGUAGES.python.sample,
      mode: "python",
      lineNumbers: true,
      theme: darkScheme.matches ? "material-darker" : "default",
      indentUnit: 4,
      matchBrackets: true,
      autoCloseBrackets: true,
      extraKeys: {
        "Ctrl-Enter": () => this.onRun && this.onRun(),
        "Cmd-Enter": () => this.onRun && this.onRun(),
        Tab: (cm) => (cm.somethingSelected() ? cm.indentSelection("add") : cm.replaceSelection(" ".repeat(cm.getOption("indentUnit")))),
        // Let keyboard users leave the editor.
        Esc: () => languageSelect.focus(),
      },
    });
    this.cm.getInputField().setAttribute("aria-label", "Code editor");
    this.cm.on("change", () => {
      if (!this.path) localStorage.setItem(`sandpit:scratch:${sandboxId}`, this.cm.getValue());
      this.setDirty(Boolean(this.path));
    });
    darkScheme.addEventListener("change", () => this.cm.setOption("theme", darkScheme.matches ? "material-darker" : "default"));
    // Keep CodeMirror's measurements right as the pane resizes.
    new ResizeObserver(() => this.cm.refresh()).observe(host);
    languageSelect.addEventListener("change", () => this.setLanguage(languageSelect.value, { fromPicker: true }));
    saveButton.addEventListener("click", () => this.save());
    // Ctrl/Cmd-S anywhere on the page (the editor included) saves the open file.
    document.addEventListener("keydown", (ev) => {
      if ((ev.ctrlKey || ev.metaKey) && ev.key.toLowerCase() === "s") {
        ev.preventDefault();
        this.save();
      }
    });
    this.updateLabel();
  }

  get language() {
    return this.languageSelect.value;
  }

  setLanguage(name, { fromPicker = false } = {}) {
    const lang = LANGUAGES[name];
    if (!lang) return;
    this.languageSelect.value = name;
    this.cm.setOption("mode", lang.mode);
    this.cm.setOption("indentUnit", name === "python" ? 4 : 2);
    if (fromPicker && !this.path && !this.cm.getValue().trim()) this.cm.setValue(lang.sample);
  }

  setDirty(dirty) {
    this.dirty = dirty;
    this.updateLabel();
  }

  updateLabel() {
    this.pathLabel.textContent = this.path ? `${this.path}${this.dirty ? " •" : ""}` : "scratch (not saved)";
    this.pathLabel.title = this.dirty ? "Unsaved changes — Ctrl/Cmd-S to save" : "";
  }

  async open(path) {
    if (this.dirty && !confirm(`Discard unsaved changes to ${this.path}?`)) return;
    try {
      const blob = await api(`sandboxes/${this.sandboxId}/files/content`, { query: { path }, raw: true });
      const text = await blob.text();
      this.path = path;
      const lang = languageForPath(path);
      if (lang) this.setLanguage(lang);
      else {
        const ext = (path.split(".").pop() || "").toLowerCase();
        this.cm.setOption("mode", MODE_BY_EXT[ext] ?? null);
      }
      this.cm.setValue(text);
      this.cm.clearHistory();
      this.setDirty(false);
      this.cm.focus();
    } catch (err) {
      toast(err, { error: true });
    }
  }

  /** The open file changed on disk (an explorer event). Reload when we have no edits. */
  async externalChange(path) {
    if (path !== this.path || this.saving) return;
    if (!this.dirty) {
      const cursor = this.cm.getCursor();
      try {
        const blob = await api(`sandboxes/${this.sandboxId}/files/content`, { query: { path }, raw: true });
        const text = await blob.text();
        if (text !== this.cm.getValue()) {
          this.cm.setValue(text);
          this.cm.setCursor(cursor);
          this.setDirty(false);
        }
      } catch {
        /* deleted meanwhile: the explorer reports it */
      }
    }
  }

  closedExternally(path) {
    if (path === this.path) {
      toast(`${path} was deleted in the sandbox; saving will recreate it.`);
      this.setDirty(true);
    }
  }

  renamed(from, to) {
    if (this.path === from) {
      this.path = to;
      this.updateLabel();
    } else if (this.path && this.path.startsWith(`${from}/`)) {
      this.path = to + this.path.slice(from.length);
      this.updateLabel();
    }
  }

  async save() {
    let path = this.path;
    if (!path) {
      const ext = LANGUAGES[this.language].ext[0];
      path = prompt("Save as (path in the workspace):", `main.${ext}`);
      if (!path) return;
      path = path.replace(/^\/+/, "");
    }
    this.saving = true;
    try {
      await api(`sandboxes/${this.sandboxId}/files/content`, {
        method: "PUT",
        query: { path },
        body: new Blob([this.cm.getValue()], { type: "application/octet-stream" }),
      });
      this.path = path;
      this.setDirty(false);
      toast(`Saved ${path}`);
    } catch (err) {
      toast(err, { error: true });
    } finally {
      setTimeout(() => (this.saving = false), 500);
    }
  }

  value() {
    return this.cm.getValue();
  }

  refresh() {
    this.cm.refresh();
  }
}
