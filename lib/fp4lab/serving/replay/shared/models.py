"""A model is a config: a checkpoint's ``config.json`` (and ``hf_quant_config.json`` where the
checkpoint has one), read, checked and shrunk to the tiny checkpoint the replay builds.

Nothing here imports SGLang: a bad config gets a named ``ConfigError`` before any environment is
built. The shrink keeps what the architecture is made of (MoE and shared experts, MLA and the DSA
indexer, sliding windows, the dense-layer prefix, the quantization and its exclusions) and makes
every width small (``TINY``); ``Model.shrunk`` says what changed and why.
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass, field
from pathlib import Path

from fp4lab.core import params, paths

BUILT_IN = paths.REPO_ROOT / "models"
"""The built-in set: ``models/<name>/config.json`` (+ ``hf_quant_config.json``) and
``source.json`` naming where each was transcribed from and which fields are assumed."""

FORMATS = {
    "modelopt_fp4": "ModelOpt NVFP4 (quant_algo NVFP4, in config.json or hf_quant_config.json)",
    "compressed-tensors": "compressed-tensors NVFP4 (4-bit float weights in groups of 16, "
    "activations too or weight-only: LLM Compressor's nvfp4-pack-quantized)",
    "mxfp4": "MXFP4 (quantization_config.quant_method mxfp4)",
}
"""The checkpoint formats taken, by SGLang's ``--quantization`` for each."""

TINY = {
    "vocab_size": 1024, "hidden_size": 256, "intermediate_size": 512,
    "moe_intermediate_size": 256, "shared_expert_intermediate_size": 256,
    "intermediate_size_mlp": 512,
    "num_attention_heads": 4, "head_dim": 64, "max_position_embeddings": 4096,
    "q_lora_rank": 128, "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 64,
    "v_head_dim": 32, "index_topk": 64, "index_head_dim": 128, "index_n_heads": 4,
    "n_routed_experts": 8, "num_experts": 8, "num_local_experts": 8,
    "num_experts_per_tok": 2, "experts_per_token": 2,
}  # fmt: skip
"""Every width made small (only fields the config has). ``index_topk`` stays above the replay's
16 tokens, so DSA's sparse attention selects every earlier token."""

MTP_FIELDS = ("num_nextn_predict_layers", "num_mtp_modules")
"""Where a config counts its multi-token-prediction layers (DeepSeek's and GLM's; MiniMax's):
each set to none, the draft layers are not the prefill graph's."""

MODEL_TYPES = {"glm_moe_dsa": "deepseek_v3", "kimi_k2": "deepseek_v3"}
"""Model types the releases' pinned transformers lacks, and the config class whose fields are
theirs (GLM-5's are DeepSeek-V3's plus the DSA indexer's; Kimi-K2 ships DeepSeek-V3's config
class as its remote code)."""

MLA_EXCLUDED = "*kv_b_proj"
"""Excluded from NVFP4 in MLA models: the releases' DeepSeek weight post-processing
(``post_load_weights``) derives the absorbed MLA weights from ``kv_b_proj`` and takes no NVFP4
there."""


class ConfigError(ValueError):
    """A config the replay cannot take; names the file, the field and what is allowed."""


@dataclass(frozen=True)
class Model:
    """A checkpoint's config, its FP4 quantization and where it came from."""

    name: str
    config: dict
    quantization: str
    """The FP4 format: ``nvfp4`` or ``mxfp4``."""
    excluded: tuple[str, ...]
    hf_quant_config: dict | None = None
    source: dict = field(default_factory=dict)
    method: str = "modelopt_fp4"
    """SGLang's ``--quantization`` for the checkpoint's format (a key of ``FORMATS``)."""

    @property
    def architecture(self) -> str:
        return self.config["architectures"][0]

    @property
    def kv_cache(self) -> str | None:
        """The KV cache quantization the checkpoint declares (``kv_cache_quant_algo``, e.g.
        ``FP8``), which the release reads from it as its server does; None: the model's dtype."""
        inline = self.config.get("quantization_config") or {}
        given = (self.hf_quant_config or {}).get("quantization", {})
        return given.get("kv_cache_quant_algo") or inline.get("kv_cache_quant_algo")

    def tiny(self) -> tuple[dict, dict | None, list[str]]:
        """The tiny config, its quantization file and what the shrink changed beyond widths."""
        return shrink(self.config, self.hf_quant_config, self.method)

    def as_record(self) -> dict:
        tiny, _, shrunk = self.tiny()
        return {"name": self.name, "architecture": self.architecture,
                "quantization": self.quantization, "method": self.method,
                "kv_cache": self.kv_cache, "excluded": list(self.excluded),
                "source": self.source, "shrunk": shrunk,
                "tiny": {k: tiny[k] for k in sorted(tiny) if k in TINY or k == "num_hidden_layers"}}  # fmt: skip


