"""Publishing without nats-py's per-message costs; JetStream acks as futures.

nats-py's `publish_async` waits for its pending-semaphore through `asyncio.wait_for`, so every
message yields to the event loop and its flusher writes each message with a syscall of its
own: about 140 µs of CPU per message in the parser, ten times the cost of the publish itself.
Here a message goes into the connection's buffer without a yield, and the acks of all
messages arrive on one wildcard subscription under the connection's inbox prefix (so a NATS
user limited to its own `_INBOX_<user>` works unchanged). Callers bound how many are in
flight and how long an ack may take, as with `publish_async` (whose futures hang for good on
a refusal: its reply handler raises the error instead of setting it on the future).

`send` writes the same bytes as nats-py's `publish` (a unit test compares them) for a third
of the CPU: nats-py checks every header key with a regex and encodes key and value piece by
piece, which was the largest single cost of a sink worker. Anything unusual (not connected,
a payload over the limit, whitespace in a subject, CR/LF in a header) goes through nats-py's
`publish` and gets its checks and errors.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Mapping

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import PubAck
from nats.protocol.command import hpub_cmd

from shared.jetstream import header

NO_RESPONDERS = "503"  # the status of a reply nobody sent: no stream listens on the subject
_BAD_SUBJECT = re.compile(r"[ \t\r\n]")
_HEADER_KEY = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # nats-py's check: RFC 7230 token characters
_GOOD_KEYS: set[str] = set()


def encode_headers(headers: Mapping[str, str]) -> bytes | None:
    """The NATS/1.0 header block nats-py would write, or None where it would change or refuse something."""
    for key in headers:
        if key not in _GOOD_KEYS:
            if not _HEADER_KEY.fullmatch(key):
                return None
            if len(_GOOD_KEYS) < 256:  # binlake's few names; not every name a hostile message brings
                _GOOD_KEYS.add(key)
    body = "".join([f"{k}: {v.strip()}\r\n" for k, v in headers.items()])
    if body.count("\n") != len(headers) or body.count("\r") != len(headers):
        return None  # a value with CR or LF: nats-py replaces them
    return f"NATS/1.0\r\n{body}\r\n".encode()


async def send(nc: Client, subject: str, data: bytes, headers: Mapping[str, str], reply: str = "") -> None:
    """`nc.publish(subject, data, reply=reply, headers=headers)`, byte for byte, without its per-message checks."""
    hdr = encode_headers(headers) if headers else None
    if (hdr is None or not nc.is_connected or nc.is_draining or len(data) > nc.max_payload or not subject
            or _BAD_SUBJECT.search(subject) or (reply and _BAD_SUBJECT.search(reply))):
        await nc.publish(subject, data, reply=reply, headers=dict(headers) if headers else None)
        return
    nc.stats["out_msgs"] += 1
    nc.stats["out_bytes"] += len(data)
    await nc._send_command(hpub_cmd(subject, reply, hdr, data))
    if nc._flush_queue is not None and nc._flush_queue.empty():
        await nc._flush_pending()


class AsyncPublisher:
    """Publish to JetStream; each publish returns the future of its ack."""

    def __init__(self, nc: Client) -> None:
        self._nc = nc
        self._prefix = ""
        self._sub: Subscription | None = None
        self._futures: dict[str, asyncio.Future[PubAck]] = {}
        self._next = 0

    @property
    def pending(self) -> int:
        return len(self._futures)

    async def start(self) -> None:
        self._prefix = self._nc.new_inbox() + "."
        self._sub = await self._nc.subscribe(self._prefix + "*", cb=self._on_reply)

    async def publish(self, subject: str, data: bytes, headers: dict[str, str] | None = None) -> asyncio.Future[PubAck]:
        """Hand the message to the connection; the future gets its ack, or the stream's refusal."""
        if self._sub is None:
            await self.start()
        self._next += 1
        token = str(self._next)
        future: asyncio.Future[PubAck] = asyncio.get_running_loop().create_future()
        self._futures[token] = future
        try:
            await send(self._nc, subject, data, headers or {}, self._prefix + token)
        except BaseException:
            self._futures.pop(token, None)
            raise
        return future

    async def _on_reply(self, msg: Msg) -> None:
        future = self._futures.pop(msg.subject[len(self._prefix):], None)
        if future is None or future.done():
            return
        if header(msg, "Status") == NO_RESPONDERS:
            future.set_exception(nats.js.errors.NoStreamResponseError())
            return
        try:
            resp = json.loads(msg.data)
            if "error" in resp:
                nats.js.errors.APIError.from_error(resp["error"])  # raises the error's own class
            future.set_result(PubAck.from_response(resp))
        except nats.js.errors.APIError as exc:
            future.set_exception(exc)
        except (ValueError, TypeError, KeyError, RecursionError) as exc:  # not an ack: no stream answered
            future.set_exception(nats.errors.Error(f"not a JetStream ack on {msg.subject}: {exc!r}"))

    def cancel_all(self) -> None:
        """Give up every ack still due (their outcome is re-learned from the stream)."""
        futures, self._futures = self._futures, {}
        for future in futures.values():
            future.cancel()

    async def close(self) -> None:
        self.cancel_all()
        if self._sub is not None:
            sub, self._sub = self._sub, None
            try:
                await sub.unsubscribe()
            except nats.errors.Error:
                pass  # the connection is closing or gone: the subscription goes with it
