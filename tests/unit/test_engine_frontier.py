"""bench engine's frontier: each tuned row against the fastest peer meeting its floor, chosen paths marked."""

from __future__ import annotations

import io

from rich.console import Console

from embedstream.bench import engine_bench
from embedstream.bench.engine_bench import MethodResult, frontier_table
from embedstream.engine.tuner import Tuning
from embedstream.engine.tuning import SHAPES, Measurement, PathSpec, choose, parse_floor


def _row(method, precision, tok_s, recall, cos=0.999) -> MethodResult:
    return MethodResult(method, precision, 1, 1.0, 100, tok_s, tok_s, 0.0, 1.0, cos, recall)


def _render(renderable) -> str:
    console = Console(file=io.StringIO(), width=300)
    console.print(renderable)
    return console.file.getvalue()


MEASURED = Tuning([Measurement(PathSpec("packed", "float32"), 5000, 6.0, 1.0, 1.0),
                   Measurement(PathSpec("packed", "int8", "per_token", ("layers.0.down",), "float32"), 8000, 4.0,
                               0.99, 0.9995),
                   Measurement(PathSpec("openvino", "int8", "static"), 12000, 3.0, 0.95, 0.99)], seconds=30)


def test_tuned_rows_are_compared_with_the_fastest_peer_that_meets_their_floor():
    default, exact = parse_floor("0.98"), parse_floor("exact")
    choices = {str(f): (choose(MEASURED.measurements, f, "bulk"), MEASURED) for f in (default, exact)}
    rows = [
        _row("embedstream (packed, fp32)", "float32", 5000, 1.0, 1.0),
        _row("embedstream (tuned @ recall@10>=0.98: packed int8 per-token, kept fp32: 1 down)", "int8", 8000, 0.99),
        _row("embedstream (tuned @ exact: packed fp32)", "float32", 5100, 1.0, 1.0),
        _row("OpenVINO fp32, sorted batches of 32", "float32", 5000, 1.0, 1.0),
        _row("OpenVINO int8 static (NNCF preset, all int8)", "int8", 12000, 0.95, 0.99),
    ]
    text = _render(frontier_table(rows, choices, 1))
    tuned_line = next(line for line in text.splitlines() if "tuned @ recall@10>=0.98" in line)
    # the lossy peer is faster but misses the floor: the comparison is with OpenVINO fp32
    assert "1.60x fastest peer meeting it (OpenVINO fp32, sorted batches of 32)" in tuned_line
    assert "1.60x packed fp32" in tuned_line
    exact_line = next(line for line in text.splitlines() if "tuned @ exact" in line)
    assert "1.02x fastest peer meeting it (OpenVINO fp32" in exact_line
    lossy = next(line for line in text.splitlines() if "NNCF preset" in line)
    assert " no " in lossy


def test_the_tuners_frontier_marks_the_path_each_shape_gets(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(engine_bench.logs, "console", lambda: Console(file=out, width=300))
    floor = parse_floor("0.98")
    engine_bench.print_frontier(MEASURED, {s: choose(MEASURED.measurements, floor, s) for s in SHAPES}, "t")
    lines = out.getvalue().splitlines()
    int8 = next(line for line in lines if "packed int8 per-token, kept fp32: 1 down" in line)
    assert int8.count("chosen") == 3  # bulk, online and shared all get it
    lossy = next(line for line in lines if "openvino int8 static, all int8" in line)
    assert "no" in lossy and "chosen" not in lossy
