"""Which process listens on a loopback TCP port: ``/proc/net/tcp`` (and ``tcp6``) give the listening socket's inode,
``/proc/PID/fd`` the process that holds it. Used to find an rpc-server fitevict did not start itself."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from fitevict.host.procmem import PROC

_LISTEN = "0A"
_LOOPBACK_NAMES = {"localhost"}


@dataclass(frozen=True, slots=True)
class Listener:
    """The process listening on an endpoint, or why none was found (``pid`` None, ``reason``)."""

    pid: int | None
    reason: str = ""


def is_loopback(host: str) -> bool:
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _listening_inodes(port: int, proc: Path) -> set[str]:
    out: set[str] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == _LISTEN and int(f[1].rsplit(":", 1)[1], 16) == port:
                out.add(f[9])
    return out


def listening_pid(endpoint: str, proc: Path = PROC) -> Listener:
    """The pid listening on ``endpoint`` (HOST:PORT) when HOST is this machine's loopback, else why not."""
    host, _, port_s = endpoint.rpartition(":")
    if not is_loopback(host):
        return Listener(None, f"unavailable, because {endpoint} is not on this machine's loopback: its process "
                              "cannot be read from here")
    inodes = _listening_inodes(int(port_s), proc)
    if not inodes:
        return Listener(None, f"unavailable, because nothing listens on port {port_s} ({proc}/net/tcp)")
    targets = {f"socket:[{i}]" for i in inodes}
    for pid in (int(p) for p in os.listdir(proc) if p.isdigit()):
        fds = proc / str(pid) / "fd"
        try:
            for fd in os.listdir(fds):
                if os.readlink(fds / fd) in targets:
                    return Listener(pid)
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue  # gone, or another user's: not the one we can read
    return Listener(None, f"unavailable, because no readable process holds the socket listening on port {port_s}")
