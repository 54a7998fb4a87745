// Run the editor's code in the sandbox and show its output as it arrives.
// Streams over the exec WebSocket when the server offers one; otherwise POSTs /code and shows
// the result when it finishes. Stop closes the stream (the server kills the process) or
// abandons the request.
import { api, h, wsUrl } from "./api.js";

export class Runner {
  constructor({ sandboxId, editor, output, runButton, stopButton, stdin, clearButton, streamPath }) {
    Object.assign(this, { sandboxId, editor, output, runButton, stopButton, stdin, streamPath });
    runButton.addEventListener("click", () => this.run());
    stopButton.addEventListener("click", () => this.stop());
    clearButton.addEventListener("click", () => this.output.replaceChildren());
    editor.onRun = () => this.run();
    this.setRunning(false);
  }

  setRunning(running) {
    this.running = running;
    this.runButton.disabled = running;
    this.stopButton.disabled = !running;
    this.output.setAttribute("aria-busy", running ? "true" : "false");
  }

  append(text, cls) {
    if (!text) return;
    if (cls === "stderr") this.stderrText = (this.stderrText || "") + text;
    const last = this.output.lastChild;
    if (last && last.nodeType === 1 && last.className === (cls || "stdout")) last.append(text);
    else this.output.append(h(`span.${cls || "stdout"}`, {}, text));
    this.output.parentElement.scrollTop = this.output.parentElement.scrollHeight;
  }

  meta(text, isError = false) {
    this.output.append(h(`span.meta${isError ? ".stderr" : ""}`, {}, text));
    this.output.parentElement.scrollTop = this.output.parentElement.scrollHeight;
  }

  async run() {
    if (this.running) return;
    const code = this.editor.value();
    const language = this.editor.language;
    const stdin = this.stdin.value;
    this.output.replaceChildren();
    if (language === "text") {
      this.meta(`${this.editor.path || "This file"} is not a program. Pick a language in the language menu to run code.`, true);
      return;
    }
    this.stderrText = "";
    this.meta(`$ run ${language}${this.editor.path ? ` (${this.editor.path})` : ""}`);
    this.setRunning(true);
    this.started = performance.now();
    try {
      if (this.streamPath) await this.runStreaming({ code, language, stdin });
      else await this.runOnce({ code, language, stdin });
    } finally {
      this.setRunning(false);
    }
  }

  async runOnce({ code, language, stdin }) {
    this.abort = new AbortController();
    try {
      const res = await api(`sandboxes/${this.sandboxId}/code`, {
        method: "POST",
        body: { code, language, stdin: stdin || undefined },
        signal: this.abort.signal,
      });
      this.append(res.stdout, "stdout");
      this.append(res.stderr, "stderr");
      this.finish(res.exit_code, res.duration_ms, { timedOut: res.timed_out, truncated: res.truncated });
    } catch (err) {
      if (err.name === "AbortError") this.meta("Stopped (the request was abandoned).", true);
      else this.meta(`Error: ${err.message}${err.code ? ` [${err.code}]` : ""}`, true);
    }
  }

  runStreaming({ code, language, stdin }) {
    // Protocol (sandboxes/consumers.py ExecConsumer): → {"type":"run",id,code,language};
    // ← started / stdout / stderr / exit / error, each with the run id; → stdin (+eof), cancel.
    return new Promise((resolve) => {
      const ws = new WebSocket(wsUrl(this.streamPath));
      const id = `r${Date.now().toString(36)}`;
      this.ws = ws;
      this.runId = id;
      let done = false;
      const end = () => {
        if (!done) {
          done = true;
          resolve();
        }
      };
      ws.onopen = () => ws.send(JSON.stringify({ type: "run", id, code, language }));
      ws.onmessage = (ev) => {
        if (typeof ev.data !== "string") return;
        let msg;
        try {
          msg = JSON.parse(ev.data);
        } catch {
          return;
        }
        if (msg.id && msg.id !== id) return;
        if (msg.type === "started") {
          // Always close stdin so a program reading it does not wait forever.
          ws.send(JSON.stringify({ type: "stdin", id, data: stdin || "", eof: true }));
        } else if (msg.type === "stdout" || msg.type === "stderr") this.append(msg.data, msg.type);
        else if (msg.type === "exit") {
          if (msg.cancelled) this.meta("Stopped.", true);
          this.finish(msg.code, msg.duration_ms, { timedOut: msg.timed_out });
          ws.close();
          end();
        } else if (msg.type === "error") {
          this.meta(`Error: ${msg.message || msg.code}${msg.code ? ` [${msg.code}]` : ""}`, true);
          if (!msg.id || msg.id === id) {
            ws.close();
            end();
          }
        }
      };
      ws.onclose = (ev) => {
        if (!done) {
          const why = { 4401: "not signed in", 4402: "payment required", 4403: "not allowed", 4404: "sandbox not found" }[ev.code];
          this.meta(`Connection closed (${why || ev.code}${ev.reason ? `: ${ev.reason}` : ""}).`, true);
        }
        end();
      };
    });
  }

  finish(exitCode, durationMs, { timedOut = false, truncated = false } = {}) {
    const ms = durationMs ?? Math.round(performance.now() - this.started);
    const bits = [`exit ${exitCode}`, `${Math.round(ms)} ms`];
    if (timedOut) bits.push("timed out");
    if (truncated) bits.push("output truncated");
    this.meta(`— ${bits.join(" · ")}`, exitCode !== 0);
    if (exitCode !== 0 && !this.stdin.value && /\bEOFError\b/.test(this.stderrText || "")) this.hintStdin();
  }

  /** The program read input that was not there: say where input goes. */
  hintStdin() {
    const focus = h("button.small", { type: "button", onclick: () => this.stdin.focus() }, "Type input");
    this.output.append(
      h(
        "div.alert.info.small.run-hint",
        { role: "status" },
        "The program asked for input (input() or a read from stdin), but the stdin box below was empty, so it got end-of-file. Type the input there, one line per input() call, and run again; for a back-and-forth program, run it in a terminal instead. ",
        focus,
      ),
    );
  }

  stop() {
    if (!this.running) return;
    if (this.ws && this.ws.readyState === WebSocket.OPEN) {
      // The server kills the process and answers with an exit message marked cancelled.
      this.ws.send(JSON.stringify({ type: "cancel", id: this.runId }));
    }
    if (this.abort) this.abort.abort();
  }
}
