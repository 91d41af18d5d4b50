"""The state store behind ``ctx.state``: local copies, their changelog, restores and
standbys.

A `StateStore` is made by the subscription when the application names a store
([`StateStoreConfig`][decaton_aio.StateStoreConfig]). It owns a `LocalStore` (an SQLite
copy) per partition this instance owns or keeps as a standby, writes tasks' changes to the
store's changelog topic before the tasks complete (into the partitions' transactions with
exactly-once), restores copies from the changelog, and tells the group, through its
assignor, how warm each copy is. `StateCollector` exports its metrics.

Inside (private): ``_state`` (the store of one subscription), ``_store`` (a local copy),
``_overlay`` (a copy's changes still in an open transaction), ``_changelog`` (the writer,
and the reader of restores and standbys), ``_state_txn`` (the writer with exactly-once),
``_assignor`` (the sticky, standby-aware assignment).
"""

from __future__ import annotations

from decaton_aio.consumer.state._state import StateCollector, StateStore
from decaton_aio.consumer.state._store import LocalStore

__all__ = ["LocalStore", "StateCollector", "StateStore"]
