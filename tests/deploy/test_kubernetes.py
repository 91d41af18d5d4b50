"""The Kubernetes manifests of deploy/kubernetes: valid against the Kubernetes schemas
(kubernetes-validate, strict: an unknown field fails) and KEDA's resources against the
OpenAPI schema of KEDA's own CustomResourceDefinitions (tests/deploy/keda, vendored from a
pinned release); each variant rendered by kustomize where it is installed; and what the
pods ask of the runtime is what the runtime takes: its flags, its environment variables,
its properties, its probe paths, a grace period derived from its shutdown timeouts, and a
ConfigMap edit the running file source applies."""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from decaton_aio import environment
from decaton_aio.cli._main import _build_parser
from decaton_aio.cli._run_args import consumer_config, health_config
from decaton_aio.consumer import HealthConfig
from decaton_aio.properties import (
    PARTITION_CONCURRENCY,
    PROCESSING_SHUTDOWN_TIMEOUT_MS,
    FilePropertySource,
    Properties,
    parse_properties_text,
)

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
KEDA_CRDS = Path(__file__).resolve().parent / "keda"
VARIANTS = ("statefulset", "deployment")
#: The Kubernetes release whose schemas the manifests are checked against.
KUBERNETES_VERSION = "1.32.0"


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def resources() -> Iterator[tuple[str, dict[str, Any]]]:
    for path in sorted(KUBERNETES.rglob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in documents(path):
            yield str(path.relative_to(KUBERNETES)), doc


def _closed(schema: Any) -> Any:
    """The schema with unknown fields refused wherever it lists the fields an object has,
    as the API server's strict field validation does."""
    if isinstance(schema, dict):
        closed = {key: _closed(value) for key, value in schema.items()}
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            closed["additionalProperties"] = False
        return closed
    if isinstance(schema, list):
        return [_closed(item) for item in schema]
    return schema


@functools.cache
def keda_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) to the OpenAPI schema of that version of a KEDA resource."""
    schemas = {}
    for path in KEDA_CRDS.glob("*.yaml"):
        (crd,) = documents(path)
        for version in crd["spec"]["versions"]:
            api_version = f"{crd['spec']['group']}/{version['name']}"
            schema = version["schema"]["openAPIV3Schema"]
            schemas[api_version, crd["spec"]["names"]["kind"]] = _closed(schema)
    return schemas


def validate(doc: dict[str, Any]) -> None:
    """Raise when ``doc`` is not a valid resource of its kind."""
    keda = keda_schemas().get((doc["apiVersion"], doc["kind"]))
    if keda is not None:
        jsonschema.validate(doc, keda)
    else:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize(
    ("where", "doc"),
    list(resources()),
    ids=[f"{where}:{doc['kind']}" for where, doc in resources()],
)
def test_every_manifest_is_valid_for_its_kind(where: str, doc: dict[str, Any]) -> None:
    """Each resource passes its kind's schema, unknown fields refused."""
    validate(doc)


@pytest.mark.parametrize(
    "doc",
    [
        {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "x"},
         "spec": {"replica": 1}},
        {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": "x"},
         "spec": {"scaleTargetRef": {"name": "x"}, "maxReplicas": 3}},
        {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": "x"},
         "spec": {"scaleTargetRef": {"name": "x"}, "maxReplicaCount": "3"}},
    ],
    ids=["a misspelt StatefulSet field", "a misspelt ScaledObject field", "a string count"],
)  # fmt: skip
def test_the_validation_refuses_a_wrong_manifest(doc: dict[str, Any]) -> None:
    """The checks above can fail: a misspelt field or a wrong type is refused."""
    with pytest.raises((jsonschema.ValidationError, kubernetes_validate.ValidationError)):
        validate(doc)


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_kustomization_lists_files_that_exist(variant: str) -> None:
    """The variant's kustomization and the base it includes name existing files."""
    for directory in (KUBERNETES / variant, KUBERNETES / "base"):
        (kustomization,) = documents(directory / "kustomization.yaml")
        for resource in kustomization["resources"]:
            assert (directory / resource).exists(), f"{directory}: {resource}"


