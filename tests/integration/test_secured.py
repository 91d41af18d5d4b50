"""Every client of the library on a secured Apache Kafka: SASL_SSL (SCRAM) and mutual TLS.

One secured embedded broker serves the whole session (``secured_kafka_broker`` and
``mtls_kafka_broker`` are its two listeners). The CLI tests run the real command line in
subprocesses; every byte they print is checked for the password.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import os
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from decaton_aio import (
    Application,
    BytesSerializer,
    JsonSerializer,
    ProcessingContext,
    ProducerConfig,
    RetryConfig,
    RetryPolicy,
    SecurityError,
    SecuritySettings,
    Subscription,
    TaskProducer,
)
from decaton_aio.cli import EXIT_NOPERM
from decaton_aio.embedded._tls import CertificateAuthority
from decaton_aio.offsets import group_positions
from decaton_aio.properties import KafkaPropertySource, encode_record
from decaton_aio.testing import BrokerHandle, drain, read_records, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture(params=["SASL_SSL", "MTLS"])
def secured(request: pytest.FixtureRequest) -> BrokerHandle:
    """Each test runs once on the SASL_SSL listener and once on the mutual TLS one."""
    name = "secured_kafka_broker" if request.param == "SASL_SSL" else "mtls_kafka_broker"
    handle: BrokerHandle = request.getfixturevalue(name)
    return handle


def _password(handle: BrokerHandle) -> str:
    assert handle.embedded is not None
    sasl = handle.embedded.listeners["SASL_SSL"].security
    assert sasl.sasl_password
    return sasl.sasl_password


async def test_python_clients_run_retry_dead_letter_property_topic_and_inspect(
    secured: BrokerHandle, tmp_path: Path
) -> None:
    """Over the secured listener: topics are created, tasks produced, a processor runs
    them (one retried then dead-lettered), the property topic is read, the dead letter
    topic read back, and the group's committed positions reach the end."""
    admin = secured.topic_admin()
    try:
        topic = await admin.create(2, prefix="secured")
        props_topic = await admin.create(1, prefix="secured-props")
    finally:
        await admin.close(delete=False)
    producer = TaskProducer(secured.producer_config(), topic, JsonSerializer(dict))
    async with producer:
        for i in range(20):
            await producer.put(f"k{i % 5}", {"n": i, "fail": i == 7})
        key, body = encode_record("decaton.partition.concurrency", 4)
        assert producer.sender is not None
        await producer.sender.send(props_topic, body, key=key)

    loaded = await KafkaPropertySource(
        secured.bootstrap_servers, props_topic, security=secured.security
    ).load()
    assert loaded == {"decaton.partition.concurrency": 4}

    async def process(ctx: ProcessingContext, task: dict[str, Any]) -> None:
        if task["fail"]:
            raise ValueError("task 7 always fails")

    retry = RetryConfig(RetryPolicy(max_attempts=2, backoff_base_ms=50, backoff_max_ms=50))
    app = Application(
        process, topics=(topic,), serializer=JsonSerializer(dict), retry=retry, properties=loaded
    )
    group = f"secured-{uuid.uuid4().hex[:8]}"
    result = await drain(
        app, secured.bootstrap_servers, expected=21, group_id=group, security=secured.security
    )
    assert len(result.processed) == 19
    assert len(result.failures) == 2  # the first attempt and its retry
    dead = await read_records(
        secured.bootstrap_servers, f"{topic}-dlq", 1, security=secured.security
    )
    assert json.loads(dead[0].value)["n"] == 7
    positions = await group_positions(
        secured.bootstrap_servers, group, topic, security=secured.security
    )
    assert sum(p.lag for p in positions) == 0
    assert sum(p.high_watermark for p in positions) == 20


async def topic_with_tasks(secured: BrokerHandle, prefix: str, partitions: int, n: int) -> str:
    """A new topic holding ``n`` tasks, keys ``k<i>`` and bodies ``<i>``."""
    admin = secured.topic_admin()
    try:
        topic = await admin.create(partitions, prefix=prefix)
    finally:
        await admin.close(delete=False)
    producer = TaskProducer(secured.producer_config(), topic, BytesSerializer())
    async with producer:
        for i in range(n):
            await producer.put(f"k{i}", str(i).encode())
    return topic


