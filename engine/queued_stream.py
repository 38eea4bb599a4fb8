"""`QueuedStream`: one request's events, queued by whoever receives them and iterated by
whoever answers the request.

It is the one stream class on every transport: the in-process front's
(`engine.fronts.async_engine.RequestStream`), an engine server's HTTP stream and its
link's (`engine_hop.remote_client.RemoteStream`, `engine_hop.link_client.LinkStream`).
They differ only in where the items come from and in what closing does.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from engine.outputs import StreamEvent


class QueuedStream:
    """The events of one request in arrival order; iteration ends after the event with
    `finished=True`, or by raising an exception put in their place (the request's error,
    or the transport's)."""

    def __init__(self, request_id: str, prompt: tuple[int, ...] = ()) -> None:
        self.request_id = request_id
        self.prompt = prompt  # kept only where the events arrive without it
        self._queue: asyncio.Queue[StreamEvent | BaseException] = asyncio.Queue()
        self.done = False

    def put(self, item: StreamEvent | BaseException) -> None:
        """Queues the stream's next item."""
        self._queue.put_nowait(item)

    def _ended(self) -> None:
        """Called once iteration reached the stream's last item (subclasses let go of it)."""
        self.done = True

    def __aiter__(self) -> AsyncIterator[StreamEvent]:
        return self

    async def __anext__(self) -> StreamEvent:
        if self.done:
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, BaseException):
            self._ended()
            raise item
        if item.finished:
            self._ended()
        return item