def kustomize(variant: str) -> list[dict[str, Any]]:
    if shutil.which("kustomize"):
        argv = ["kustomize", "build", str(KUBERNETES / variant)]
    elif shutil.which("kubectl"):
        argv = ["kubectl", "kustomize", str(KUBERNETES / variant)]
    else:
        pytest.skip("neither kustomize nor kubectl (which includes it) is installed")
    out = subprocess.run(argv, check=True, capture_output=True, text=True, timeout=60).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_variant_renders_with_kustomize(variant: str) -> None:
    """kustomize renders the variant into valid resources, its workload and the shared
    ones, each once."""
    rendered = kustomize(variant)
    kinds = sorted(doc["kind"] for doc in rendered)
    workload = "StatefulSet" if variant == "statefulset" else "Deployment"
    shared = ["ConfigMap", "Secret", "Service", "PodDisruptionBudget", "TriggerAuthentication"]
    assert kinds == sorted([workload, "ScaledObject", *shared])
    for doc in rendered:
        validate(doc)


# --- What the pods ask of the runtime ------------------------------------------------------


def workload(variant: str) -> dict[str, Any]:
    (doc,) = documents(KUBERNETES / variant / f"{variant}.yaml")
    return doc


def container(variant: str) -> dict[str, Any]:
    (processor,) = workload(variant)["spec"]["template"]["spec"]["containers"]
    return processor


def base(kind: str) -> dict[str, Any]:
    (found,) = [
        doc for where, doc in resources() if where.startswith("base/") and doc["kind"] == kind
    ]
    return found


def env(variant: str) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in container(variant)["env"]}


def properties() -> Properties:
    text = base("ConfigMap")["data"]["decaton.properties"]
    return Properties(parse_properties_text(text))  # unknown names and bad values raise


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_grace_period_is_derived_from_the_shutdown_timeout(variant: str) -> None:
    """The kubelet waits for the runtime's own drain bound (the supervisor's: the shutdown
    timeout plus 90 s, at least 120 s) and 10 s more before it kills the pod."""
    drain_s = properties()[PROCESSING_SHUTDOWN_TIMEOUT_MS].value / 1000
    grace = workload(variant)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace == max(120, drain_s + 90) + 10


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_command_line_is_one_run_takes(variant: str) -> None:
    """The container's arguments parse as `run`'s (a pod name for $(POD_NAME)), and the
    consumer settings they make are valid."""
    processor = container(variant)
    assert processor["command"] == ["python", "-m", "decaton_aio"]
    argv = [arg.replace("$(POD_NAME)", "page-view-counter-0") for arg in processor["args"]]
    args = _build_parser().parse_args(argv)
    assert args.command == "run"
    consumer_config(args, "kafka:9093", "page-view-counter")
    if variant == "statefulset":  # static membership: the pod's stable name
        assert args.consumer_group_instance_id == "page-view-counter-0"
        assert args.workers == 1
        pod_name = env(variant)["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"]
        assert pod_name == "metadata.name"
    else:
        assert args.consumer_group_instance_id is None
        cpus = int(processor["resources"]["requests"]["cpu"])
        assert args.workers == cpus  # a worker per core of the request


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variable_is_one_the_runtime_reads(variant: str) -> None:
    """No misspelt DECATON_AIO_ variable is silently ignored."""
    known = {variable.name for variable in environment.VARIABLES}
    names = {name for name in env(variant) if name.startswith(environment.PREFIX)}
    assert names
    assert names <= known, names - known


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_files_the_runtime_reads_are_mounted(variant: str) -> None:
    """The properties file comes from the ConfigMap, mounted as a directory (a subPath
    mount never sees an edit), and the password and CA from keys of the Secret."""
    pod = workload(variant)["spec"]["template"]["spec"]
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    mounts = {mount["mountPath"]: mount for mount in container(variant)["volumeMounts"]}
    variables = env(variant)

    def source(variable: str) -> tuple[dict[str, Any], str]:
        path = PurePosixPath(variables[variable]["value"])
        mount = mounts[str(path.parent)]
        assert "subPath" not in mount
        return volumes[mount["name"]], path.name

    volume, name = source("DECATON_AIO_PROPERTIES_FILE")
    assert volume["configMap"]["name"] == base("ConfigMap")["metadata"]["name"]
    assert name in base("ConfigMap")["data"]
    secret = base("Secret")
    for variable in ("DECATON_AIO_SASL_PASSWORD_FILE", "DECATON_AIO_SSL_CAFILE"):
        volume, name = source(variable)
        assert volume["secret"]["secretName"] == secret["metadata"]["name"]
        assert name in secret["stringData"]
    assert "DECATON_AIO_SASL_PASSWORD" not in variables  # a file, never a variable


