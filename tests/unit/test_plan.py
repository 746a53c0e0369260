"""`embedstream plan`: indexing, serving, storage and stage arithmetic, bench-file input, validation, CLI."""

from __future__ import annotations

import io
import json
import math

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from embedstream.errors import CodedError
from embedstream.plan import (
    BenchThroughput,
    IndexingInputs,
    PlanError,
    ServingInputs,
    StageInputs,
    StorageInputs,
    build_plan,
    ceil_devices,
    indexing_line,
    load_bench,
    parse_mrl,
    parse_stage_ms,
    plan_indexing,
    plan_serving,
    plan_stages,
    plan_storage,
    render,
    serving_line,
    storage_line,
    vector_bytes,
)
from embedstream.plan.command import plan_command

REFERENCE = ["--chunks", "10000000", "--tokens", "256", "--tokens-per-s", "8000", "--devices", "8"]
REFERENCE_LINE = "indexing: 2.56e9 tokens → 88.9 h on 1 device, 11.1 h on 8 devices, $177.78"


def _rendered(plan) -> str:
    buf = io.StringIO()
    render(plan, Console(file=buf, width=200, color_system=None))
    return buf.getvalue()


# ------------------------------------------------------------------------------------------ indexing


def test_reference_answer_89_hours_on_one_device_11_on_eight():
    p = plan_indexing(IndexingInputs(chunks=10_000_000, tokens_per_chunk=256, tokens_per_s=8000, devices=8))
    assert p.total_tokens == 2.56e9
    assert p.seconds_one_device == 320_000
    assert round(p.hours_one_device) == 89 and round(p.hours_one_device, 1) == 88.9
    assert p.seconds == 40_000
    assert round(p.hours) == 11 and round(p.hours, 1) == 11.1
    # cost = hours × devices × price: the same device-hours whether on 1 or 8 devices
    assert p.device_hours == pytest.approx(88.888_888_9)
    assert p.cost == pytest.approx(88.888_888_9 * 2.0)
    assert indexing_line(p).startswith(REFERENCE_LINE)


def test_indexing_one_device_prints_only_one_device_and_price_scales_cost():
    p = plan_indexing(IndexingInputs(10_000_000, 256, 8000, devices=1, price_per_device_hour=3.0))
    line = indexing_line(p)
    assert "88.9 h on 1 device," in line and "devices" not in line.split("$")[0]
    assert p.cost == pytest.approx(320_000 / 3600 * 3.0)


def test_indexing_short_jobs_print_minutes_and_seconds():
    assert "5.0 min" in indexing_line(plan_indexing(IndexingInputs(1000, 240, 800, 1)))  # 300 s
    assert "30.0 s" in indexing_line(plan_indexing(IndexingInputs(100, 240, 800, 1)))


# ------------------------------------------------------------------------------------------- serving


def test_serving_pairs_per_second_and_device_counts_with_headroom():
    p = plan_serving(ServingInputs(qps=100, candidates=50, pairs_per_s=900, texts_per_s=30))
    assert p.pairs_per_s == 5_000
    assert p.texts_per_s == 100
    # 5000 ÷ (900 × 0.7 = 630) = 7.94 -> 8;  100 ÷ (30 × 0.7 = 21) = 4.76 -> 5
    assert p.rerank.usable_per_device == pytest.approx(630)
    assert p.rerank_devices == 8
    assert p.embed_devices == 5
    assert p.cost_per_hour == pytest.approx(13 * 2.0)
    assert p.cost_per_million_requests == pytest.approx(26.0 / 360_000 * 1e6)
    line = serving_line(p)
    assert "5,000 rerank pairs/s" in line and "8 rerank devices" in line and "5 query embedding devices" in line


