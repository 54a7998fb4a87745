// Billing page: plan, this period's usage (daily chart, quota bar, per key), the upcoming
// invoice and past invoices.
import { api, apiAll, date, h, money, num, pageData, showError, toast } from "./api.js";
import { barChart } from "./chart.js";
import { confirmUpgrade } from "./plan.js";

const $ = (id) => document.getElementById(id);
const canManage = pageData("can-manage");
const offer = pageData("plan-offer");

/** "1 execution", "2 executions", "1,000 executions". */
export function executions(n) {
  return `${num(n)} ${n === 1 ? "execution" : "executions"}`;
}

const shortDay = (iso) => new Date(`${iso}T00:00:00Z`).toLocaleDateString("en-US", { month: "short", day: "numeric", timeZone: "UTC" });

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
  if (u.projection_available === false) {
    $("projected").textContent = "—";
    $("projected-exec").textContent = u.projection_note;
  } else {
    $("projected").textContent = money(u.projected_cents);
    $("projected-exec").textContent = `≈ ${executions(u.projected_executions)}`;
  }
  const used = u.included_executions ? u.executions / u.included_executions : 0;
  const quota = $("quota");
  quota.className = `quota${used >= 1 ? " over" : used >= 0.8 ? " warn" : ""}`;
  quota.firstElementChild.style.width = used > 0 ? `max(3px, ${Math.min(100, used * 100).toFixed(1)}%)` : "0";
  quota.setAttribute("aria-valuenow", Math.round(used * 100));
  $("quota-text").textContent = `${num(u.executions)} of ${executions(u.included_executions).replace("execution", "included execution")} used (${num(u.remaining_included_executions)} left)${
    u.plan === "free" && used >= 1 ? " — the free allowance is used up; upgrade to keep running code." : ""
  }.`;
  const points = u.by_day.map((d) => ({ label: shortDay(d.day), value: d.executions, title: `${shortDay(d.day)}: ${executions(d.executions)}` }));
  $("daily-chart").replaceChildren(points.length ? barChart(points, { label: "Executions per day (UTC)", unit: (n) => (n === 1 ? "execution" : "executions") }) : h("p.empty", {}, "No usage yet."));
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
  const label = p.scheduled_plan && p.scheduled_plan !== p.plan ? `Keep ${p.plan}` : other === "premium" ? `Upgrade to Premium (${offer.premium_price}/month)` : "Downgrade to Free";
  $("plan-actions").replaceChildren(
    h("button", { type: "button", class: other === "premium" ? "primary" : "", onclick: () => changePlan(target, p.plan) }, label),
  );
}

async function changePlan(plan, current) {
  if (plan === "premium" && current !== "premium") {
    if (!(await confirmUpgrade(offer))) return;
  } else {
    const question =
      plan === "free"
        ? "Move this organization to the Free plan at the start of next month? This month stays Premium and is billed as such; then terminals, live file updates, port previews and sandbox tokens stop."
        : `Keep the ${plan} plan and cancel the scheduled change?`;
    if (!confirm(question)) return;
    try {
      await api("billing/plan", { method: "POST", body: { plan } });
      toast(`Plan change to ${plan} requested`);
    } catch (err) {
      toast(err, { error: true });
      return;
    }
  }
  await Promise.all([loadPlan(), loadUsage(), loadUpcoming()]);
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
    h("p.small.muted", {}, `${date(up.period_start)} – ${date(new Date(Date.parse(up.period_end) - 86400000).toISOString())} · ${up.plan} plan · ${executions(up.executions)} so far`),
    h("div.row", { style: "align-items:flex-start" },
      h("div.grow", {}, h("h3.small", {}, "So far"), table(up.lines, up.total_cents)),
      up.projected.available === false
        ? h("div.grow", {}, h("h3.small", {}, "Projected"), h("p.small.muted", {}, up.projected.note))
        : h("div.grow", {}, h("h3.small", {}, `Projected (${executions(up.projected.executions)})`), table(up.projected.lines, up.projected.total_cents)),
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