@pytest.mark.parametrize("variant", VARIANTS)
def test_probes_and_scrapes_reach_the_metrics_port(variant: str) -> None:
    """Liveness asks /healthz, readiness /readyz, on the port the runtime serves (all
    addresses), with a timeout above the endpoint's own wait for the event loop; the
    scrape annotations name the same port."""
    processor = container(variant)
    variables = env(variant)
    port = int(variables["DECATON_AIO_METRICS_PORT"]["value"])
    assert variables["DECATON_AIO_METRICS_ADDR"]["value"] == "0.0.0.0"
    (named,) = processor["ports"]
    assert named["containerPort"] == port
    answer_s = health_config(_build_parser().parse_args(["run", "x:y"])).answer_timeout_ms / 1000
    assert answer_s == HealthConfig().answer_timeout_ms / 1000
    paths = {"startupProbe": "/healthz", "livenessProbe": "/healthz", "readinessProbe": "/readyz"}
    for probe, path in paths.items():
        check = processor[probe]
        assert check["httpGet"] == {"path": path, "port": named["name"]}
        assert check["timeoutSeconds"] > answer_s
    annotations = workload(variant)["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(port)
    assert annotations["prometheus.io/path"] == "/metrics"


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_autoscaler_and_the_budget_select_this_workload(variant: str) -> None:
    """KEDA scales this variant's workload, never past the partitions (idle consumers
    refused), and the disruption budget and Service select its pods."""
    (scaled,) = documents(KUBERNETES / variant / "scaledobject.yaml")
    target = workload(variant)
    assert scaled["spec"]["scaleTargetRef"] == {
        "apiVersion": target["apiVersion"],
        "kind": target["kind"],
        "name": target["metadata"]["name"],
    }
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "kafka"
    assert trigger["metadata"]["allowIdleConsumers"] == "false"
    assert trigger["authenticationRef"]["name"] == base("TriggerAuthentication")["metadata"]["name"]
    assert 1 <= scaled["spec"]["minReplicaCount"] <= scaled["spec"]["maxReplicaCount"]
    labels = target["spec"]["template"]["metadata"]["labels"]
    assert target["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert base("PodDisruptionBudget")["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert base("Service")["spec"]["selector"].items() <= labels.items()


def test_both_variants_stop_at_one_member_per_partition() -> None:
    """The replica ceiling times the workers per pod is the same partition count in both
    variants: members beyond it would hold nothing."""
    members = set()
    for variant in VARIANTS:
        (scaled,) = documents(KUBERNETES / variant / "scaledobject.yaml")
        argv = [arg.replace("$(POD_NAME)", "pod-0") for arg in container(variant)["args"]]
        workers = _build_parser().parse_args(argv).workers
        members.add(scaled["spec"]["maxReplicaCount"] * workers)
    assert len(members) == 1, members


def _kubelet_writes(directory: Path, version: str, files: dict[str, str]) -> None:
    """Write ``files`` into ``directory`` as the kubelet updates a ConfigMap volume: a new
    hidden directory, the ``..data`` link swapped to it by a rename, each file a link
    through ``..data``."""
    (directory / version).mkdir()
    for name, text in files.items():
        (directory / version / name).write_text(text)
        if not (directory / name).is_symlink():
            (directory / name).symlink_to(Path("..data") / name)
    (directory / "..data_tmp").symlink_to(version)
    (directory / "..data_tmp").rename(directory / "..data")


async def test_an_edit_of_the_configmap_reaches_the_running_properties(tmp_path: Path) -> None:
    """Given the ConfigMap's file in a volume laid out as the kubelet lays it out, when the
    kubelet swaps in an edited version (same size, same modification time), the watched
    file source applies the new value while running."""
    text = base("ConfigMap")["data"]["decaton.properties"]
    assert "decaton.partition.concurrency=384\n" in text
    _kubelet_writes(tmp_path, "..2026_01_01_00_00_00.1", {"decaton.properties": text})
    path = tmp_path / "decaton.properties"
    source = FilePropertySource(path, interval_s=0.02)
    properties = Properties(await source.load())
    concurrency = properties[PARTITION_CONCURRENCY]
    changed = asyncio.Event()
    concurrency.subscribe(lambda *_: changed.set())
    await source.start(properties, layer=0)
    try:
        before = path.stat()
        edited = text.replace("concurrency=384", "concurrency=128")
        _kubelet_writes(tmp_path, "..2026_01_01_00_01_00.2", {"decaton.properties": edited})
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        assert path.stat().st_size == before.st_size
        await asyncio.wait_for(changed.wait(), 10)
        assert concurrency.value == 128
    finally:
        await source.stop()
