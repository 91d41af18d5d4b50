"""Why a client could not connect: telling TLS and SASL failures apart from an absent cluster.

aiokafka reports every failed bootstrap the same way ("Unable to bootstrap from ...") and
logs the cause. When a client of the library fails to start, `connect_error()` probes
the first bootstrap server once with the same settings and turns what it finds into a
[`SecurityError`][decaton_aio.errors.SecurityError] that names the setting or file to fix (a wrong
password, a CA file that does not trust the cluster, a missing client certificate, TLS
spoken to a plain listener or the other way round); anything else stays a
[`BrokerError`][decaton_aio.errors.BrokerError]. The probe runs only after a failure, so a
healthy start costs nothing, and it never retries: a wrong password ends the start at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import struct
from typing import Any, Final

import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import (
    AuthenticationFailedError,
    IllegalSaslStateError,
    KafkaError,
    SaslAuthenticationFailed,
    UnsupportedSaslMechanismError,
)

from decaton_aio._aiokafka import (
    AIOKafkaClient,
    MetadataRequest,
    MetadataSync,
    check_version,
    client_of,
    close_consumer_parts,
    create_conn,
)
from decaton_aio.errors import BrokerError, SecurityError
from decaton_aio.security import SecuritySettings

__all__ = [
    "connect_error",
    "diagnose",
    "start_admin",
    "start_client",
    "start_or_close",
    "stop_member",
    "watch_metadata",
]

log = structlog.get_logger("decaton_aio.consumer")

_PROBE_TIMEOUT_S: Final = 10.0
# An ApiVersions v0 request (api key 18), correlation id 1, client id "decaton-aio-probe".
_CLIENT_ID: Final = b"decaton-aio-probe"
_API_VERSIONS: Final = struct.pack(">hhih", 18, 0, 1, len(_CLIENT_ID)) + _CLIENT_ID
_TLS_ALERT: Final = b"\x15\x03"


async def connect_error(
    exc: BaseException, bootstrap_servers: str, security: SecuritySettings
) -> BrokerError:
    """The error to raise for a client that could not start: a
    [`SecurityError`][decaton_aio.errors.SecurityError] when TLS or SASL is the cause, else
    a [`BrokerError`][decaton_aio.errors.BrokerError] saying the cluster could not be
    reached."""
    if isinstance(exc, BrokerError):
        return exc
    found = await diagnose(bootstrap_servers, security)
    if found is not None:
        return found
    return BrokerError(f"cannot reach the cluster at {bootstrap_servers}: {exc!r}")


async def start_admin(bootstrap_servers: str, security: SecuritySettings) -> AIOKafkaAdminClient:
    """A started admin client.

    Raises:
        SecurityError: TLS or SASL failed (the message says what to fix).
        BrokerError: the cluster cannot be reached.
    """
    client = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers, **security.client_kwargs())
    await start_client(client, bootstrap_servers, security)
    return client


async def start_client(
    client: AIOKafkaConsumer | AIOKafkaAdminClient,
    bootstrap_servers: str,
    security: SecuritySettings,
) -> None:
    """Start a consumer or admin client of ``bootstrap_servers``. A start that fails, for
    whatever reason (a cancellation too), closes the client again: the connections it
    opened before the failure are not left open.

    Raises:
        SecurityError: TLS or SASL failed (the message says what to fix).
        BrokerError: the cluster cannot be reached.
        BaseException: anything else the start raised, as it was.
    """
    check_version()
    try:
        await start_or_close(client)
    except KafkaError as exc:
        raise await connect_error(exc, bootstrap_servers, security) from exc


async def start_or_close(client: AIOKafkaConsumer | AIOKafkaProducer | AIOKafkaAdminClient) -> None:
    """Start an aiokafka client; a start that fails, for whatever reason (a cancellation
    too), closes the client again before the error is raised as it was: the connections
    it opened before the failure are not left open.
    """
    try:
        await client.start()
    except BaseException:
        if isinstance(client, AIOKafkaAdminClient):
            await client.close()
        else:
            await client.stop()
        raise


async def stop_member(consumer: AIOKafkaConsumer, *, timeout_s: float) -> None:
    """Stop a consumer that is a group member, within ``timeout_s``.

    A clean stop leaves the group at once and takes well under a second. When the
    client's group coordination hangs (it can after the coordinator's broker restarted:
    its coordinator lookup waits for a metadata update that never comes), its stop would
    wait for it forever; after ``timeout_s`` the coordination is cancelled and the
    fetcher and connections closed without leaving the group, which then notices after
    the session timeout. Nothing is lost either way: what was not committed is fetched
    again by the partitions' next owner.
    """
    stopping = asyncio.ensure_future(consumer.stop())
    try:
        async with asyncio.timeout(timeout_s):
            await asyncio.shield(stopping)
        return
    except TimeoutError:
        pass
    log.warning(
        "the consumer did not leave its group in time: closing without leaving "
        "(the group reassigns its partitions after the session timeout)",
        timeout_s=timeout_s,
    )
    stopping.cancel()  # and with it the coordination routine its stop awaits
    with contextlib.suppress(asyncio.CancelledError):
        await stopping
    await close_consumer_parts(consumer)  # whose own stop did not reach them


#: How often `watch_metadata()` looks at a client's metadata synchronizer.
METADATA_WATCH_S: Final = 1.0


async def watch_metadata(
    consumer: AIOKafkaConsumer | AIOKafkaClient,
    *,
    every_s: float = METADATA_WATCH_S,
    stuck_s: float | None = None,
) -> None:
    """Keep a consumer's (or a client's) metadata synchronizer answering; runs until
    cancelled.

    aiokafka's group coordination waits for ``client.force_metadata_update()`` (its
    coordinator lookup, ``ensure_coordinator_known``, after a failed FindCoordinator, and
    holding ``_coordinator_lookup_lock``, which every ``commit`` then waits for too). Only
    the client's ``_md_synchronizer`` task resolves that future, and aiokafka 0.14 leaves
    it pending in three ways: the task ended on an error (nothing restarts it); after an
    update that began on its own timer and during which the topic set changed, the task
    waits again on a waiter nobody sets (pending until the next ``metadata_max_age_ms``);
    or an update hangs. The member then never finds its coordinator again, its commits
    time out and its stop hangs.

    Every ``every_s``: a synchronizer that ended (not cancelled: the client's own close
    cancels it) is started again; a pending update gets its waiter set (harmless while an
    update runs: the synchronizer replaces the waiter after it); one pending longer than
    ``stuck_s`` (by default two request timeouts plus 5 s) has its synchronizer cancelled
    and started again. The future it left is resolved (``False``: "not updated"), so its
    waiters retry.
    """
    client = consumer if isinstance(consumer, AIOKafkaClient) else client_of(consumer)
    sync = MetadataSync(client)
    if not sync.known:
        return  # an aiokafka whose synchronizer this does not know
    loop = asyncio.get_running_loop()
    if stuck_s is None:
        stuck_s = 2 * sync.request_timeout_ms / 1000 + 5
    seen: asyncio.Future[Any] | None = None
    since = 0.0
    while True:
        await asyncio.sleep(every_s)
        task, fut = sync.task, sync.update
        if task is None or task.cancelled():
            continue  # not started, or closing
        if not task.done():
            if fut is None or fut.done():
                seen = None
                continue
            sync.wake()
            if fut is not seen:
                seen, since = fut, loop.time()
                continue
            if loop.time() - since < stuck_s:
                continue
            log.warning(
                "metadata update stuck: restarting the client's synchronizer",
                waited_s=round(loop.time() - since, 1),
            )
            task.cancel()
            await asyncio.wait([task])
        else:
            log.warning(
                "the client's metadata synchronizer ended: starting it again",
                error=repr(task.exception()),
            )
        if sync.task is not task:
            continue  # the client closed (or restarted it) meanwhile
        sync.start()
        if fut is not None and not fut.done():
            fut.set_result(False)
        seen = None


async def diagnose(bootstrap_servers: str, security: SecuritySettings) -> SecurityError | None:
    """Probe the first bootstrap server that answers; the security problem found, if any.

    Raises:
        ConfigError: a TLS file cannot be used (see ``SecuritySettings.ssl_context``).
    """
    for server in bootstrap_servers.split(","):
        host, _, port = server.strip().rpartition(":")
        if not host or not port.isdigit():
            continue
        host = host.strip("[]")
        try:
            async with asyncio.timeout(_PROBE_TIMEOUT_S):
                return await _probe(host, int(port), security)
        except (OSError, TimeoutError):
            continue  # this one does not answer at all: try the next
    return None


async def _probe(host: str, port: int, security: SecuritySettings) -> SecurityError | None:
    where = f"{host}:{port}"
    problem = await _probe_transport(host, port, security)
    if problem is not None:
        return problem
    conn = None
    try:
        conn = await create_conn(
            host, port, client_id="decaton-aio-probe", **security.client_kwargs()
        )
        await conn.send(MetadataRequest([]))
    except (SaslAuthenticationFailed, AuthenticationFailedError):
        return SecurityError(
            f"authentication failed at {where} for user {security.sasl_username!r} with "
            f"{security.sasl_mechanism}: check the user name and the password (the cluster "
            "does not say which is wrong)"
        )
    except UnsupportedSaslMechanismError:
        return SecurityError(
            f"{where} does not enable the SASL mechanism {security.sasl_mechanism}: ask "
            "the cluster's operators which one it enables (often SCRAM-SHA-512)"
        )
    except IllegalSaslStateError:
        return SecurityError(f"{where} refused the SASL exchange: check sasl_mechanism")
    except KafkaError:
        if not security.uses_sasl:
            return SecurityError(
                f"{where} closed the connection after the first request: the listener may "
                "require SASL (security_protocol SASL_SSL or SASL_PLAINTEXT)"
            )
        return None
    finally:
        if conn is not None:
            conn.close()
    return None


async def _probe_transport(
    host: str, port: int, security: SecuritySettings
) -> SecurityError | None:
    """Connect (with TLS when configured), send ApiVersions and read the reply's size."""
    where = f"{host}:{port}"
    context = security.ssl_context()
    writer = None
    try:
        try:
            reader, writer = await asyncio.open_connection(
                host, port, ssl=context, server_hostname=host if context else None
            )
            writer.write(struct.pack(">i", len(_API_VERSIONS)) + _API_VERSIONS)
            await writer.drain()
            head = await reader.readexactly(4)
        except ssl.SSLCertVerificationError as exc:
            return _untrusted(where, security, exc)
        except ssl.SSLError as exc:
            return _handshake_failed(where, security, exc.reason or str(exc))
        except (asyncio.IncompleteReadError, ConnectionResetError) as exc:
            if context is None:
                raise OSError(str(exc)) from exc  # not a TLS question: let the caller judge
            return _handshake_failed(where, security, "the connection was closed")
        if context is None and head.startswith(_TLS_ALERT):
            return SecurityError(
                f"{where} speaks TLS but security_protocol is {security.security_protocol}: "
                f"use {'SASL_SSL' if security.uses_sasl else 'SSL'}"
            )
        return None
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


