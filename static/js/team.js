// Team page: members and roles, invitations, API keys (secret shown once, copy, revoke).
import { api, apiAll, copyText, date, dateTime, h, pageData, showError, toast } from "./api.js";

const canManage = pageData("can-manage");
const $ = (id) => document.getElementById(id);
const ROLES = ["owner", "admin", "member"];

async function loadMembers() {
  try {
    const members = await apiAll("members");
    $("members").replaceChildren(
      ...members.map((m) =>
        h(
          "tr",
          { dataset: { member: m.id } },
          h("td", {}, m.email),
          h(
            "td",
            {},
            canManage
              ? h(
                  "select",
                  { "aria-label": `Role of ${m.email}`, onchange: (ev) => changeRole(m, ev.target) },
                  ...ROLES.map((r) => h("option", { value: r, selected: r === m.role }, r)),
                )
              : m.role,
          ),
          h("td.hide-sm", {}, date(m.created_at)),
          h("td.actions", {}, canManage ? h("button.small.danger", { type: "button", onclick: () => removeMember(m) }, "Remove") : null),
        ),
      ),
    );
  } catch (err) {
    showError($("members-error"), err);
  }
}

async function changeRole(m, select) {
  try {
    await api(`members/${m.id}`, { method: "PATCH", body: { role: select.value } });
    toast(`${m.email} is now ${select.value}`);
  } catch (err) {
    toast(err, { error: true });
    select.value = m.role;
  }
}

async function removeMember(m) {
  if (!confirm(`Remove ${m.email} from the organization?`)) return;
  try {
    await api(`members/${m.id}`, { method: "DELETE" });
    loadMembers();
  } catch (err) {
    toast(err, { error: true });
  }
}

function invitationStatus(inv) {
  if (inv.accepted_at) return h("span.pill.ok", {}, "accepted");
  if (inv.revoked_at) return h("span.pill", {}, "cancelled");
  if (inv.expires_at && Date.parse(inv.expires_at) < Date.now()) return h("span.pill", {}, "expired");
  return h("span.pill.warn", {}, "pending");
}

function invitationActions(inv) {
  if (inv.accepted_at || inv.revoked_at) return null;
  return [
    h("button.small", { type: "button", onclick: () => resendInvitation(inv), "aria-label": `Resend invitation to ${inv.email}` }, "Resend"),
    " ",
    h("button.small.danger", { type: "button", onclick: () => cancelInvitation(inv), "aria-label": `Cancel invitation to ${inv.email}` }, "Cancel"),
  ];
}

async function loadInvitations() {
  const invitations = await apiAll("invitations");
  $("invitations").replaceChildren(
    ...(invitations.length
      ? invitations.map((i) =>
          h(
            "tr",
            { dataset: { invitation: i.id } },
            h("td", {}, i.email),
            h("td", {}, i.role),
            h("td", {}, invitationStatus(i)),
            h("td.hide-sm", {}, dateTime(i.expires_at)),
            h("td.actions", {}, invitationActions(i)),
          ),
        )
      : [h("tr", {}, h("td.empty", { colspan: 5 }, "No invitations yet."))]),
  );
}

function invitationSent(inv, verb) {
  const copy = h("button.small", { type: "button", onclick: async () => toast((await copyText(inv.url)) ? "Link copied" : "Copy failed") }, "Copy link");
  return inv.emailed
    ? h("div.alert.info", { role: "status" }, `Invitation ${verb} to ${inv.email}. They can also use this link: `, h("code", {}, inv.url), " ", copy)
    : h("div.alert.warn", { role: "status" }, `The mail to ${inv.email} could not be sent; share this link with them instead: `, h("code", {}, inv.url), " ", copy);
}

async function resendInvitation(inv) {
  try {
    const sent = await api(`invitations/${inv.id}/resend`, { method: "POST" });
    $("invite-result").replaceChildren(invitationSent(sent, "sent again"));
    loadInvitations();
  } catch (err) {
    toast(err, { error: true });
  }
}

async function cancelInvitation(inv) {
  if (!confirm(`Cancel the invitation to ${inv.email}? Its link stops working.`)) return;
  try {
    await api(`invitations/${inv.id}`, { method: "DELETE" });
    toast(`Invitation to ${inv.email} cancelled`);
    $("invite-result").replaceChildren();
    loadInvitations();
  } catch (err) {
    toast(err, { error: true });
  }
}

function keyStatus(k) {
  if (k.revoked) return h("span.pill", {}, "revoked");
  if (k.expires_at && Date.parse(k.expires_at) < Date.now()) return h("span.pill.bad", {}, "expired");
  return h("span.pill.ok", {}, "active");
}

