"""Other CPU inference engines as rows of `bench engine`: OpenVINO and ONNX Runtime, on the same texts.

The model is exported once with torch.onnx from the local folder (no hub), cached in
``~/.cache/embedstream/peers/<model-key>/``; each peer runs length-sorted batches of 32 padded to
their longest (their best arrival-free setup), pools like the model's sentence-transformers config
(mean or CLS) and normalises. Optional: each peer whose package (the ``.[bench]`` extra) is missing,
or that cannot run this model, becomes a :class:`Skipped` row with the reason.

* OpenVINO float32 / bf16 (``INFERENCE_PRECISION_HINT``; bf16 only where the CPU computes it) and
  int8 static: NNCF post-training quantisation calibrated on the engine's own 300 calibration texts.
* ONNX Runtime float32 on the graph fused by ``onnxruntime.transformers.optimizer`` (Attention,
  SkipLayerNorm, BiasGelu) and int8 dynamic per-channel (``quantize_dynamic``) of that graph.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from embedstream.engine import calibrate
from embedstream.engine.backends.linear import cpu_has_native_bf16
from embedstream.engine.backends.openvino_encoder import export_onnx, missing, nncf_int8

BATCH = 32
RunFn = Callable[[list[str]], tuple[np.ndarray, int]]


@dataclass
class Peer:
    name: str
    precision: str  # float32 | bfloat16 | int8: whose peak GEMM rate the row is compared with
    build: Callable[[int], RunFn]  # threads -> run(texts) -> (vectors, computed tokens)


@dataclass
class Skipped:
    name: str
    reason: str


def _missing(*modules: str) -> str | None:
    return missing(modules, "pip install '.[bench]'")


def _unsupported(spec) -> str | None:
    if spec.kind != "embed":
        return "not an embedding model"
    if spec.pooling not in ("mean", "cls"):
        return f"pooling {spec.pooling!r}: the peers' harness pools mean or CLS only"
    if spec.dense:
        return "the model has Dense layers after pooling, which the exported encoder lacks"
    return None


def work_dir(spec) -> Path:
    folder = Path.home() / ".cache" / "embedstream" / "peers" / calibrate.model_key(spec.path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def padded_runner(spec, infer: Callable[[dict], np.ndarray], input_names: list[str]) -> RunFn:
    """Length-sorted batches of 32 padded to their longest; pooled and normalised like the model."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(spec.path))

    def run(texts: list[str]) -> tuple[np.ndarray, int]:
        enc = tokenizer(texts, truncation=True, max_length=spec.max_tokens)["input_ids"]
        order = sorted(range(len(texts)), key=lambda i: len(enc[i]))
        out = np.empty((len(texts), 0), dtype=np.float32)
        computed = 0
        for start in range(0, len(order), BATCH):
            rows = order[start : start + BATCH]
            width = max(len(enc[i]) for i in rows)
            ids = np.full((len(rows), width), tokenizer.pad_token_id or 0, dtype=np.int64)
            mask = np.zeros_like(ids)
            for r, i in enumerate(rows):
                ids[r, : len(enc[i])] = enc[i]
                mask[r, : len(enc[i])] = 1
            feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
            hidden = infer({n: feed[n] for n in input_names})
            if spec.pooling == "cls":
                pooled = hidden[:, 0]
            else:
                pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
            if out.shape[1] == 0:
                out = np.empty((len(texts), pooled.shape[1]), dtype=np.float32)
            out[rows] = pooled / np.linalg.norm(pooled, axis=1, keepdims=True)
            computed += ids.size
        return out, computed

    return run


