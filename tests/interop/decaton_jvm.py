"""Decaton's own client and processor, run from tests through bench/java's interop driver.

:func:`decaton_produce` puts tasks with ``DecatonClient``; :class:`DecatonSubscription`
runs a ``ProcessorSubscription`` and collects what it processed. Each starts one JVM.
Task bodies are Decaton's sample protobuf ``HelloTask`` (``hello_task_class()``) unless a
subscription reads raw bytes.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from types import TracebackType
from typing import Any

from bench.jvm import JvmBuild
from decaton_aio.testing import BrokerHandle

__all__ = ["MAIN", "DecatonSubscription", "decaton_produce", "unb64"]

MAIN = "io.github.decatonaio.bench.interop.InteropDriver"
_TIMEOUT_S = 90.0


def unb64(value: str | None) -> bytes | None:
    """Bytes from the driver's base64 (``None`` stays ``None``)."""
    return None if value is None else base64.b64decode(value)


def _broker_args(broker: BrokerHandle) -> list[str]:
    args = ["--bootstrap-servers", broker.bootstrap_servers]
    return args if broker.supports_idempotence else [*args, "--no-idempotence"]


async def decaton_produce(
    build: JvmBuild,
    broker: BrokerHandle,
    topic: str,
    tasks: list[dict[str, Any]],
    *,
    legacy: bool = False,
    application_id: str = "decaton-interop",
    instance_id: str = "decaton-interop-1",
) -> list[tuple[int, int]]:
    """Put ``tasks`` (the driver's JSON lines) with DecatonClient; their (partition,
    offset), in order."""
    argv = ["produce", "--topic", topic, *_broker_args(broker)]
    argv += ["--application-id", application_id, "--instance-id", instance_id]
    if legacy:
        argv.append("--legacy")
    process = await asyncio.create_subprocess_exec(
        *build.command(MAIN, *argv),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    lines = "".join(json.dumps(task) + "\n" for task in tasks).encode()
    out, err = await asyncio.wait_for(process.communicate(lines), _TIMEOUT_S)
    if process.returncode != 0:
        raise AssertionError(f"DecatonClient exited {process.returncode}:\n{err.decode()[-3000:]}")
    puts = [json.loads(line) for line in out.decode().splitlines()]
    return [(put["partition"], put["offset"]) for put in puts if put.get("event") == "put"]


class DecatonSubscription:
    """A Decaton ``ProcessorSubscription`` in a JVM, as an async context manager.

    Args:
        build: the built Java project.
        broker: the broker.
        topic: the task topic (with retries on, ``<topic>-retry`` is consumed too).
        group: the consumer group.
        body: ``"hello"`` (HelloTask, decoded by Decaton) or ``"bytes"``.
        retry_backoff_ms: turns Decaton's retry queueing on with this backoff.
        retry_key_prefix: tasks whose key starts with it are retried once.
        legacy_parse_fallback: ``decaton.legacy.parse.fallback.enabled``.
        sleep_ms: each task's processing time (a sleep of the processing thread).
        commit_interval_ms: ``decaton.commit.interval.ms`` (Decaton's default: 1000).
    """

    def __init__(
        self,
        build: JvmBuild,
        broker: BrokerHandle,
        topic: str,
        group: str,
        *,
        body: str = "hello",
        retry_backoff_ms: int | None = None,
        retry_key_prefix: str | None = None,
        legacy_parse_fallback: bool = False,
        sleep_ms: int = 0,
        commit_interval_ms: int | None = None,
    ) -> None:
        argv = ["subscribe", "--topic", topic, "--group", group, "--body", body]
        argv += _broker_args(broker)
        if retry_backoff_ms is not None:
            argv += ["--retry-backoff-ms", str(retry_backoff_ms)]
        if retry_key_prefix is not None:
            argv += ["--retry-key-prefix", retry_key_prefix]
        if legacy_parse_fallback:
            argv.append("--legacy-parse-fallback")
        if sleep_ms:
            argv += ["--sleep-ms", str(sleep_ms)]
        if commit_interval_ms is not None:
            argv += ["--commit-interval-ms", str(commit_interval_ms)]
        self._command = build.command(MAIN, *argv)
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._errors: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        self._stderr = b""
        self.tasks: list[dict[str, Any]] = []
        self.states: list[str] = []
        #: Every task and state event, in the order the driver wrote them.
        self.events: list[dict[str, Any]] = []

    async def __aenter__(self) -> DecatonSubscription:
        self._process = await asyncio.create_subprocess_exec(
            *self._command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        self._reader = asyncio.create_task(self._read())
        self._errors = asyncio.create_task(self._read_stderr())
        return self

    async def _read_stderr(self) -> None:
        # Drained as it comes, so a chatty JVM never blocks on a full pipe.
        assert self._process is not None
        assert self._process.stderr is not None
        async for line in self._process.stderr:
            self._stderr = (self._stderr + line)[-6000:]

    async def _read(self) -> None:
        assert self._process is not None
        assert self._process.stdout is not None
        async for line in self._process.stdout:
            event = json.loads(line)
            self.events.append(event)
            if event["event"] == "task":
                self.tasks.append(event)
            elif event["event"] == "state":
                self.states.append(event["state"])
            self._changed.set()
        self._changed.set()  # the process ended

    async def wait_tasks(self, count: int, timeout_s: float = _TIMEOUT_S) -> list[dict[str, Any]]:
        """Wait until Decaton processed ``count`` tasks; all it processed so far."""
        assert self._process is not None

        async def enough() -> None:
            while len(self.tasks) < count:
                if self._process is not None and self._process.returncode is not None:
                    break
                self._changed.clear()
                await self._changed.wait()

        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(enough(), timeout_s)
        if len(self.tasks) < count:
            done = [(t["topic"], t["offset"], t["key"]) for t in self.tasks]
            raise AssertionError(
                f"Decaton processed {len(self.tasks)} of {count} tasks {done} "
                f"(states {self.states}, "
                f"exit {self._process.returncode}):\n{self._stderr.decode(errors='replace')}"
            )
        return self.tasks

    async def kill(self) -> None:
        """SIGKILL the JVM: no close, no last commit, no leave-group."""
        assert self._process is not None
        if self._process.returncode is None:
            self._process.kill()
        await self._process.wait()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        process = self._process
        if process is None:
            return
        assert process.stdin is not None
        if process.returncode is None:
            process.stdin.close()  # the driver closes the subscription and exits
            try:
                await asyncio.wait_for(process.wait(), 30)
            except TimeoutError:
                process.kill()
                await process.wait()
        for reader in (self._reader, self._errors):
            if reader is not None:
                await reader
