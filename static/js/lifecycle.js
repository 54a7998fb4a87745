// Pause, resume and fork on the playground page. A paused (or archived) sandbox keeps its
// page: the Resume button replaces Pause, and the controls that would run something in it
// are off until it runs again (the API answers 409 sandbox_paused to them meanwhile).
import { api, toast } from "./api.js";

const HELD = ["paused", "archived"];

export class Lifecycle {
  constructor({ sandboxId, pauseButton, resumeButton, forkButton, onState }) {
    this.sandboxId = sandboxId;
    this.pauseButton = pauseButton;
    this.resumeButton = resumeButton;
    this.forkButton = forkButton;
    this.onState = onState;
    pauseButton.addEventListener("click", () => this.act("pause"));
    resumeButton.addEventListener("click", () => this.act("resume"));
    forkButton.addEventListener("click", () => this.fork());
  }

  /** Show the buttons that fit `state`; controls marked needs-live follow it too. */
  render(state) {
    const held = HELD.includes(state);
    const ended = ["stopped", "destroyed", "error"].includes(state);
    this.pauseButton.hidden = held || ended;
    this.resumeButton.hidden = !held;
    this.resumeButton.textContent = state === "archived" ? "Resume (restart)" : "Resume";
    this.resumeButton.title = state === "archived" ? "Start it again from its archived files (its processes are not kept)" : "Thaw its processes";
    this.forkButton.disabled = ended;
    if (ended) return;
    for (const b of document.querySelectorAll(".needs-live")) {
      if (b.id !== "destroy") b.disabled = held;
    }
  }

  async act(action) {
    const button = action === "pause" ? this.pauseButton : this.resumeButton;
    button.disabled = true;
    try {
      const sb = await api(`sandboxes/${this.sandboxId}/${action}`, { method: "POST", body: {} });
      this.onState(sb.state);
      toast(action === "pause" ? "Paused: processes frozen, memory kept." : "Running again.");
    } catch (err) {
      toast(err, { error: true });
    } finally {
      button.disabled = false;
    }
  }

  async fork() {
    this.forkButton.disabled = true;
    try {
      const sb = await api(`sandboxes/${this.sandboxId}/fork`, { method: "POST", body: {} });
      toast(`Forked into ${sb.id}.`);
      window.location.assign(`/sandboxes/${sb.id}/`);
    } catch (err) {
      toast(err, { error: true });
      this.forkButton.disabled = false;
    }
  }
}