def _openvino(spec, onnx_path: Path, hint: str, quantized: bool) -> Callable[[int], RunFn]:
    def build(threads: int) -> RunFn:
        import openvino as ov

        core = ov.Core()
        model = nncf_int8(spec, onnx_path, keep_float=(), recipe="nncf-preset") if quantized else core.read_model(str(onnx_path))
        compiled = core.compile_model(model, "CPU", {
            "INFERENCE_PRECISION_HINT": hint, "INFERENCE_NUM_THREADS": threads,
            "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1,
        })
        names = [port.get_any_name() for port in compiled.inputs]
        request = compiled.create_infer_request()
        return padded_runner(spec, lambda feed: request.infer(feed)[compiled.output(0)], names)

    return build


def _ort_models(onnx_path: Path) -> tuple[Path, Path]:
    """(fused float32 graph, its dynamic per-channel int8 quantisation), built once."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers import optimizer

    fused = onnx_path.with_name("model-ort-fused.onnx")
    int8 = onnx_path.with_name("model-ort-fused-int8.onnx")
    if not fused.is_file():
        import onnx

        graph = onnx.load(str(onnx_path))
        hidden = next(int(i.type.tensor_type.shape.dim[-1].dim_value) for i in graph.graph.output)
        heads = _num_heads(onnx_path)
        optimized = optimizer.optimize_model(str(onnx_path), model_type="bert", num_heads=heads, hidden_size=hidden,
                                             opt_level=0)
        optimized.save_model_to_file(str(fused))
    if not int8.is_file():  # the fused ops are outside ONNX's shape inference: say their outputs are float
        from onnx import TensorProto

        quantize_dynamic(str(fused), str(int8), per_channel=True, weight_type=QuantType.QInt8,
                         extra_options={"DefaultTensorType": TensorProto.FLOAT})
    return fused, int8


def _num_heads(onnx_path: Path) -> int:
    import json

    return int(json.loads((onnx_path.parent / "config.json").read_text())["num_attention_heads"])


def _onnxruntime(spec, model_path: Path) -> Callable[[int], RunFn]:
    def build(threads: int) -> RunFn:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]
        return padded_runner(spec, lambda feed: session.run(None, feed)[0], names)

    return build


def peers(spec) -> tuple[list[Peer], list[Skipped]]:
    """The peer rows that can run here, and those that cannot (with why)."""
    skipped = [Skipped("FastEmbed", "downloads its ONNX model from the hub at first use; this machine is offline")]
    why = _unsupported(spec)
    names = ("OpenVINO", "ONNX Runtime")
    if why:
        return [], skipped + [Skipped(n, why) for n in names]
    missing_export = _missing("onnx")
    found: list[Peer] = []
    folder = work_dir(spec)
    onnx_path = None
    if missing_export is None:
        onnx_path = export_onnx(spec, folder)
        (folder / "config.json").write_text((spec.path / "config.json").read_text())
    ov_missing = missing_export or _missing("openvino")
    if ov_missing:
        skipped.append(Skipped("OpenVINO", ov_missing))
    else:
        found.append(Peer("OpenVINO fp32, sorted bs=32", "float32", _openvino(spec, onnx_path, "f32", False)))
        if cpu_has_native_bf16():
            found.append(Peer("OpenVINO bf16, sorted bs=32", "bfloat16", _openvino(spec, onnx_path, "bf16", False)))
        else:
            skipped.append(Skipped("OpenVINO bf16", "the CPU has no native bf16 (AVX512-BF16 / AMX)"))
        if _missing("nncf"):
            skipped.append(Skipped("OpenVINO int8", _missing("nncf")))
        else:
            found.append(Peer("OpenVINO int8 static (NNCF)", "int8", _openvino(spec, onnx_path, "f32", True)))
    ort_missing = missing_export or _missing("onnxruntime")
    if ort_missing:
        skipped.append(Skipped("ONNX Runtime", ort_missing))
    else:
        fused, int8 = _ort_models(onnx_path)
        found.append(Peer("ONNX Runtime fp32 (fused), sorted bs=32", "float32", _onnxruntime(spec, fused)))
        found.append(Peer("ONNX Runtime int8 dynamic per-channel", "int8", _onnxruntime(spec, int8)))
    return found, skipped
