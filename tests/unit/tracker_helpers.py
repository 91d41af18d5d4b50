"""What the watermark tracker tests need beyond the API the package uses.

``register(tracker, offset)`` registers a single offset through ``register_batch`` (the
call the runtime makes); ``capacity(tracker)`` reads how many ring slots the tracker has
allocated; ``completed_offsets(base, bitmap)`` decodes a bitmap of
``WatermarkTracker.export_completed`` into the offsets it marks.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from decaton_aio.consumer._watermark import WatermarkTracker

__all__ = ["capacity", "completed_offsets", "register"]


def register(tracker: WatermarkTracker, offset: int) -> bool:
    """Register one fetched offset as pending.

    Returns:
        ``True`` when an imported checkpoint marks the offset as already completed: it is
        registered as done then. Raises what ``register_batch`` raises.
    """
    return bool(tracker.register_batch([offset]).size)


def capacity(tracker: WatermarkTracker) -> int:
    """Ring slots the tracker has allocated (one byte each)."""
    return len(tracker._buf)


def completed_offsets(base: int, bitmap: bytes) -> npt.NDArray[np.int64]:
    """The offsets an exported bitmap marks as needing no processing, in increasing order:
    completed records, and gap offsets that were never delivered (bit ``i``, most
    significant first, is offset ``base + i``)."""
    bits = np.unpackbits(np.frombuffer(bitmap, dtype=np.uint8))
    return np.flatnonzero(bits).astype(np.int64) + base
