// Where the plan blocks a feature: owners and admins get an upgrade button (with the price),
// members are told whom to ask. Never an API instruction.
import { api, h, toast } from "./api.js";

/** Ask, with the price, and upgrade. Resolves true when the plan changed. */
export async function confirmUpgrade(offer) {
  const question =
    `Upgrade this organization to Premium for ${offer.premium_price} a month?\n\n` +
    `It includes ${Number(offer.premium_included).toLocaleString("en-US")} executions a month, then ` +
    `${offer.overage_per_100k} per 100,000 more, plus terminals, live file updates, port previews ` +
    `and sandbox tokens. It starts now and this month is billed in full.`;
  if (!confirm(question)) return false;
  try {
    await api("billing/plan", { method: "POST", body: { plan: "premium" } });
    toast("Upgraded to Premium");
    return true;
  } catch (err) {
    toast(err, { error: true });
    return false;
  }
}

/** A notice saying `what` needs Premium, with the action that fits the viewer's role. */
export function planNotice(offer, what, { onUpgraded = () => location.reload() } = {}) {
  const parts = [h("span", {}, `${what} need${what.endsWith("s") ? "" : "s"} the Premium plan. `)];
  if (offer && offer.can_upgrade) {
    parts.push(
      h(
        "button.small.primary",
        {
          type: "button",
          class: "upgrade-btn",
          onclick: async () => {
            if (await confirmUpgrade(offer)) onUpgraded();
          },
        },
        `Upgrade to Premium (${offer.premium_price}/month)`,
      ),
    );
  } else {
    const managers = (offer && offer.managers) || [];
    parts.push(
      h(
        "span.ask-owner",
        {},
        managers.length
          ? `Ask an owner or admin to upgrade: ${managers.slice(0, 3).join(", ")}${managers.length > 3 ? " …" : ""}.`
          : "Ask an owner of this organization to upgrade.",
      ),
    );
  }
  return h("div.alert.warn.small.plan-notice", { role: "status" }, ...parts);
}
