// Staff dashboard: the executions-per-hour chart and in-place kill buttons (the forms also
// work without JavaScript).
import { api, h, money, pageData, showError, toast } from "./api.js";
import { barChart } from "./chart.js";

const data = pageData("staff-data");
const points = data.hours.map((b) => {
  const d = new Date(b.hour);
  return { label: `${String(d.getUTCHours()).padStart(2, "0")}h`, value: b.executions, title: `${d.toISOString().slice(0, 13)}:00 UTC: ${b.executions} executions` };
});
document.getElementById("hours-chart").replaceChildren(barChart(points, { label: "Executions per hour", unit: "executions", height: 160 }));

for (const cell of document.querySelectorAll("td.cents")) cell.textContent = money(Number(cell.dataset.cents));

for (const form of document.querySelectorAll(".kill-form")) {
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const row = form.closest("tr");
    if (!confirm(`Kill ${row.dataset.id}? The owner's work in it is lost.`)) return;
    const button = form.querySelector("button");
    button.disabled = true;
    try {
      const res = await api(form.getAttribute("action"), { method: "POST" });
      row.querySelector(".pill").className = "pill destroyed";
      row.querySelector(".pill").textContent = "destroyed";
      form.replaceWith(h("span.muted.small", {}, res.destroyed ? "killed" : "already gone"));
      const count = document.getElementById("live-count");
      count.textContent = Math.max(0, Number(count.textContent) - (res.destroyed ? 1 : 0));
      toast(`${row.dataset.id} ${res.destroyed ? "killed" : "was already destroyed"}`);
    } catch (err) {
      button.disabled = false;
      showError(document.getElementById("kill-error"), err);
    }
  });
}