def test_headroom_changes_device_counts():
    full = plan_serving(ServingInputs(100, 50, pairs_per_s=900, texts_per_s=30, headroom=1.0))
    assert full.rerank_devices == math.ceil(5000 / 900) == 6
    assert full.embed_devices == 4
    tight = plan_serving(ServingInputs(100, 50, pairs_per_s=900, texts_per_s=30, headroom=0.5))
    assert tight.rerank_devices == 12  # 5000 / 450 = 11.1
    assert tight.embed_devices == 7  # 100 / 15 = 6.7


def test_device_count_exact_fit_is_not_rounded_up_by_float_noise():
    assert 21 / (3 * 0.7) > 10  # the float trap: 10.000000000000002
    assert plan_serving(ServingInputs(21, 1, pairs_per_s=3, texts_per_s=3)).embed_devices == 10
    assert ceil_devices(5000, 500) == 10
    assert ceil_devices(5000.5, 500) == 11
    assert ceil_devices(0.1, 500) == 1


def test_serving_without_a_throughput_leaves_that_count_unknown_and_says_how():
    p = plan_serving(ServingInputs(100, 50, pairs_per_s=900))
    assert p.rerank_devices == 8 and p.embed_devices is None and not p.complete
    assert "--texts-per-s" in p.embed.missing
    out = _rendered(build_plan(qps=100, pairs_per_s=900))
    assert "query embedding devices unknown" in out
    assert '--texts-per-s or --from-bench FILE with "texts_per_s"' in out


# ------------------------------------------------------------------------------------------- storage


def test_storage_100m_by_1024_float32_is_410_gb():
    p = plan_storage(StorageInputs(vectors=100_000_000, dims=1024, mrl=(256, 128)))
    full = p.rows[0]
    assert full.dims == 1024 and not full.matryoshka
    assert full.bytes["float32"] == 409.6e9
    assert round(full.gb("float32")) == 410
    assert full.gib("float32") == pytest.approx(381.47, abs=0.01)
    assert full.bytes["float16"] == 204.8e9
    assert full.bytes["int8"] == full.bytes["uint8"] == 102.4e9
    assert full.bytes["binary"] == 12.8e9
    assert [r.dims for r in p.rows] == [1024, 256, 128]
    assert all(r.matryoshka for r in p.rows[1:])
    assert p.bytes(256, "float32") == 102.4e9
    assert p.bytes(128, "float32") == 51.2e9
    assert p.bytes(128, "binary") == 1.6e9
    assert storage_line(p) == "storage: 100,000,000 vectors × 1,024 dims × 4 B (float32) = 410 GB (381 GiB)"


def test_vector_bytes_per_dtype_and_packed_binary():
    assert vector_bytes(1024, "float32") == 4096
    assert vector_bytes(1024, "float16") == 2048
    assert vector_bytes(1024, "int8") == vector_bytes(1024, "uint8") == 1024
    assert vector_bytes(1024, "binary") == 128
    assert vector_bytes(100, "binary") == 13  # bits packed per vector, rounded up to a byte
    with pytest.raises(PlanError, match="unknown dtype"):
        vector_bytes(8, "bfloat8")


def test_plan_error_is_a_coded_value_error():
    with pytest.raises(CodedError) as err:
        vector_bytes(8, "bfloat8")
    assert isinstance(err.value, ValueError) and err.value.code == "bad_plan_input"
    assert str(err.value) == err.value.message and "unknown dtype 'bfloat8'" in err.value.message


def test_storage_table_lists_every_dtype_and_mrl_size_in_gb_and_gib():
    out = _rendered(build_plan(vectors=100_000_000, dims=1024, mrl="256,128"))
    for text in ("410 GB", "381 GiB", "205 GB", "102 GB", "12.8 GB", "51.2 GB", "256 (MRL)", "128 (MRL)",
                 "int8/uint8", "binary"):
        assert text in out


def test_parse_mrl():
    assert parse_mrl("256,128", 1024) == (256, 128)
    assert parse_mrl(" 256 , 128, 256 ,", 1024) == (256, 128)
    assert parse_mrl("1024,256", 1024) == (256,)  # the full size is always printed anyway
    assert parse_mrl(None) == () and parse_mrl("") == ()