def write_tiny(config: dict, hf_quant: dict | None, folder: Path) -> Path:
    """The tiny checkpoint folder (configs only: SGLang's dummy loader makes the weights)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    if hf_quant is not None:
        (folder / "hf_quant_config.json").write_text(json.dumps(hf_quant, indent=1))
    return folder


def _json(path: Path) -> dict:
    try:
        found = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--config: cannot read {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--config: {path} is not valid JSON ({exc})") from None
    if not isinstance(found, dict):
        raise ConfigError(f"--config: {path} holds {type(found).__name__}, not a JSON object")
    return found


def _fp4_group(group: dict) -> bool:
    """Whether a compressed-tensors config group quantizes weights as NVFP4 (4-bit floats in
    groups of 16)."""
    weights = group.get("weights") or {}
    return (weights.get("num_bits"), str(weights.get("type")).lower(), weights.get("group_size")) == (
        4, "float", 16)  # fmt: skip


def quantization(
    config: dict, hf_quant: dict | None, where: str
) -> tuple[str, str, tuple[str, ...]]:
    """The FP4 format (``nvfp4`` or ``mxfp4``), SGLang's ``--quantization`` for it (a key of
    ``FORMATS``) and the excluded modules, from ``config.json``'s ``quantization_config`` or
    ModelOpt's ``hf_quant_config.json``."""
    inline = config.get("quantization_config") or {}
    modelopt = (hf_quant or {}).get("quantization") or {}
    method = str(inline.get("quant_method", "")).lower()
    algo = str(inline.get("quant_algo") or modelopt.get("quant_algo") or "").upper()
    if method == "mxfp4":
        return "mxfp4", "mxfp4", tuple(inline.get("modules_to_not_convert") or ())
    if algo == "NVFP4" and method in ("", "modelopt", "modelopt_fp4"):
        excluded = inline.get("ignore") or inline.get("exclude_modules")
        return "nvfp4", "modelopt_fp4", tuple(excluded or modelopt.get("exclude_modules") or ())
    groups = (inline.get("config_groups") or {}).values()
    if method == "compressed-tensors" and any(_fp4_group(g) for g in groups):
        return "nvfp4", "compressed-tensors", tuple(inline.get("ignore") or ())
    said = f"quant_method={method or None}, quant_algo={algo or None}"
    raise ConfigError(f"--config: {where} has no FP4 quantization ({said}); allowed: "
                      f"{'; '.join(FORMATS.values())}")  # fmt: skip


def read(path: str | Path, name: str | None = None) -> Model:
    """The model of a ``config.json`` given by path (or its folder), with the folder's
    ``hf_quant_config.json``; ConfigError naming what is wrong otherwise."""
    given = Path(path)
    file = given / "config.json" if given.is_dir() else given
    if not file.is_file():
        raise ConfigError(f"--config: no such file {file}; allowed: a config.json or its folder")
    config = _json(file)
    archs = config.get("architectures")
    if not isinstance(archs, list) or not archs or not all(isinstance(a, str) for a in archs):
        raise ConfigError(f"--config: {file} has architectures={archs!r}; allowed: a list of "
                          f"model class names, as a checkpoint's config.json holds")  # fmt: skip
    quant_file = file.parent / "hf_quant_config.json"
    hf_quant = _json(quant_file) if quant_file.is_file() else None
    fmt, method, excluded = quantization(config, hf_quant, str(file))
    source = _json(file.parent / "source.json") if (file.parent / "source.json").is_file() else {}
    return Model(name or file.parent.name, config, fmt, excluded, hf_quant, source, method=method)


def built_in() -> list[str]:
    """The names of the built-in set."""
    return sorted(p.parent.name for p in BUILT_IN.glob("*/config.json"))


ALL, NONE = "all", "none"
"""The values of a models parameter that mean the whole built-in set, and none of it."""


def check_names(
    name: str, given: list[str] | tuple[str, ...] | str, none: bool = False
) -> list[str]:
    """The models of the parameter ``name`` as given (a list, one comma-separated string, ``all``
    or, where ``none`` is allowed, ``none``), each one of the built-in set."""
    allowed = f"{ALL}, {NONE + ', ' if none else ''}{', '.join(built_in())}"
    names = params.items(name, given, allowed)
    if names == [ALL]:
        return built_in()
    if none and names == [NONE]:
        return []
    params.choices(name, names, tuple(built_in()))
    return names


