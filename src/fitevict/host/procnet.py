"""Which process listens on a loopback TCP port: ``/proc/net/tcp`` (and ``tcp6``) give the listening socket's inode,
``/proc/PID/fd`` the process that holds it. Used to find an rpc-server fitevict did not start itself."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from fitevict.host.procmem import PROC

_LISTEN = "0A"
_ESTABLISHED = "01"
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


def _socket_inodes(port: int, proc: Path, *, state: str, side: int) -> set[str]:
    """Inodes of the sockets in ``state`` whose local (``side`` 1) or remote (``side`` 2) port is ``port``."""
    out: set[str] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == state and int(f[side].rsplit(":", 1)[1], 16) == port:
                out.add(f[9])
    return out


def _holders(inodes: set[str], proc: Path) -> set[int]:
    """The readable processes holding any of these socket inodes."""
    targets = {f"socket:[{i}]" for i in inodes}
    found: set[int] = set()
    for pid in (int(p) for p in os.listdir(proc) if p.isdigit()):
        fds = proc / str(pid) / "fd"
        try:
            if any(os.readlink(fds / fd) in targets for fd in os.listdir(fds)):
                found.add(pid)
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue  # gone, or another user's: not one we can read
    return found


def client_pids(endpoint: str, proc: Path = PROC) -> set[int]:
    """The processes on this machine connected to ``endpoint`` (HOST:PORT on loopback) now."""
    return _holders(_socket_inodes(int(endpoint.rpartition(":")[2]), proc, state=_ESTABLISHED, side=2), proc)


def listening_pid(endpoint: str, proc: Path = PROC) -> Listener:
    """The pid listening on ``endpoint`` (HOST:PORT) when HOST is this machine's loopback, else why not."""
    host, _, port_s = endpoint.rpartition(":")
    if not is_loopback(host):
        return Listener(None, f"unavailable, because {endpoint} is not on this machine's loopback: its process "
                              "cannot be read from here")
    inodes = _socket_inodes(int(port_s), proc, state=_LISTEN, side=1)
    if not inodes:
        return Listener(None, f"unavailable, because nothing listens on port {port_s} ({proc}/net/tcp)")
    pids = _holders(inodes, proc)
    if not pids:
        return Listener(None, f"unavailable, because no readable process holds the socket listening on port {port_s}")
    return Listener(min(pids))
