"""bench latency's reading of a run: the highest rate each policy sustains, by either criterion."""

from embedstream.bench.latency_bench import LatencyBenchResult, Step, summary, sustained_rates


def step(policy: str, rate: float, p95: float, in_target: float, shed_pct: float = 0.0, backlog: bool = False) -> Step:
    return Step("embed", policy, backlog, rate, sent=100, achieved_qps=rate * (1 - shed_pct / 100), p50=p95 / 2,
                p95=p95, p99=p95, shed_pct=shed_pct, shed=int(shed_pct), failed=0, in_target_pct=in_target)


def test_a_policy_that_sheds_sustains_by_served_p95_but_not_by_goodput():
    result = LatencyBenchResult("cpu", 30.0, 1000.0, 30.0, steps=[
        step("fixed-0", 10, 22, 100), step("fixed-0", 25, 34, 85), step("fixed-0", 50, 48, 60),
        step("deadline", 10, 21, 100), step("deadline", 25, 28, 92, shed_pct=5), step("deadline", 50, 29, 80, 15),
    ])
    goodput = sustained_rates(result)
    served = sustained_rates(result, served=True)
    assert goodput[("embed", False, "fixed-0")] == 10 and goodput[("embed", False, "deadline")] == 10
    assert served[("embed", False, "fixed-0")] == 10 and served[("embed", False, "deadline")] == 50
    lines = summary(result)
    assert any("controller (deadline) 50 vs best fixed 10 (5.00x)" in line for line in lines)


def test_no_rate_sustained_reads_as_zero():
    result = LatencyBenchResult("cpu", 30.0, 1000.0, 30.0, steps=[step("aimd", 10, 45, 50, backlog=True)])
    assert sustained_rates(result) == {("embed", True, "aimd"): 0.0}
    assert sustained_rates(result, served=True) == {("embed", True, "aimd"): 0.0}
