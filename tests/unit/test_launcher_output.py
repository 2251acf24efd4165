"""services.launcher.children.copy_lines: every line of a child's output, prefixed, however long."""

from __future__ import annotations

import asyncio

import pytest

from services.launcher.children import copy_lines


async def copied(data: bytes, capsys: pytest.CaptureFixture[str], chunk: int = 7) -> str:
    stream = asyncio.StreamReader()
    for i in range(0, len(data), chunk):
        stream.feed_data(data[i:i + chunk])
    stream.feed_eof()
    await copy_lines(stream, "[x] ")
    return capsys.readouterr().out


async def test_every_line_gets_the_prefix_whatever_the_chunks(capsys: pytest.CaptureFixture[str]) -> None:
    assert await copied(b"one\ntwo\n\nthree", capsys) == "[x] one\n[x] two\n[x] \n[x] three"


async def test_a_line_far_longer_than_a_read_is_copied_whole(capsys: pytest.CaptureFixture[str]) -> None:
    line = b'{"event": "loader.crashed", "error": "' + b"j" * (1 << 20) + b'"}\n'
    out = await copied(line + b"after\n", capsys, chunk=1 << 16)
    assert out == "[x] " + line.decode() + "[x] after\n"


async def test_utf8_split_across_reads_and_bad_bytes(capsys: pytest.CaptureFixture[str]) -> None:
    assert await copied("héllo wörld\n".encode() + b"\xff\n", capsys, chunk=1) == "[x] héllo wörld\n[x] \ufffd\n"