@pytest.mark.parametrize("metadata_max", [4096, 0], ids=["commit-metadata", "checkpoint-topic"])
async def test_checkpoints_are_saved_and_loaded_over_the_secured_listener(
    secured: BrokerHandle, metadata_max: int
) -> None:
    """A task stuck at offset 3 holds the commit there while later tasks finish; the
    checkpoint (in the commit metadata, or the checkpoint topic when the metadata may hold
    none) reaches the secured cluster, so the group's next run processes offset 3 only,
    and no checkpoint read fails on the way."""
    topic = await topic_with_tasks(secured, "secured-checkpoints", 1, 12)
    group = f"secured-cp-{uuid.uuid4().hex[:8]}"
    stuck = asyncio.Event()
    finished: list[int] = []

    async def process(ctx: ProcessingContext, task: bytes) -> None:
        if ctx.offset == 3:
            await stuck.wait()
        finished.append(ctx.offset)

    properties = {
        "decaton.commit.interval.ms": 100,
        "decaton.processing.shutdown.timeout.ms": 200,
    }
    app = Application(process, topics=(topic,), properties=properties)
    with capture_logs() as logs:
        async with secured.subscription(app, group, commit_metadata_max_bytes=metadata_max):
            await wait_until(lambda: len(finished) == 11, what="11 finished tasks")
        # stopped with offset 3 unfinished: the last commit holds 3 and the 8 done above it
        stuck.set()
        again: list[int] = []

        async def rerun(ctx: ProcessingContext, task: bytes) -> None:
            again.append(ctx.offset)

        await drain(
            Application(rerun, topics=(topic,)),
            secured.bootstrap_servers,
            expected=1,
            group_id=group,
            security=secured.security,
        )
    assert again[0] == 3
    loaded = [e for e in logs if e["event"] == "checkpoint loaded"]
    assert [(e["committed"], e["done_above"]) for e in loaded] == [(3, 8)], loaded
    failed = [e for e in logs if e["log_level"] != "info" and "checkpoint" in e["event"]]
    assert not failed, failed


async def test_exactly_once_outputs_over_the_secured_listener(secured: BrokerHandle) -> None:
    """Exactly-once on a secured cluster: the transactional producers connect with the
    subscription's TLS and SASL settings, every task's output is committed, and so is the
    group's offset."""
    topic = await topic_with_tasks(secured, "secured-eo", 2, 10)
    outputs = await topic_with_tasks(secured, "secured-eo-out", 1, 0)

    async def process(ctx: ProcessingContext, task: bytes) -> None:
        await ctx.produce(outputs, task, key=ctx.key)

    app = Application(process, topics=(topic,), exactly_once=True)
    group = f"secured-eo-{uuid.uuid4().hex[:8]}"
    await drain(
        app, secured.bootstrap_servers, expected=10, group_id=group, security=secured.security
    )
    written = await read_records(secured.bootstrap_servers, outputs, 10, security=secured.security)
    assert sorted(int(r.value) for r in written) == list(range(10))
    positions = await group_positions(
        secured.bootstrap_servers, group, topic, security=secured.security
    )
    assert sum(p.lag for p in positions) == 0


async def test_durable_producer_replays_its_spool_to_the_secured_cluster(
    secured: BrokerHandle, tmp_path: Path
) -> None:
    """Tasks spooled while no broker answered are delivered over TLS (and SASL) by the
    next producer that opens the spool."""
    admin = secured.topic_admin()
    try:
        topic = await admin.create(1, prefix="secured-spool")
    finally:
        await admin.close(delete=False)
    spool = tmp_path / "spool"
    nowhere = dataclasses.replace(
        secured.producer_config(spool_dir=spool, request_timeout_ms=1000),
        bootstrap_servers="127.0.0.1:1",
    )
    async with TaskProducer(nowhere, topic, BytesSerializer()) as offline:
        spooled = [await offline.put(f"k{i}", b"task") for i in range(5)]
    assert all(where.spooled for where in spooled)

    async with TaskProducer(
        secured.producer_config(spool_dir=spool), topic, BytesSerializer()
    ) as online:
        assert online.sender is not None
        await online.sender.wait_drained(timeout_s=30)
    records = await read_records(secured.bootstrap_servers, topic, 5, security=secured.security)
    assert sorted(r.key for r in records) == [f"k{i}".encode() for i in range(5)]


# ----------------------------------------------------------------------------- the CLI

APP = textwrap.dedent(
    """
    import os
    from decaton_aio import Application, JsonSerializer

    async def process(ctx, task):
        if task.get("fail"):
            raise ValueError("this one fails")
        with open(os.environ["DONE_FILE"], "a") as out:
            out.write(ctx.key.decode() + "\\n")

    app = Application(process, topics=("unused",), serializer=JsonSerializer(dict))
    """
)


class Outputs:
    """Everything the CLI printed in one test, to check for the password at the end."""

    def __init__(self) -> None:
        self.text: list[str] = []

    async def run(self, *argv: str, cwd: Path, env: dict[str, str] | None = None) -> int:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "decaton_aio", *argv,
            cwd=cwd, env={**os.environ, **(env or {})},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 90)
        self.text += [out.decode(), err.decode()]
        assert proc.returncode is not None
        return proc.returncode


