"""tests/run_summary.py reads the progress logs of tests/run_rig.py into one line per run."""

from __future__ import annotations

import run_summary

LOG = """\
23:59:00 load  3.00 start tests/unit/test_a.py::test_one
23:59:30 load  5.00 end   tests/unit/test_a.py::test_one call:passed 30.0s
23:59:30 load  5.00 start tests/kafka/test_b.py::test_two
00:01:00 load  9.00 end   tests/kafka/test_b.py::test_two setup:failed 90.0s
00:01:00 load  7.00 start tests/cdc/test_c.py::test_three
"""


def test_a_run_reads_as_its_tests_time_load_failures_and_where_it_stopped(tmp_path):
    path = tmp_path / "progress-1.log"
    path.write_text(LOG)
    run = run_summary.read(path)
    assert run.started == 3 and run.wall_min == 2.0  # past midnight
    assert run.failed == ["tests/kafka/test_b.py::test_two"]
    assert run.running == "tests/cdc/test_c.py::test_three"
    assert run.per_folder["unit"] == 30.0 and run.per_folder["kafka"] == 90.0
    line = run_summary.table([run]).splitlines()[2]
    assert line.startswith("| progress-1.log | 3 | 2.0 | 5.0 | 3.0-9.0 | 1 (unfinished: tests/cdc/test_c.py::test_three) |")
