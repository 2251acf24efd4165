"""shared.nats_client: header blocks parse exactly as nats-py parses them."""

from __future__ import annotations

import random

import pytest
from nats.aio.client import Client as NatsClient

from shared.nats_client import Client

BLOCKS = [
    b"Nats-Msg-Id: main:000001:000000000004:0\r\nBinlake-Op: i\r\nBinlake-Rows: 3\r\n\r\n",
    b"A:b\r\nA:c\r\n\r\n",  # the last one wins
    b"Name:\tvalue with spaces  \r\n  Padded :  x \r\n\r\n",
    b"Bad Name: x\r\nBad\x1fName: y\r\nok: \xff\xfe\r\n\xc3\xa9t\xc3\xa9: z\r\n\r\n",
    b"no colon here\r\n: empty name\r\nk:\r\n\r\n",
    b"",
]


@pytest.mark.parametrize("raw", BLOCKS)
def test_known_blocks_parse_like_nats_py(raw: bytes) -> None:
    assert Client._parse_header_lines(raw) == NatsClient._parse_header_lines(raw)


def test_random_blocks_parse_like_nats_py() -> None:
    rnd = random.Random(3)
    alphabet = b"ab:-_ \t\r\n\x0b\x0c\x1c\x1d\x1e\x1f\x7f\x80\xc3\xa9\xff0"
    for _ in range(5000):
        raw = bytes(rnd.choice(alphabet) for _ in range(rnd.randint(0, 60)))
        assert Client._parse_header_lines(raw) == NatsClient._parse_header_lines(raw), raw