# -------------------------------------------------------------------------------------------- stages


def test_stage_table_ms_shares_and_cost_per_million():
    p = plan_stages(StageInputs(parse_stage_ms("embed=5,search=4,rerank=40"), price_per_device_hour=2.0))
    assert [r.name for r in p.rows] == ["queue", "embed", "search", "rerank"]  # no LLM unless given
    assert p.row("queue").source == "default" and p.row("embed").source == "--stage-ms"
    assert p.total_ms == 51
    assert p.row("rerank").share == pytest.approx(40 / 51)
    assert sum(r.share for r in p.rows) == pytest.approx(1.0)
    # $ per 1M requests = ms × price / 3.6e6 × 1e6
    assert p.row("rerank").cost_per_million == pytest.approx(40 * 2.0 / 3.6e6 * 1e6)  # $22.22
    assert p.row("embed").cost_per_million == pytest.approx(2.7778, abs=1e-4)
    assert p.row("queue").cost_per_million == 0 and not p.row("queue").uses_device
    assert p.total_cost_per_million == pytest.approx(49 * 2.0 / 3.6)
    assert p.slowest.name == "rerank"


def test_stage_llm_is_optional_and_dominates_when_given():
    p = plan_stages(StageInputs(parse_stage_ms("queue_wait=1,embed=5,search=4,rerank=40,llm=800")))
    assert p.row("llm").label == "LLM" and p.row("queue").ms == 1
    assert p.slowest.name == "llm" and p.row("llm").share == pytest.approx(800 / 850)
    out = _rendered(build_plan(stage_ms="embed=5,search=4,rerank=40,llm=800"))
    assert "LLM is 94% of it" in out and "94.0%" in out and "$444.44" in out


def test_stage_defaults_come_from_measured_throughput_when_known():
    p = plan_stages(StageInputs({}, candidates=50, texts_per_s=200, pairs_per_s=1000))
    assert p.row("embed").ms == pytest.approx(5.0) and p.row("embed").source == "measured texts/s"
    assert p.row("rerank").ms == pytest.approx(50.0) and p.row("rerank").source == "measured pairs/s"
    flagged = plan_stages(StageInputs({"rerank": 12.0}, pairs_per_s=1000))
    assert flagged.row("rerank").ms == 12.0 and flagged.row("rerank").source == "--stage-ms"


# ---------------------------------------------------------------------------------------- bench file


def _bench(tmp_path, obj, name="bench.json"):
    path = tmp_path / name
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return path


def test_bench_file_supplies_all_three_throughputs(tmp_path):
    path = _bench(tmp_path, {"tokens_per_s": 3500, "pairs_per_s": 900, "texts_per_s": 30, "model": "x"})
    assert load_bench(path) == BenchThroughput(3500.0, 900.0, 30.0, str(path))
    plan = build_plan(chunks=10_000_000, tokens=256, devices=8, qps=100, from_bench=path)
    assert plan.indexing.inputs.tokens_per_s == 3500
    assert plan.indexing.inputs.throughput_source == "bench file"
    assert plan.indexing.seconds_one_device == pytest.approx(2.56e9 / 3500)
    assert plan.serving.rerank_devices == 8 and plan.serving.embed_devices == 5
    assert plan.serving.rerank.source == "bench file"
    assert plan.stages.row("rerank").source == "measured pairs/s"


def test_flag_overrides_bench_and_missing_key_falls_back_to_flag(tmp_path):
    path = _bench(tmp_path, {"pairs_per_s": 900})
    plan = build_plan(chunks=10_000_000, tokens=256, tokens_per_s=8000, devices=8, from_bench=path)
    assert plan.indexing.inputs.tokens_per_s == 8000 and plan.indexing.inputs.throughput_source == "--tokens-per-s"
    assert round(plan.indexing.hours_one_device) == 89
    plan = build_plan(qps=100, pairs_per_s=1000, from_bench=path)
    assert plan.serving.inputs.pairs_per_s == 1000 and plan.serving.rerank_devices == 8  # 5000 / 700 = 7.1