def _security_argv(handle: BrokerHandle, tmp_path: Path) -> list[str]:
    """The client.properties file for SASL_SSL, the individual flags for mutual TLS."""
    assert handle.embedded is not None
    sec = handle.security
    if sec.uses_sasl:
        listener = handle.embedded.listeners["SASL_SSL"]
        return ["--client-properties", str(listener.client_properties)]
    assert sec.ssl_cafile is not None
    assert sec.ssl_certfile is not None
    return [
        "--bootstrap-servers", handle.bootstrap_servers, "--security-protocol", "SSL",
        "--ssl-cafile", str(sec.ssl_cafile), "--ssl-certfile", str(sec.ssl_certfile),
    ]  # fmt: skip


@pytest.mark.timeout(300)  # three CLI runs, each with its own TLS handshakes
async def test_cli_produce_run_inspect_over_the_secured_listener(
    secured: BrokerHandle, tmp_path: Path
) -> None:
    """produce, run (retries, dead letters, a property topic that ignores a key) and
    inspect, each given only the security flags or a client.properties file; the
    password never shows in what they print."""
    admin = secured.topic_admin()
    try:
        topic = await admin.create(1, prefix="secured-cli")
        props_topic = await admin.create(1, prefix="secured-cli-props")
    finally:
        await admin.close(delete=False)
    async with TaskProducer(secured.producer_config(), props_topic, BytesSerializer()) as p:
        key, body = encode_record("decaton.ignore.keys", ["skip-me"])
        assert p.sender is not None
        await p.sender.send(props_topic, body, key=key)
    (tmp_path / "secured_app.py").write_text(APP)
    done = tmp_path / "done.txt"
    done.touch()
    lines = [{"key": f"k{i}", "task": {"n": i}} for i in range(6)]
    lines += [{"key": "skip-me", "task": {}}, {"key": "bad", "task": {"fail": True}}]
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(line) + "\n" for line in lines))
    security = _security_argv(secured, tmp_path)
    outputs = Outputs()

    code = await outputs.run(
        "produce", *security, "--topic", topic, "--file", str(tasks), cwd=tmp_path
    )
    assert code == 0, outputs.text
    assert "produced 8 tasks" in outputs.text[-2]

    group = f"cli-{uuid.uuid4().hex[:8]}"
    # Its debug log goes to files: a pipe nobody reads until the end fills up, and the
    # process then blocks on its next log line.
    out_path, err_path = tmp_path / "run.out", tmp_path / "run.err"
    with out_path.open("wb") as out_file, err_path.open("wb") as err_file:
        run = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "decaton_aio", "--log-level", "debug", "run", "secured_app:app",
            *security, "--topic", topic, "--group", group, "--properties-topic", props_topic,
            "--retry-max-attempts", "2", "--retry-backoff-ms", "50",
            "--session-timeout-ms", "6000", "--heartbeat-interval-ms", "500",
            cwd=tmp_path, env={**os.environ, "DONE_FILE": str(done)},
            stdout=out_file, stderr=err_file,
        )  # fmt: skip
    try:
        dead = await read_records(
            secured.bootstrap_servers, f"{topic}-dlq", 1, timeout_s=60, security=secured.security
        )
        assert dead[0].key == b"bad"
        await _until(lambda: len(done.read_text().split()) >= 6)
    finally:
        if run.returncode is None:
            run.terminate()
        await asyncio.wait_for(run.wait(), 60)
        err = err_path.read_text(errors="replace")
        outputs.text += [out_path.read_text(errors="replace"), err]
    assert run.returncode == 0, err[-2000:]
    assert sorted(done.read_text().split()) == [f"k{i}" for i in range(6)]  # not skip-me

    code = await outputs.run(
        "inspect", *security, "--group", group, "--topic", topic, "--json", cwd=tmp_path
    )
    assert code == 0, outputs.text
    rows = [json.loads(line) for line in outputs.text[-2].splitlines()]
    assert rows == [
        {"topic": topic, "partition": 0, "committed": 8, "high_watermark": 8, "lag": 0,
         "pending": None, "paused": None}
    ]  # fmt: skip
    assert not [text for text in outputs.text if _password(secured) in text]


async def _until(predicate: Any, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.1)


# ------------------------------------------------------------------------------ refusals


