"""`embedstream plan`: indexing, serving, storage and per-request stage arithmetic.

Modules: :mod:`.inputs` (validated numbers, the bench file, ``PlanError``), :mod:`.arithmetic` (the
pure sections, :func:`build_plan`), :mod:`.render` (summary lines and rich tables) and :mod:`.command`
(the typer command, registered by ``embedstream.cli``). Importing this package does not import typer.

Everything here is plain arithmetic over numbers you measured (or assumed); nothing is run.

Indexing
    total tokens = chunks × average tokens per chunk;
    seconds = total tokens ÷ (tokens/s per device × devices);
    cost = hours × devices × price per device-hour (= device-hours × price, the same on 1 or N devices).
    Reference: 10M chunks × 256 tokens = 2.56e9 tokens at 8,000 tokens/s → 320,000 s = 88.9 h on
    one device, 40,000 s = 11.1 h on eight.

Serving
    rerank pairs/s = QPS × candidates; rerank devices = ceil(pairs/s ÷ (pairs/s per device × headroom));
    query-embedding texts/s = QPS; embedding devices = ceil(QPS ÷ (texts/s per device × headroom)).
    ``headroom`` (default 0.7) is the fraction of a device's measured throughput you plan to use.

Storage
    bytes = vectors × bytes per vector; bytes per vector = dims × bytes per dim (float32 4, float16 2,
    int8/uint8 1) and ceil(dims / 8) for binary (one bit per dim, packed per vector). Raw vectors
    only: no HNSW graph, payloads or replicas. Printed in decimal GB (1e9) and GiB (2^30), for the
    full size and each Matryoshka size given.

Stages (one request)
    queue wait, embed, search, rerank and an optional LLM stage, each in ms. Each stage's ms comes
    from ``--stage-ms`` if given, else from a measured throughput when one is known (embed = 1000 ÷
    texts/s, rerank = candidates × 1000 ÷ pairs/s: the device time one request costs at that
    throughput), else from a built-in default. $ per 1M requests for a stage = ms × price per
    device-hour ÷ 3.6e6 (price per device-ms) × 1e6. Queue wait holds no device and costs $0.

Autoscaling (``--lag-thresholds``, :mod:`.autoscale`)
    KEDA's kafka scaler runs ceil(lag ÷ lagThreshold) workers per lane. lagThreshold = floor(records/s one
    worker sustains × headroom × drain seconds), at least 1: the worker count that drains the backlog in
    about the lane's drain time (``--drain-s``, default online 2, bulk 300, rerank 2, cdc 10). A record is
    a chunk (``--tokens`` tokens at ``--tokens-per-s``), a query (``--texts-per-s``), a rerank or search
    request (``--candidates`` pairs at ``--pairs-per-s``), a search of the online lane's collection (one at
    a time per worker: queue + embed + search ms) or a change event (``--events-per-s``). Overload, which
    lag does not show (a shed query is committed): the online lane's prometheus trigger scales on queries
    offered (answered + shed) per worker against ``--texts-per-s × headroom`` (``offeredQueriesPerS``).
    ``--helm-values FILE`` writes them in the chart's values layout (deploy/helm/embedstream).

Bench file (``--from-bench FILE``)
    A JSON object with any of these keys (numbers > 0, per device); other keys are ignored::

        {"tokens_per_s": 3500, "pairs_per_s": 900, "texts_per_s": 30}

    ``tokens_per_s``: document tokens embedded per second (indexing);
    ``pairs_per_s``: (query, passage) pairs reranked per second (serving, rerank stage);
    ``texts_per_s``: query texts embedded per second (serving, embed stage).
    A flag given on the command line (``--tokens-per-s`` etc.) overrides the file's key; a key the
    file lacks falls back to the flag; a number needed by neither is an error that says so.
"""

from embedstream.plan.arithmetic import (
    DEFAULT_STAGE_MS,
    DTYPE_BYTES,
    IndexingInputs,
    IndexingPlan,
    Plan,
    ServingInputs,
    ServingPlan,
    ServingRow,
    StageInputs,
    StagePlan,
    StageRow,
    StorageInputs,
    StoragePlan,
    StorageRow,
    build_plan,
    ceil_devices,
    plan_indexing,
    plan_serving,
    plan_stages,
    plan_storage,
    vector_bytes,
)
from embedstream.plan.autoscale import AutoscaleInputs, AutoscalePlan, parse_drain_s, plan_autoscaling
from embedstream.plan.inputs import BENCH_KEYS, BenchThroughput, PlanError, load_bench, parse_mrl, parse_stage_ms
from embedstream.plan.render import autoscaling_line, indexing_line, render, serving_line, stages_line, storage_line

__all__ = [
    "AutoscaleInputs",
    "AutoscalePlan",
    "BENCH_KEYS",
    "DEFAULT_STAGE_MS",
    "DTYPE_BYTES",
    "BenchThroughput",
    "IndexingInputs",
    "IndexingPlan",
    "Plan",
    "PlanError",
    "ServingInputs",
    "ServingPlan",
    "ServingRow",
    "StageInputs",
    "StagePlan",
    "StageRow",
    "StorageInputs",
    "StoragePlan",
    "StorageRow",
    "build_plan",
    "autoscaling_line",
    "ceil_devices",
    "indexing_line",
    "load_bench",
    "parse_drain_s",
    "parse_mrl",
    "parse_stage_ms",
    "plan_autoscaling",
    "plan_indexing",
    "plan_serving",
    "plan_stages",
    "plan_storage",
    "render",
    "serving_line",
    "stages_line",
    "storage_line",
    "vector_bytes",
]
