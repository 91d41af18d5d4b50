"""Per-key state: ``ctx.state`` and the settings of the store behind it.

An application that names a store (``Application(state=StateStoreConfig("counts"))``)
gives every task the state of its record's key:

```python
async def process(ctx, task):
    count = ctx.state.get(0)
    ctx.state.set(count + 1)
```

Values are anything msgspec encodes as MessagePack (numbers, strings, lists, dicts,
msgspec Structs, dataclasses); [`KeyState.get()`][decaton_aio.KeyState.get] returns plain
Python values unless ``value_type`` is set. A task's changes take effect when its processor
returns: the last value it set (or its delete) is written to the store's changelog topic
(``<group>-<store>-changelog``, compacted, one partition per task partition) and, once the
changelog acknowledged it, to the local copy; only then does the task complete, so a
committed offset never has a change the changelog lacks (with ``exactly_once`` the change is
in the same transaction as the task's outputs and offset, and the copy takes it when that
transaction commits). A processor that raises changes nothing. A key's tasks run one at a
time in its lane, so reads and writes need no locks.

The local copy is an SQLite database per partition, in ``directory`` (kept across
restarts, so a restart replays only the changelog written since its checkpoint) or in
memory (``directory=None``: every assignment replays the whole changelog partition).
Standby replicas (``num_standby_replicas``) keep warm copies of partitions an instance
does not own; the group's assignment prefers handing a partition to the instance with the
warmest copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import msgspec

from decaton_aio.errors import ConfigError

__all__ = ["KeyState", "LocalCopy", "StateStoreConfig"]

_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


@dataclass(frozen=True)
class StateStoreConfig:
    """A state store of an application.

    Attributes:
        name: the store's name; its changelog topic is ``<group>-<name>-changelog``.
        directory: where the SQLite files of its partitions live (one directory per
            instance: a second process on the same directory is refused); ``None`` keeps
            them in memory.
        num_standby_replicas: how many other instances follow each partition's changelog
            to keep a warm copy (0: none). A failover to a warm copy replays only what it
            had not read yet.
        value_type: decode values as this type (e.g. a msgspec Struct); plain Python
            values when ``None``.
        replication_factor: of the created changelog topic; like the side topics' when
            ``None`` (3, or the number of brokers when fewer).
    """

    name: str
    directory: str | Path | None = None
    num_standby_replicas: int = 0
    value_type: Any = None
    replication_factor: int | None = None

    def __post_init__(self) -> None:
        if not self.name or not set(self.name) <= _NAME_CHARS:
            raise ConfigError(
                f"state store name {self.name!r} must be letters, digits, '.', '_' or '-' "
                "(it becomes part of a topic name)"
            )
        if self.num_standby_replicas < 0:
            raise ConfigError(f"num_standby_replicas must be >= 0, got {self.num_standby_replicas}")
        if self.directory is not None:
            object.__setattr__(self, "directory", Path(self.directory))

    def changelog_topic(self, group: str) -> str:
        """The changelog topic of this store in consumer group ``group``."""
        return f"{group}-{self.name}-changelog"


class LocalCopy(Protocol):
    """A partition's local copy of a store, as [`KeyState`][decaton_aio.KeyState] reads it.

    The runtime's copies (SQLite, in ``decaton_aio.consumer.state``) are the ones a task
    sees; the runtime alone writes to them.
    """

    def get(self, key: bytes) -> bytes | None:
        """The value of ``key`` as stored (encoded), ``None`` when it has none."""
        ...


_UNSET = object()
_DELETED = object()
_ENCODER = msgspec.msgpack.Encoder()


class KeyState:
    """The state of one task's key (``ctx.state``).

    Reads see the task's own changes; the change is written when the processor returns.
    """

    __slots__ = ("_change", "_encoded", "_key", "_store", "_type")

    def __init__(self, store: LocalCopy, key: bytes, value_type: Any = None) -> None:
        self._store = store
        self._key = key
        self._type = value_type
        self._change: object = _UNSET
        self._encoded: bytes | None = None

    def get(self, default: Any = None) -> Any:
        """The key's value, or ``default`` when it has none."""
        change = self._change
        if change is _DELETED:
            return default
        if change is not _UNSET:
            return change
        raw = self._store.get(self._key)
        if raw is None:
            return default
        if self._type is None:
            return msgspec.msgpack.decode(raw)
        return msgspec.msgpack.decode(raw, type=self._type)

    def set(self, value: Any) -> None:
        """Make ``value`` the key's state once the task completes.

        Raises:
            ConfigError: the value cannot be encoded (it says which type).
        """
        if value is None:
            raise ConfigError("ctx.state.set(None): use ctx.state.delete() to remove a key")
        try:
            encoded = _ENCODER.encode(value)
        except (TypeError, msgspec.EncodeError) as exc:
            raise ConfigError(
                f"ctx.state.set: {type(value).__name__} cannot be stored ({exc}); use values "
                "msgspec encodes (numbers, str, bytes, list, dict, Struct, dataclass)"
            ) from exc
        self._change = value
        self._encoded = encoded

    def delete(self) -> None:
        """Remove the key's state once the task completes."""
        self._change = _DELETED
        self._encoded = None

    @property
    def changed(self) -> bool:
        """Whether the task set or deleted the value."""
        return self._change is not _UNSET

    @property
    def key(self) -> bytes:
        """The key whose state this is."""
        return self._key

    @property
    def store(self) -> LocalCopy:
        """The local copy the key's state is read from (the runtime writes to it)."""
        return self._store

    def encoded_change(self) -> bytes | None:
        """The change as the changelog stores it: the encoded value, ``None`` for a delete.

        Caller: the runtime, after the processor returned, when
            [`changed`][decaton_aio.KeyState.changed].
        """
        return self._encoded
