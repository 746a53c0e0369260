"""OpenVINO as a CPU backend behind the runner's encoder contract: PackedBatch in, packed [T, H] hidden out.

Why: on this repo's reference CPU (Zen 4, AVX512-BF16 + VNNI, no AMX) OpenVINO's kernels ran
all-MiniLM-L6-v2 faster than the packed torch path at 2 threads in float32 (1.12x) and bf16 (1.19x),
and its NNCF static int8 2x faster than our int8 (``bench engine``, stop 20's note), though less accurate
(``nncf_int8``). It computes padded
batches, so a packed batch is cut into **length groups** that each pad to their own longest sequence
(``length_groups``: at most ``PAD_LIMIT``, 2%, of a group is padding), and only the real tokens are gathered
back, so pooling and heads stay the packed path's (sentence-transformers modules, score heads).

What it does not do: yield between layers (``yield_points``): a query waits for the whole bulk pass
ahead of it, which the packed path splits into per-layer steps. So ``backend=openvino`` suits bulk
workers; online workers keep ``auto`` (packed). BERT-family encoders only (the ONNX export traces
these; anything else is refused at start with the reason).

The encoder is exported once to ONNX (``export_onnx``) and, for int8, quantised once by NNCF
(``nncf_int8``) on the engine's calibration texts; both are cached with the activation ranges
(``calibrate.artifacts_dir``), so later starts only compile (seconds). Needs the ``openvino``
extra (``pip install '.[openvino]'``).
"""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

import numpy as np
import torch

from embedstream import logs
from embedstream.engine import calibrate
from embedstream.engine.backends import bert
from embedstream.engine.backends.linear import cpu_flags, cpu_has_native_bf16
from embedstream.engine.errors import ConfigError
from embedstream.engine.packed import PackedBatch

# Most of a length group that may be padding. MiniLM, 600 bench texts, 1 thread, medians of 3 (tok/s, padding):
# 0.0: fp32 3,967 (0%), int8 8,873; 0.02: 3,947 (1.8%), 9,116; 0.05: 3,892 (4.2%), 8,492; 0.10: 3,757 (6.3%),
# 8,753; 0.20: 3,673 (8.3%), 8,608. OpenVINO's per-call cost is small next to padded FLOPs: keep groups tight.
# Larger groups do not help two threads either: fp32 at 2 threads, max_batch_tokens 8,192 / 16,384 / 32,768 /
# 65,536 (groups up to that many tokens): 6,964 / 6,843 / 7,161 / 6,850 tok/s, one run (73% of the fp32 peak).
PAD_LIMIT = 0.02
NNCF_CALIBRATION_TEXTS = 300
ONNX_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
EXTRA = "pip install 'embedstream[openvino]' (or '.[openvino]' in a checkout)"

log = logs.get("embedstream.engine.openvino")


def missing(modules: tuple[str, ...] = ("openvino", "onnx"), install: str = EXTRA) -> str | None:
    """Why the backend (or, with other ``modules``, a bench peer) cannot load here: a package absent, else None."""
    absent = [m for m in modules if importlib.util.find_spec(m) is None]
    return f"not installed: {', '.join(absent)} ({install})" if absent else None


def supports(config, precision: str) -> str | None:
    """None when this backend can run the model at ``precision``, else the reason."""
    reason = missing() or bert.supports(config)
    if reason:
        return reason
    if precision == "bfloat16" and not cpu_has_native_bf16():
        return "bfloat16 needs a CPU with AVX512-BF16 or AMX (OpenVINO would emulate it)"
    if precision == "int8" and missing(("nncf",)):
        return f"int8 needs nncf ({EXTRA})"
    return None


