"""The path choice is a pure function of the measurements: synthetic timings and qualities, no model."""

from __future__ import annotations

import pytest

from embedstream.engine.tuning import (
    Measurement,
    PathSpec,
    QualityFloor,
    choose,
    parse_floor,
    shape_for_lanes,
)

PACKED_FP32 = PathSpec("packed", "float32")
OV_FP32 = PathSpec("openvino", "float32")
PACKED_BF16 = PathSpec("packed", "bfloat16")
PACKED_INT8 = PathSpec("packed", "int8", "per_token", ("layers.0.down",), "float32")
OV_INT8_ALL = PathSpec("openvino", "int8", "static")


def m(path, tok_s, query_ms=5.0, recall=1.0, cos=1.0) -> Measurement:
    return Measurement(path, tok_s, query_ms, recall, cos)


# A host like issue 27's: bf16 slower than float32, all-int8 OpenVINO fast but lossy, packed int8 in between.
HOST = [
    m(PACKED_FP32, 5_400, 6.0),
    m(OV_FP32, 5_600, 7.5),
    m(PACKED_BF16, 3_400, 8.0, recall=0.996, cos=0.99997),
    m(PACKED_INT8, 9_000, 4.0, recall=0.985, cos=0.9996),
    m(OV_INT8_ALL, 12_200, 3.0, recall=0.95, cos=0.9905),
]


def test_default_floor_picks_the_fastest_path_that_keeps_recall():
    choice = choose(HOST, parse_floor("recall@10>=0.98"), "bulk")
    assert choice.winner.path == PACKED_INT8
    assert choice.runner_up.path == OV_FP32  # bf16 keeps recall too but is slower than float32 here
    assert choice.exact_best.path == OV_FP32


def test_a_lower_floor_admits_the_lossy_path():
    assert choose(HOST, parse_floor("0.9"), "bulk").winner.path == OV_INT8_ALL


def test_exact_picks_among_float32_paths_only():
    choice = choose(HOST, parse_floor("exact"), "bulk")
    assert choice.winner.path == OV_FP32 and choice.runner_up.path == PACKED_FP32
    assert choose(HOST, parse_floor("exact"), "online").winner.path == PACKED_FP32  # lower query latency


def test_min_cos_term_is_applied_too():
    floor = parse_floor("recall@10>=0.98, min_cos>=0.9999")
    assert floor == QualityFloor(recall_at_10=0.98, min_cos=0.9999)
    assert choose(HOST, floor, "bulk").winner.path == OV_FP32


def test_shapes_pick_differently_and_shared_workers_keep_paths_that_yield():
    assert choose(HOST, QualityFloor(recall_at_10=0.9), "online").winner.path == OV_INT8_ALL
    shared = choose(HOST, QualityFloor(recall_at_10=0.9), "shared")
    assert shared.winner.path == PACKED_INT8
    assert all(c.path.backend == "packed" for c in shared.considered)


def test_an_approximate_path_inside_the_noise_margin_never_displaces_float32():
    measurements = [m(PACKED_FP32, 5_000), m(PACKED_INT8, 5_100, recall=0.99)]
    assert choose(measurements, QualityFloor(), "bulk").winner.path == PACKED_FP32
    measurements = [m(PACKED_FP32, 5_000), m(PACKED_INT8, 5_400, recall=0.99)]
    assert choose(measurements, QualityFloor(), "bulk").winner.path == PACKED_INT8


@pytest.mark.parametrize("floor", ["exact", "recall@10>=0.98", "0.5", "recall@10>=0"])
@pytest.mark.parametrize("shape", ["bulk", "online", "shared"])
def test_the_choice_is_never_slower_than_the_fastest_float32_path(floor, shape):
    choice = choose(HOST, parse_floor(floor), shape)
    key = (lambda x: x.bulk_tok_s) if shape == "bulk" else (lambda x: -x.query_ms)
    assert key(choice.winner) >= key(choice.exact_best)


def test_float32_must_have_been_measured():
    with pytest.raises(ValueError, match="no float32 path"):
        choose([m(PACKED_INT8, 9_000)], QualityFloor(), "bulk")


@pytest.mark.parametrize("text", ["fast", "recall@10>0.98", "1.5", "min_cos>=2"])
def test_bad_floors_are_refused(text):
    with pytest.raises(ValueError):
        parse_floor(text)


def test_measurements_round_trip_through_json():
    for x in HOST:
        assert Measurement.from_json(x.to_json()) == x


def test_lanes_map_to_shapes():
    assert shape_for_lanes(("bulk",)) == "bulk"
    assert shape_for_lanes(("online",)) == "online"
    assert shape_for_lanes(("online", "bulk")) == "shared"