def test_bench_missing_key_without_flag_is_a_clear_error(tmp_path):
    path = _bench(tmp_path, {"pairs_per_s": 900})
    with pytest.raises(PlanError, match=r'--tokens-per-s or --from-bench FILE with "tokens_per_s".*has no "tokens_per_s"'):
        build_plan(chunks=10, tokens=256, from_bench=path)


@pytest.mark.parametrize("content, message", [
    ("[1, 2]", "must hold a JSON object"),
    ("{not json", "is not valid JSON"),
    ({"tokens_per_s": -5}, '"tokens_per_s" must be a positive number'),
    ({"tokens_per_s": "fast"}, '"tokens_per_s" must be a number'),
    ({"pairs_per_s": True}, '"pairs_per_s" must be a number'),
    ({"throughput": 5}, "has none of the keys tokens_per_s, pairs_per_s, texts_per_s"),
])
def test_bad_bench_files(tmp_path, content, message):
    with pytest.raises(PlanError, match=message):
        load_bench(_bench(tmp_path, content))


def test_bench_file_not_found(tmp_path):
    with pytest.raises(PlanError, match="--from-bench: no such file"):
        load_bench(tmp_path / "missing.json")


# ---------------------------------------------------------------------------------------- validation


@pytest.mark.parametrize("kwargs, message", [
    (dict(chunks=0, tokens=256, tokens_per_s=8000), "--chunks must be a positive number, got 0"),
    (dict(chunks=10, tokens=-1, tokens_per_s=8000), "--tokens must be a positive number"),
    (dict(chunks=10, tokens=256, tokens_per_s=0), "--tokens-per-s must be a positive number"),
    (dict(chunks=10, tokens=256, tokens_per_s=float("nan")), "--tokens-per-s must be a finite number"),
    (dict(chunks=10, tokens=256, tokens_per_s=8000, devices=0), "--devices must be a positive number"),
    (dict(chunks=10, tokens=256, tokens_per_s=8000, devices=1.5), "--devices must be a whole number"),
    (dict(chunks=10, tokens=256, tokens_per_s=8000, price_per_device_hour=-1), "--price-per-device-hour must be >= 0"),
    (dict(chunks=10, tokens=256), "indexing needs a throughput: pass --tokens-per-s"),
    (dict(chunks=10, tokens_per_s=8000), "indexing needs --tokens"),
    (dict(tokens=256, qps=1), "give --chunks too"),
    (dict(qps=0), "--qps must be a positive number"),
    (dict(qps=100, candidates=0), "--candidates must be a positive number"),
    (dict(qps=100, pairs_per_s=-900), "--pairs-per-s must be a positive number"),
    (dict(qps=100, headroom=0), "--headroom must be a positive number"),
    (dict(qps=100, headroom=1.5), r"--headroom is the usable fraction .* in \(0, 1\]"),
    (dict(vectors=0, dims=1024), "--vectors must be a positive number"),
    (dict(vectors=10, dims=0), "--dims must be a positive number"),
    (dict(vectors=10), "storage needs --dims"),
    (dict(dims=1024, qps=1), "give --vectors too"),
    (dict(vectors=10, dims=1024, mrl="256,abc"), "--mrl: 'abc' is not a whole number"),
    (dict(vectors=10, dims=1024, mrl="0"), "--mrl: sizes must be positive"),
    (dict(vectors=10, dims=1024, mrl="2048"), "--mrl: Matryoshka size 2048 exceeds --dims 1024"),
    (dict(stage_ms="embed=5,gpu=3"), "--stage-ms: unknown stage 'gpu'"),
    (dict(stage_ms="embed"), "must be STAGE=MS"),
    (dict(stage_ms="embed=fast"), "is not a number of milliseconds"),
    (dict(stage_ms="embed=-5"), "--stage-ms embed must be >= 0"),
    (dict(stage_ms="queue=0,embed=0,search=0,rerank=0"), "add up to 0 ms"),
    (dict(), "nothing to plan"),
])
def test_validation_errors_name_the_flag(kwargs, message):
    with pytest.raises(PlanError, match=message):
        build_plan(**kwargs)