def _untrusted(
    where: str, security: SecuritySettings, exc: ssl.SSLCertVerificationError
) -> SecurityError:
    reason = exc.verify_message or exc.reason or "certificate verify failed"
    if "hostname" in str(reason).lower() or "ip address mismatch" in str(reason).lower():
        return SecurityError(
            f"the certificate of {where} does not name that host ({reason}): connect by a "
            "name the certificate holds, or turn ssl_check_hostname off "
            "(ssl.endpoint.identification.algorithm= empty)"
        )
    trust = (
        f"the CA file {security.ssl_cafile}"
        if security.ssl_cafile is not None
        else "the system's trusted CAs (no ssl_cafile given)"
    )
    return SecurityError(
        f"the certificate of {where} is not trusted by {trust} ({reason}): point ssl_cafile "
        "(--ssl-cafile, ssl.truststore.location) at the CA that signed the cluster's "
        "certificate"
    )


def _handshake_failed(where: str, security: SecuritySettings, reason: str) -> SecurityError:
    upper = reason.upper()
    if "CERTIFICATE" in upper and "VERIFY" not in upper:
        if security.ssl_certfile is None:
            return SecurityError(
                f"{where} requires a client certificate (TLS alert: {reason}): set "
                "ssl_certfile and ssl_keyfile (--ssl-certfile, --ssl-keyfile, "
                "ssl.keystore.location)"
            )
        return SecurityError(
            f"{where} refused the client certificate {security.ssl_certfile} (TLS alert: "
            f"{reason}): is it signed by a CA the cluster trusts, and still valid?"
        )
    return SecurityError(
        f"the TLS handshake with {where} failed ({reason}): does the listener speak TLS? "
        f"for a plain listener use security_protocol "
        f"{'SASL_PLAINTEXT' if security.uses_sasl else 'PLAINTEXT'}"
    )