def length_groups(lengths: list[int], pad_limit: float = PAD_LIMIT) -> list[tuple[int, int]]:
    """Consecutive runs ``(first, end)`` of a length-sorted (longest first) batch whose padding to the run's
    first (longest) length stays within ``pad_limit`` of the run's padded size."""
    groups: list[tuple[int, int]] = []
    start, real = 0, 0
    for i, n in enumerate(lengths):
        width = lengths[start]
        if i > start and (width * (i - start + 1) - (real + n)) > pad_limit * width * (i - start + 1):
            groups.append((start, i))
            start, real = i, 0
        real += n
    if lengths:
        groups.append((start, len(lengths)))
    return groups


def export_onnx(spec, folder: Path) -> Path:
    """The encoder (last hidden state) as ONNX, dynamic batch and length, traced with a padded row so
    the exported graph keeps the attention mask; eager attention (SDPA does not trace to ONNX)."""
    from transformers import AutoModel

    path = folder / "model.onnx"
    if path.is_file():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    model = AutoModel.from_pretrained(str(spec.path), attn_implementation="eager").eval()
    names = [n for n in ONNX_INPUTS if n != "token_type_ids" or model.config.type_vocab_size > 1]

    class LastHidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *inputs):
            return self.model(**dict(zip(names, inputs))).last_hidden_state

    vocab = int(model.config.vocab_size)
    ids = torch.randint(min(1000, vocab - 1), min(2000, vocab), (2, 16))
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    example = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    tmp = folder / f"model.{os.getpid()}.tmp.onnx"
    axes = {n: {0: "batch", 1: "length"} for n in [*names, "last_hidden_state"]}
    torch.onnx.export(LastHidden(), tuple(example[n] for n in names), str(tmp), input_names=names,
                      output_names=["last_hidden_state"], dynamic_axes=axes, opset_version=17, dynamo=False)
    os.replace(tmp, path)  # atomic: a second worker starting at once reads a whole file or none
    return path


INT8_RECIPE = "ffn-float"  # in the cached file's name: a new recipe quantises again
FFN = (r".*layer\.\d+/output/dense/MatMul", r".*layer\.\d+/intermediate/dense/MatMul")  # BERT/RoBERTa exports
# The packed encoder's linear kinds (bert.LINEAR_KINDS) as node name patterns of the exported graph.
_NODE_PATTERNS = {"qkv": r"attention/self/(query|key|value)", "out": r"attention/output/dense",
                  "up": r"intermediate/dense", "down": r"output/dense"}
TUNED_CALIBRATION_TEXTS = 64  # the tuner's int8 variants: each is one more NNCF run at first start


def node_patterns(linears) -> tuple[str, ...]:
    """Node name patterns for linears named like the packed encoder's (``layers.3.down``)."""
    out = []
    for name in sorted(linears):
        _, layer, kind = name.split(".")
        out.append(rf".*layer\.{int(layer)}/{_NODE_PATTERNS[kind]}/MatMul")
    return tuple(out)


def int8_recipe_name(linears) -> str:
    """The cached file's recipe name for a tuned set of unquantised linears."""
    import hashlib

    if not linears:
        return f"all-t{TUNED_CALIBRATION_TEXTS}"
    digest = hashlib.sha256(",".join(sorted(linears)).encode()).hexdigest()[:10]
    return f"keep{len(linears)}-{digest}-t{TUNED_CALIBRATION_TEXTS}"


