"""Ranged GETs sent from the daemon's request loop itself, over an aiohttp session on it.

Why: a cold small file is one GET, and sent from a worker thread it costs the GIL twice
over, handed to the thread and back and then contended by every other fetching thread at
each socket call, on top of urllib3's per-request work in Python. On the request loop
(uvloop) the sockets are driven in C and aiohttp parses the answer in C, so the same GET
costs the daemon less CPU and no thread hop (docs/optimization-history.md, "Cold small
files' GETs on the request loop").

The session belongs to the loop it was opened on, the first GET's, and is closed there
(`close`), as the loop ends; a GET asked on another loop answers None, and the caller sends
it from a thread as before. So does a GET the client's own session would send through a
proxy or with a client certificate (botocore_adapter.direct_tls), or over HTTPS with a CA
bundle that does not load. What is sent is the lean
path's request (lean.py), signed by the same signer, and only its expected answer is taken:
the caller decides what any other means.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import Any

import aiohttp

from . import botocore_adapter

log = logging.getLogger(__name__)


class LoopGets:
    """One keep-alive connection pool on one asyncio loop. Not thread-safe: every method is
    called on that loop."""

    def __init__(self, client: Any, max_connections: int) -> None:
        """`client` is the boto3 client whose session the GETs stand in for."""
        self._client = client
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tls: dict[str, ssl.SSLContext | bool | None] = {}

    def _session_here(self, url: str) -> tuple[aiohttp.ClientSession, ssl.SSLContext | bool] | None:
        """The session of the running loop and how to secure `url`, or None where this GET
        is not for the loop."""
        loop = asyncio.get_running_loop()
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max_connections),
                auto_decompress=False, skip_auto_headers=("Accept-Encoding",))
            self._loop = loop
        elif loop is not self._loop:
            return None
        scheme = url.partition(":")[0]
        if scheme not in self._tls:
            try:
                self._tls[scheme] = botocore_adapter.direct_tls(self._client, url)
            except (OSError, ssl.SSLError) as error:
                # The client's CA bundle cannot be loaded: its own session will say so, in
                # the thread every GET goes to from now on.
                log.info("GETs stay in threads: the CA bundle did not load (%s)", error)
                self._tls[scheme] = None
        tls = self._tls[scheme]
        return None if tls is None else (self._session, tls)

    async def get(self, url: str, headers: dict[str, str],
                  seconds: float) -> tuple[int, Any, bytes] | None:
        """(status, headers, body) of one GET of `url` that ends within `seconds`, the body
        read only for a 206 (partial content); None where the GET is not for this loop.
        Raises TimeoutError when the answer is late, aiohttp.ClientError when the transfer
        fails."""
        here = self._session_here(url)
        if here is None:
            return None
        # A task of its own: aiohttp ends a late GET by cancelling the task that sent it, and
        # a request handler runs in place, under the request loop's own task, until it first
        # waits (the pyfuse3 patch's request loop), so it would cancel the loop instead.
        return await asyncio.get_running_loop().create_task(self._get(*here, url, headers,
                                                                      seconds))

    async def _get(self, session: aiohttp.ClientSession, tls: ssl.SSLContext | bool, url: str,
                   headers: dict[str, str], seconds: float) -> tuple[int, Any, bytes]:
        async with session.get(url, headers=headers, ssl=tls, allow_redirects=False,
                               timeout=aiohttp.ClientTimeout(total=seconds)) as response:
            body = await response.read() if response.status == 206 else b""
            return response.status, response.headers, body

    async def close(self) -> None:
        """Close the pool, on its own loop (a no-op if no GET was sent)."""
        if self._session is not None and asyncio.get_running_loop() is self._loop:
            await self._session.close()
            self._session = None
