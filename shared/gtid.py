"""Pure: MySQL GTID sets (`uuid:1-5:7,uuid:tag:1-3`), their text and their binary form.

A MySQL resume point carries the set of transactions the source had executed at that point
(`@@gtid_executed` then). The parser adds each transaction's GTID as it commits, resumes by
sending the set to the server (COM_BINLOG_DUMP_GTID), and after a failover checks that the new
server has executed the whole set. Tagged GTIDs (`uuid:tag:n`, MySQL 8.3+) are kept per
(uuid, tag). MariaDB's GTIDs (`domain-server-seq`) are another thing and live with the parser.
"""

from __future__ import annotations

import re
import struct
import uuid as uuidlib
from typing import Final

from shared.errors import DecodeError

_TAG = re.compile(r"[a-z_][a-z0-9_]{0,31}")
_TAGGED_FORMAT: Final = 1  # the first and last byte of the set's count in the binary form with tags

Tsid = tuple[str, str]  # (uuid, tag); the tag is "" for untagged GTIDs


class GtidError(ValueError):
    """Text that is not a MySQL GTID or GTID set."""


def _uuid(text: str) -> str:
    try:
        return str(uuidlib.UUID(text.strip()))
    except ValueError:
        raise GtidError(f"{text!r} is not a server uuid") from None


def _tag(text: str) -> str:
    tag = text.strip().lower()
    if not _TAG.fullmatch(tag):
        raise GtidError(f"{text!r} is not a GTID tag (a letter or _, then up to 31 letters, digits or _)")
    return tag


_TSIDS: dict[str, Tsid] = {}  # `uuid` / `uuid:tag` as written -> normalised; a topology has few


def parse_gtid(text: str) -> tuple[Tsid, int]:
    """`uuid:n` or `uuid:tag:n` -> ((uuid, tag), n)."""
    head, _, number = text.rpartition(":")
    tsid = _TSIDS.get(head)
    if tsid is None:
        parts = head.split(":")
        if len(parts) not in (1, 2) or not head:
            raise GtidError(f"{text!r} is not a MySQL GTID (uuid:n or uuid:tag:n)")
        tsid = (_uuid(parts[0]), _tag(parts[1]) if len(parts) == 2 else "")
        if len(_TSIDS) < 4096:
            _TSIDS[head] = tsid
    if not number.isdigit() or int(number) < 1:
        raise GtidError(f"{text!r} is not a MySQL GTID (uuid:n or uuid:tag:n)")
    return tsid, int(number)


