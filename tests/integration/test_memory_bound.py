"""Memory bounded in bytes: 1 MB records, far more of them than the pending-bytes limit
(``decaton.max.pending.bytes.total``, 256 MB by default), fetched much faster than they
are processed. The process's peak RSS stays under the limit plus a fixed overhead, no
record is lost and each key's records run in offset order."""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from decaton_aio.testing import BrokerHandle, wait_until

pytestmark = pytest.mark.integration

RECORDS = 400  # 400 MB: well over the limit
LIMIT_MB = 256  # the default decaton.max.pending.bytes.total
# The README's figure: interpreter, clients, a fetch in flight (Tansu, which does not keep
# to the fetch size limits, needs the most: 342-357 MB at its peak).
OVERHEAD_MB = 150

APP = textwrap.dedent(
    """
    import asyncio, os
    from decaton_aio import Application, BytesSerializer

    LOG = open(os.environ["MEMORY_LOG"], "a", buffering=1)

    async def process(ctx, task):
        await asyncio.sleep(2.0)  # slow: records pile up unless fetching is paused
        LOG.write(f"{ctx.partition} {ctx.offset} {ctx.key.decode()} {len(task)}\\n")

    app = Application(process, topics=("unused",), serializer=BytesSerializer())
    """
)


def peak_rss_mb(pid: int) -> int:
    """The process's peak resident set size so far (``VmHWM``), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) // 1024
    raise AssertionError(f"no VmHWM for process {pid}")


@pytest.mark.timeout(300)
async def test_pending_bytes_bound_the_memory_of_large_records(
    kafka_broker: BrokerHandle, topic_factory: Any, tmp_path: Path
) -> None:
    if not kafka_broker.is_embedded or sys.platform != "linux":
        pytest.skip("measures a local process's RSS (Linux /proc) next to the embedded broker")
    topic = await topic_factory(partitions=8, configs={"max.message.bytes": str(2 << 20)})
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka_broker.bootstrap_servers, max_request_size=2 << 20, linger_ms=5
    )
    await producer.start()
    try:
        sent = [
            await producer.send(topic, os.urandom(1 << 20), key=b"k%d" % (n % 50))
            for n in range(RECORDS)
        ]
        produced = {(m.partition, m.offset) for m in await asyncio.gather(*sent)}
    finally:
        await producer.stop()

    (tmp_path / "memory_app.py").write_text(APP)
    log = tmp_path / "processed.log"
    log.touch()
    argv = [sys.executable, "-m", "decaton_aio", "run", "memory_app:app", "--topic", topic]
    argv += ["--bootstrap-servers", kafka_broker.bootstrap_servers]
    argv += ["--group", f"memory-{uuid.uuid4().hex[:8]}"]
    argv += ["--property", "decaton.partition.concurrency=1000"]
    env = {**os.environ, "MEMORY_LOG": str(log), "PYTHONPATH": str(tmp_path)}
    with (tmp_path / "run.err").open("wb") as stderr:
        process = await asyncio.create_subprocess_exec(
            *argv, cwd=tmp_path, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=stderr
        )
    peak = 0
    try:

        def done() -> bool:
            nonlocal peak
            assert process.returncode is None, (tmp_path / "run.err").read_text()[-2000:]
            peak = max(peak, peak_rss_mb(process.pid))
            return len(log.read_text().splitlines()) >= RECORDS

        await wait_until(done, what=f"{RECORDS} records processed", timeout_s=240)
        peak = max(peak, peak_rss_mb(process.pid))
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), 30)
    lines = [line.split() for line in log.read_text().splitlines()]
    seen = {(int(p), int(o)) for p, o, _, _ in lines}
    assert seen == produced  # nothing lost
    assert all(int(size) == 1 << 20 for *_, size in lines)
    by_key: dict[tuple[str, str], list[int]] = defaultdict(list)
    for partition, offset, key, _ in lines:
        by_key[(partition, key)].append(int(offset))
    assert all(offsets == sorted(offsets) for offsets in by_key.values())  # order kept
    print(f"memory bound: {RECORDS} records of 1 MB, peak RSS {peak} MB")
    assert peak < LIMIT_MB + OVERHEAD_MB, f"peak RSS {peak} MB"
