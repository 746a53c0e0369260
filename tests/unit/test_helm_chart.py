"""The Helm chart (deploy/helm/embedstream), checked the way CI checks it.

`helm lint --strict`, then every object `helm template` renders for several values combinations (defaults,
KEDA off, CDC and every workload on, secured Kafka, thresholds written by `embedstream plan`) decoded
strictly into its Go type from k8s.io/api, KEDA's apis or prometheus-operator's by deploy/validate (unknown
or misspelled fields, wrong types, duplicate keys, unknown kinds rejected; selectors, ports, scale targets
and KEDA trigger metadata checked together). The behaviour tests read only what the validator accepted
(its -json output). Helm and the validator are Go programs built from the Go module proxy by
deploy/validate/tools.sh, cached under ~/.cache/embedstream/go-tools and go's own caches.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from embedstream.config import KafkaSettings
from parts import require
from embedstream.plan import build_plan

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "embedstream"
VALIDATE_DIR = ROOT / "deploy" / "validate"
COMBOS = {
    "defaults": [],
    "keda-off": ["-f", str(CHART / "ci" / "keda-off.yaml")],
    "cdc-on": ["-f", str(CHART / "ci" / "cdc-on.yaml")],
    "secured-kafka": ["-f", str(CHART / "ci" / "secured-kafka.yaml")],
}
LANES = {"embed-online", "embed-bulk", "rerank", "cdc-bridge"}

# The first build of helm and the validator (downloads and compiles) takes minutes on 2 loaded vCPUs.
pytestmark = [pytest.mark.timeout(3600)]


@pytest.fixture(scope="module", autouse=True)
def _needs_go() -> None:
    """Helm and the validator are built with go: without it these tests fail, or skip when left out by name."""
    require("go", shutil.which("go") is not None, "needs the Go toolchain (go 1.26) for helm and the validator")


@pytest.fixture(scope="module")
def tools() -> tuple[str, str]:
    out = subprocess.run(["bash", str(VALIDATE_DIR / "tools.sh")], capture_output=True, text=True, timeout=3300)
    assert out.returncode == 0, out.stderr[-4000:]
    helm, validate = out.stdout.split()
    return helm, validate


def _run(args: list[str], stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=300)


def render(tools, *args: str) -> str:
    out = _run([tools[0], "template", "emb", str(CHART), "--namespace", "embedstream", *args])
    assert out.returncode == 0, out.stderr
    return out.stdout


def validate(tools, manifest: str) -> subprocess.CompletedProcess:
    return _run([tools[1], "-json", "-"], stdin=manifest)


def validated(tools, manifest: str) -> list[dict]:
    out = validate(tools, manifest)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def rendered(tools) -> dict[str, str]:
    return {name: render(tools, *args) for name, args in COMBOS.items()}


@pytest.fixture(scope="module")
def objects(tools, rendered) -> dict[str, list[dict]]:
    return {name: validated(tools, text) for name, text in rendered.items()}


def by_kind(objs: list[dict], kind: str) -> dict[str, dict]:
    return {o["metadata"]["name"].removeprefix("emb-embedstream-"): o for o in objs if o["kind"] == kind}


def container(workload: dict) -> dict:
    (only,) = workload["spec"]["template"]["spec"]["containers"]
    return only


def env(workload: dict) -> dict[str, object]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(workload)["env"]}


# ---------------------------------------------------------------------------------------------- lint


@pytest.mark.parametrize("combo", COMBOS)
def test_helm_lint_strict(tools, combo):
    out = _run([tools[0], "lint", "--strict", str(CHART), *COMBOS[combo]])
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in out.stdout


def test_helm_refuses_values_that_would_make_a_broken_pod(tools):
    out = _run([tools[0], "template", "emb", str(CHART), "--set", "kafka.securityProtocol=SASL_SSL",
                "--set", "kafka.sasl.mechanism=SCRAM-SHA-512", "--set", "kafka.tls.secretName=tls"])
    assert out.returncode != 0 and "kafka.sasl.secretName" in out.stderr
    out = _run([tools[0], "template", "emb", str(CHART), "--set", "rerank.enabled=true"])
    assert out.returncode != 0 and "set modelsVolume" in out.stderr
    out = _run([tools[0], "template", "emb", str(CHART), "--set", "env.EMBEDSTREAM_KAFKA__GROUP_BULK=other"])
    assert out.returncode != 0 and "through the chart's kafka/qdrant values" in out.stderr


@pytest.mark.parametrize("setting, message", [
    ("embedBulk.autoscalling.minReplicas=1", "additional properties 'autoscalling' not allowed"),
    ("embedBulk.threads=four", "got string, want null or integer"),
    ("kafka.securityProtocol=TLS", "/kafka/securityProtocol"),
    ("embedOnline.autoscaling.lagThreshold.queries=0", "minimum"),
])
def test_values_schema_refuses_a_misspelled_or_mistyped_value(tools, setting, message):
    out = _run([tools[0], "template", "emb", str(CHART), "--set", setting])
    assert out.returncode != 0 and message in out.stderr, out.stderr


# ------------------------------------------------------------------------------------- strict types


def test_every_combination_validates_strictly(objects):
    kinds = {name: sorted({o["kind"] for o in objs}) for name, objs in objects.items()}
    assert kinds["defaults"] == ["Deployment", "Job", "PodDisruptionBudget", "ScaledObject", "Service",
                                 "ServiceAccount", "StatefulSet"]
    assert "ScaledObject" not in kinds["keda-off"]
    assert {"PodMonitor", "HorizontalPodAutoscaler"} <= set(kinds["cdc-on"])
    assert "TriggerAuthentication" in kinds["secured-kafka"]
    # the chart never renders a Secret: every credential is a reference to one the user made
    assert all("Secret" not in k for k in kinds.values())


def _broken(manifest: str, old: str, new: str) -> str:
    assert old in manifest, old
    return manifest.replace(old, new, 1)


@pytest.mark.parametrize("old, new, message", [
    # a misspelled field of a Kubernetes type
    ("  serviceName: emb-embedstream-embed-online", "  servicName: emb-embedstream-embed-online",
     'unknown field "spec.servicName"'),
    # a field of the wrong type: a port number as a string
    ("containerPort: 9400,", 'containerPort: "9400",', "of type int32"),
    # KEDA's trigger metadata is map[string]string: an unquoted number is a type error
    ('lagThreshold: "', "lagThreshold: 7 #", "into Go struct field ScaleTriggers.spec.triggers.metadata of type string"),
    # a misspelled KEDA field, and a kind that does not exist
    ("  minReplicaCount:", "  minReplicas:", 'unknown field "spec.minReplicas"'),
    ("kind: ScaledObject", "kind: ScaledObjekt", "no such type"),
    # a key given twice
    ("  podManagementPolicy: Parallel", "  podManagementPolicy: Parallel\n  podManagementPolicy: OrderedReady",
     'key "podManagementPolicy" already set'),
    # trigger metadata KEDA's kafka scaler would not read, or would refuse
    ("consumerGroup:", "consumergroup:", "metadata.consumergroup: not a parameter of KEDA's kafka scaler"),
    ("offsetResetPolicy: earliest", "offsetResetPolicy: newest", "offsetResetPolicy"),
    ('activationLagThreshold: "0"', 'activationLagThreshold: "-1"', "activationLagThreshold must be a non-negative"),
    # references between objects
    ("httpGet: {path: /readyz, port: metrics}", "httpGet: {path: /readyz, port: metric}",
     'readinessProbe: port "metric" is not a port of this container'),
    ("    name: emb-embedstream-embed-bulk\n  pollingInterval", "    name: emb-embedstream-embed-bulkk\n  pollingInterval",
     "scale target StatefulSet emb-embedstream-embed-bulkk (apps/v1) is not rendered"),
    ("- {name: home, mountPath: /home/embedstream}", "- {name: homes, mountPath: /home/embedstream}",
     'volumeMount "homes": no such volume'),
    # a pre-install hook (the topics Job) that needs an object the release creates only after it
    ("      restartPolicy: OnFailure\n", "      restartPolicy: OnFailure\n      serviceAccountName: emb-embedstream\n",
     "a pre-install hook runs before the release's ServiceAccount exists"),
])
def test_validator_rejects_a_broken_object(tools, rendered, old, new, message):
    good = rendered["defaults"]
    assert validate(tools, good).returncode == 0
    out = validate(tools, _broken(good, old, new))
    assert out.returncode == 1 and message in out.stderr, out.stderr


def test_generated_kafka_metadata_is_what_the_pinned_keda_says(tools):
    out = subprocess.run(["go", "run", "./internal/genkafka", "-check"], cwd=VALIDATE_DIR, capture_output=True,
                         text=True, timeout=1200)
    assert out.returncode == 0, out.stderr


# ---------------------------------------------------------------------------------------- behaviour


def test_a_statefulset_per_lane_with_probes_pdb_and_static_member_ids(objects):
    objs = objects["cdc-on"]
    sets, pdbs = by_kind(objs, "StatefulSet"), by_kind(objs, "PodDisruptionBudget")
    assert set(sets) == LANES and set(pdbs) == LANES | {"gateway"}
    for name, sts in sets.items():
        c = container(sts)
        assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
        assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
        assert c["startupProbe"]["httpGet"]["path"] == "/healthz"
        assert c["ports"] == [{"name": "metrics", "containerPort": 9400, "protocol": "TCP"}]
        assert c["args"][-2:] == ["--metrics-port", "9400"] and "memory" in c["resources"]["limits"]
        # the pod's own name is its static member id in each of its groups
        assert env(sts)["EMBEDSTREAM_KAFKA__GROUP_INSTANCE_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}
        assert env(sts)["EMBEDSTREAM_WORKER__HEALTH_HOST"] == "0.0.0.0"
        assert "replicas" not in sts["spec"]  # KEDA owns the count
        assert pdbs[name]["spec"]["selector"]["matchLabels"] == sts["spec"]["selector"]["matchLabels"]
        pod = sts["spec"]["template"]
        assert pod["metadata"]["annotations"]["prometheus.io/port"] == "9400"
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
        assert c["securityContext"]["readOnlyRootFilesystem"] is True and c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    args = {name: container(s)["args"] for name, s in sets.items()}
    assert args["embed-online"][:4] == ["worker", "embed", "--lanes", "online"]
    assert args["embed-bulk"][:5] == ["worker", "embed", "--lanes", "bulk", "--no-search"]
    assert args["rerank"][:4] == ["worker", "rerank", "--model", "/models/reranker"]
    assert args["cdc-bridge"][:4] == ["worker", "cdc", "--topic", "cdc.public.articles"]
    gateway = by_kind(objs, "Deployment")["gateway"]
    assert container(gateway)["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container(gateway)["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert "--rerank-model" in container(gateway)["args"]
    assert env(gateway)["EMBEDSTREAM_KAFKA__TOPIC_REPLIES"] == "embedstream.replies.gateway"
    assert "EMBEDSTREAM_KAFKA__GROUP_INSTANCE_ID" not in env(gateway)


def test_keda_scales_each_lane_on_its_own_groups_lag(objects):
    kafka = KafkaSettings()
    scaled = by_kind(objects["cdc-on"], "ScaledObject")
    assert set(scaled) == LANES
    expected = {  # lane -> (group, topics) as the workers consume them (workers/embed_worker.py, rerank_worker.py)
        "embed-online": (kafka.group_online, [kafka.topic_chunks_online, kafka.topic_queries]),
        "embed-bulk": (kafka.group_bulk, [kafka.topic_chunks_bulk]),
        "rerank": (kafka.group_rerank, [kafka.topic_rerank, kafka.topic_search]),
        "cdc-bridge": (kafka.group_cdc, ["cdc.public.articles"]),
    }
    for lane, so in scaled.items():
        assert so["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": f"emb-embedstream-{lane}"}
        triggers = so["spec"]["triggers"]
        assert {t["type"] for t in triggers} == {"kafka"}
        assert {t["metadata"]["consumerGroup"] for t in triggers} == {expected[lane][0]}
        assert sorted(t["metadata"]["topic"] for t in triggers) == sorted(expected[lane][1])
        assert all(t["metadata"]["offsetResetPolicy"] == "earliest" for t in triggers)
    assert scaled["embed-online"]["spec"]["minReplicaCount"] >= 1  # queries never wait for a cold start
    assert scaled["embed-bulk"]["spec"]["minReplicaCount"] == 0


def test_without_keda_the_replica_counts_are_the_values(objects):
    sets = by_kind(objects["keda-off"], "StatefulSet")
    assert {name: s["spec"]["replicas"] for name, s in sets.items()} == {"embed-online": 2, "embed-bulk": 2}


def test_topic_and_group_defaults_are_the_settings_defaults(objects):
    """The chart states the names twice (workers' env, KEDA triggers) from one place, its values; those
    must equal embedstream/config.py's defaults, or a default install would scale on a group nobody uses."""
    kafka = KafkaSettings()
    online = by_kind(objects["defaults"], "StatefulSet")["embed-online"]
    names = {k: v for k, v in env(online).items() if k.startswith(("EMBEDSTREAM_KAFKA__TOPIC_", "EMBEDSTREAM_KAFKA__GROUP_"))
             and k != "EMBEDSTREAM_KAFKA__GROUP_INSTANCE_ID"}
    fields = {f"EMBEDSTREAM_KAFKA__{f.upper()}": getattr(kafka, f) for f in type(kafka).model_fields
              if f.startswith(("topic_", "group_")) and f not in ("group_instance_id", "group_protocol")}
    assert names == fields


def test_lane_settings_are_docker_composes(objects):
    """Threads, precision and lane knobs: the chart's defaults are docker-compose.yml's."""
    compose = (ROOT / "docker-compose.yml").read_text()
    default = dict(re.findall(r"\$\{([A-Z_]+):-([^}]*)\}", compose))
    sets = by_kind(objects["cdc-on"], "StatefulSet")
    pairs = [("embed-online", "EMBEDSTREAM_ENGINE__THREADS", "EMBED_ONLINE_THREADS"),
             ("embed-online", "EMBEDSTREAM_ENGINE__PRECISION", "EMBED_ONLINE_PRECISION"),
             ("embed-online", "EMBEDSTREAM_WORKER__BATCH_WINDOW_MS", "EMBED_ONLINE_BATCH_WINDOW_MS"),
             ("embed-bulk", "EMBEDSTREAM_ENGINE__THREADS", "EMBED_BULK_THREADS"),
             ("embed-bulk", "EMBEDSTREAM_WORKER__MAX_QUEUE_TOKENS", "EMBED_BULK_MAX_QUEUE_TOKENS"),
             ("rerank", "EMBEDSTREAM_ENGINE__THREADS", "RERANK_THREADS"),
             ("rerank", "EMBEDSTREAM_WORKER__BATCH_WINDOW_MS", "RERANK_BATCH_WINDOW_MS"),
             ("cdc-bridge", "EMBEDSTREAM_WORKER__RECORD_RETRY_LIMIT_S", "WORKER_RECORD_RETRY_LIMIT_S"),
             ("cdc-bridge", "EMBEDSTREAM_WORKER__STALL_TIMEOUT_S", "WORKER_STALL_TIMEOUT_S")]
    for lane, name, knob in pairs:
        assert env(sets[lane])[name] == default[knob], (lane, name)


def test_secured_kafka_reads_every_credential_from_secrets(objects, rendered):
    objs = objects["secured-kafka"]
    (auth,) = by_kind(objs, "TriggerAuthentication").values()
    refs = {r["parameter"]: (r["name"], r["key"]) for r in auth["spec"]["secretTargetRef"]}
    assert refs == {"username": ("embedstream-kafka-user", "username"), "password": ("embedstream-kafka-user", "password"),
                    "ca": ("embedstream-kafka-tls", "ca.crt"), "cert": ("embedstream-kafka-tls", "tls.crt"),
                    "key": ("embedstream-kafka-tls", "tls.key")}
    for so in by_kind(objs, "ScaledObject").values():
        for t in so["spec"]["triggers"]:
            assert t["metadata"]["sasl"] == "scram_sha512" and t["metadata"]["tls"] == "enable"
            assert t["authenticationRef"]["name"] == auth["metadata"]["name"]
            assert t["metadata"]["bootstrapServers"] == "kafka-0.kafka:9093,kafka-1.kafka:9093,kafka-2.kafka:9093"
    for workload in [*by_kind(objs, "StatefulSet").values(), *by_kind(objs, "Deployment").values()]:
        e = env(workload)
        assert e["EMBEDSTREAM_KAFKA__SASL_PASSWORD"] == {"secretKeyRef": {"name": "embedstream-kafka-user", "key": "password"}}
        assert e["EMBEDSTREAM_QDRANT__API_KEY"] == {"secretKeyRef": {"name": "embedstream-qdrant", "key": "api-key"}}
        assert e["EMBEDSTREAM_KAFKA__SSL_CAFILE"] == "/etc/embedstream/kafka-tls/ca.crt"
        assert e["EMBEDSTREAM_KAFKA__SESSION_TIMEOUT_MS"] == "30000"
        mounts = {m["name"]: m["mountPath"] for m in container(workload)["volumeMounts"]}
        assert mounts["kafka-tls"] == "/etc/embedstream/kafka-tls"


def test_default_thresholds_are_plans_output_for_the_reference_throughputs(objects):
    """values.yaml's lagThresholds are `embedstream plan`'s answer for the throughputs its comment names
    (docs/kubernetes.md says where each was measured): change either and this says so."""
    plan = build_plan(lag_thresholds=True, tokens=200, tokens_per_s=5827, online_tokens_per_s=5689, texts_per_s=90,
                      pairs_per_s=22, events_per_s=5)
    want = {row.topic.topic_key.replace("_", "-"): row.lag_threshold for row in plan.autoscaling.rows}
    got = {t["name"]: int(t["metadata"]["lagThreshold"])
           for so in by_kind(objects["cdc-on"], "ScaledObject").values() for t in so["spec"]["triggers"]}
    assert got == want == {"chunks-online": 39, "queries": 126, "chunks-bulk": 6118, "rerank": 1, "search": 1,
                           "changes": 35}
    values = (CHART / "values.yaml").read_text()
    assert "--tokens 200 --tokens-per-s 5827 --online-tokens-per-s 5689" in values
    assert "--texts-per-s 90 --pairs-per-s 22 --events-per-s 5" in values


def test_plan_thresholds_reach_every_trigger(tools, tmp_path):
    """`embedstream plan --lag-thresholds --helm-values F` writes a file the chart takes as it is: every
    trigger of every lane gets the plan's number, and the result still validates strictly."""
    plan = build_plan(lag_thresholds=True, tokens=200, tokens_per_s=5800, online_tokens_per_s=5600, texts_per_s=150,
                      pairs_per_s=900, candidates=50, events_per_s=40, drain_s="bulk=600")
    values = tmp_path / "thresholds.yaml"
    plan.autoscaling.write_values(values)
    objs = validated(tools, render(tools, *COMBOS["cdc-on"], "-f", str(values)))
    got = {}
    for so in by_kind(objs, "ScaledObject").values():
        for t in so["spec"]["triggers"]:
            got[t["name"]] = int(t["metadata"]["lagThreshold"])
    want = {row.topic.topic_key.replace("_", "-"): row.lag_threshold for row in plan.autoscaling.rows}
    assert got == want
    assert want["chunks-bulk"] == 12_180 and want["queries"] == 210  # 5800 × 0.7 ÷ 200 × 600; 150 × 0.7 × 2
