"""Request-reply over NATS with msgpack bodies and explicit, typed errors.

A reply is `{"ok": true, ...}` or `{"ok": false, "code": <code>, "error": <message>}`; the
codes are stable so clients in any language can branch on them. A handler answers with
several messages (`{"part": i, "last": bool, ...}`) when a reply would exceed max_payload.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import Any

import msgpack
import nats.errors
import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from shared import clients
from shared.errors import BinlakeError, NatsUnavailable, StoreFull
from shared.health import Conditions
from shared.subjects import INBOX_PREFIX, subject_matches

Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
STREAM_REDEFINED = "stream_redefined"  # a reply's code: the stream a cursor counts in was defined again
NO_ROOM = "no_room"  # a reply's code: JetStream refused a write the service had to make for want of room
RETENTION_GAP = "retention_gap"  # a reply's code: the stream no longer holds messages the client has not read
SERVICE_PROBLEMS = frozenset({"unavailable", NO_ROOM})
"""Reply codes that say the service cannot do its work (its stream, its backend, NATS away; no room), for
`/healthz`. A client's own state (a gap, a stream defined again since its position) is not one:
`binlake status` names it."""
PROBLEM_TTL_S = 120.0  # a failed request's condition, unless one on its subject is answered sooner
MAX_IN_FLIGHT = 1024  # requests one subscription answers at once; more are refused as `unavailable`
MAX_PER_CALLER = 64  # of those, what one caller (`serve`'s `caller`) may have: no client starves the others
log = structlog.get_logger()


class RpcError(BinlakeError):
    """The service refused a request; `code` says why (bad_request, conflict, not_found, ...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        # The service could not answer because something it needs is away for a moment (meta,
        # NATS during a leader election): the caller may retry, as after any bus error; or because
        # JetStream has no room for what it had to write: the caller waits, as for its own writes.
        self.retriable = code in ("unavailable", NO_ROOM)
        self.waits = code == NO_ROOM


class BadRequest(RpcError):
    def __init__(self, message: str) -> None:
        super().__init__("bad_request", message)


def pack(obj: Any) -> bytes:
    data: bytes = msgpack.packb(obj, use_bin_type=True)
    return data


def unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def require(req: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    """The field `key` of a request, checked for presence and type (BadRequest otherwise)."""
    if key not in req:
        raise BadRequest(f"missing field {key!r}")
    value = req[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        name = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise BadRequest(f"field {key!r} must be {name}, got {type(value).__name__}")
    return value


def require_client(req: dict[str, Any]) -> str:
    """The request's client name, checked like every name that comes over NATS."""
    client: str = require(req, "client", str)
    problem = clients.name_problem(client)
    if problem:
        raise BadRequest(problem)
    return client


def split_reply(reply: dict[str, Any], fields: tuple[str, ...], limit: int) -> list[dict[str, Any]]:
    """Cut a reply whose parallel lists `fields` make it larger than `limit` bytes into parts.

    The first field decides the cuts; the others (same length) are cut at the same places.
    """
    items = reply.get(fields[0])
    if not isinstance(items, list) or len(pack(reply)) <= limit:
        return [{**reply, "part": 0, "last": True}]
    cuts: list[tuple[int, int]] = []
    start, size = 0, 0
    for i, item in enumerate(items):
        item_size = (len(item) if isinstance(item, (bytes, str)) else len(pack(item))) + 16
        if i > start and size + item_size > limit:
            cuts.append((start, i))
            start, size = i, 0
        size += item_size
    cuts.append((start, len(items)))
    head = {k: v for k, v in reply.items() if k not in fields}
    return [{**head, **{f: reply[f][a:b] for f in fields if isinstance(reply.get(f), list)}, "part": n,
             "last": n == len(cuts) - 1} for n, (a, b) in enumerate(cuts)]


INBOX = re.compile(rf"(?:{INBOX_PREFIX}|_R_)\.[^\s*>]+")
"""A reply subject binlake answers: under `_INBOX` or a user's `_INBOX_<user>` (BINLAKE_NATS_INBOX), or
`_R_`, nats-server's own reply subject for a request from another account (shared.permissions)."""


async def serve(nc: NATS, subject: str, handler: Handler, queue: str = "",
                split_fields: tuple[str, ...] = (),
                bind: Callable[[str, dict[str, Any]], dict[str, Any]] | None = None,
                caller: Callable[[str], str | None] | None = None,
                health: Conditions | None = None) -> Subscription:
    """Answer requests on `subject` with `handler`; errors become `{"ok": false}` replies.

    With `split_fields`, a reply larger than the connection's max_payload is sent as several
    messages, each with `part` and `last`, the lists in `split_fields` spread over them.
    `bind(subject, request)` checks a request against the subject it came on, before `handler`.
    `caller(subject)` names who asks (a store client, by its subject, which only it may publish
    on): one caller has at most MAX_PER_CALLER requests in flight, so its long polls never fill
    the MAX_IN_FLIGHT every caller shares. `health`: a request the service could not answer for
    its own reasons (SERVICE_PROBLEMS) is reported there until one on its subject is answered.
    """
    limit = max(1024, nc.max_payload - 64 * 1024) if nc.max_payload else 900 * 1024

    running: set[asyncio.Task[None]] = set()
    per_caller: dict[str, int] = {}

    async def answer(msg: Msg) -> None:
        try:
            try:
                req = unpack(msg.data) if msg.data else {}
            except Exception as exc:  # msgpack raises several unrelated types
                raise BadRequest(f"request is not msgpack: {exc}") from None
            if not isinstance(req, dict):
                raise BadRequest("request must be a msgpack map")
            if bind is not None:
                req = bind(msg.subject, req)
            reply = {"ok": True, **(await handler(req))}
        except RpcError as exc:
            reply = {"ok": False, "code": exc.code, "error": str(exc)}
        except StoreFull as exc:  # before BinlakeError: the caller waits for room, as for its own writes
            reply = {"ok": False, "code": NO_ROOM, "error": str(exc)}
        except BinlakeError as exc:
            log.warning("rpc.failed", subject=msg.subject, error=repr(exc))
            reply = {"ok": False, "code": "unavailable" if exc.retriable else "failed", "error": str(exc)}
        except Exception as exc:  # a bug must still answer, or the client waits for its timeout
            log.error("rpc.crashed", subject=msg.subject, error=repr(exc), exc_info=True)
            reply = {"ok": False, "code": "failed", "error": f"internal error: {exc!r}"}
        if health is not None:
            if reply.get("code") in SERVICE_PROBLEMS:
                health.set(msg.subject, f"{msg.subject}: {reply.get('error')}", ttl_s=PROBLEM_TTL_S)
            else:  # answered, the caller's error included: the service works
                health.clear(msg.subject)
        if not split_fields or not reply.get("ok"):
            await msg.respond(pack(reply))
            return
        for part in split_reply(reply, split_fields, limit):
            await nc.publish(msg.reply, pack(part))

    async def on_msg(msg: Msg) -> None:
        if not msg.reply:
            return
        if not subject_matches(subject, msg.subject) or not INBOX.fullmatch(msg.reply):
            # A JetStream consumer can deliver a stored message to any subject it is told (its
            # subject is then the stored one), and a requester can name any reply subject: we
            # answer only requests made on our subject, into an inbox, or an answer could be
            # written into a stream or a bucket.
            log.warning("rpc.refused", subject=msg.subject[:200], reply=msg.reply[:200])
            return
        if len(running) >= MAX_IN_FLIGHT:  # a flood of requests must not grow memory without end
            await msg.respond(pack({"ok": False, "code": "unavailable",
                                    "error": f"{MAX_IN_FLIGHT} requests already in flight here; retry later"}))
            return
        who = caller(msg.subject) if caller is not None else None
        if who is not None and per_caller.get(who, 0) >= MAX_PER_CALLER:
            await msg.respond(pack({"ok": False, "code": "unavailable",
                                    "error": f"{who} has {MAX_PER_CALLER} requests in flight here already; wait for "
                                             "their answers before sending more"}))
            return
        # nats.py delivers one message at a time per subscription; a long-poll get of one
        # client must not hold up everybody else's requests.
        task = asyncio.create_task(answer(msg))
        running.add(task)
        task.add_done_callback(running.discard)
        if who is not None:
            per_caller[who] = per_caller.get(who, 0) + 1
            task.add_done_callback(lambda _: _done(who))

    def _done(who: str) -> None:
        left = per_caller[who] - 1
        if left:
            per_caller[who] = left
        else:
            del per_caller[who]  # callers come and go: the map holds only the busy ones

    return await nc.subscribe(subject, queue=queue, cb=on_msg)


async def call(nc: NATS, subject: str, req: dict[str, Any], timeout: float = 5.0) -> dict[str, Any]:
    """Send a request; return the reply or raise RpcError / NatsUnavailable."""
    try:
        msg = await nc.request(subject, pack(req), timeout=timeout)
    except nats.errors.NoRespondersError:
        raise NatsUnavailable(f"nothing answers on {subject}; is the service running?") from None
    except (nats.errors.TimeoutError, TimeoutError):
        raise NatsUnavailable(f"no answer on {subject} within {timeout}s") from None
    reply = unpack(msg.data)
    if not reply.get("ok"):
        raise RpcError(reply.get("code", "failed"), reply.get("error", "request failed"))
    return dict(reply)


async def call_parts(nc: NATS, subject: str, req: dict[str, Any], fields: tuple[str, ...],
                     timeout: float = 5.0) -> dict[str, Any]:
    """Like `call` for a reply that may come in several parts; the parts' `fields` lists are joined."""
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox, max_msgs=0)
    try:
        await nc.publish(subject, pack(req), reply=inbox)
        merged: dict[str, Any] | None = None
        while True:
            try:
                msg = await sub.next_msg(timeout=timeout)
            except (nats.errors.TimeoutError, TimeoutError):
                raise NatsUnavailable(f"no (complete) answer on {subject} within {timeout}s") from None
            if msg.headers and msg.headers.get("Status") == "503":
                raise NatsUnavailable(f"nothing answers on {subject}; is the service running?")
            part = unpack(msg.data)
            if not part.get("ok"):
                raise RpcError(part.get("code", "failed"), part.get("error", "request failed"))
            if merged is None:
                merged = dict(part)
            else:
                for field in fields:
                    merged[field] = list(merged.get(field, [])) + list(part.get(field, []))
            if part.get("last", True):
                return merged
    finally:
        await sub.unsubscribe()