def nncf_int8(spec, onnx_path: Path, keep_float: tuple[str, ...] = FFN, recipe: str = INT8_RECIPE,
              texts: int = NNCF_CALIBRATION_TEXTS):
    """NNCF static int8 (transformer preset: SmoothQuant, per-channel weights, calibrated activation ranges) on
    the engine's calibration texts, with both FFN projections left unquantised (they run in bf16 where the CPU
    has it): int8 in the attention's QKV and output projections only. Static per-tensor activation scales
    cannot follow MiniLM's FFN activations; the packed path's int8 uses per-token scales instead.
    Measured on all-MiniLM-L6-v2 (600 bench texts, 2 threads, one run; ``bench quality`` recall@10 of int8
    documents and queries vs float32):

    ============================  ============  ============  ======  =========
    left unquantised              min cos       mean 1 - cos  time    recall@10
    ============================  ============  ============  ======  =========
    nothing (NNCF's preset)       0.9911        2.2e-3        4.0 s   -
    FFN down                      0.9979        1.05e-3       4.45 s  0.963
    FFN down + up (this recipe)   0.9986        4.9e-4        4.72 s  0.976
    ============================  ============  ============  ======  =========

    Still short of the packed int8's 0.9805 recall; OpenVINO bf16 took 5.6 s. OpenVINO's per-token kind of
    int8 does not keep recall either: int8 weights (``nncf.compress_weights``, per channel) with activations
    quantised at run time per group of ``DYNAMIC_QUANTIZATION_GROUP_SIZE`` input channels, bf16 elsewhere.
    One run, 2 threads, the same length groups:

    =========================  =========  ========  =========
    int8 kind                  tok/s      min cos   recall@10
    =========================  =========  ========  =========
    this recipe                13,495     0.9986    0.976
    dynamic, groups of 64      13,583     0.9982    0.966
    dynamic, groups of 128     15,812     0.9979    0.957
    dynamic, groups of 384     16,275     0.9948    0.947
    NNCF's preset (all int8)   18,471     0.9911    -
    =========================  =========  ========  =========

    (min cos over the 600 bench texts; recall from ``bench quality``'s corpus, this recipe's from an earlier
    run.) No OpenVINO kind measured reaches 0.98; only the packed path's int8 does, at about half this speed.

    ``keep_float``: node name patterns left unquantised (``()``: NNCF's own preset, as ``bench engine``'s
    OpenVINO peer row runs it), ``recipe`` names the cached file. Cached next to the ONNX file; returns the
    OpenVINO model."""
    import openvino as ov

    path = onnx_path.with_name(f"openvino-int8-{recipe}.xml")
    core = ov.Core()
    if path.is_file():
        return core.read_model(str(path))
    import nncf

    tokenizer, calibration = calibrate.calibration_texts(spec, texts)
    model = core.read_model(str(onnx_path))
    names = [port.get_any_name() for port in model.inputs]

    def feed(text: str) -> dict:
        (item,) = tokenizer.encode_many([text], [True])
        row = {"input_ids": np.asarray([item.ids], dtype=np.int64),
               "token_type_ids": np.asarray([item.type_ids], dtype=np.int64)}
        row["attention_mask"] = np.ones_like(row["input_ids"])
        return {n: row[n] for n in names}

    log.info("openvino_int8_calibrating", model=spec.name, texts=len(calibration), cache=str(path))
    start = time.perf_counter()
    quantized = nncf.quantize(model, nncf.Dataset(calibration, feed), model_type=nncf.ModelType.TRANSFORMER,
                              subset_size=len(calibration),
                              ignored_scope=nncf.IgnoredScope(patterns=list(keep_float), validate=False))
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.xml")
    ov.save_model(quantized, str(tmp))
    os.replace(tmp.with_suffix(".bin"), path.with_suffix(".bin"))
    os.replace(tmp, path)  # the .xml last: its presence means both files are whole
    log.info("openvino_int8_calibrated", model=spec.name, seconds=round(time.perf_counter() - start, 1))
    return quantized


def int8_float_hint() -> str:
    """What the unquantised part of an int8 model runs in: bf16 where the CPU computes it natively, but float32
    on CPUs with AMX. There OpenVINO's int8 model with a bf16 hint broke single texts: over the 200 mixed-length
    bench texts of ``test_minilm_openvino_int8_keeps_cosine_on_the_bench_corpus`` the median cos to float32 was
    0.9995 both ways, but the worst text (32 tokens) fell to 0.8536 with bf16 against 0.9991 with float32 (Intel
    Xeon with AMX-BF16/INT8, OpenVINO 2026.4.1, one thread; the bf16 hint alone, without int8, stayed at 1.0).
    On AVX512-BF16 without AMX (AMD Zen 4) the bf16 hint kept 0.9986."""
    if "amx_bf16" in cpu_flags():
        return "f32"
    return "bf16" if cpu_has_native_bf16() else "f32"


