"""Network faults between the runtime and the cluster, through a real Toxiproxy: two
``run`` instances of an application with retries, a dead letter topic, outputs and
per-key state keep every guarantee through latency, a bandwidth cap, connection resets,
a black hole, fragmented packets, connections cut after some bytes, an unreachable
node and requests and responses cut in the middle of commits, on each path (see
``scenario.py``), and some of them during a rebalance (a member joins as the fault
begins, another leaves in it): nothing lost, keys in order, the group's
commits at the end, under exactly-once every output once and the state's counts exact,
no process exits, descriptors and memory flat, and ``produce --spool-dir`` delivers
what it spooled once the network is back.

``make test`` runs one short scenario (faults of a few seconds) per fault; ``make
faults`` (part of ``make chaos``) the whole matrix with 30 s faults. Each prints its
figures (time to detect, stall, time to recover, tasks redone) and writes them to
``faults-<name>.json`` beside the test's directory.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from decaton_aio.embedded import EmbeddedBroker, Toxiproxy
from decaton_aio.testing import BrokerHandle
from tests.faults.scenario import FAULTS, Cluster, Scenario
from tests.integration.test_exactly_once import needs_transactions

pytestmark = [pytest.mark.integration, pytest.mark.faults]

#: One short scenario per fault: (path, exactly-once).
SHORT = {
    "latency": ("runtime", False),
    "bandwidth": ("runtime", True),
    "reset_peer": ("runtime", False),
    "timeout": ("runtime", True),
    "slicer": ("runtime", False),
    "limit_data": ("runtime", True),
    "down": ("producer", False),
    "commit": ("runtime", True),
}
#: Faults during a rebalance (a member joins and one leaves as the fault begins):
#: (path, fault, exactly-once); the first is part of the short form.
REBALANCES = (
    ("runtime", "reset_peer", True),
    ("coordinator", "timeout", False),
    ("coordinator", "timeout", True),
    ("coordinator", "reset_peer", False),
    ("coordinator", "reset_peer", True),
)
SHORT_FAULT_S = 4.0
LONG_FAULT_S = 30.0

PATHS = ("runtime", "producer", "coordinator", "leaders", "node")


def _matrix() -> list[object]:
    params: list[object] = []
    for fault, (path, eos) in SHORT.items():
        params.append(
            pytest.param(
                path,
                fault,
                eos,
                SHORT_FAULT_S,
                False,
                id=f"short-{path}-{fault}",
            )
        )
    path, fault, eos = REBALANCES[0]
    name = f"short-{path}-{fault}-rebalance"
    params.append(pytest.param(path, fault, eos, SHORT_FAULT_S, True, id=name))
    marks = pytest.mark.chaos_long
    for path in PATHS:
        for fault in FAULTS:
            # Exactly-once where the transactions' path is cut: the runtime's, and the
            # coordinator's (a member cut from it is fenced, its transaction aborted).
            for eos in (False, True) if path in ("runtime", "coordinator") else (False,):
                if fault == "commit" and path not in ("runtime", "coordinator"):
                    continue  # no commit goes through the other paths' faults
                name = f"long-{path}-{fault}" + ("-eos" if eos else "")
                params.append(
                    pytest.param(path, fault, eos, LONG_FAULT_S, False, id=name, marks=marks)
                )
    for path, fault, eos in REBALANCES:
        name = f"long-{path}-{fault}-rebalance" + ("-eos" if eos else "")
        params.append(pytest.param(path, fault, eos, LONG_FAULT_S, True, id=name, marks=marks))
    return params


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("path", "fault", "exactly_once", "fault_s", "rebalance"), _matrix())
async def test_a_network_fault_keeps_every_guarantee(
    path: str,
    fault: str,
    exactly_once: bool,
    fault_s: float,
    rebalance: bool,
    toxiproxy: Toxiproxy,
    request: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:
    three_nodes = path in ("coordinator", "leaders", "node")
    broker: EmbeddedBroker = request.getfixturevalue(
        "proxied_cluster" if three_nodes else "proxied_broker"
    )
    if exactly_once:
        needs_transactions(BrokerHandle(broker.bootstrap_servers, broker))
    scenario = Scenario(
        Cluster(broker, toxiproxy, path),
        fault,
        fault_s=fault_s,
        exactly_once=exactly_once,
        workdir=tmp_path,
        rebalance=rebalance,
    )
    try:
        figures = await scenario.run()
    finally:
        scenario.report(request.node.callspec.id)  # the figures of a failed run too
    assert figures.tasks > 0
    if scenario.missed:
        # Everything else held. The lag's return to 0 after a 30 s outage is the rejoin
        # (the members' sessions expired meanwhile) plus the catch-up of the backlog at
        # the pace the machine's free cores allow: a miss is reported with its figures
        # (see docs/operations.md).
        pytest.xfail(scenario.missed)
