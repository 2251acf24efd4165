"""`binlake tail <db.table>`: the table's change events from BINLAKE_CDC as JSON lines."""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import json
import sys
from typing import Any

import nats.js.errors

from services.ops.common import nats_auth, nats_url, run
from shared import envelope, jetstream, objects
from shared.errors import ConfigError
from shared.mysql import parse_name
from shared.ordered_reader import OrderedReader
from shared.subjects import Names


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"base64": base64.b64encode(value).decode()}
    return str(value)


def start_seq(spec: str, first: int, last: int) -> int:
    """`earliest`, `latest` (only new events), a stream sequence, or an ISO time / epoch ms."""
    if spec == "earliest":
        return first
    if spec == "latest":
        return last + 1
    if spec.isdigit() and int(spec) < 10**12:
        return int(spec)
    raise ConfigError(f"--from must be earliest, latest or a stream sequence, got {spec!r}")


def table_subject(names: Names, source: str, table: str) -> str:
    """The CDC subject of `db.table` as the command takes it (`db`.`table` for names with dots or backticks)."""
    return names.cdc(source, *parse_name(table, set()))


async def tail(url: str, prefix: str, source: str, table: str, frm: str, follow: bool, limit: int) -> int:
    names = Names(prefix)
    subject = table_subject(names, source, table)
    auth = nats_auth()
    nc = await jetstream.connect(url, name="binlake-tail", auth=auth, first_connect_s=3.0)
    printed = 0
    try:
        js = nc.jetstream(prefix=auth.nats_api_prefix)
        try:
            info = await js.stream_info(names.cdc_stream)
        except nats.js.errors.NotFoundError:
            raise ConfigError(f"stream {names.cdc_stream} does not exist yet; is a sink running?") from None
        reader = OrderedReader(js, names.cdc_stream, subject,
                               start_seq(frm, info.state.first_seq, info.state.last_seq), 256)
        try:
            while limit <= 0 or printed < limit:
                msgs = await reader.fetch(wait_s=1.0)
                if not msgs and not follow:
                    break
                for m in msgs:
                    try:
                        env = envelope.as_dict(envelope.decode(
                            await objects.resolve(js, m.data, names.cdc_objects_bucket)))
                    except envelope.EnvelopeError as exc:  # shown, not fatal: the stream is not ours alone
                        env = {"_error": f"not a binlake envelope: {exc}"}
                    except objects.ObjectMissing as exc:
                        env = {"_error": str(exc)}
                    env["_seq"] = m.metadata.sequence.stream
                    env["_stored"] = m.metadata.timestamp.isoformat() if isinstance(
                        m.metadata.timestamp, dt.datetime) else None
                    print(json.dumps(env, default=_json_default, ensure_ascii=False), flush=True)
                    printed += 1
                    if 0 < limit <= printed:
                        break
        finally:
            await reader.close()
    finally:
        await nc.close()
    return printed


def main() -> None:
    ap = argparse.ArgumentParser(prog="binlake tail", description=__doc__)
    ap.add_argument("table", help="db.table (`db`.`table` when a name holds a dot or a backtick)")
    ap.add_argument("--from", dest="frm", default="earliest", help="earliest (default), latest, or a stream seq")
    ap.add_argument("--no-follow", action="store_true", help="stop at the end instead of waiting for new events")
    ap.add_argument("-n", "--limit", type=int, default=0, help="stop after N events")
    ap.add_argument("--source", default="main")
    ap.add_argument("--prefix", default="binlake")
    args = ap.parse_args(sys.argv[1:])
    run("tail", lambda: tail(nats_url(), args.prefix, args.source, args.table, args.frm, not args.no_follow,
                             args.limit))