def named(name: str) -> Model:
    """One model of the built-in set, by name."""
    if name not in built_in():
        raise ConfigError(f"models contains {name!r}; allowed values: {', '.join(built_in())}")
    return read(BUILT_IN / name)


MOE_STEPS = ("decoder_sparse_step", "moe_layer_freq", "interleave_moe_layer_step")
"""Fields that interleave MoE layers with dense ones every N layers."""

NESTED = ("text_config", "vision_config")
"""A multimodal wrapper's configs: each shrunk as a model of its own."""


def layers_kept(config: dict) -> int:
    """The fewest layers that keep every layer pattern of ``config``: at least two (the dense
    prefix as one layer, then one of the rest), every kind a per-layer ``layer_types`` holds
    (sliding and full, linear and full attention), one MoE layer of an interleave."""
    kept = 2
    kinds = config.get("layer_types")
    if isinstance(kinds, list) and kinds:
        firsts: dict[str, int] = {}
        for i, kind in enumerate(kinds):
            firsts.setdefault(json.dumps(kind), i)
        kept = max(kept, max(firsts.values()) + 1)
    for key in MOE_STEPS:
        step = config.get(key)
        if isinstance(step, int) and step > 1:
            kept = max(kept, step)
    return kept


def _shrunk(config: dict) -> dict:
    """One model's config with every width of TINY and its layers cut to ``layers_kept``
    (per-layer lists with them, the dense prefix as one layer, MTP layers left out)."""
    tiny = {**config, **{k: v for k, v in TINY.items() if k in config}}
    heads, kv = config.get("num_attention_heads"), config.get("num_key_value_heads")
    if kv is not None and heads:
        tiny["num_key_value_heads"] = TINY["num_attention_heads"] // (2 if kv < heads else 1)
    kept = layers_kept(config)
    if "num_hidden_layers" in config:
        tiny["num_hidden_layers"] = kept
    if config.get("first_k_dense_replace"):
        tiny["first_k_dense_replace"] = 1
    count = config.get("num_hidden_layers")
    for key, value in config.items():  # per-layer lists (layer_types, no_rope_layers, ...)
        if isinstance(value, list) and count and len(value) == count:
            tiny[key] = value[:kept]
    if isinstance(config.get("mlp_only_layers"), list):
        tiny["mlp_only_layers"] = [i for i in config["mlp_only_layers"] if i < kept]
    for counted in MTP_FIELDS:
        if config.get(counted):
            tiny[counted] = 0
    if config.get("rotary_dim") and config.get("head_dim"):  # a partial rotary keeps its share
        tiny["rotary_dim"] = max(2, config["rotary_dim"] * tiny["head_dim"] // config["head_dim"])
    return tiny


def shrink(config: dict, hf_quant: dict | None, method: str) -> tuple[dict, dict | None, list[str]]:
    """The config shrunk (``_shrunk``; a multimodal wrapper's text and vision configs each as a
    model of their own), the quantization kept; ModelOpt's quantization file; and what changed
    beyond the widths."""
    tiny = _shrunk(config)
    notes: list[str] = []
    for key in NESTED:
        if isinstance(config.get(key), dict):
            tiny[key] = _shrunk(config[key])
            notes.append(f"{key} shrunk as a model of its own")
    if tiny.get("num_hidden_layers", 2) > 2:
        notes.append(f"{tiny['num_hidden_layers']} layers kept, so that every layer pattern is")
    if config.get("n_group", 1) > 1:
        tiny["n_group"], tiny["topk_group"] = 2, 1
        notes.append("grouped routing kept as 2 groups of 4 experts, 1 chosen")
    if config.get("model_type") in MODEL_TYPES:
        tiny["model_type"] = MODEL_TYPES[config["model_type"]]
        notes.append(f"model_type {config['model_type']} read as {tiny['model_type']} (the "
                     f"releases' transformers has no {config['model_type']} config class)")  # fmt: skip
    if "kv_lora_rank" in config and method == "modelopt_fp4":
        inline = "quantization_config" in config
        quant = dict(config["quantization_config"] if inline else hf_quant["quantization"])
        key = "ignore" if "ignore" in quant else "exclude_modules"
        if not any(fnmatch.fnmatch("model.layers.0.self_attn.kv_b_proj", p)
                   for p in quant.get(key, [])):  # fmt: skip
            quant[key] = [*quant.get(key, []), MLA_EXCLUDED]
            notes.append(f"{MLA_EXCLUDED} excluded from NVFP4 (the releases' post_load_weights "
                         f"takes no NVFP4 there)")  # fmt: skip
        if inline:
            tiny["quantization_config"] = quant
        else:
            hf_quant = {**hf_quant, "quantization": quant}
    return tiny, hf_quant, notes
