"""A first run shows the demo's own steps: library warnings that are not the user's business are DEBUG records."""

from __future__ import annotations

import logging
import sys

from embedstream import logs


def test_kafka_pythons_no_group_warning_is_a_debug_record(capsys):
    from kafka import KafkaConsumer

    logs.configure(json=True, level="INFO")
    consumer = KafkaConsumer(bootstrap_servers="127.0.0.1:1", api_version=(2, 8))  # a probe: no group
    consumer.close()
    logging.getLogger("kafka.coordinator.consumer").warning("something else went wrong")
    err = capsys.readouterr().err
    assert "group_id is None" not in err
    assert "something else went wrong" in err  # only the listed message is demoted

    logs.configure(json=True, level="DEBUG")
    logging.getLogger("kafka.coordinator.consumer").warning("group_id is None: disabling auto-commit.")
    err = capsys.readouterr().err
    assert "group_id is None" in err and '"level": "debug"' in err
    logs.configure(json=True, level="INFO")


def test_no_weight_loading_bars_once_configured():
    logs.configure(json=True)
    import transformers

    assert not transformers.utils.logging.is_progress_bar_enabled()


def test_triton_stays_out_of_a_cpu_process():
    """transformers imports torch._dynamo, which imported triton; its nanobind bindings then printed ~40
    "leaked instance/type/function" lines at every interpreter exit."""
    import subprocess

    code = ("import sys, embedstream, torch, torch._dynamo, transformers.masking_utils; "
            "print(torch.cuda.is_available(), sys.modules.get('triton') is not None)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    cuda, loaded = out.stdout.split()
    assert loaded == ("True" if cuda == "True" else "False"), out.stderr[-2000:]
    assert "nanobind" not in out.stderr
