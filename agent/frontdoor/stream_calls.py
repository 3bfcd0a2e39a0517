"""A streaming inference call's requests served side by side, as Triton serves
`ModelStreamInfer` for models that are not decoupled: each request starts as it
arrives, up to a bound per call, and the answers go back in the order of their
requests. Requests of one sequence are served one after another, in the order
they came, so a sequence's order never depends on how long another request's
path takes; a request waiting (for a sequence slot, say) does not stop the
requests behind it from running (the END that frees the slot)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from functools import partial
from typing import Any, TypeVar

Request = TypeVar("Request")
Answer = TypeVar("Answer")


async def side_by_side(
    requests: AsyncIterator[Request],
    serve: Callable[[Request], Awaitable[Answer]],
    limit: int,
    order_key: Callable[[Request], Hashable | None],
) -> AsyncIterator[Answer]:
    """`serve` each of `requests` as it arrives and yield the answers in request
    order. At most `limit` requests are outstanding (running, or answered and not
    yet yielded); the call reads no more until the oldest is yielded. Requests with
    the same `order_key` (not None) run one after another. An exception from
    `requests` or `serve` ends the call once the answers before it are out."""
    answers: asyncio.Queue[asyncio.Task[Answer] | None] = asyncio.Queue()
    room = asyncio.Semaphore(limit)
    running: set[asyncio.Task[Answer]] = set()
    last: dict[Hashable, asyncio.Task[Answer]] = {}  # each sequence's latest request
    failure: list[Exception] = []

    def forget(key: Hashable, task: asyncio.Task[Answer]) -> None:
        if last.get(key) is task:  # no later request of its sequence came
            del last[key]

    async def one(request: Request, after: asyncio.Task[Answer] | None) -> Answer:
        if after is not None:
            await asyncio.wait([after])  # its sequence's previous request
        return await serve(request)

    async def read() -> None:
        try:
            async for request in requests:
                await room.acquire()
                key = order_key(request)
                task = asyncio.create_task(one(request, last.get(key) if key is not None else None))
                running.add(task)
                task.add_done_callback(running.discard)
                if key is not None:
                    last[key] = task
                    task.add_done_callback(partial(forget, key))
                answers.put_nowait(task)
        except Exception as exc:
            failure.append(exc)
        answers.put_nowait(None)

    reader = asyncio.create_task(read())
    try:
        while (task := await answers.get()) is not None:
            answer = await task
            room.release()
            yield answer
        if failure:
            raise failure[0]
    finally:
        reader.cancel()
        for task in list(running):
            task.cancel()


async def until_set(
    requests: AsyncIterator[Request], ending: asyncio.Event
) -> AsyncIterator[Request]:
    """`requests` until `ending` is set: a call whose client sends nothing more ends
    then, once the answers it has are out (the grpcio door's shutdown; the native
    door ends its calls' messages itself)."""
    iterator = aiter(requests)
    ended = asyncio.ensure_future(ending.wait())
    following: asyncio.Future[Request] | None = None
    try:
        while True:
            following = asyncio.ensure_future(anext(iterator))
            await asyncio.wait({following, ended}, return_when=asyncio.FIRST_COMPLETED)
            if not following.done():
                return
            try:
                yield following.result()
            except StopAsyncIteration:
                return
    finally:
        ended.cancel()
        # The last read, when the call ends or its consumer is cancelled: still
        # waiting, it may yet finish as the stream closes; or it finished as the
        # consumer was cancelled, unread. Either way its end is nobody's to report.
        if following is not None:
            following.cancel()  # nothing, once it is done
            following.add_done_callback(_retrieved)


def _retrieved(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()
