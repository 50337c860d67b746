"""A write joins the next one in the same event-loop turn (``server/gathered.py``), over a real socket pair."""

from __future__ import annotations

import asyncio
import socket

from fitevict.server.gathered import _Gathered


class _Recording(asyncio.Protocol):
    pass


def test_writes_in_one_turn_go_out_as_one_and_close_sends_what_is_gathered() -> None:
    async def run() -> tuple[list[bytes], bytes]:
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair()
        transport, _ = await loop.create_connection(_Recording, sock=ours)
        writes: list[bytes] = []
        real_write = transport.write
        transport.write = lambda data: (writes.append(bytes(data)), real_write(data))  # type: ignore[method-assign]
        g = _Gathered(transport, loop)
        g.write(b"HTTP/1.1 200 OK\r\n\r\n")
        assert writes == [] and g.get_write_buffer_size() == len(b"HTTP/1.1 200 OK\r\n\r\n")  # held
        g.write(b"body")
        assert writes == [b"HTTP/1.1 200 OK\r\n\r\nbody"]  # the next write sends both, at once
        g.write(b"chunk")
        assert writes[-1] != b"chunk"
        await asyncio.sleep(0)  # the turn ends: a lone write goes out
        assert writes[-1] == b"chunk"
        g.write(b"last")
        g.close()  # what is held goes before the close
        assert writes[-1] == b"last"
        await asyncio.sleep(0)
        theirs.settimeout(5)
        got = b""
        while chunk := theirs.recv(1024):
            got += chunk
        theirs.close()
        return writes, got

    writes, got = asyncio.run(run())
    assert len(writes) == 3
    assert got == b"HTTP/1.1 200 OK\r\n\r\nbodychunklast"