async function loadKeys() {
  const keys = await apiAll("api-keys");
  $("api-keys").replaceChildren(
    ...(keys.length
      ? keys.map((k) =>
          h(
            "tr",
            { dataset: { key: k.id } },
            h("td", {}, k.name),
            h("td", {}, h("code", {}, `${k.prefix}…`)),
            h("td.hide-sm", { title: k.created_by ? `by ${k.created_by}` : "" }, date(k.created_at)),
            h("td", {}, k.last_used_at ? dateTime(k.last_used_at) : h("span.muted", {}, "never")),
            h("td", {}, keyStatus(k)),
            h("td.actions", {}, k.revoked ? null : h("button.small.danger", { type: "button", onclick: () => revokeKey(k), "aria-label": `Revoke ${k.name}` }, "Revoke")),
          ),
        )
      : [h("tr", {}, h("td.empty", { colspan: 6 }, "No API keys yet."))]),
  );
}

// The key whose secret the creation box shows: the secret leaves the screen when that key is
// revoked (or the box is dismissed), and is never fetched again.
let shownSecretKeyId = null;

function forgetSecret() {
  shownSecretKeyId = null;
  $("key-result").replaceChildren();
}

async function revokeKey(k) {
  if (!confirm(`Revoke "${k.name}"? Programs using it stop working at once.`)) return;
  try {
    await api(`api-keys/${k.id}`, { method: "DELETE" });
    if (shownSecretKeyId === k.id) forgetSecret();
    toast(`Revoked ${k.name}`);
    loadKeys();
  } catch (err) {
    toast(err, { error: true });
  }
}

if (canManage) {
  $("invite-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const form = ev.target;
    const out = $("invite-result");
    out.replaceChildren();
    try {
      const inv = await api("invitations", { method: "POST", body: { email: form.email.value, role: form.role.value } });
      out.replaceChildren(invitationSent(inv, "emailed"));
      form.reset();
      loadInvitations();
    } catch (err) {
      showError(out, err);
    }
  });

  $("key-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const form = ev.target;
    const out = $("key-result");
    forgetSecret();
    const body = { name: form.name.value };
    if (form.expires_at.value) body.expires_at = new Date(`${form.expires_at.value}T23:59:59`).toISOString();
    try {
      const key = await api("api-keys", { method: "POST", body });
      const copy = h("button.small", { type: "button", id: "copy-secret" }, "Copy");
      copy.addEventListener("click", async () => {
        copy.textContent = (await copyText(key.secret)) ? "Copied ✓" : "Copy failed";
      });
      out.replaceChildren(
        h(
          "div.alert.info",
          { role: "status" },
          h("strong", {}, `Key "${key.name}" created.`),
          " Copy the secret now — it will not be shown again.",
          h("div.secret-box", {}, h("code", { id: "new-secret" }, key.secret), copy),
          h("button.small", { type: "button", onclick: forgetSecret }, "Done, I saved it"),
        ),
      );
      shownSecretKeyId = key.id;
      copy.focus();
      form.reset();
      loadKeys();
    } catch (err) {
      showError(out, err);
    }
  });

  Promise.all([loadInvitations(), loadKeys()]).catch((err) => showError($("key-result"), err));
}
const networkToggle = $("network-toggle");
if (networkToggle) {
  networkToggle.addEventListener("change", async () => {
    const wanted = networkToggle.checked;
    try {
      const org = await api("organization", { method: "PATCH", body: { allow_network: wanted } });
      networkToggle.checked = org.allow_network;
      toast(org.allow_network ? "Outbound network allowed for new sandboxes." : "Outbound network turned off for new sandboxes.");
    } catch (err) {
      networkToggle.checked = !wanted;
      showError($("network-result"), err);
    }
  });
}
const runtimeSelect = $("runtime-select");
if (runtimeSelect) {
  let saved = runtimeSelect.value;
  runtimeSelect.addEventListener("change", async () => {
    try {
      const org = await api("organization", { method: "PATCH", body: { docker_runtime: runtimeSelect.value } });
      saved = org.docker_runtime;
      runtimeSelect.value = saved;
      $("runtime-result").replaceChildren();
      toast(
        saved === "runsc"
          ? "New docker sandboxes run under gVisor."
          : saved === "runc"
            ? "New docker sandboxes run as plain containers."
            : "New docker sandboxes follow the installation's default.",
      );
    } catch (err) {
      runtimeSelect.value = saved;
      showError($("runtime-result"), err);
    }
  });
}
loadMembers();
