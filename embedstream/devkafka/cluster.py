"""One dev broker or a cluster of N: start / stop / restart / status / borrowed over a data dir, and the
node-level faults a cluster's tests inject (a node killed -9, a node stopped and started again).

A cluster of N KRaft nodes, each a broker and a voter of the controller quorum, lives in one data dir::

    <data dir>/node-1/   the data dir of node 1 (layout.py): client port PORT, controller PORT+1
    <data dir>/node-2/   node 2: PORT+2, PORT+3
    ...

All nodes share one cluster id and listen on 127.0.0.1 (by default). The project's topics get replication
factor 3 and ``min.insync.replicas`` 2 there (``producers/topics.py`` asks the cluster how many brokers it
has), and so do the broker's internal topics (``cluster_overrides``). A data dir holds either one broker
(``kraft-logs/`` at its top) or a cluster (``node-*/``): stop and status find out which by looking.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import time
from pathlib import Path
from typing import Iterator

from embedstream.devkafka import broker, leash
from embedstream.devkafka.broker import DEFAULT_STOP_TIMEOUT_S, DEFAULT_WAIT_S, BrokerInfo, await_node, launch_node
from embedstream.devkafka.errors import DevKafkaError
from embedstream.devkafka.jars import kafka_version
from embedstream.devkafka.layout import DEFAULT_HOST, DEFAULT_PORT, Layout, file_lock, layout_for
from embedstream.devkafka.probe import broker_answers
from embedstream.devkafka.process import _signal_group, live_pid, pid_alive, terminate
from embedstream.devkafka.security import PLAINTEXT, check_mode
from embedstream.devkafka.storage import configured_listener, random_cluster_id, read_cluster_id, server_properties

PORTS_PER_NODE = 2  # client port, controller port
CLUSTER_REPLICATION_FACTOR = 3
CLUSTER_MIN_INSYNC = 2
MAX_BROKERS = 9


@dataclasses.dataclass(frozen=True)
class ClusterInfo:
    """Where a running dev cluster's nodes listen; ``bootstrap`` is the list clients are given."""

    nodes: tuple[BrokerInfo, ...]
    data_dir: Path
    version: str
    cluster_id: str | None
    security: str = PLAINTEXT
    admin_env: Path | None = None  # a cluster is plaintext only

    @property
    def bootstrap(self) -> str:
        """``host:port,host:port,...``, every node: a client reaches the cluster through any one that answers."""
        return ",".join(node.bootstrap for node in self.nodes)

    @property
    def pid(self) -> str:
        return ",".join(str(node.pid) for node in self.nodes)


def node_port(port: int, node: int) -> int:
    """Client port of node ``node`` (1-based) of the cluster whose first port is ``port``."""
    return port + PORTS_PER_NODE * (node - 1)


def node_layout(root: Path, node: int) -> Layout:
    return Layout(root / f"node-{node}")


def _root(port: int, data_dir: Path | str | None) -> Path:
    return layout_for(port, data_dir).root


def cluster_size(port: int = DEFAULT_PORT, data_dir: Path | str | None = None) -> int:
    """Nodes of the cluster in the data dir (0: the data dir holds no cluster)."""
    root = _root(port, data_dir)
    size = 0
    while node_layout(root, size + 1).config.is_file():
        size += 1
    return size


# How soon the cluster acts on a node's death (Kafka's defaults: fenced 9 s after its last heartbeat, a dead active
# controller replaced after 2-3 s). Until the dead node is fenced, no partition that has it in sync moves its high
# watermark: nothing new is read from any of them. See docs/fleet.md, request-reply through a broker failure.
FAILOVER = {"broker.session.timeout.ms": "2500", "broker.heartbeat.interval.ms": "500",
            "controller.quorum.fetch.timeout.ms": "1000", "controller.quorum.election.timeout.ms": "500"}


