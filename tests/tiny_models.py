"""Tiny random models built in-process, saved like real Hugging Face / sentence-transformers folders.

No trained CLS, last-token or cross-encoder weights can be downloaded here, and exactness of pooling
and heads does not need trained weights: these folders load through the same code paths as real
ones, in both embedstream and the sentence-transformers reference.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from embedstream.corpus import stdlib_paragraphs
from embedstream.config import default_registry
from embedstream.engine.model_spec import resolve_path

MINILM = resolve_path(default_registry()["all-MiniLM-L6-v2"].path)


def _write_st_files(folder: Path, dim: int, pooling: str, max_seq_length: int, normalize: bool = True) -> None:
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(
        json.dumps(
            {
                "word_embedding_dimension": dim,
                "pooling_mode_cls_token": pooling == "cls",
                "pooling_mode_mean_tokens": pooling == "mean",
                "pooling_mode_max_tokens": False,
                "pooling_mode_mean_sqrt_len_tokens": False,
                "pooling_mode_lasttoken": pooling == "last_token",
            }
        )
    )
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length, "do_lower_case": False}))


# A 2-layer, 32-wide encoder over MiniLM's WordPiece vocabulary (BERT and RoBERTa test models).
TINY_ENCODER = dict(
    vocab_size=30522,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=128,
)


def tiny_bert_config(**overrides):
    from transformers import BertConfig

    return BertConfig(**{**TINY_ENCODER, **overrides})


def build_tiny_bert(folder: Path, pooling: str = "cls", seed: int = 0) -> Path:
    """A 2-layer BERT with MiniLM's WordPiece vocabulary and sentence-transformers files."""
    from transformers import BertModel, BertTokenizerFast

    torch.manual_seed(seed)
    folder.mkdir(parents=True, exist_ok=True)
    BertModel(tiny_bert_config()).eval().save_pretrained(folder)
    BertTokenizerFast(vocab_file=str(MINILM / "vocab.txt")).save_pretrained(folder)
    _write_st_files(folder, 32, pooling, 128)
    return folder


def build_tiny_cross_encoder(folder: Path, seed: int = 0, base: Path | None = None) -> Path:
    """A sequence-classification head (one label) on a tiny BERT, or on ``base`` (e.g. MiniLM)."""
    from transformers import AutoModelForSequenceClassification, BertForSequenceClassification, BertTokenizerFast

    torch.manual_seed(seed)
    folder.mkdir(parents=True, exist_ok=True)
    if base is None:
        model = BertForSequenceClassification(tiny_bert_config(num_labels=1))
        tokenizer = BertTokenizerFast(vocab_file=str(MINILM / "vocab.txt"))
    else:
        model = AutoModelForSequenceClassification.from_pretrained(str(base), num_labels=1)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(base))
    model.eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def build_tiny_qwen3(folder: Path, seed: int = 0) -> Path:
    """A 2-layer Qwen3 decoder (GQA, q/k norms, RoPE) with a byte-level BPE tokenizer appending EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3Model

    torch.manual_seed(seed)
    folder.mkdir(parents=True, exist_ok=True)
    eos = "<|endoftext|>"
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=[eos], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(list(stdlib_paragraphs()[:2000]), trainer)
    eos_id = tok.token_to_id(eos)
    tok.post_processor = processors.TemplateProcessing(
        single=f"$A {eos}", pair=f"$A {eos} $B {eos}", special_tokens=[(eos, eos_id)]
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, pad_token=eos, padding_side="left")
    fast.save_pretrained(folder)
    config = Qwen3Config(
        vocab_size=tok.get_vocab_size(),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=512,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        bos_token_id=eos_id,
    )
    Qwen3Model(config).eval().save_pretrained(folder)
    _write_st_files(folder, 32, "last_token", 256)
    return folder


def build_tiny_st_pipeline(
    folder: Path, dense: list[tuple], pooling: str = "mean", include_prompt: bool = True,
    normalize: bool = True, seed: int = 0,
) -> Path:
    """A tiny BERT with a sentence-transformers module pipeline saved by ``SentenceTransformer.save``:
    Transformer -> Pooling -> one Dense per ``(out_features, bias, activation class name in torch.nn[,
    use_residual])`` -> Normalize. LaBSE and distiluse ship Dense layers like these."""
    from sentence_transformers import SentenceTransformer, models

    encoder = build_tiny_bert(folder.parent / f"{folder.name}-encoder", pooling=pooling, seed=seed)
    torch.manual_seed(seed + 1)
    modules = [models.Transformer(str(encoder)), models.Pooling(32, pooling_mode=pooling.replace("_", ""),
                                                                include_prompt=include_prompt)]
    size = 32
    for out_features, bias, activation, *residual in dense:
        layer = models.Dense(size, out_features, bias=bias, activation_function=getattr(torch.nn, activation)(),
                             use_residual=bool(residual and residual[0]))
        torch.nn.init.normal_(layer.linear.weight, std=size**-0.5)  # larger than the default: outputs differ visibly
        modules.append(layer)
        size = out_features
    if normalize:
        modules.append(models.Normalize())
    SentenceTransformer(modules=modules, device="cpu").save(str(folder))
    return folder


def build_tiny_roberta_cross_encoder(folder: Path, seed: int = 0) -> Path:
    """A RoBERTa sequence-classification model (one label): its head (dense, tanh, projection on token 0)
    is a module of its own, unlike BERT's pooler + classifier."""
    from transformers import BertTokenizerFast, RobertaConfig, RobertaForSequenceClassification

    torch.manual_seed(seed)
    folder.mkdir(parents=True, exist_ok=True)
    # positions start after the padding index (0 here), so 128 tokens need 130 position embeddings
    config = RobertaConfig(**{**TINY_ENCODER, "max_position_embeddings": 130}, pad_token_id=0, type_vocab_size=2,
                           num_labels=1)
    RobertaForSequenceClassification(config).eval().save_pretrained(folder)
    BertTokenizerFast(vocab_file=str(MINILM / "vocab.txt"), model_max_length=128).save_pretrained(folder)
    return folder
