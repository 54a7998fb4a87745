// Billing page: plan, this period's usage (daily chart, quota bar, per key), the upcoming
// invoice and past invoices.
import { api, apiAll, date, h, money, num, pageData, showError, toast } from "./api.js";
import { barChart } from "./chart.js";

const $ = (id) => document.getElementById(id);
const canManage = pageData("can-manage");

function lineRows(lines) {
  return lines.map((l) => h("tr", {}, h("td", {}, l.description), h("td", {}, num(l.quantity)), h("td", {}, money(l.amount_cents))));
}

async function loadUsage() {
  const u = await api("usage");
  $("plan").textContent = u.plan;
  $("executions").textContent = num(u.executions);
  $("period").textContent = `${date(u.period_start)} – ${date(new Date(Date.parse(u.period_end) - 86400000).toISOString())}`;
  $("amount").textContent = money(u.amount_so_far_cents);
  $("cap").textContent = u.spending_cap_cents != null ? `Spending cap ${money(u.spending_cap_cents)}` : "No spending cap";
  $("projected").textContent = money(u.projected_cents);
  $("projected-exec").textContent = `≈ ${num(u.projected_executions)} executions`;
  const used = u.included_executions ? u.executions / u.included_executions : 0;
  const quota = $("quota");
  quota.className = `quota${used >= 1 ? " over" : used >= 0.8 ? " warn" : ""}`;
  quota.firstElementChild.style.width = used > 0 ? `max(3px, ${Math.min(100, used * 100).toFixed(1)}%)` : "0";
  quota.setAttribute("aria-valuenow", Math.round(used * 100));
  $("quota-text").textContent = `${num(u.executions)} of ${num(u.included_executions)} included executions used (${num(u.remaining_included_executions)} left)${
    u.plan === "free" && used >= 1 ? " — the free allowance is used up; upgrade to keep running code." : ""
  }.`;
  const points = u.by_day.map((d) => ({ label: String(new Date(`${d.day}T00:00:00Z`).getUTCDate()), value: d.executions, title: `${d.day}: ${d.executions} executions` }));
  $("daily-chart").replaceChildren(points.length ? barChart(points, { label: "Executions per day", unit: "executions" }) : h("p.empty", {}, "No usage yet."));
  $("by-key").replaceChildren(
    ...(u.by_key.length
      ? u.by_key.map((k) => h("tr", {}, h("td", {}, k.name), h("td", {}, num(k.executions))))
      : [h("tr", {}, h("td.empty", { colspan: 2 }, "No usage yet this period."))]),
  );
  return u;
}

async function loadPlan() {
  const p = await api("billing/plan");
  $("plan-note").textContent = p.scheduled_plan ? `Changes to ${p.scheduled_plan} on ${date(p.scheduled_at)}` : "";
  if (!canManage) return;
  const other = p.plan === "free" ? "premium" : "free";
  const target = p.scheduled_plan && p.scheduled_plan !== p.plan ? p.plan : other;
  const label = p.scheduled_plan && p.scheduled_plan !== p.plan ? `Keep ${p.plan}` : other === "premium" ? "Upgrade to premium" : "Downgrade to free";
  $("plan-actions").replaceChildren(
    h("button", { type: "button", class: other === "premium" ? "primary" : "", onclick: () => changePlan(target) }, label),
  );
}

async function changePlan(plan) {
  if (!confirm(`Switch this organization to the ${plan} plan?`)) return;
  try {
    await api("billing/plan", { method: "POST", body: { plan } });
    toast(`Plan change to ${plan} requested`);
    await Promise.all([loadPlan(), loadUsage(), loadUpcoming()]);
  } catch (err) {
    toast(err, { error: true });
  }
}

async function loadUpcoming() {
  const up = await api("invoices/upcoming");
  const table = (lines, total) =>
    h(
      "table",
      {},
      h("thead", {}, h("tr", {}, h("th", {}, "Item"), h("th", {}, "Quantity"), h("th", {}, "Amount"))),
      h("tbody", {}, ...(lines.length ? lineRows(lines) : [h("tr", {}, h("td.muted", { colspan: 3 }, "Nothing billable."))])),
      h("tfoot", {}, h("tr", {}, h("th", { colspan: 2 }, "Total"), h("th", {}, money(total)))),
    );
  $("upcoming").replaceChildren(
    h("p.small.muted", {}, `${date(up.period_start)} – ${date(new Date(Date.parse(up.period_end) - 86400000).toISOString())} · ${up.plan} plan · ${num(up.executions)} executions so far`),
    h("div.row", { style: "align-items:flex-start" },
      h("div.grow", {}, h("h3.small", {}, "So far"), table(up.lines, up.total_cents)),
      h("div.grow", {}, h("h3.small", {}, `Projected (${num(up.projected.executions)} executions)`), table(up.projected.lines, up.projected.total_cents)),
    ),
  );
}

async function loadInvoices() {
  const invoices = await apiAll("invoices");
  $("invoices").replaceChildren(
    ...(invoices.length
      ? invoices.map((i) =>
          h(
            "tr",
            {},
            h("td", {}, `${i.period_start.slice(0, 7)}`),
            h("td", {}, i.plan),
            h("td", {}, num(i.executions)),
            h("td", {}, money(i.total_cents, i.currency)),
            h("td", {}, h(`span.pill${i.status === "paid" ? ".ok" : i.status === "open" ? ".warn" : ""}`, {}, i.status)),
          ),
        )
      : [h("tr", {}, h("td.empty", { colspan: 5 }, "No invoices yet. The first is issued when this period closes."))]),
  );
}

async function loadAll() {
  const results = await Promise.allSettled([loadUsage(), loadPlan(), loadUpcoming(), loadInvoices()]);
  const failed = results.find((r) => r.status === "rejected");
  if (failed) showError($("billing-error"), failed.reason);
  else $("billing-error").replaceChildren();
}

loadAll();
setInterval(() => {
  if (!document.hidden) loadUsage().catch(() => {});
}, 30000);