def cluster_overrides(host: str, port: int, node: int, brokers: int) -> dict[str, str]:
    """server.properties entries that make a single node one of ``brokers`` (broker + controller each).

    Every replicated thing gets 3 copies, 2 of them in sync for a write to count (at most ``brokers``):
    the project's topics (set by producers/topics.py), the broker's defaults and its internal topics
    (committed offsets, transactions)."""
    replicas = min(CLUSTER_REPLICATION_FACTOR, brokers)
    in_sync = min(CLUSTER_MIN_INSYNC, replicas)
    this = node_port(port, node)
    voters = ",".join(f"{n}@{host}:{node_port(port, n) + 1}" for n in range(1, brokers + 1))
    return {
        "node.id": str(node),
        "controller.quorum.voters": voters,
        "listeners": f"PLAINTEXT://{host}:{this},CONTROLLER://{host}:{this + 1}",
        "advertised.listeners": f"PLAINTEXT://{host}:{this}",
        "default.replication.factor": str(replicas),
        "min.insync.replicas": str(in_sync),
        "offsets.topic.replication.factor": str(replicas),
        "transaction.state.log.replication.factor": str(replicas),
        "transaction.state.log.min.isr": str(in_sync),
        "share.coordinator.state.topic.replication.factor": str(replicas),
        "share.coordinator.state.topic.min.isr": str(in_sync),
        **FAILOVER,
        "unclean.leader.election.enable": "false",  # a stale replica never becomes leader: nothing acked is lost
        # The consumer protocol (KIP-848) keeps the session timeout on the broker; let a group ask for what the
        # classic protocol allows: 6 s (a killed worker's partitions move soon) to 5 min (a static member
        # restarting on a busy host keeps its partitions)
        "group.consumer.min.session.timeout.ms": "6000",
        "group.consumer.max.session.timeout.ms": "300000",
    }


def _check_shape(root: Path, brokers: int) -> None:
    size = cluster_size(data_dir=root)
    if brokers == 1 and size:
        raise DevKafkaError(f"{root} holds a {size}-broker cluster; start it with --brokers {size} or use another data dir")
    if brokers > 1 and Layout(root).meta.is_file():
        raise DevKafkaError(f"{root} holds a single broker; start the cluster with another data dir")
    if brokers > 1 and size and size != brokers:
        raise DevKafkaError(f"{root} holds a {size}-broker cluster, not {brokers}; use another data dir")


def start(
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    data_dir: Path | str | None = None,
    wait_s: float = DEFAULT_WAIT_S,
    *,
    brokers: int | None = None,
    home: Path | str | None = None,
    security: str = PLAINTEXT,
    **single_options,
) -> BrokerInfo | ClusterInfo:
    """Start (or reuse) one broker (``brokers=1``: ``broker.start``) or a cluster of ``brokers`` KRaft nodes
    (None: as many as the data dir holds, else 1).

    A cluster's nodes are launched together (one node alone has no controller quorum) and the call returns
    once every node answers and lists all of them. Idempotent like one broker: running nodes are reused,
    stopped ones started; storage is formatted once per node, with the cluster's one id."""
    root = _root(port, data_dir)
    brokers = brokers or cluster_size(port, root) or 1
    if not 1 <= brokers <= MAX_BROKERS:
        raise DevKafkaError(f"brokers must be 1..{MAX_BROKERS}, got {brokers}")
    _check_shape(root, brokers)
    if brokers == 1:
        return broker.start(host, port, root, wait_s, home=home, security=security, **single_options)
    if check_mode(security) != PLAINTEXT or single_options:
        raise DevKafkaError("a dev cluster is plaintext only; --secure starts a single broker")
    root.mkdir(parents=True, exist_ok=True)
    version = kafka_version()
    with file_lock(root / ".lock"):
        cluster_id = read_cluster_id(node_layout(root, 1)) or random_cluster_id()
        launched: dict[int, tuple[int, Path]] = {}
        pids: dict[int, int] = {}
        for node in range(1, brokers + 1):
            layout = node_layout(root, node)
            layout.root.mkdir(parents=True, exist_ok=True)
            config = server_properties(host, node_port(port, node), layout,
                                       cluster_overrides(host, port, node, brokers))
            pid = live_pid(layout)
            if pid is not None and layout.config.read_text() != config:
                raise DevKafkaError(f"node {node} (pid {pid}) already runs from {layout.root} with another "
                                    "host/port; stop the cluster first")
            if pid is None:
                pid, libs = launch_node(layout, config, version, home, host=host, port=node_port(port, node),
                                        cluster_id=cluster_id)
                launched[node] = (pid, libs)
            pids[node] = pid
        try:
            for node, (pid, libs) in launched.items():
                await_node(pid, libs, host, node_port(port, node), node_layout(root, node), wait_s,
                           brokers=brokers)
            for node in pids.keys() - launched.keys():
                _wait_listed(host, node_port(port, node), brokers, wait_s)
        except BaseException:
            for node, (pid, _libs) in launched.items():  # no half-started cluster holds the ports
                with contextlib.suppress(DevKafkaError):
                    terminate(pid, 10.0)
            raise
    return _cluster_info(root, host, port, pids, version)


