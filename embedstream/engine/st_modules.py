"""Read a sentence-transformers folder's module pipeline (``modules.json``): what runs after the encoder.

sentence-transformers saves a model as a list of modules, each in its own folder with its own
config (``1_Pooling/config.json``, ``2_Dense/config.json`` + weights, ...), applied in order. The
vectors are only right if every module runs, so each entry is parsed here into a description the
engine's output head executes (:mod:`embedstream.engine.head`), and a module type embedstream does
not implement is refused by name at start: dropping one (as a reader of Pooling and Normalize alone
would drop LaBSE's or distiluse's Dense) gives wrong vectors without any error.

Implemented, in the only order they are accepted: Transformer -> Pooling -> Dense* -> Normalize?.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from embedstream.config import Pooling
from embedstream.engine.errors import ConfigError

IMPLEMENTED = ("Transformer", "Pooling", "Dense", "Normalize")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
DEFAULT_DENSE_ACTIVATION = "torch.nn.modules.activation.Tanh"  # sentence-transformers' Dense default

# pooling_mode (current saves) and the boolean keys of older saves -> embedstream's names
_POOLING_NAMES: dict[str, Pooling] = {"cls": "cls", "mean": "mean", "lasttoken": "last_token"}
_LEGACY_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
_SENTENCE_EMBEDDING = "sentence_embedding"


@dataclass(frozen=True)
class DenseSpec:
    """One saved ``Dense`` module: ``activation(x @ W.T + b)`` (+ x, or + x @ R.T, with a residual)."""

    path: Path  # the module's folder: config.json and the weights
    in_features: int
    out_features: int
    bias: bool = True
    activation: str = DEFAULT_DENSE_ACTIVATION  # dotted torch.nn.Module class, as saved
    residual: bool = False

    @property
    def weights(self) -> Path:
        return next(self.path / name for name in WEIGHT_FILES if (self.path / name).is_file())


@dataclass(frozen=True)
class STPipeline:
    """The modules after the Transformer, as the folder declares them."""

    transformer_path: str  # the encoder's sub-folder; "" is the model folder itself
    pooling: Pooling | None
    include_prompt: bool
    dense: tuple[DenseSpec, ...]
    normalize: bool


def _read_json(path: Path) -> dict | list | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _module_kind(entry: dict, folder: Path) -> str:
    """The class name of a sentence-transformers module; anything else is refused by its type."""
    full = str(entry.get("type", ""))
    kind = full.rsplit(".", 1)[-1]
    if not full.startswith("sentence_transformers.") or kind not in IMPLEMENTED:
        raise ConfigError(
            f"{folder}: modules.json lists module {full or '(no type)'!r} (path {entry.get('path', '')!r}), which "
            f"embedstream does not implement (implemented: {', '.join(IMPLEMENTED)}); refusing the model rather "
            "than skipping a step and returning different vectors"
        )
    return kind


def _pooling(folder: Path, cfg: dict) -> tuple[Pooling, bool]:
    modes = cfg.get("pooling_mode")
    if modes is None:
        modes = [mode for key, mode in _LEGACY_POOLING_KEYS.items() if cfg.get(key)] or ["mean"]
    modes = [modes] if isinstance(modes, str) else list(modes)
    if len(modes) != 1 or modes[0] not in _POOLING_NAMES:
        raise ConfigError(f"{folder}: unsupported pooling {modes}; embedstream supports cls, mean, last_token")
    return _POOLING_NAMES[modes[0]], bool(cfg.get("include_prompt", True))


def _dense(module_folder: Path, cfg: dict) -> DenseSpec:
    for key in ("module_input_name", "module_output_name"):
        if cfg.get(key, _SENTENCE_EMBEDDING) != _SENTENCE_EMBEDDING:
            raise ConfigError(f"{module_folder}: Dense with {key}={cfg[key]!r} (only sentence-embedding Dense layers are implemented)")
    activation = cfg.get("activation_function") or DEFAULT_DENSE_ACTIVATION
    if not str(activation).startswith("torch.nn."):
        raise ConfigError(f"{module_folder}: Dense activation {activation!r} is not a torch.nn module")
    if not any((module_folder / name).is_file() for name in WEIGHT_FILES):
        raise ConfigError(f"{module_folder}: Dense has no weights ({' or '.join(WEIGHT_FILES)})")
    try:
        return DenseSpec(
            module_folder, int(cfg["in_features"]), int(cfg["out_features"]), bool(cfg.get("bias", True)),
            str(activation), bool(cfg.get("use_residual", False)),
        )
    except KeyError as exc:
        raise ConfigError(f"{module_folder}: Dense config.json has no {exc.args[0]!r}") from None


def read_pipeline(folder: Path) -> STPipeline | None:
    """The folder's module pipeline, or None when it has no modules.json (a plain HF folder)."""
    modules = _read_json(folder / "modules.json")
    if modules is None:
        return None
    if not isinstance(modules, list) or not modules:
        raise ConfigError(f"{folder}: modules.json is not a list of modules")
    order = modules  # applied in list order, as sentence-transformers loads them
    kinds = [_module_kind(entry, folder) for entry in order]
    expected = "Transformer, Pooling, Dense (any number), Normalize (optional, last)"
    if kinds[:2] != ["Transformer", "Pooling"] or "Pooling" in kinds[2:] or "Transformer" in kinds[1:] or (
        "Normalize" in kinds[:-1]
    ):
        raise ConfigError(f"{folder}: modules.json order {kinds} is not {expected}")
    pooling, include_prompt = _pooling(folder, _read_json(folder / order[1].get("path", "") / "config.json") or {})
    dense = tuple(
        _dense(folder / entry["path"], _read_json(folder / entry["path"] / "config.json") or {})
        for entry, kind in zip(order, kinds) if kind == "Dense"
    )
    return STPipeline(str(order[0].get("path", "")), pooling, include_prompt, dense, kinds[-1] == "Normalize")


def check_dense_chain(name: str, hidden: int, dense: tuple[DenseSpec, ...]) -> int:
    """Each Dense must take the previous output's size; returns the model's output size."""
    size = hidden
    for layer in dense:
        if layer.in_features != size:
            raise ConfigError(
                f"model {name!r}: Dense {layer.path.name} takes {layer.in_features} features but receives {size}"
            )
        size = layer.out_features
    return size
