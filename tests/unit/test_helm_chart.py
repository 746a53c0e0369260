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
from embedstream.producers.search_routing import query_topic, search_group, search_topic

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
PREFIX = "embedstream.emb."  # every topic and group of release emb in namespace embedstream (kafka.namePrefix null)

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


def test_generated_scaler_metadata_is_what_the_pinned_keda_says(tools):
    out = subprocess.run(["go", "run", "./internal/genscalers", "-check"], cwd=VALIDATE_DIR, capture_output=True,
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
    assert env(gateway)["EMBEDSTREAM_KAFKA__TOPIC_REPLIES"] == PREFIX + "embedstream.replies.gateway"
    assert "EMBEDSTREAM_KAFKA__GROUP_INSTANCE_ID" not in env(gateway)


def test_keda_scales_each_lane_on_its_own_groups_lag(objects):
    kafka = KafkaSettings()
    scaled = by_kind(objects["cdc-on"], "ScaledObject")
    assert set(scaled) == LANES
    kafka = KafkaSettings(**{f: PREFIX + getattr(kafka, f) for f in type(kafka).model_fields
                             if f.startswith(("topic_", "group_")) and f not in ("group_instance_id", "group_protocol")})
    own = KafkaSettings(topic_search=kafka.topic_search, topic_queries=kafka.topic_queries, group_search=kafka.group_search)
    expected = {  # lane -> {(group, topic)} as the workers consume them (workers/embed_worker.py, vector_search.py,
        # rerank_worker.py, producers/search_routing.py): the online lane's collection has its own queries topic, and
        # its search topic is read in the collection's search group
        "embed-online": {(kafka.group_online, kafka.topic_chunks_online), (kafka.group_online, kafka.topic_queries),
                         (kafka.group_online, query_topic(own, "docs")),
                         (search_group(own, "docs"), search_topic(own, "docs"))},
        "embed-bulk": {(kafka.group_bulk, kafka.topic_chunks_bulk)},
        "rerank": {(kafka.group_rerank, kafka.topic_rerank), (kafka.group_rerank, kafka.topic_search)},
        "cdc-bridge": {(kafka.group_cdc, "cdc.public.articles")},
    }
    for lane, so in scaled.items():
        assert so["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": f"emb-embedstream-{lane}"}
        triggers = [t for t in so["spec"]["triggers"] if t["type"] == "kafka"]
        assert {(t["metadata"]["consumerGroup"], t["metadata"]["topic"]) for t in triggers} == expected[lane]
        assert all(t["metadata"]["offsetResetPolicy"] == "earliest" for t in triggers)
        assert {t["type"] for t in so["spec"]["triggers"]} == ({"kafka", "prometheus"} if lane == "embed-online" else {"kafka"})
    assert scaled["embed-online"]["spec"]["minReplicaCount"] >= 1  # queries never wait for a cold start
    assert scaled["embed-bulk"]["spec"]["minReplicaCount"] == 0


def test_without_keda_the_replica_counts_are_the_values(objects):
    sets = by_kind(objects["keda-off"], "StatefulSet")
    assert {name: s["spec"]["replicas"] for name, s in sets.items()} == {"embed-online": 2, "embed-bulk": 2}


def test_topic_and_group_defaults_are_the_settings_defaults(objects):
    """The chart states the names twice (workers' env, KEDA triggers) from one place, its values; those
    must equal embedstream/config.py's defaults under the release's prefix (the claims topic, where deployments
    meet, without), or a default install would scale on a group nobody uses."""
    kafka = KafkaSettings()
    online = by_kind(objects["defaults"], "StatefulSet")["embed-online"]
    names = {k: v for k, v in env(online).items() if k.startswith(("EMBEDSTREAM_KAFKA__TOPIC_", "EMBEDSTREAM_KAFKA__GROUP_"))
             and k != "EMBEDSTREAM_KAFKA__GROUP_INSTANCE_ID"}
    fields = {f"EMBEDSTREAM_KAFKA__{f.upper()}": ("" if f == "topic_claims" else PREFIX) + getattr(kafka, f)
              for f in type(kafka).model_fields
              if f.startswith(("topic_", "group_")) and f not in ("group_instance_id", "group_protocol")}
    assert names == fields
    assert env(online)["EMBEDSTREAM_KAFKA__DEPLOYMENT"] == PREFIX.rstrip(".")


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
    triggers = [t for so in by_kind(objects["cdc-on"], "ScaledObject").values() for t in so["spec"]["triggers"]]
    got = {t["name"]: int(t["metadata"]["lagThreshold"]) for t in triggers if t["type"] == "kafka"}
    assert got == want == {"chunks-online": 39, "queries": 126, "collection-queries": 126, "collection-search": 81,
                           "chunks-bulk": 6118, "rerank": 1, "search": 1, "changes": 35}
    (offered,) = [t for t in triggers if t["type"] == "prometheus"]
    assert float(offered["metadata"]["threshold"]) == \
        plan.autoscaling.values()["embedOnline"]["autoscaling"]["offeredQueriesPerS"] == 63.0  # 90 queries/s × 0.7
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
    got, offered = {}, []
    for so in by_kind(objs, "ScaledObject").values():
        for t in so["spec"]["triggers"]:
            if t["type"] == "kafka":
                got[t["name"]] = int(t["metadata"]["lagThreshold"])
            else:
                offered.append(float(t["metadata"]["threshold"]))
    want = {row.topic.topic_key.replace("_", "-"): row.lag_threshold for row in plan.autoscaling.rows}
    assert got == want
    assert want["chunks-bulk"] == 12_180 and want["queries"] == 210  # 5800 × 0.7 ÷ 200 × 600; 150 × 0.7 × 2
    assert offered == [105.0]  # 150 queries/s × 0.7 headroom offered per online worker


# ------------------------------------------------------------------------------ releases side by side


def _release(tools, release: str, *args: str) -> str:
    out = _run([tools[0], "template", release, str(CHART), "--namespace", "embedstream", *args])
    assert out.returncode == 0, out.stderr
    return out.stdout


def _kafka_names(objs: list[dict], release: str) -> set[tuple[str, str]]:
    """(kind, name) of every topic and group a release's pods are given or its triggers watch."""
    names = set()
    for o in objs:
        if o["metadata"]["labels"]["app.kubernetes.io/instance"] != release:
            continue
        if o["kind"] in ("StatefulSet", "Deployment", "Job"):
            for key, value in env(o).items():
                if key.startswith("EMBEDSTREAM_KAFKA__TOPIC_"):
                    names.add(("topic", value))
                elif key.startswith("EMBEDSTREAM_KAFKA__GROUP_") and key != "EMBEDSTREAM_KAFKA__GROUP_INSTANCE_ID":
                    names.add(("group", value))
        if o["kind"] == "ScaledObject":
            for t in o["spec"]["triggers"]:
                if t["type"] == "kafka":
                    names |= {("topic", t["metadata"]["topic"]), ("group", t["metadata"]["consumerGroup"])}
    return names


def test_two_releases_side_by_side_validate_with_names_of_their_own(tools):
    """Issue #41: two releases with default values shared every topic and group (a shared group splits its
    partitions between them). Names are scoped by <namespace>.<release> now; both rendered into one stream
    validate, and they share nothing but the claims topic (where deployments meet) and the Debezium topic both
    bridges read (a source, each release with its own group)."""
    both = _release(tools, "emb", *COMBOS["cdc-on"]) + _release(tools, "two", *COMBOS["cdc-on"],
                                                                 "--set", "qdrant.collection=docs_two")
    objs = validated(tools, both)
    first, second = _kafka_names(objs, "emb"), _kafka_names(objs, "two")
    assert first & second == {("topic", "embedstream.claims"), ("topic", "cdc.public.articles")}
    assert all(name.startswith("embedstream.emb.") for kind, name in first if name not in ("embedstream.claims",
                                                                                          "cdc.public.articles"))
    deployments = {env(o)["EMBEDSTREAM_KAFKA__DEPLOYMENT"] for o in objs if o["kind"] == "StatefulSet"}
    assert deployments == {"embedstream.emb", "embedstream.two"}


@pytest.mark.parametrize("second_args, messages", [
    # names as they were (no prefix): every topic and group shared
    (["--set", "kafka.namePrefix=", "--set", "qdrant.collection=docs_two"],
     ['releases emb and two share consumer group "embedstream-embed-online" on kafka:9092',
      'releases emb and two share topic "embedstream.queries" on kafka:9092']),
    # one collection of one Qdrant server written by both: refused at start at run time, here already
    ([], ['releases emb and two share Qdrant collection "docs" on http://qdrant:6333: two deployments of one '
          'collection: the second is refused at start (collection_claimed)']),
])
def test_validator_refuses_two_releases_that_collide(tools, second_args, messages):
    first = _release(tools, "emb", *(["--set", "kafka.namePrefix="] if second_args else []))
    out = validate(tools, first + _release(tools, "two", *second_args))
    assert out.returncode == 1, out.stderr
    for message in messages:
        assert message in out.stderr, out.stderr


def test_the_online_lanes_overload_trigger_counts_shed_queries(objects):
    """A shed query is committed (no lag): the prometheus trigger scales the online lane on the queries offered,
    answered + shed, of this release's online pods only."""
    online = by_kind(objects["cdc-on"], "ScaledObject")["embed-online"]
    (trigger,) = [t for t in online["spec"]["triggers"] if t["type"] == "prometheus"]
    meta = trigger["metadata"]
    assert trigger["metricType"] == "AverageValue" and meta["serverAddress"] == "http://prometheus-operated.monitoring.svc:9090"
    assert 'embedstream_texts_total{lane="online",kind="query",' in meta["query"]
    assert 'embedstream_shed_total{lane="online",' in meta["query"]
    assert meta["query"].count('namespace="embedstream",pod=~"emb-embedstream-embed-online-[0-9]+"') == 2
    assert "or vector(0)" in meta["query"]  # no shed series yet is 0, not an empty sum
    assert not [t for t in by_kind(objects["defaults"], "ScaledObject")["embed-online"]["spec"]["triggers"]
                if t["type"] == "prometheus"]  # no Prometheus address: lag triggers only


@pytest.mark.parametrize("old, new, message", [
    ("serverAddress: \"http://prometheus-operated.monitoring.svc:9090\"", "serverAddress: \"prometheus:9090\"",
     'serverAddress "prometheus:9090" must be an http(s) URL with a host'),
    ('threshold: "63"', 'threshold: "0"', "threshold must be a positive number"),
    ('threshold: "63"', 'threshold: "many"', "threshold"),
    ("activationThreshold: \"0\"", "activationThresold: \"0\"", "metadata.activationThresold: not a parameter of KEDA's prometheus scaler"),
    ("metricType: AverageValue", "metricType: Utilization", "metricType Utilization is for the cpu and memory scalers"),
])
def test_validator_rejects_a_broken_prometheus_trigger(tools, rendered, old, new, message):
    good = rendered["cdc-on"]
    assert validate(tools, good).returncode == 0
    out = validate(tools, _broken(good, old, new))
    assert out.returncode == 1 and message in out.stderr, out.stderr
