"""Every error binlake raises on purpose.

```
BinlakeError                      retriable = False
├── TransientError                retriable = True   (NATS timeout, MySQL gone away)
│   ├── SourceUnavailable         MySQL/MariaDB cannot be reached (yet)
│   ├── NatsUnavailable           NATS cannot be reached or timed out
│   │   └── StoreFull             JetStream has no room left; waits (no restart budget) until it has
│   └── PublishFailed             JetStream refused or lost a publish; resume from the stream tail
└── FatalError                    needs a person: the message says what to change
    ├── ConfigError               bad or missing configuration
    ├── SourceMisconfigured       server settings binlake cannot work with
    ├── MissingPrivilege          the replication user lacks a privilege
    ├── AccessDenied              wrong credentials
    ├── BinlogPurged              the saved position is no longer in the server's binlogs
    ├── DecodeError               a binlog event that cannot be decoded exactly
    ├── OversizeEvent             one row does not fit into a message
    ├── StreamMismatch            a JetStream stream exists with an incompatible definition
    ├── StreamRedefined           a stream a reader has a cursor in was defined again (or is behind it)
    ├── LeaseLost                 another instance owns the lease now
    └── ForeignValue              a KV value binlake did not write (e.g. a server reply relayed into it)
```
"""

from __future__ import annotations


class BinlakeError(Exception):
    """Base class; `retriable` says whether a supervisor may restart the actor, `waits` that it
    restarts it for as long as it takes (the cause is outside binlake, and nothing is lost while
    it waits), without using up its restart budget."""

    retriable = False
    waits = False


class TransientError(BinlakeError):
    """A condition that goes away by itself; restart with backoff."""

    retriable = True


class SourceUnavailable(TransientError):
    """MySQL/MariaDB cannot be reached (yet)."""


class NatsUnavailable(TransientError):
    """NATS cannot be reached or a request timed out."""


class PublishFailed(TransientError):
    """JetStream refused or lost a publish; the parser resumes from the stream tail."""


class StoreFull(NatsUnavailable):
    """JetStream refuses a write for want of room (its storage limit, or an account's); the writer
    resumes from the stream tail once there is room."""

    waits = True


class SparkUnavailable(TransientError):
    """The Spark master does not answer (yet)."""


class SnapshotConflict(TransientError):
    """A snapshot's progress changed under it (another parser took over); restart from what is stored."""


class FatalError(BinlakeError):
    """Needs a person: the message says what to change."""


class ConfigError(FatalError):
    """Bad or missing configuration."""


class SourceMisconfigured(FatalError):
    """A server setting binlake cannot work with."""


class MissingPrivilege(FatalError):
    """The replication user lacks a privilege."""


class AccessDenied(FatalError):
    """Wrong user name or password for the source."""


class BinlogPurged(FatalError):
    """The saved position is no longer in the server's binlogs."""


class DecodeError(FatalError):
    """A binlog event that cannot be decoded exactly."""


class OversizeEvent(FatalError):
    """A single row is larger than the NATS max_payload."""


class StreamMismatch(FatalError):
    """A JetStream stream exists with a definition binlake cannot use."""


class StreamRedefined(FatalError):
    """A stream a reader keeps a cursor in was deleted and defined again (its sequences restarted), or
    ends before the cursor: reading on would skip or misread messages, so the reader halts."""


class HeldTableRenamed(FatalError):
    """A RENAME TABLE names a table the loader set aside: applying it would leave that table's kept
    changes under the old name, so the loader halts before it."""


class LeaseLost(FatalError):
    """Another instance owns the lease now."""


class ForeignValue(FatalError):
    """A KV value binlake did not write: a NATS server reply relayed into the bucket, or garbage."""