class OpenVINOEncoder:
    """Runs a BERT-family encoder through OpenVINO on packed batches (see the module doc)."""

    HINTS = {"float32": "f32", "bfloat16": "bf16"}  # int8: the quantised ops in int8, the rest as int8_float_hint()

    def __init__(self, spec, config, precision: str, threads: int | None = None,
                 keep_float: tuple[str, ...] | None = None, float_dtype: str | None = None):
        """int8 only: ``keep_float`` the linears (packed names, ``layers.3.down``) left unquantised (None: both
        FFN projections, ``INT8_RECIPE``), ``float_dtype`` what they run in (None: ``int8_float_hint()``)."""
        why = supports(config, precision)
        if why:
            raise ConfigError(f"backend=openvino cannot run {spec.name} at {precision}: {why}")
        import openvino as ov

        folder = calibrate.artifacts_dir(spec.path, calibrate.model_key(spec.path)) / "openvino"
        onnx_path = export_onnx(spec, folder)
        core = ov.Core()
        if precision != "int8":
            model = core.read_model(str(onnx_path))
        elif keep_float is None:
            model = nncf_int8(spec, onnx_path)
        else:
            model = nncf_int8(spec, onnx_path, node_patterns(keep_float), int8_recipe_name(keep_float),
                              TUNED_CALIBRATION_TEXTS)
        native = "bf16" if cpu_has_native_bf16() else "f32"
        hint = {"float32": "f32", "bfloat16": "bf16"}.get(float_dtype or "", int8_float_hint()) \
            if precision == "int8" else self.HINTS.get(precision, native)
        self.compiled = core.compile_model(model, "CPU", {
            "INFERENCE_PRECISION_HINT": hint,
            "INFERENCE_NUM_THREADS": int(threads or 0),
            "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1,
        })
        self.inputs = [port.get_any_name() for port in self.compiled.inputs]
        self.request = self.compiled.create_infer_request()
        self.hidden_size = int(config.hidden_size)
        self.layers = int(config.num_hidden_layers)
        self.intermediate = int(config.intermediate_size)
        self.last_padding_tokens = 0
        self.padding_tokens = 0  # all batches' (bench engine's padding column)
        self.pad_limit = PAD_LIMIT

    def flops_per_token(self, length: int) -> float:
        """Linear layers plus attention scores and values (same count as the packed encoder's)."""
        h, f = self.hidden_size, self.intermediate
        return self.layers * (2.0 * (4 * h * h + 2 * h * f) + 4.0 * length * h)

    def __call__(self, batch: PackedBatch) -> torch.Tensor:
        lengths, cu = batch.lengths, batch.cu_seqlens.tolist()
        ids, types = batch.input_ids.numpy(), batch.token_type_ids.numpy()
        out = np.empty((batch.total_tokens, self.hidden_size), dtype=np.float32)
        padding = 0
        for first, end in length_groups(lengths, self.pad_limit):
            width, lo, hi = lengths[first], cu[first], cu[end]
            # The group's rows are consecutive in the packed order, so a row-major mask of the real positions
            # lines up with the packed tokens: one scatter in, one gather out.
            real = np.arange(width) < np.asarray(lengths[first:end])[:, None]
            feed = {n: np.zeros(real.shape, dtype=np.int64) for n in ONNX_INPUTS}
            feed["input_ids"][real] = ids[lo:hi]
            feed["token_type_ids"][real] = types[lo:hi]
            feed["attention_mask"][real] = 1
            padding += real.size - (hi - lo)
            out[lo:hi] = self.request.infer({n: feed[n] for n in self.inputs})[self.compiled.output(0)][real]
        self.last_padding_tokens = padding
        self.padding_tokens += padding
        return torch.from_numpy(out)
