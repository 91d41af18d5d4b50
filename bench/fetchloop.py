"""The fetch loops alone: aiokafka's fetcher and the consumer's own
(`decaton_aio.consumer.fetch.Fetcher`) fetching the same paced topic, one at a time, each
in a process of its own, for ``python -m bench.cycles --fetch-loops``.

A child (``python -m bench.fetchloop IMPL ...``, on uvloop as the runtime) assigns every
partition of the topic at its end (once every partition is placed there) and calls
``getmany(timeout_ms=100, max_records=2000)`` as the runtime's fetch routine does, each
record made the runtime's `TaskRecord`, the fetch pacing switched between the runtime's
idle and busy settings after each call as its pacer does (1 byte or 100 ms idle, 16 KiB
or 5 ms while records flow). After a warm-up it prints ``open``, then,
after the window, one JSON line: its calls (cycles), its own CPU (every thread) and its
records over the window, and for ours the requests it sent of each kind.

The parent (`measure_fetch_loops()`) starts an embedded broker, produces to a fresh topic
of each partition count at each rate (records of the S1 shape: a ``dt_meta`` header and a
small value), runs each loop in turn under that load and notes the broker's CPU and the
machine's over each window.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["IMPLS", "fetch_loop_table", "main", "measure_fetch_loops"]

#: The loops measured: aiokafka's fetcher as the runtime uses it, ours with fetch
#: sessions, ours with every request full (no session); ``none`` fetches nothing (the
#: broker's CPU for the producing alone, its records counted as produced at the rate).
IMPLS = ("aiokafka", "ours", "ours-sessionless", "none")

_ROOT = Path(__file__).absolute().parent.parent
_IDLE = (1, 100)
_BUSY = (16 * 1024, 5)
_TIMEOUT_MS = 100
_MAX_RECORDS = 2000
_META = bytes.fromhex("0880a0c7c3e7b2f2021204626e63681a0570616365642805")  # dt_meta-like


# ------------------------------------------------------------------ the child


async def _child(args: argparse.Namespace) -> None:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from bench.procs import own_cpu
    from decaton_aio._aiokafka import AIOKafkaClient, set_fetch_pacing
    from decaton_aio.consumer._records import RAW_RECORDS, install_raw_records, task_record
    from decaton_aio.consumer.fetch import FetchConfig, Fetcher

    if args.impl == "none":
        await asyncio.sleep(args.warmup_s)
        print("open", flush=True)
        cpu0 = own_cpu()
        await asyncio.sleep(args.window_s)
        idle = {"cycles": 0, "cpu_s": round(own_cpu() - cpu0, 4), "window_s": args.window_s}
        print(json.dumps({**idle, "records": 0}), flush=True)
        return
    tps = [TopicPartition(args.topic, p) for p in range(args.partitions)]
    stop: list[Any] = []
    counters: Any = None
    if args.impl == "aiokafka":
        install_raw_records()
        consumer = AIOKafkaConsumer(
            bootstrap_servers=args.bootstrap,
            enable_auto_commit=False,
            key_deserializer=RAW_RECORDS,
            fetch_min_bytes=_IDLE[0],
            fetch_max_wait_ms=_IDLE[1],
            auto_offset_reset="latest",
        )
        await consumer.start()
        consumer.assign(tps)
        await consumer.seek_to_end(*tps)
        getmany = consumer.getmany

        def pace(busy: bool) -> None:
            set_fetch_pacing(consumer, *(_BUSY if busy else _IDLE))

        stop.append(consumer.stop)
    else:
        client = AIOKafkaClient(bootstrap_servers=args.bootstrap)
        await client.bootstrap()
        config = FetchConfig(
            min_bytes=_IDLE[0],
            max_wait_ms=_IDLE[1],
            auto_offset_reset="latest",
            sessions=args.impl == "ours",
        )
        fetcher = Fetcher(client, config)
        await fetcher.start()
        for tp in tps:
            fetcher.assign(tp)
        while any(fetcher.position(tp) is None for tp in tps):  # placed at the end first
            await fetcher.getmany(timeout_ms=_TIMEOUT_MS)
        getmany = fetcher.getmany  # type: ignore[assignment]

        def pace(busy: bool) -> None:
            fetcher.set_pacing(*(_BUSY if busy else _IDLE))

        stop += [fetcher.stop, client.close]
        counters = fetcher.counters
    loop = asyncio.get_running_loop()
    began = loop.time()
    opened_at: float | None = None
    cpu0 = 0.0
    before: dict[str, int] = {}
    cycles = records = 0
    busy = False
    while True:
        now = loop.time()
        if opened_at is None and now - began >= args.warmup_s:
            opened_at, cpu0, cycles, records = now, own_cpu(), 0, 0
            before = dict(vars(counters)) if counters is not None else {}
            print("open", flush=True)
        elif opened_at is not None and now - opened_at >= args.window_s:
            break
        batches = await getmany(timeout_ms=_TIMEOUT_MS, max_records=_MAX_RECORDS)
        for batch in batches.values():
            for record in batch:
                task_record(record)
            records += len(batch)
        if bool(batches) is not busy:
            busy = bool(batches)
            pace(busy)
        cycles += 1
    assert opened_at is not None
    window_s = loop.time() - opened_at
    cpu_s = own_cpu() - cpu0
    row: dict[str, Any] = {
        "cycles": cycles,
        "cpu_s": round(cpu_s, 4),
        "window_s": round(window_s, 3),
        "records": records,
    }
    if counters is not None:
        after = vars(counters)
        for name in ("requests", "full_requests", "incremental_requests", "bytes"):
            row[name] = after[name] - before.get(name, 0)
    print(json.dumps(row), flush=True)
    for close in stop:
        await close()


# ------------------------------------------------------------------ the parent


async def _produce(servers: str, topic: str, partitions: int, rate: float) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=servers, linger_ms=5, acks=1)
    await producer.start()
    loop = asyncio.get_running_loop()
    tick_s = 0.01
    carry, sent = 0.0, 0
    next_at = loop.time()
    try:
        while True:
            carry += rate * tick_s
            count, carry = int(carry), carry - int(carry)
            for _ in range(count):
                await producer.send(
                    topic,
                    b"v" * 64,
                    key=f"k{sent % 10_000}".encode(),
                    partition=sent % partitions,
                    headers=[("dt_meta", _META)],
                )
                sent += 1
            next_at += tick_s
            await asyncio.sleep(max(0.0, next_at - loop.time()))
    finally:
        await producer.stop()


async def _one_loop(
    impl: str, servers: str, topic: str, partitions: int, args: Any, broker_pids: list[int]
) -> dict[str, Any]:
    from bench.procs import cpu_delta, cpu_times, machine_times

    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.fetchloop",
        impl,
        "--bootstrap",
        servers,
        "--topic",
        topic,
        "--partitions",
        str(partitions),
        "--warmup-s",
        str(args.warmup_s),
        "--window-s",
        str(args.window_s),
        stdout=asyncio.subprocess.PIPE,
        cwd=_ROOT,
    )
    assert proc.stdout is not None
    broker0: dict[int, float] = {}
    machine0: Any = None
    row: dict[str, Any] = {"event": "error"}
    async with asyncio.timeout(args.warmup_s + args.window_s + 60):
        async for raw in proc.stdout:
            line = raw.decode().strip()
            if line == "open":
                broker0, machine0 = cpu_times(broker_pids), machine_times()
            elif line.startswith("{"):
                broker_s = cpu_delta(broker0, cpu_times(broker_pids))
                machine1 = machine_times()
                row = json.loads(line)
                row["broker_cpu_s"] = round(broker_s, 4)
                if machine0 is not None:
                    row["machine_busy"] = round(
                        (machine1.busy - machine0.busy) / row["window_s"], 2
                    )
        await proc.wait()
    return row


def loop_figures(row: dict[str, Any]) -> dict[str, Any]:
    """Cycles per second, CPU ms per cycle, CPU and broker CPU s per 1,000 records."""
    window, cycles, records = row["window_s"], row["cycles"], row["records"]
    return {
        "cycles_per_s": round(cycles / window, 1) if window else None,
        "cpu_ms_per_cycle": round(row["cpu_s"] * 1000 / cycles, 3) if cycles else None,
        "cpu_cores": round(row["cpu_s"] / window, 3) if window else None,
        "records_per_s": round(records / window) if window else None,
        "cpu_s_per_1000": round(row["cpu_s"] * 1000 / records, 4) if records else None,
        "broker_cpu_s_per_1000": (
            round(row["broker_cpu_s"] * 1000 / records, 4) if records else None
        ),
    }


async def _create(admin: Any, partitions: int) -> str:
    # A loaded machine's broker may refuse topics for a while after it answers.
    for attempt in range(30):
        try:
            topic: str = await admin.create(partitions, prefix=f"fetchloop-p{partitions}")
            return topic
        except Exception:
            if attempt == 29:
                raise
            await asyncio.sleep(2)
    raise AssertionError("unreachable")


async def measure_fetch_loops(args: Any, record: Any, say: Any) -> None:
    """Each loop of ``args.impls`` on a fresh topic of each of ``args.partitions`` at
    each of ``args.rates`` (records/s); each row goes to ``record``."""
    from bench import reaper
    from decaton_aio.embedded import EmbeddedBroker
    from decaton_aio.testing import TopicAdmin

    broker = EmbeddedBroker(
        flavor="apache",
        log_path=args.workdir / "broker.log",
        startup_timeout_s=240,  # a shared machine may start it slowly
    )
    reaper.adopt_broker(broker)
    broker.start()
    admin = TopicAdmin(broker.bootstrap_servers)
    try:
        for partitions in args.partitions:
            topic = await _create(admin, partitions)
            for rate in args.rates:
                producing = asyncio.get_running_loop().create_task(
                    _produce(broker.bootstrap_servers, topic, partitions, rate)
                )
                try:
                    await asyncio.sleep(args.warmup_s)  # the topic's partitions all ready
                    for impl in args.impls:
                        say(f"fetch loop {impl}: {partitions} partitions, {rate:,.0f} records/s")
                        row = await _one_loop(
                            impl, broker.bootstrap_servers, topic, partitions, args, broker.pids
                        )
                        row.update(event="fetch_loop", impl=impl, partitions=partitions, rate=rate)
                        if impl == "none" and "window_s" in row:
                            row["records"] = round(rate * row["window_s"])
                        if "cycles" in row:
                            row.update(loop_figures(row))
                        record(row)
                finally:
                    producing.cancel()
                    await asyncio.gather(producing, return_exceptions=True)
    finally:
        await admin.close(delete=False)
        broker.stop()
        reaper.release_broker(broker)


def _fmt(value: Any, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def fetch_loop_table(rows: list[dict[str, Any]]) -> list[str]:
    """Markdown lines: each fetch loop's figures (rows of ``event: fetch_loop``)."""
    rows = [r for r in rows if r.get("event") == "fetch_loop" and "cycles" in r]
    if not rows:
        return []
    lines = [
        "## Fetch loops alone",
        "",
        "Each loop in a process of its own, fetching every partition of a topic produced "
        "to at the rate given, `getmany(timeout_ms=100, max_records=2000)` as the runtime "
        "calls it with its pacing (`bench/fetchloop.py`): calls per second, the process's "
        "CPU per call and per 1,000 records, the broker's CPU per 1,000 records, the "
        "requests ours sent (incremental of them) and the cores busy on the whole machine.",
        "",
        "| partitions | rate /s | loop | records /s | cycles /s | CPU ms / cycle | "
        "cores | CPU s / 1000 | broker CPU s / 1000 | requests (incremental) | "
        "machine busy |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        requests = "-"
        if "requests" in r:
            requests = f"{r['requests']:,} ({r['incremental_requests']:,})"
        lines.append(
            f"| {r['partitions']} | {_fmt(r['rate'])} | {r['impl']} | "
            f"{_fmt(r.get('records_per_s'))} | {_fmt(r.get('cycles_per_s'), 1)} | "
            f"{_fmt(r.get('cpu_ms_per_cycle'), 3)} | {_fmt(r.get('cpu_cores'), 3)} | "
            f"{_fmt(r.get('cpu_s_per_1000'), 4)} | {_fmt(r.get('broker_cpu_s_per_1000'), 4)} | "
            f"{requests} | {_fmt(r.get('machine_busy'), 2)} |"
        )
    lines.append("")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fetchloop")
    parser.add_argument("impl", choices=IMPLS)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--partitions", type=int, required=True)
    parser.add_argument("--warmup-s", type=float, default=3.0)
    parser.add_argument("--window-s", type=float, default=15.0)
    import uvloop  # the runtime's event loop

    uvloop.run(_child(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
