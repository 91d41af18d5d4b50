"""The overlay of open transactions' state changes over a local copy (exactly-once): reads
see open changes, a commit applies them with their offsets, an abort drops them, and the
copy's checkpoint never covers a change that is still open."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from decaton_aio.consumer.state import LocalStore
from decaton_aio.consumer.state._overlay import MISSING, Overlay

OWNERS = ("a", "b")
KEYS = (b"x", b"y", b"z")

operations = st.lists(
    st.one_of(
        st.tuples(
            st.just("stage"),
            st.sampled_from(OWNERS),
            st.sampled_from(KEYS),
            st.one_of(st.none(), st.binary(min_size=1, max_size=3)),
        ),
        st.tuples(st.just("commit"), st.sampled_from(OWNERS)),
        st.tuples(st.just("abort"), st.sampled_from(OWNERS)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(operations)
def test_reads_commits_and_aborts_follow_the_model(ops: list[tuple]) -> None:
    """Against a model (the committed copy plus each owner's open changes, sequenced):
    a read sees the newest open change of the key, else the copy; a commit puts the
    owner's changes into the copy and supersedes older open changes of the same keys; an
    abort forgets the owner's changes. The copy's position passes every committed offset
    only when nothing below it is open, and never an open change's offset."""
    store = LocalStore(None)
    store.overlay = overlay = Overlay()
    copy: dict[bytes, bytes] = {}
    open_: dict[str, dict[bytes, tuple[int, bytes | None]]] = {o: {} for o in OWNERS}
    open_offsets: dict[str, list[int]] = {o: [] for o in OWNERS}
    sequence = 0
    offset = 0  # the broker's next changelog offset
    committed_end = 0  # past the last committed change
    for op in ops:
        if op[0] == "stage":
            _, owner, key, value = op
            sequence += 1
            open_[owner][key] = (sequence, value)
            staged = overlay.stage(owner, key, value)
            staged.offset = offset
            open_offsets[owner].append(offset)
            offset += 1
        elif op[0] == "commit":
            owner = op[1]
            for key, (seq, value) in open_[owner].items():
                if value is None:
                    copy.pop(key, None)
                else:
                    copy[key] = value
                for other in OWNERS:
                    if other != owner and key in open_[other] and open_[other][key][0] < seq:
                        del open_[other][key]
            committed_end = max([committed_end] + [o + 1 for o in open_offsets[owner]])
            open_[owner], open_offsets[owner] = {}, []
            store.apply_committed(overlay.take(owner))
            offset += 1  # the commit marker
            if not any(open_offsets.values()):
                assert store.position == committed_end
        else:
            owner = op[1]
            dropped = overlay.discard(owner)
            assert dropped == len(open_offsets[owner])
            open_[owner], open_offsets[owner] = {}, []
            offset += 1  # the abort marker
        for key in KEYS:
            newest = max(
                (open_[o][key] for o in OWNERS if key in open_[o]),
                default=None,
                key=lambda entry: entry[0],
            )
            expected = newest[1] if newest is not None else copy.get(key)
            assert store.get(key) == expected
        still_open = [o for offsets in open_offsets.values() for o in offsets]
        if still_open:
            assert store.position <= min(still_open)
    store.close()


def test_an_aborted_change_never_reaches_the_file(tmp_path: Path) -> None:
    """A change of a transaction that aborted is read while open, gone after the abort,
    and neither its value nor its offset is in the flushed file; a committed one is, with
    the checkpoint just past it."""
    path = tmp_path / "0.sqlite"
    store = LocalStore(path)
    store.overlay = overlay = Overlay()
    overlay.stage("t", b"k", b"1").offset = 0
    assert store.get(b"k") == b"1"
    assert overlay.discard("t") == 1
    assert store.get(b"k") is None
    store.flush()
    assert store.checkpoint == 0
    overlay.stage("t", b"k", b"2").offset = 2  # after the abort marker
    store.apply_committed(overlay.take("t"))
    assert overlay.lookup(b"k") is MISSING
    store.close()
    again = LocalStore(path)
    assert (again.get(b"k"), again.checkpoint) == (b"2", 3)
    again.close()


def test_a_change_without_an_offset_holds_the_position_back() -> None:
    """While another transaction's change has no offset yet (its send is in flight), a
    commit applies its own values but does not move the checkpoint: the unknown offset
    may be below them."""
    store = LocalStore(None)
    store.overlay = overlay = Overlay()
    overlay.stage("a", b"k", b"1")  # offset not known yet
    overlay.stage("b", b"j", b"2").offset = 5
    store.apply_committed(overlay.take("b"))
    assert (store.get(b"j"), store.position) == (b"2", 0)
    overlay.discard("a")
    overlay.stage("b", b"j", b"3").offset = 7
    store.apply_committed(overlay.take("b"))
    assert store.position == 8
    store.close()


def test_a_delete_in_an_open_transaction_hides_the_committed_value() -> None:
    """A staged tombstone reads as no value until it aborts (the copy's value is back) or
    commits (the key is gone)."""
    store = LocalStore(None)
    store.replay(b"k", b"old", 0)
    store.overlay = overlay = Overlay()
    overlay.stage("t", b"k", None).offset = 1
    assert store.get(b"k") is None
    overlay.discard("t")
    assert store.get(b"k") == b"old"
    overlay.stage("t", b"k", None).offset = 3
    store.apply_committed(overlay.take("t"))
    assert store.get(b"k") is None
    assert len(overlay) == 0
    store.close()
