// The code editor: CodeMirror 5 with a language picker, open/save of sandbox files.
/* global CodeMirror */
import { api, toast } from "./api.js";

export const LANGUAGES = {
  python: { mode: "python", label: "Python", ext: ["py"], sample: 'import sys\n\nname = sys.stdin.readline().strip() or "world"\nprint(f"Hello, {name}!")\n' },
  node: { mode: "javascript", label: "Node.js", ext: ["js", "mjs", "cjs"], sample: 'const os = require("os");\nconsole.log(`Hello from Node ${process.version} on ${os.platform()}`);\n' },
  bash: { mode: "shell", label: "Bash", ext: ["sh", "bash"], sample: 'echo "Hello from $(uname -s)"\nls -la\n' },
};

/** Editor modes for the languages the server may add (only these modes are vendored). */
const MODE_BY_LANGUAGE = { typescript: { name: "javascript", typescript: true } };

/** The sandbox's languages (GET .../languages) become the menu: the three above keep their
 * richer samples, the others come with the server's label, extensions and hello world. */
export function addLanguages(list) {
  for (const entry of list) {
    if (!LANGUAGES[entry.name]) {
      LANGUAGES[entry.name] = { mode: MODE_BY_LANGUAGE[entry.name] ?? null, label: entry.label, ext: entry.extensions, sample: entry.sample };
    }
  }
  const offered = new Set(list.map((entry) => entry.name));
  for (const name of Object.keys(LANGUAGES)) if (!offered.has(name)) delete LANGUAGES[name];
}

/** Not a program: opened files the editor shows without a language to run them in. */
export const PLAIN_TEXT = "text";

export function languageForPath(path) {
  const ext = (path.split(".").pop() || "").toLowerCase();
  for (const [name, lang] of Object.entries(LANGUAGES)) if (lang.ext.includes(ext)) return name;
  return null;
}

const darkScheme = window.matchMedia("(prefers-color-scheme: dark)");

const MODE_BY_EXT = { json: { name: "javascript", json: true }, ts: "javascript", md: null, txt: null };

// Brackets close themselves and typing a closer steps over the one already there. Quotes are not
// paired: after a string prefix (f", r", b") a paired quote left a stray `")` behind
// `print(f"Hi {name}")`, and a lone quote is what people type anyway. `override` keeps a
// mode's own settings (Python's pairs quotes) from replacing these.
const AUTO_CLOSE = { pairs: "()[]{}", explode: "[]{}()", override: true };

export class Editor {
  constructor({ sandboxId, host, languageSelect, pathLabel, saveButton }) {
    this.sandboxId = sandboxId;
    this.languageSelect = languageSelect;
    this.pathLabel = pathLabel;
    this.path = null;
    this.dirty = false;
    this.shownLanguage = "python";
    this.cm = CodeMirror(host, {
      value: this.scratch("python"),
      mode: "python",
      lineNumbers: true,
      theme: darkScheme.matches ? "material-darker" : "default",
      indentUnit: 4,
      matchBrackets: true,
      autoCloseBrackets: AUTO_CLOSE,
      extraKeys: {
        "Ctrl-Enter": () => this.onRun && this.onRun(),
        "Cmd-Enter": () => this.onRun && this.onRun(),
        Tab: (cm) => (cm.somethingSelected() ? cm.indentSelection("add") : cm.replaceSelection(" ".repeat(cm.getOption("indentUnit")))),
        // Let keyboard users leave the editor.
        Esc: () => languageSelect.focus(),
      },
    });
    // A reload must not keep a menu choice the browser restored but the editor does not show.
    languageSelect.value = "python";
    this.cm.getInputField().setAttribute("aria-label", "Code editor");
    this.cm.on("change", () => {
      if (!this.path) localStorage.setItem(this.scratchKey(this.language), this.cm.getValue());
      this.setDirty(Boolean(this.path));
    });
    darkScheme.addEventListener("change", () => this.cm.setOption("theme", darkScheme.matches ? "material-darker" : "default"));
    // Keep CodeMirror's measurements right as the pane resizes.
    new ResizeObserver(() => this.cm.refresh()).observe(host);
    languageSelect.addEventListener("change", () => this.pickLanguage(languageSelect.value));
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

  /** Rebuild the language menu from the sandbox's languages (GET .../languages); the
   * shown language stays when the sandbox has it. */
  setLanguages(list) {
    addLanguages(list);
    const shown = this.shownLanguage;
    const options = Object.entries(LANGUAGES).map(([name, lang]) => {
      const option = document.createElement("option");
      option.value = name;
      option.textContent = lang.label;
      return option;
    });
    const plain = document.createElement("option");
    plain.value = PLAIN_TEXT;
    plain.textContent = "Plain text";
    this.languageSelect.replaceChildren(...options, plain);
    if (LANGUAGES[shown] || shown === PLAIN_TEXT) {
      this.languageSelect.value = shown;
    } else if (this.path) {
      this.setLanguage(PLAIN_TEXT); // an open file in a language this sandbox cannot run
    } else if (options.length) {
      this.setLanguage(options[0].value);
      this.cm.setValue(this.scratch(options[0].value));
      this.cm.clearHistory();
    }
  }

  /** Each language keeps its own scratch file (in this browser), so switching never runs
   * one language's code as another's. */
  scratchKey(name) {
    return `sandpit:scratch:${this.sandboxId}:${name}`;
  }

  scratch(name) {
    const legacy = name === "python" ? localStorage.getItem(`sandpit:scratch:${this.sandboxId}`) : null;
    return localStorage.getItem(this.scratchKey(name)) ?? legacy ?? LANGUAGES[name].sample;
  }

  setLanguage(name) {
    const lang = LANGUAGES[name];
    this.languageSelect.value = name;
    this.shownLanguage = name;
    this.cm.setOption("mode", lang ? lang.mode : null);
    this.cm.setOption("indentUnit", name === "python" ? 4 : 2);
  }

  /** The language menu: switch to that language's scratch file. An open file is closed first
   * (asking when it has unsaved changes); its own language comes from its extension. */
  pickLanguage(name) {
    const previous = this.shownLanguage;
    if (!LANGUAGES[name]) {
      // Plain text only describes opened files; there is no plain-text scratch to run.
      this.languageSelect.value = previous;
      return;
    }
    if (this.path) {
      const question = this.dirty
        ? `Discard unsaved changes to ${this.path} and start a ${LANGUAGES[name].label} scratch file?`
        : `Close ${this.path} and switch to a ${LANGUAGES[name].label} scratch file?`;
      if (!confirm(question)) {
        this.languageSelect.value = previous;
        return;
      }
      this.path = null;
    }
    this.setLanguage(name);
    this.cm.setValue(this.scratch(name));
    this.cm.clearHistory();
    this.setDirty(false);
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
        // Not a program we can run (data.csv, notes.md): shown as plain text, not as Python.
        this.setLanguage(PLAIN_TEXT);
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
      const ext = (LANGUAGES[this.language] || LANGUAGES.python).ext[0];
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
