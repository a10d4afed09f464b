"""Tiny random mlx-lm models of any architecture: the zoo test, coverage and examples.

:func:`tiny_config` fills an architecture's ``ModelArgs`` with small values by field
name (:data:`SMALL`) plus per-architecture overrides (:data:`OVERRIDES`); :func:`build`
makes the model with random weights, evaluated, optionally quantized.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
from typing import Any

import mlx.core as mx
import mlx.nn as nn

# the architectures of the zoo test (issue 3)
ZOO = ("llama", "qwen2", "qwen3", "gemma3_text", "mixtral", "phi3", "olmo2", "starcoder2", "deepseek_v3")

# small values by ModelArgs field name; only fields an architecture declares are set
SMALL: dict[str, Any] = {
    "hidden_size": 64,
    "d_model": 64,
    "n_embd": 64,
    "dim": 64,
    "num_hidden_layers": 2,
    "n_layer": 2,
    "n_layers": 2,
    "num_layers": 2,
    "intermediate_size": 128,
    "ffn_dim": 128,
    "n_inner": 128,
    "hidden_dim": 128,
    "num_attention_heads": 4,
    "n_head": 4,
    "n_heads": 4,
    "num_heads": 4,
    "num_key_value_heads": 2,
    "n_kv_heads": 2,
    "num_kv_heads": 2,
    "head_dim": 16,
    "vocab_size": 128,
    "rms_norm_eps": 1e-5,
    "layer_norm_eps": 1e-5,
    "layer_norm_epsilon": 1e-5,
    "norm_eps": 1e-5,
    "norm_epsilon": 1e-5,
    "max_position_embeddings": 4096,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "num_local_experts": 4,
    "num_experts": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "kv_lora_rank": 16,
    "q_lora_rank": 32,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 16,
    "v_head_dim": 16,
    "sliding_window": 16,
    "rope_theta": 10000.0,
}

# values for fields an architecture requires (no default) and SMALL does not name
REQUIRED: dict[str, Any] = {
    "first_k_dense_replace": 1,
    "routed_scaling_factor": 1.0,
    "num_shared_experts": 1,
    "topk_group": 1,
    "n_group": 1,
    "moe_topk": 2,
    "topk_method": "greedy",
    "logits_scaling": 1.0,
    "embedding_multiplier": 1.0,
    "attention_multiplier": 1.0,
    "residual_multiplier": 1.0,
    "scale_emb": 1.0,
    "scale_depth": 1.0,
    "dim_model_base": 64,
    "partial_rotary_factor": 1.0,
    "n_positions": 4096,
    "n_ctx": 4096,
    "model_max_length": 4096,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "no_rope_layers": [],
    "conv_kernel": 4,
    "conv_L_cache": 3,
    "conv_window": 4,
    "conv1d_width": 4,
    "state_size": 16,
    "ssm_state_size": 16,
    "time_step_rank": 8,
    "n_groups": 1,
    "mamba_num_heads": 4,
    "mamba_head_dim": 16,
    "rope_scaling": None,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    "sliding_window_pattern": 2,
    "sliding_window_size": 16,
    "rotary_dim": 16,
    "rotary_pct": 1.0,
    "rotary_emb_base": 10000.0,
    "shared_intermediate_size": 64,
    "moe_layer_freq": 1,
    "moe_num_experts": 4,
    "hidden_act": "silu",
    "ffn_hidden_size": 128,
    "expert_ffn_hidden_size": 32,
    "ff_intermediate_size": 128,
    "intermediate_size_mlp": 128,
    "num_dense_layers": 1,
    "num_query_heads": [4, 4],
    "linear_num_value_heads": 4,
    "linear_num_key_heads": 2,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "full_attention_interval": 2,
    "num_attention_groups": 2,
    "num_kv_reuse_layers": 0,
    "logits_soft_cap": None,
    "layer_types": ["full_attention", "full_attention"],
}

_YARN = {
    "type": "yarn",
    "factor": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 0,
    "original_max_position_embeddings": 4096,
    "beta_fast": 32,
    "beta_slow": 1,
}
_ROPE_PARAMS = {
    "rope_theta": 10000.0,
    "rope_type": "default",
    "llama_4_scaling_beta": 0.1,
    "original_max_position_embeddings": 4096,
}

OVERRIDES: dict[str, dict[str, Any]] = {
    # a sliding (RotatingKVCache) layer and a global (KVCache) layer; the window is
    # shorter than the zoo prompt, so the rotating cache trims and wraps
    "gemma3_text": {"sliding_window_pattern": 2, "query_pre_attn_scalar": 16, "rope_local_base_freq": 10000.0},
    # one dense layer, then a mixture-of-experts layer
    "deepseek_v3": {"first_k_dense_replace": 1, "n_group": 1, "topk_group": 1, "topk_method": "noaux_tc"},
    # architectures whose configs need a structured field (coverage only)
    "deepseek_v2": {"rope_scaling": _YARN},
    "minicpm3": {
        "rope_scaling": {
            "type": "longrope",
            "short_factor": [1.0] * 4,
            "long_factor": [1.0] * 4,
            "original_max_position_embeddings": 4096,
        }
    },
    "ministral3": {"rope_parameters": _ROPE_PARAMS},
    "mistral4": {"rope_parameters": _ROPE_PARAMS},
    "exaone4": {"sliding_window_pattern": "LG"},
    "lfm2_moe": {"layer_types": ["conv", "full_attention"]},
    "llama4_text": {"no_rope_layers": [1, 1]},
    "mamba2": {"time_step_limit": (0.0, float("inf"))},
    "recurrent_gemma": {"attention_window_size": 16, "block_types": ["recurrent", "attention"]},
    "hunyuan": {
        "num_shared_expert": 1,
        "cla_share_factor": 1,
        "rope_scaling": {"alpha": 1.0, "factor": 1.0, "type": "dynamic"},
    },
    "lille-130m": {"block_size": 4096},
    "exaone_moe": {"is_moe_layer": [False, True]},
    "glm_moe_dsa": {
        "index_head_dim": 16,
        "index_n_heads": 2,
        "index_topk": 4,
        "scoring_func": "sigmoid",
        "topk_method": "noaux_tc",
    },
    # its Model writes -inf into logits at fixed token ids up to 100351: a smaller vocab
    # makes eager mlx-lm itself scatter out of bounds (heap corruption)
    "phi3small": {"dense_attention_every_n_layers": 2, "gegelu_limit": 20.0, "vocab_size": 100352},
    "cohere2": {"sliding_window_pattern": 2},
    "qwen3_next": {"full_attention_interval": 2},
    "baichuan_m1": {"sliding_window_layers": [0], "conv_window": 2},
}


def model_classes(model_type: str) -> tuple[Any, Any]:
    """The (Model, ModelArgs) classes of an mlx-lm architecture module."""
    try:
        mod = importlib.import_module(f"mlx_lm.models.{model_type}")
    except ImportError as exc:
        raise ImportError(f"mlx-lm has no architecture {model_type!r} ({exc})") from exc
    return mod.Model, mod.ModelArgs


def _exists(model_type: str) -> bool:
    return importlib.util.find_spec(f"mlx_lm.models.{model_type}") is not None


def tiny_config(model_type: str, **extra: Any) -> dict[str, Any]:
    """A small configuration dict for ``model_type`` (fields by name from :data:`SMALL`)."""
    _, args_cls = model_classes(model_type)
    fields = dataclasses.fields(args_cls) if dataclasses.is_dataclass(args_cls) else ()
    names = {f.name for f in fields}
    cfg: dict[str, Any] = {"model_type": model_type}
    cfg.update({k: v for k, v in SMALL.items() if k in names})
    for f in fields:  # required flags nobody named: off
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if not required or f.name in cfg:
            continue
        if f.name in REQUIRED:
            cfg[f.name] = REQUIRED[f.name]
        elif f.name == "text_config":  # a multimodal wrapper: a small text model inside
            inner = f"{model_type}_text"
            cfg[f.name] = {
                **SMALL,
                **REQUIRED,
                "tie_word_embeddings": False,
                "norm_topk_prob": True,
                "model_type": inner if _exists(inner) else model_type,
            }
        elif str(f.type) in ("bool", "<class 'bool'>"):
            cfg[f.name] = False
    cfg.update(OVERRIDES.get(model_type, {}))
    cfg.update(extra)
    return _head_dim_follows(cfg, extra)


def _head_dim_follows(cfg: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """A caller who sets the hidden size or the number of heads, and not the head size,
    gets mlx-lm's own default for it (hidden size over heads), not the tiny models' 16:
    ``build("mixtral", hidden_size=2048, num_attention_heads=32)`` has heads of 64."""
    hidden, heads = cfg.get("hidden_size"), cfg.get("num_attention_heads")
    resized = "hidden_size" in extra or "num_attention_heads" in extra
    if "head_dim" in extra or cfg.get("head_dim") != SMALL["head_dim"] or not resized:
        return cfg
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0 and hidden % heads == 0:
        cfg["head_dim"] = hidden // heads
    return cfg


def build(
    model_type: str,
    *,
    seed: int = 0,
    dtype: mx.Dtype = mx.float32,
    bits: int | None = None,
    group_size: int = 32,
    **extra: Any,
) -> nn.Module:
    """A tiny ``model_type`` model with random weights, evaluated (optionally quantized).

    ``group_size`` is 32, not mlx-lm's 64: with a hidden size of 64, a group of 64 sends
    the projections to MLX 0.32.4's CUDA ``qmm_sm90`` kernel (chosen when K <= group
    size), whose float32 results are wrong and change from call to call
    (docs/gpu.md, item 1 of the 06:45 UTC run).
    """
    model_cls, args_cls = model_classes(model_type)
    mx.random.seed(seed)
    model = model_cls(args_cls.from_dict(tiny_config(model_type, **extra)))
    if dtype != mx.float32:
        model.set_dtype(dtype)
    if bits is not None:
        nn.quantize(model, group_size=group_size, bits=bits)
    mx.eval(model.parameters())
    return model
