"""Port previews: a server inside a sandbox, proxied on its own host or under a path.

The package: addresses.py (how a request names a preview), headers.py (what is forwarded
each way), access.py (auth, the exemption, opening the metered port), http_proxy.py,
websocket_proxy.py, router.py (previews or Django). This module imports nothing, so
addresses.py can be imported alone (the events socket builds port URLs from it).

Two forms. The host form, `<port>-<sandbox id>.<SANDPIT_PREVIEW_DOMAIN>` (and the same under
SANDPIT_E2B_DOMAIN, which is E2B's `get_host(port)`), gives each preview its own origin: a
page's absolute URLs (`<script src="/app.js">`) stay in the preview, and the browser keeps its
cookies and storage apart from Sandpit's. The path form, /sandboxes/<id>/ports/<port>/... on
Sandpit's own origin (SANDPIT_PREVIEW_PATHS), is kept for deployments without a wildcard
domain. What follows describes the path form; the host form differs where noted under "Host
form" below.

HTTP and WebSocket are relayed over provider.connect_port (works without sandbox network),
bodies streamed both ways. The prefix is stripped before forwarding (the app sees "/..."),
Location and Set-Cookie paths are rewritten back under it, hop-by-hop headers and Sandpit's
own credentials are never forwarded.

Auth, in order: ?token=<sandbox token with the 'ports' scope> (then remembered in an
HttpOnly SameSite=Lax cookie scoped to this preview's path), `Authorization: Bearer` API
key or token, that cookie, or the browser session of an organization member (checked on
every request, so logging out or leaving the organization ends access at once). A request
authenticated by a cookie (the preview cookie or the session) with an unsafe method must
come from Sandpit's own origin (Sec-Fetch-Site, else Origin): another site, or another
origin on the same site, cannot make the viewer's browser act on a preview.

Feature 'ports' (Premium); one execution per request and per WebSocket. The one exemption:
subresources (scripts, styles, images...) loaded same-origin by a member's browser session,
as told by Sec-Fetch-Dest/Sec-Fetch-Site, which only the browser sets. Requests with an API
key or token always count, whatever headers they carry.

Previews are served from Sandpit's own origin, so by default every proxied response carries
`Content-Security-Policy: sandbox ...` without allow-same-origin: the sandbox's pages run in
an opaque origin and cannot call Sandpit's API with the viewer's session. Deployments that
serve previews from a separate origin can turn that off (SANDPIT_PREVIEW_CSP_SANDBOX=False).
Headers whose effect reaches beyond the one response (ORIGIN_WIDE_HEADERS, and upstream
cookies named like Sandpit's own) are dropped, and every response is `Cache-Control: private`.

Host form: the preview host never receives Sandpit's session cookie (host-only on Sandpit's
own host), and the browser session is not accepted there even if a shared cookie domain sent
it. The first visit carries `?token=` (a sandbox token with the 'ports' scope): a GET or HEAD
with it is answered by a redirect to the same URL without the token, setting the preview
cookie host-only (no Domain), Path=/, HttpOnly, SameSite=Lax; later requests authenticate by
that cookie (or an Authorization header), re-checked on every request. No prefix is added to
Location or Set-Cookie; an upstream cookie's Domain is still dropped (host-only), so one
preview cannot set cookies for its sibling previews. No CSP sandbox: the page is already
cross-origin to Sandpit (it cannot read Sandpit's cookies, storage or API responses), and an
opaque origin would break the very things the host form is for (its own cookies, storage and
same-origin module scripts). Unsafe methods by cookie must come from the preview's own origin;
a WebSocket's Origin must be the preview's own origin (playground/asgi.py).
"""
