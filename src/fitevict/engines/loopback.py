"""HTTP clients for the seats and tools on 127.0.0.1, which speak plain HTTP.

httpx gives every client it makes a TLS context of its own and loads its CA bundle into it: tens of milliseconds
of CPU (``bench/loopback_clients.py``) and some 150,000 small allocations (OpenSSL parsing each certificate), even
for a client that only ever reaches
``http://127.0.0.1``. Made in the event loop for each prompt saved at an eviction or restored at a load, that was
both a stall of every request in flight and the churn that fragmented the front door's heap over hours of swaps.
Every client made here shares one context, made once; none of these addresses is ever reached over TLS.
"""

from __future__ import annotations

import functools
import ssl
from typing import Any

import httpx


@functools.cache
def tls() -> ssl.SSLContext:
    """The one TLS context the loopback clients share (the system's default trust store; never used for
    ``http://`` addresses, but httpx makes one for every client that is not handed one)."""
    return ssl.create_default_context()


def aclient(base_url: str, timeout: float | httpx.Timeout) -> httpx.AsyncClient:
    """An async client for ``base_url`` (``http://127.0.0.1:PORT``), sharing the one TLS context."""
    return httpx.AsyncClient(base_url=base_url, timeout=timeout, verify=tls(), trust_env=False)


def get(url: str, timeout: float, **kw: Any) -> httpx.Response:
    """``httpx.get`` without a TLS context of its own."""
    return httpx.get(url, timeout=timeout, verify=tls(), trust_env=False, **kw)


def post(url: str, timeout: float, **kw: Any) -> httpx.Response:
    """``httpx.post`` without a TLS context of its own."""
    return httpx.post(url, timeout=timeout, verify=tls(), trust_env=False, **kw)


__all__ = ["aclient", "get", "post", "tls"]
