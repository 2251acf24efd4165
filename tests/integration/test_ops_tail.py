"""`binlake tail` on a stream that also holds a message that is not a binlake envelope."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys

import nats

from services.launcher.processes import ROOT, clean_env
from shared import envelope, jetstream, objects
from shared.subjects import Names


async def publish(nats_url: str) -> None:
    names = Names()
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await jetstream.ensure_streams(js, names, 16)
        env = {"v": envelope.VERSION, "source": "main", "db": "shop", "table": "items", "op": "i", "ts": 1,
               "pos": {"file": "mysql-bin.000001", "offset": 4, "gtid": None}, "scn": 1 << 32 | 4,
               "txn": {"id": "t", "i": 0, "last": True}, "pk": ["id"], "rows": [{"after": {"id": 1}}]}
        subject = names.cdc("main", "shop", "items")
        await js.publish(subject, b"\xc1 not msgpack")
        await js.publish(subject, envelope.encode({**env, "v": 99}))
        await js.publish(subject, envelope.encode(env))
        # A message larger than NATS: the object, then its reference; and a reference whose object is gone.
        big = {**env, "scn": (1 << 32 | 4) + 1, "rows": [{"after": {"id": 2, "b": b"z" * 300_000}}]}
        data = envelope.encode(big)
        bucket = names.cdc_objects_bucket
        await objects.ensure_bucket(js, bucket, names.cdc_stream)
        ref_env = objects.reference(big, data, bucket, "big-1")
        ref = objects.Ref.of(ref_env)
        assert ref is not None
        await objects.put(js, ref, data)
        await js.publish(subject, envelope.encode(ref_env), headers={objects.HEADER: f"{bucket}/{ref.name}"})
        gone = objects.reference(big, data + b"!", bucket, "gone-1")
        await js.publish(subject, envelope.encode(gone), headers={objects.HEADER: f"{bucket}/gone"})
    finally:
        await nc.close()


def test_tail_shows_what_is_not_an_envelope_and_goes_on(nats_url: str) -> None:
    asyncio.run(publish(nats_url))
    env = clean_env()
    env["BINLAKE_NATS_URL"] = nats_url
    out = subprocess.run([sys.executable, "-m", "services.cli", "tail", "shop.items", "--no-follow"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    errors = [line.get("_error", "")[:27] for line in lines]
    errors[4] = errors[4][:15]
    assert errors == ["not a binlake envelope: not", "not a binlake envelope: env", "", "",
                      "object 'gone-1."]
    assert "version 99" in lines[1]["_error"]
    assert lines[2]["rows"] == [{"after": {"id": 1}}] and lines[2]["_seq"] == 3
    assert lines[3]["rows"] == [{"after": {"id": 2, "b": {"base64": base64.b64encode(b"z" * 300_000).decode()}}}]