def test_dataclass_inputs_validate_too():
    with pytest.raises(PlanError, match="--tokens-per-s"):
        IndexingInputs(10, 256, -1)
    with pytest.raises(PlanError, match="--headroom"):
        ServingInputs(100, headroom=2)
    with pytest.raises(PlanError, match="--mrl"):
        StorageInputs(10, 128, mrl=(256,))
    with pytest.raises(PlanError, match="unknown stage"):
        StageInputs({"gpu": 1.0})


# ----------------------------------------------------------------------------------------------- CLI


@pytest.fixture
def app() -> typer.Typer:
    app = typer.Typer()
    app.command("plan")(plan_command)

    @app.command("other")
    def other() -> None:  # a second command keeps "plan" a subcommand, as in embedstream.cli
        pass

    return app


def _invoke(app, *args):
    return CliRunner().invoke(app, ["plan", *args], env={"NO_COLOR": "1", "TERM": "dumb"})


def test_cli_reference_command_prints_89_and_11_hours(app):
    result = _invoke(app, *REFERENCE)
    assert result.exit_code == 0, result.output
    assert REFERENCE_LINE in result.output
    assert "(88.9 device-hours × $2.00)" in result.output
    assert "88.9 h (3.7 days)" in result.output and "11.1 h" in result.output  # the table
    assert "serving" not in result.output and "storage" not in result.output  # only what was asked


def test_cli_serving_storage_and_stages(app):
    result = _invoke(app, "--qps", "100", "--candidates", "50", "--pairs-per-s", "900", "--texts-per-s", "30",
                     "--vectors", "100000000", "--dims", "1024", "--mrl", "256,128",
                     "--stage-ms", "embed=5,search=4,rerank=40", "--price-per-device-hour", "2")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "100 QPS × 50 candidates = 5,000 rerank pairs/s → 8 rerank devices, 5 query embedding devices" in out
    assert "storage: 100,000,000 vectors × 1,024 dims × 4 B (float32) = 410 GB (381 GiB)" in out
    assert "request: 51 ms end to end, rerank is 78% of it" in out
    assert "$22.22" in out and "78.4%" in out


def test_cli_from_bench(app, tmp_path):
    path = _bench(tmp_path, {"tokens_per_s": 8000, "pairs_per_s": 900, "texts_per_s": 30})
    result = _invoke(app, "--chunks", "10000000", "--tokens", "256", "--devices", "8", "--qps", "100",
                     "--from-bench", str(path))
    assert result.exit_code == 0, result.output
    assert f"bench file {path}: tokens_per_s=8,000, pairs_per_s=900, texts_per_s=30" in result.output
    assert REFERENCE_LINE in result.output
    assert "8 rerank devices, 5 query embedding devices" in result.output


@pytest.mark.parametrize("args, message", [
    (["--chunks", "0", "--tokens", "256", "--tokens-per-s", "8000"], "error: --chunks must be a positive number, got 0"),
    (["--chunks", "10", "--tokens", "256"], "error: indexing needs a throughput"),
    (["--qps", "100", "--headroom", "1.2"], "error: --headroom is the usable fraction"),
    (["--from-bench", "/nonexistent/bench.json", "--qps", "1"], "error: --from-bench: no such file"),
    ([], "error: nothing to plan"),
])
def test_cli_validation_errors_exit_2(app, args, message):
    result = _invoke(app, *args)
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_cli_rejects_non_numbers_and_lists_options_in_help(app):
    assert _invoke(app, "--chunks", "many").exit_code == 2
    help_text = _invoke(app, "--help").output
    for flag in ("--chunks", "--tokens", "--tokens-per-s", "--devices", "--price-per-device-hour", "--qps",
                 "--candidates", "--pairs-per-s", "--texts-per-s", "--headroom", "--vectors", "--dims",
                 "--mrl", "--from-bench", "--stage-ms"):
        assert flag in help_text