async def test_wrong_password_fails_at_once_with_an_authentication_error(
    secured_kafka_broker: BrokerHandle, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A wrong password ends produce (exit 77, one line saying authentication failed)
    and the Python clients' start with SecurityError: no hang, no retry loop, no secret
    in any message, log line, or the broker's log."""
    handle = secured_kafka_broker
    wrong = "not-the-password-" + uuid.uuid4().hex[:6]
    bad = handle.security.with_overrides(sasl_password=wrong)
    password_file = tmp_path / "password"
    password_file.write_text(wrong + "\n")
    (tmp_path / "tasks.jsonl").write_text('{"key": "a", "task": 1}\n')
    outputs = Outputs()
    assert handle.security.ssl_cafile is not None
    started = time.monotonic()
    code = await outputs.run(
        "produce", "--bootstrap-servers", handle.bootstrap_servers,
        "--security-protocol", "SASL_SSL", "--sasl-mechanism", "SCRAM-SHA-512",
        "--sasl-username", str(handle.security.sasl_username),
        "--sasl-password-file", str(password_file),
        "--ssl-cafile", str(handle.security.ssl_cafile),
        "--topic", "anything", "--file", str(tmp_path / "tasks.jsonl"),
        cwd=tmp_path,
    )  # fmt: skip
    assert code == EXIT_NOPERM
    assert time.monotonic() - started < 60
    err = outputs.text[-1].strip().splitlines()
    assert len(err) == 1, err
    assert "authentication failed" in err[0]

    app = Application(_noop, topics=("anything",))
    with pytest.raises(SecurityError, match="authentication failed"):
        await TaskProducer(
            ProducerConfig(handle.bootstrap_servers, security=bad), "t", BytesSerializer()
        ).start()
    with pytest.raises(SecurityError, match="authentication failed"):
        await Subscription(app, handle.consumer_config("g", security=bad)).start()
    with pytest.raises(SecurityError, match="authentication failed"):
        await read_records(handle.bootstrap_servers, "anything", 1, security=bad)
    assert handle.embedded is not None
    broker_log = handle.embedded.log_tail(1_000_000)
    for text in [*outputs.text, caplog.text, repr(bad), broker_log]:
        assert wrong not in text
        assert _password(handle) not in text


async def _noop(ctx: ProcessingContext, task: bytes) -> None:
    pass


async def test_untrusted_certificate_names_the_ca_file(
    secured: BrokerHandle, tmp_path: Path
) -> None:
    """A CA file that did not sign the cluster's certificate: a TLS error naming it."""
    other = CertificateAuthority(tmp_path, "some-other-ca").certificate
    settings = secured.security.with_overrides(ssl_cafile=str(other))
    with pytest.raises(SecurityError, match=f"not trusted by the CA file {other}"):
        await read_records(secured.bootstrap_servers, "anything", 1, security=settings)


async def test_mutual_tls_without_a_client_certificate_says_so(
    mtls_kafka_broker: BrokerHandle,
) -> None:
    """The mutual TLS listener refuses a client without a certificate, and the error
    says a client certificate is required."""
    assert mtls_kafka_broker.security.ssl_cafile is not None
    bare = SecuritySettings("SSL", ssl_cafile=mtls_kafka_broker.security.ssl_cafile)
    with pytest.raises(SecurityError, match="requires a client certificate"):
        await read_records(mtls_kafka_broker.bootstrap_servers, "anything", 1, security=bare)


class UnsecuredTokens:
    """Unsigned OAUTHBEARER tokens, which the embedded broker accepts (tests only)."""

    def __init__(self, subject: str) -> None:
        self.subject = subject

    async def token(self) -> str:
        now = int(time.time())
        claims = {"sub": self.subject, "iat": now, "exp": now + 600}

        def part(data: dict[str, Any]) -> str:
            return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")

        return f"{part({'alg': 'none'})}.{part(claims)}."


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "PLAIN", "OAUTHBEARER"])
async def test_every_sasl_mechanism_produces(
    secured_kafka_broker: BrokerHandle, mechanism: str
) -> None:
    """SCRAM-SHA-256, PLAIN and OAUTHBEARER (a token provider object) reach the cluster
    too (SCRAM-SHA-512 is every other test's)."""
    base = secured_kafka_broker.security
    if mechanism == "OAUTHBEARER":
        settings = SecuritySettings(
            "SASL_SSL",
            "OAUTHBEARER",
            sasl_oauth_token_provider=UnsecuredTokens("decaton-test"),
            ssl_cafile=base.ssl_cafile,
        )
    else:
        settings = base.with_overrides(sasl_mechanism=mechanism)
    handle = BrokerHandle(secured_kafka_broker.bootstrap_servers, security=settings)
    admin = handle.topic_admin()
    try:
        topic = await admin.create(1, prefix="mechanism")
    finally:
        await admin.close()
    async with TaskProducer(handle.producer_config(), topic, BytesSerializer()) as producer:
        where = await producer.put("k", b"v")
    assert where.offset == 0
    assert not where.spooled
