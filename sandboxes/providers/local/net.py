"""Outbound network for a jail without the host's network: slirp4netns and a firewall.

A networked jail still has a network namespace of its own (sharing the host's
would put Postgres, Redis and Sandpit itself on the sandbox's 127.0.0.1).
slirp4netns, started on the host once the jail exists, gives that namespace a
``tap0`` device and a default route to 10.0.2.2 and relays its traffic
through ordinary sockets opened on the host, in user space; 10.0.2.3 forwards
DNS to the host's resolver (the jail's /etc/resolv.conf points at it).

Because slirp connects *from* the host, two leaks need closing:

- ``--disable-host-loopback`` stops the gateway 10.0.2.2 from mapping to the
  host's 127.0.0.1;
- everything else the host can reach privately (its own addresses, where
  services bound to 0.0.0.0 answer, and the private, link-local and
  carrier-grade NAT ranges, home of cloud metadata services) is rejected by
  an nftables table in the jail's namespace, installed before create()
  returns. Code inside has no CAP_NET_ADMIN there, so it cannot lift it.

The host's addresses are read when the sandbox is created: an address the
host gains later is blocked only if it falls in one of the private ranges.
slirp4netns runs sandboxed (own mount namespace, capabilities dropped,
seccomp) and joins the jail's cgroups, so it is killed with them.
"""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
from dataclasses import dataclass
from typing import IO

SLIRP_GATEWAY = "10.0.2.2"
SLIRP_DNS = "10.0.2.3"
TAP_DEVICE = "tap0"
_TOOL_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
RESOLV_CONF = f"nameserver {SLIRP_DNS}\noptions edns0\n"
BLOCKED_V4 = (
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "224.0.0.0/3",
)
"""IPv4 destinations a networked sandbox may not reach besides the host's own addresses."""


@dataclass(frozen=True)
class NetTools:
    """Paths of the host programs a networked sandbox needs."""

    slirp4netns: str
    nsenter: str
    nft: str


def find_tools() -> NetTools | None:
    """The programs, or None when one is missing (network=True is then refused)."""
    found = [shutil.which(name, path=_TOOL_PATH) for name in ("slirp4netns", "nsenter", "nft")]
    if not all(found):
        return None
    slirp, nsenter, nft = found
    return NetTools(slirp4netns=str(slirp), nsenter=str(nsenter), nft=str(nft))


def host_addresses() -> list[ipaddress.IPv4Address]:
    """Every IPv4 address of the host (the LOCAL entries of /proc/net/fib_trie)."""
    out: set[ipaddress.IPv4Address] = set()
    last = ""
    try:
        with open("/proc/net/fib_trie") as f:
            for line in f:
                text = line.strip()
                if text.startswith("|--"):
                    last = text[3:].strip()
                elif text == "/32 host LOCAL" and last:
                    out.add(ipaddress.IPv4Address(last))
    except (OSError, ValueError):
        pass
    return sorted(out)


def ruleset() -> str:
    """The nftables table for one jail's namespace: loopback and slirp's DNS pass,
    the blocked destinations are rejected (connection refused at once), IPv6 too."""
    networks = [ipaddress.IPv4Network(n) for n in BLOCKED_V4]
    networks += [ipaddress.IPv4Network(a) for a in host_addresses()]
    # nft refuses overlapping intervals in a set: merge them first.
    blocked = ", ".join(str(n) for n in ipaddress.collapse_addresses(networks))
    return (
        "table inet sandpit {\n"
        "  chain output {\n"
        "    type filter hook output priority 0; policy accept;\n"
        '    oifname "lo" accept\n'
        f"    ip daddr {SLIRP_DNS} udp dport 53 accept\n"
        f"    ip daddr {SLIRP_DNS} tcp dport 53 accept\n"
        f"    ip daddr {{ {blocked} }} reject\n"
        "    meta nfproto ipv6 reject\n"
        "  }\n"
        "}\n"
    )


def start_firewall(tools: NetTools, jail_pid: int, log: IO[bytes]) -> subprocess.Popen[bytes]:
    """Start installing `ruleset()` in the jail's network namespace; wait() for it."""
    proc = subprocess.Popen(
        [tools.nsenter, f"--net=/proc/{jail_pid}/ns/net", "--", tools.nft, "-f", "-"],
        stdin=subprocess.PIPE,
        stdout=log,
        stderr=log,
    )
    assert proc.stdin is not None
    try:
        proc.stdin.write(ruleset().encode())
    finally:
        proc.stdin.close()
    return proc


def start_slirp(
    tools: NetTools, jail_pid: int, ready_fd: int, log: IO[bytes]
) -> subprocess.Popen[bytes]:
    """Start slirp4netns on the jail's namespace; it writes to `ready_fd` once tap0 is up.

    The namespace is named by path, not pid: given a pid, slirp4netns would also
    join the jail's innermost user namespace (bwrap's --disable-userns nests
    one), where it has no right to enter the network namespace.
    """
    return subprocess.Popen(
        [
            tools.slirp4netns,
            "--configure",
            "--mtu=65520",
            "--disable-host-loopback",
            "--enable-sandbox",
            "--enable-seccomp",
            f"--ready-fd={ready_fd}",
            "--netns-type=path",
            f"/proc/{jail_pid}/ns/net",
            TAP_DEVICE,
        ],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        pass_fds=(ready_fd,),
        start_new_session=True,
    )