def test_a_required_number_left_out_is_refused_and_an_optional_one_may_be():
    with pytest.raises(PlanError, match="--tokens-per-s must be a number, got None"):
        IndexingInputs(1000, 256, None)
    assert ServingInputs(10, pairs_per_s=None).pairs_per_s is None
    with pytest.raises(PlanError, match="--pairs-per-s must be a positive number"):
        ServingInputs(10, pairs_per_s=0)


# ------------------------------------------------------------------------------- autoscaling (KEDA)


def test_lag_threshold_is_what_one_worker_drains_in_the_lanes_drain_time():
    from embedstream.plan.autoscale import AutoscaleInputs, parse_drain_s, plan_autoscaling

    p = plan_autoscaling(AutoscaleInputs(tokens_per_chunk=200, tokens_per_s=5000, texts_per_s=150, pairs_per_s=900,
                                         events_per_s=40, candidates=50, headroom=0.7,
                                         drain_s=parse_drain_s("bulk=600")))
    rows = {(r.topic.values_key, r.topic.topic_key): r for r in p.rows}
    # a chunk is 200 tokens: 5000 × 0.7 ÷ 200 = 17.5 chunks/s per worker
    assert rows["embedBulk", "chunks_bulk"].records_per_s == pytest.approx(17.5)
    assert rows["embedBulk", "chunks_bulk"].lag_threshold == 17.5 * 600 == 10_500
    assert rows["embedOnline", "chunks_online"].lag_threshold == 35  # 17.5 × the online default, 2 s
    assert rows["embedOnline", "queries"].lag_threshold == 210  # 150 × 0.7 × 2
    assert rows["embedOnline", "collection_queries"].lag_threshold == 210  # the collection's searches' embeddings
    # a search, one at a time on its worker: queue 2 + embed 1000/150 + search 4 ms = 12.67 ms; 78.9/s × 0.7 × 2
    assert rows["embedOnline", "collection_search"].records_per_s == pytest.approx(1000 / (2 + 1000 / 150 + 4) * 0.7)
    assert rows["embedOnline", "collection_search"].lag_threshold == 110
    # a rerank or search request is 50 pairs: 900 × 0.7 ÷ 50 = 12.6 requests/s, 25.2 in 2 s
    assert rows["rerank", "rerank"].lag_threshold == rows["rerank", "search"].lag_threshold == 25
    assert rows["cdc", "changes"].lag_threshold == 280  # 40 × 0.7 × 10
    # an online worker (1 thread) measured on its own: its chunks get their own rate
    online = plan_autoscaling(AutoscaleInputs(tokens_per_chunk=200, tokens_per_s=5000, online_tokens_per_s=2000))
    assert [r.lag_threshold for r in online.rows if r.topic.topic_key in ("chunks_online", "chunks_bulk")] == [14, 5250]
    assert p.values() == {
        "embedOnline": {"autoscaling": {"lagThreshold": {"chunks_online": 35, "queries": 210, "collection_queries": 210,
                                                         "collection_search": 110},
                                        "offeredQueriesPerS": 105.0}},  # 150 × 0.7 queries offered per worker
        "embedBulk": {"autoscaling": {"lagThreshold": {"chunks_bulk": 10_500}}},
        "rerank": {"autoscaling": {"lagThreshold": {"rerank": 25, "search": 25}}},
        "cdc": {"autoscaling": {"lagThreshold": {"changes": 280}}},
    }


def test_lag_threshold_is_at_least_one_and_unknown_throughputs_say_what_to_pass():
    from embedstream.plan.autoscale import AutoscaleInputs, plan_autoscaling

    p = plan_autoscaling(AutoscaleInputs(pairs_per_s=10, candidates=50, tokens_per_s=4000))
    rows = {(r.topic.values_key, r.topic.topic_key): r for r in p.rows}
    assert rows["rerank", "rerank"].lag_threshold == 1  # 10 × 0.7 ÷ 50 × 2 = 0.28 requests: never 0
    assert rows["embedBulk", "chunks_bulk"].lag_threshold is None
    assert rows["embedBulk", "chunks_bulk"].missing == "pass --tokens (average tokens per chunk)"
    assert rows["embedOnline", "queries"].missing == "pass --texts-per-s"
    assert set(p.values()) == {"rerank"}