def _wait_listed(host: str, port: int, brokers: int, wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    while not broker_answers(host, port, brokers=brokers):
        if time.monotonic() >= deadline:
            raise DevKafkaError(f"the node on {host}:{port} did not list {brokers} brokers within {wait_s:.0f} s")
        time.sleep(0.2)


def _cluster_info(root: Path, host: str, port: int, pids: dict[int, int], version: str) -> ClusterInfo:
    nodes = []
    for node, pid in sorted(pids.items()):
        layout = node_layout(root, node)
        nodes.append(BrokerInfo(host, node_port(port, node), pid, layout.root, layout.server_log, version,
                                read_cluster_id(layout)))
    return ClusterInfo(tuple(nodes), root, version, nodes[0].cluster_id)


def stop(
    port: int = DEFAULT_PORT,
    data_dir: Path | str | None = None,
    timeout_s: float = DEFAULT_STOP_TIMEOUT_S,
) -> bool:
    """Stop the data dir's broker or every node of its cluster (data kept); True if any was running.

    A cluster's nodes get SIGTERM together and are waited for together: stopped one after another,
    the last ones would wait for a controller quorum that has gone."""
    root = _root(port, data_dir)
    size = cluster_size(port, root)
    if not size:
        return broker.stop(port, root, timeout_s)
    with file_lock(root / ".lock"):
        running = {node: pid for node in range(1, size + 1)
                   if (pid := live_pid(node_layout(root, node))) is not None}
        for pid in running.values():
            _signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for node, pid in running.items():
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if pid_alive(pid):  # overstayed: SIGKILL
                terminate(pid, 0.0)
            node_layout(root, node).pid_file.unlink(missing_ok=True)
    return bool(running)


def restart(
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    data_dir: Path | str | None = None,
    wait_s: float = DEFAULT_WAIT_S,
    *,
    stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S,
    brokers: int | None = None,
    **options,
) -> BrokerInfo | ClusterInfo:
    """Stop then start with the same data (topics and offsets kept); ``brokers`` defaults to what the data dir holds."""
    size = brokers or cluster_size(port, data_dir) or None
    stop(port, data_dir, timeout_s=stop_timeout_s)
    return start(host, port, data_dir, wait_s, brokers=size, **options)


def status(port: int = DEFAULT_PORT, data_dir: Path | str | None = None) -> dict:
    """State of the data dir's broker, or of its cluster: ``answering`` when every node answers and lists
    all of them, ``bootstrap`` the list of every node, ``nodes`` each node's own status."""
    root = _root(port, data_dir)
    size = cluster_size(port, root)
    if not size:
        return broker.status(port, root)
    nodes = []
    for node in range(1, size + 1):
        layout = node_layout(root, node)
        pid = live_pid(layout)
        _protocol, host, node_port_ = configured_listener(layout) or ("PLAINTEXT", DEFAULT_HOST, node_port(port, node))
        nodes.append({
            "node": node, "running": pid is not None,
            "answering": pid is not None and broker_answers(host, node_port_, brokers=size),
            "pid": pid, "bootstrap": f"{host}:{node_port_}", "data_dir": str(layout.root),
            "log": str(layout.server_log),
        })
    return {
        "running": all(n["running"] for n in nodes),
        "answering": all(n["answering"] for n in nodes),
        "brokers": size,
        "bootstrap": ",".join(n["bootstrap"] for n in nodes),
        "security": "plaintext",
        "data_dir": str(root),
        "cluster_id": read_cluster_id(node_layout(root, 1)),
        "nodes": nodes,
    }


@contextlib.contextmanager
def borrowed(port: int = DEFAULT_PORT, data_dir: Path | str | None = None, **start_options) -> Iterator[BrokerInfo | ClusterInfo]:
    """A broker (or cluster: ``brokers=3``) for the length of a ``with``: one found answering is used and
    left running; one started here is stopped however the block ends (an error, Ctrl-C), and is bound to
    this process (``leash``), so it dies with it even when it is killed -9. What the demo and every
    benchmark use."""
    started_here = not status(port=port, data_dir=data_dir).get("answering")
    if started_here:
        leash.ensure()  # what this process starts from here on dies with it, even killed -9
    info = start(port=port, data_dir=data_dir, **start_options)
    try:
        yield info
    finally:
        if started_here:
            stop(port=port, data_dir=data_dir)


# -- node faults (the cluster tests) ---------------------------------------------------------------
def _node(port: int, data_dir: Path | str | None, node: int) -> tuple[Path, Layout, int]:
    root = _root(port, data_dir)
    size = cluster_size(port, root)
    if not 1 <= node <= size:
        raise DevKafkaError(f"{root} has no node {node} (nodes 1..{size})")
    return root, node_layout(root, node), size


def kill_node(port: int, data_dir: Path | str | None, node: int) -> int:
    """SIGKILL one node (a crash: no controlled shutdown, nothing flushed); returns its pid."""
    _root_, layout, _size = _node(port, data_dir, node)
    pid = live_pid(layout)
    if pid is None:
        raise DevKafkaError(f"node {node} of {layout.root.parent} is not running")
    _signal_group(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10.0
    while pid_alive(pid):
        if time.monotonic() > deadline:
            raise DevKafkaError(f"node {node} (pid {pid}) survived SIGKILL")
        time.sleep(0.05)
    layout.pid_file.unlink(missing_ok=True)
    return pid


def stop_node(port: int, data_dir: Path | str | None, node: int, timeout_s: float = DEFAULT_STOP_TIMEOUT_S) -> bool:
    """Stop one node cleanly (SIGTERM: controlled shutdown, leadership handed over); True if it ran."""
    _root_, layout, _size = _node(port, data_dir, node)
    pid = live_pid(layout)
    if pid is not None:
        terminate(pid, timeout_s)
        layout.pid_file.unlink(missing_ok=True)
    return pid is not None


def start_node(port: int, data_dir: Path | str | None, node: int, wait_s: float = DEFAULT_WAIT_S,
               home: Path | str | None = None) -> BrokerInfo:
    """Start one stopped (or killed) node again with its config and data; returns once the node answers
    and lists every node of the cluster."""
    root, layout, size = _node(port, data_dir, node)
    protocol, host, this_port = configured_listener(layout) or ("PLAINTEXT", DEFAULT_HOST, node_port(port, node))
    version = kafka_version()
    with file_lock(root / ".lock"):
        pid = live_pid(layout)
        if pid is None:
            pid, libs = launch_node(layout, layout.config.read_text(), version, home, host=host, port=this_port)
            await_node(pid, libs, host, this_port, layout, wait_s, brokers=size)
    return BrokerInfo(host, this_port, pid, layout.root, layout.server_log, version, read_cluster_id(layout))
