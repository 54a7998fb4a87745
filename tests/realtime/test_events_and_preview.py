"""The events socket (file watchers, port and status signals) and the port preview proxy."""

from __future__ import annotations

import json

import httpx
import pytest

from .conftest import TerminalOutput, open_terminal, recv_json

pytestmark = pytest.mark.django_db(transaction=True)


def test_file_watcher_port_signals_and_preview(server, rt_api_a, key_a, sbx_a):  # type: ignore[no-untyped-def]
    events = server.ws(f"/ws/sandboxes/{sbx_a}/events", key=key_a)
    ready = recv_json(events, "ready")
    assert {"status", "ports", "files"} <= set(ready["signals"])
    events.send(
        json.dumps(
            {"type": "watch", "id": "explorer", "path": ".", "ignore": ["*.tmp"], "debounce_ms": 50}
        )
    )
    assert recv_json(events, "watching")["id"] == "explorer"

    term = TerminalOutput(server.ws(open_terminal(rt_api_a, sbx_a)["ws_path"], key=key_a))
    term.read_until(r"\$ ")
    term.send("mkdir -p docs && echo hi > docs/made.txt && touch skip.tmp\r")
    seen: dict[str, str] = {}
    while "docs/made.txt" not in seen:
        for event in recv_json(events, "files")["events"]:
            seen[event["path"]] = event["type"]
    assert seen["docs"] == "created" and seen["docs/made.txt"] == "created"
    assert "skip.tmp" not in seen

    term.send("python3 -m http.server 8000 >/dev/null 2>&1 &\r")
    opened = recv_json(events, "port_open", timeout=15)
    assert opened["port"] == 8000 and opened["url"] == f"/sandboxes/{sbx_a}/ports/8000/"
    listed = rt_api_a.get(f"/api/v1/sandboxes/{sbx_a}/ports").json()["results"]
    assert [p["port"] for p in listed] == [8000]

    # The preview, through daphne and the provider's port stream, with the API key...
    page = rt_api_a.get(opened["url"])
    assert page.status_code == 200, page.text
    assert "Directory listing for /" in page.text and "docs/" in page.text
    assert "sandbox" in page.headers["content-security-policy"]
    # ...the app's absolute redirects stay under the preview prefix...
    moved = rt_api_a.get(opened["url"] + "docs", follow_redirects=False)
    assert moved.status_code == 301 and moved.headers["location"] == opened["url"] + "docs/"
    # ...with ?token= (which becomes a cookie for this path, so subresources work)...
    token = rt_api_a.post(f"/api/v1/sandboxes/{sbx_a}/tokens", json={"scopes": ["ports"]}).json()[
        "token"
    ]
    browser = httpx.Client(base_url=server.http, timeout=10)
    first = browser.get(f"{opened['url']}?token={token}")
    assert first.status_code == 200 and "Directory listing" in first.text
    assert f"Path={opened['url']}" in first.headers["set-cookie"]
    assert "HttpOnly" in first.headers["set-cookie"]
    # (Secure + SameSite=None on loopback, as browsers allow; httpx would not send it back.)
    cookie = first.headers["set-cookie"].split(";")[0]
    sub = httpx.get(server.http + opened["url"] + "docs/made.txt", headers={"Cookie": cookie})
    assert sub.status_code == 200 and sub.text == "hi\n"
    # ...and nothing without credentials, or with a token that lacks the scope.
    assert httpx.get(server.http + opened["url"]).status_code == 401
    terminal_token = rt_api_a.post(
        f"/api/v1/sandboxes/{sbx_a}/tokens", json={"scopes": ["terminal"]}
    ).json()["token"]
    assert httpx.get(f"{server.http}{opened['url']}?token={terminal_token}").status_code == 403
    assert rt_api_a.get(f"/sandboxes/{sbx_a}/ports/8001/").status_code == 502

    term.send("kill %1\r")
    closed = recv_json(events, "port_closed", timeout=15)
    assert closed["port"] == 8000
    events.close()


def test_destroying_the_sandbox_is_signalled_and_ends_terminals(server, rt_api_a, key_a, sbx_a):  # type: ignore[no-untyped-def]
    events = server.ws(f"/ws/sandboxes/{sbx_a}/events", key=key_a)
    recv_json(events, "ready")
    term = TerminalOutput(server.ws(open_terminal(rt_api_a, sbx_a)["ws_path"], key=key_a))
    term.read_until(r"\$ ")
    assert rt_api_a.delete(f"/api/v1/sandboxes/{sbx_a}").status_code == 200
    assert recv_json(events, "status")["state"] in ("destroyed", "gone")
    assert term.wait_control("exit")["type"] == "exit"