@pytest.mark.parametrize("text, message", [
    ("gpu=3", "--drain-s: unknown lane 'gpu' (known: online, bulk, rerank, cdc)"),
    ("bulk", "must be LANE=SECONDS"),
    ("bulk=0", "--drain-s bulk must be a positive number"),
    ("online=soon", "is not a number of seconds"),
])
def test_drain_s_errors_name_the_lane(text, message):
    from embedstream.plan.autoscale import parse_drain_s

    with pytest.raises(PlanError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_drain_s(text)


def test_cli_prints_thresholds_and_writes_helm_values(tmp_path):
    out = tmp_path / "thresholds.yaml"
    app = typer.Typer()
    app.command()(plan_command)
    result = CliRunner().invoke(app, ["--lag-thresholds", "--tokens", "200", "--tokens-per-s", "5000",
                                      "--texts-per-s", "150", "--drain-s", "bulk=600", "--helm-values", str(out)])
    assert result.exit_code == 0, result.output
    assert "autoscaling: KEDA lagThreshold" in result.output
    assert "embedBulk" in result.output and "10,500" in result.output
    assert "rerank devices" not in result.output  # no serving section without --qps
    values = json.loads(out.read_text())  # JSON is YAML: helm -f reads it
    assert values == {"embedOnline": {"autoscaling": {"lagThreshold": {"chunks_online": 35, "queries": 210,
                                                                       "collection_queries": 210, "collection_search": 110},
                                                      "offeredQueriesPerS": 105.0}},
                      "embedBulk": {"autoscaling": {"lagThreshold": {"chunks_bulk": 10_500}}}}
    assert "note: rerank" in result.output and "--pairs-per-s" in result.output
    assert "overload: embedOnline.autoscaling.offeredQueriesPerS 105" in result.output


def test_a_searchs_time_comes_from_the_stage_table_and_its_defaults_are_the_plans():
    """collection_search: one search at a time per worker, queue + embed + search ms (--stage-ms, else defaults that
    are the stage table's own); the overload threshold is --texts-per-s × headroom."""
    from embedstream.plan.arithmetic import DEFAULT_STAGE_MS
    from embedstream.plan.autoscale import SEARCH_STAGE_MS

    assert SEARCH_STAGE_MS == {k: DEFAULT_STAGE_MS[k] for k in SEARCH_STAGE_MS}
    plan = build_plan(lag_thresholds=True, texts_per_s=90, stage_ms="queue=5,search=20")
    rows = {r.topic.topic_key: r for r in plan.autoscaling.rows if r.topic.values_key == "embedOnline"}
    assert rows["collection_search"].lag_threshold == int(1000 / (5 + 1000 / 90 + 20) * 0.7 * 2)  # 38
    assert plan.autoscaling.values()["embedOnline"]["autoscaling"]["offeredQueriesPerS"] == 63.0
    unknown = build_plan(lag_thresholds=True, tokens=200, tokens_per_s=5000).autoscaling
    assert {r.topic.topic_key: r.missing for r in unknown.rows}["collection_search"] == \
        "pass --texts-per-s (or --stage-ms embed=MS)"
    assert "offeredQueriesPerS" not in unknown.values()["embedOnline"]["autoscaling"]


def test_cli_tokens_alone_still_needs_chunks_or_lag_thresholds():
    with pytest.raises(PlanError, match="give --chunks too"):
        build_plan(tokens=200, tokens_per_s=5000, qps=1)
    assert build_plan(tokens=200, tokens_per_s=5000, lag_thresholds=True).autoscaling is not None