class GtidSet:
    """A set of MySQL GTIDs: per (uuid, tag), sorted disjoint half-open intervals [start, end)."""

    __slots__ = ("_intervals", "_members", "_text")

    def __init__(self, intervals: dict[Tsid, list[list[int]]] | None = None) -> None:
        self._intervals: dict[Tsid, list[list[int]]] = intervals or {}
        self._text: str | None = None
        self._members: dict[Tsid, str] = {}  # each (uuid, tag)'s ranges as text, kept while unchanged

    # -- text ---------------------------------------------------------------------------

    @classmethod
    def parse(cls, text: str | None) -> GtidSet:
        """`@@gtid_executed` text (newlines and spaces allowed) -> a set; empty text is the empty set."""
        out = cls()
        for member in (text or "").replace("\n", "").split(","):
            member = member.strip()
            if not member:
                continue
            head, *items = member.split(":")
            sid, tag = _uuid(head), ""
            if not items:
                raise GtidError(f"{member!r} names a uuid without transactions")
            for item in items:
                item = item.strip()
                if item and not item[0].isdigit():
                    tag = _tag(item)
                    continue
                lo, sep, hi = item.partition("-")
                if not lo.isdigit() or (sep and not hi.isdigit()):
                    raise GtidError(f"{item!r} in {member!r} is not a transaction number or range")
                start, end = int(lo), int(hi if sep else lo)
                if start < 1 or end < start:
                    raise GtidError(f"{item!r} in {member!r} is an empty or negative range")
                out._add_range((sid, tag), start, end + 1)
        return out

    def __str__(self) -> str:
        # Asked for at every commit (the resume point): only the ranges that changed are formatted again.
        if self._text is None:
            members: dict[str, list[str]] = {}
            for tsid in sorted(self._intervals):
                text = self._members.get(tsid)
                if text is None:
                    ranges = ":".join(str(a) if b == a + 1 else f"{a}-{b - 1}" for a, b in self._intervals[tsid])
                    text = self._members[tsid] = f"{tsid[1]}:{ranges}" if tsid[1] else ranges
                members.setdefault(tsid[0], []).append(text)
            self._text = ",".join(f"{sid}:{':'.join(items)}" for sid, items in members.items())
        return self._text

    def __repr__(self) -> str:
        return f"GtidSet({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GtidSet) and self._intervals == other._intervals

    def __hash__(self) -> int:
        return hash(str(self))

    def __bool__(self) -> bool:
        return bool(self._intervals)

    # -- set operations -----------------------------------------------------------------

    def has(self, gtid: str) -> bool:
        """Whether one transaction (`uuid:n` / `uuid:tag:n`) is in the set."""
        tsid, n = parse_gtid(gtid)
        return any(a <= n < b for a, b in self._intervals.get(tsid, ()))

    def add(self, gtid: str) -> None:
        """Add one executed transaction (`uuid:n` / `uuid:tag:n`)."""
        tsid, n = parse_gtid(gtid)
        self._add_range(tsid, n, n + 1)

    def update(self, other: GtidSet) -> None:
        """Add every transaction of `other`."""
        for tsid, ranges in other._intervals.items():
            for a, b in ranges:
                self._add_range(tsid, a, b)

    def copy(self) -> GtidSet:
        return GtidSet({k: [list(r) for r in v] for k, v in self._intervals.items()})

    def contains(self, other: GtidSet) -> bool:
        """Every transaction of `other` is in this set."""
        for tsid, ranges in other._intervals.items():
            mine = self._intervals.get(tsid, [])
            for a, b in ranges:
                if not any(x <= a and b <= y for x, y in mine):
                    return False
        return True

    def missing(self, other: GtidSet) -> GtidSet:
        """The transactions of `other` that this set lacks."""
        out = GtidSet()
        for tsid, ranges in other._intervals.items():
            mine = self._intervals.get(tsid, [])
            for a, b in ranges:
                for x, y in mine:  # sorted and disjoint: cut what they cover from [a, b)
                    if y <= a or x >= b:
                        continue
                    if x > a:
                        out._add_range(tsid, a, x)
                    a = max(a, y)
                if a < b:
                    out._add_range(tsid, a, b)
        return out

    def _add_range(self, tsid: Tsid, start: int, end: int) -> None:
        self._text = None
        self._members.pop(tsid, None)
        ranges = self._intervals.setdefault(tsid, [])
        if ranges and ranges[-1][1] == start:  # the usual case: the next transaction of a server
            ranges[-1][1] = end
            return
        ranges.append([start, end])
        ranges.sort()
        merged: list[list[int]] = [ranges[0]]
        for a, b in ranges[1:]:
            if a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        self._intervals[tsid] = merged

    # -- binary form (Previous_gtids events, COM_BINLOG_DUMP_GTID) ------------------------

    def encode(self) -> bytes:
        """MySQL's encoded Gtid_set; the tagged form only when a tag is present (older servers read the other)."""
        tagged = any(tag for _, tag in self._intervals)
        n = len(self._intervals)
        out = [struct.pack("<Q", (_TAGGED_FORMAT << 56) | (n << 8) | _TAGGED_FORMAT if tagged else n)]
        for (sid, tag), ranges in sorted(self._intervals.items()):
            out.append(uuidlib.UUID(sid).bytes)
            if tagged:
                raw = tag.encode()
                out.append(bytes([len(raw) << 1]) + raw)  # serialization varlen: tags are < 64 bytes
            out.append(struct.pack("<Q", len(ranges)))
            out += [struct.pack("<qq", a, b) for a, b in ranges]
        return b"".join(out)

    @classmethod
    def decode(cls, data: bytes) -> GtidSet:
        """The inverse of `encode` (the body of a Previous_gtids event)."""
        out = cls()
        try:
            (head,) = struct.unpack_from("<Q", data, 0)
            tagged = (head >> 56) == _TAGGED_FORMAT and (head & 0xFF) == _TAGGED_FORMAT
            n, pos = ((head >> 8) & 0xFFFFFFFFFFFF if tagged else head), 8
            for _ in range(n):
                sid = str(uuidlib.UUID(bytes=bytes(data[pos:pos + 16])))
                pos += 16
                tag = ""
                if tagged:
                    length = data[pos] >> 1
                    tag = bytes(data[pos + 1:pos + 1 + length]).decode()
                    pos += 1 + length
                (count,) = struct.unpack_from("<Q", data, pos)
                pos += 8
                if tag and not _TAG.fullmatch(tag):
                    raise ValueError(f"tag {tag!r}")
                for _ in range(count):
                    a, b = struct.unpack_from("<qq", data, pos)
                    pos += 16
                    if not 1 <= a < b:
                        raise ValueError(f"interval [{a}, {b})")
                    out._add_range((sid, tag), a, b)
        except (struct.error, IndexError, ValueError, UnicodeDecodeError) as exc:
            raise DecodeError(f"cannot decode a MySQL GTID set ({exc}); {bytes(data[:64]).hex()}") from None
        return out

