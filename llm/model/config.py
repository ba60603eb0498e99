"""The Qwen3 architecture's settings: :class:`Qwen3Config` (sizes, dtypes, RoPE, remat, the
attention kernel), validated when built. The model these settings build is
:mod:`llm.model.qwen3`.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping

import jax.numpy as jnp

from llm.model.attention import ATTENTION_IMPLS
from llm.model.errors import ModelConfigError, reject_unknown

#: Supported parameter / compute dtypes, by name.
DTYPES: dict[str, Any] = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}

#: Standard deviation of the normal initialiser (``initializer_range`` in transformers).
INIT_STD = 0.02

#: Rematerialisation of the decoder layers in the forward without a cache (what the backward
#: pass keeps; :meth:`Qwen3ForCausalLM.hidden_states`): ``"none"`` every intermediate of every
#: layer; ``"full"`` only each layer's input, the layer is recomputed in the backward pass
#: (about one extra forward, ~1.33x the FLOPs of forward + backward); ``"save_matmuls"`` each
#: layer's matmul outputs without a batch dimension (the projections) are kept, the rest
#: (norms, RoPE, attention, activations) recomputed.
REMAT_POLICIES = ("none", "full", "save_matmuls")

_INT_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
)


#: Keys of a ``conf/model`` preset that say where a stage's weights come from
#: (``llm.training.config.ModelConfig``: ``path``, ``pretrained``, ``shipped``), not the architecture.
WEIGHT_SOURCE_KEYS = ("path", "pretrained", "shipped")


@dataclasses.dataclass(frozen=True)
class Qwen3Config:
    """Architecture and precision of a Qwen3 decoder.

    Frozen (hashable) so it can live in a module's static graph. ``param_dtype`` is the
    storage dtype of the weights, ``dtype`` the compute dtype; both are ``"float32"`` or
    ``"bfloat16"``. Logits are always returned in float32.

    ``attention_impl`` (one of :data:`llm.model.attention.ATTENTION_IMPLS`) is how causal
    self-attention is computed in the forward without a KV cache (training, scoring) and in
    the prefill into an empty cache: ``"dense"`` the whole score tensor, ``"chunked"`` tiles
    with an online softmax (no ``[B, heads, T, T]`` buffer), ``"cudnn"`` cuDNN's fused kernel
    with its causal mask and sequence lengths (NVIDIA GPUs, 16-bit compute), ``"xla"`` the
    same layout through JAX's XLA path, ``"splash"`` Pallas' TPU kernel with segment ids,
    ``"auto"`` cuDNN on a GPU, splash on a TPU, chunked elsewhere. The decode steps (a few
    queries against the cache) call ``jax.nn.dot_product_attention`` with
    ``implementation="xla"`` / ``"cudnn"`` when this names one, and the dense grouped
    attention otherwise. It changes no architecture field and is not written to
    ``config.json``.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 4096
    param_dtype: str = "float32"
    dtype: str = "float32"
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None
    attention_impl: str = "auto"

    def __post_init__(self) -> None:
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ModelConfigError(f"{name}={value!r} must be an integer >= 1")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ModelConfigError(
                f"num_attention_heads={self.num_attention_heads} must be a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.head_dim % 2:
            raise ModelConfigError(f"head_dim={self.head_dim} must be even (RoPE rotates pairs)")
        if not (isinstance(self.rope_theta, (int, float)) and self.rope_theta > 0):
            raise ModelConfigError(f"rope_theta={self.rope_theta!r} must be a number > 0")
        if not (isinstance(self.rms_norm_eps, (int, float)) and 0 < self.rms_norm_eps < 1):
            raise ModelConfigError(f"rms_norm_eps={self.rms_norm_eps!r} must be in (0, 1)")
        for name in ("param_dtype", "dtype"):
            if getattr(self, name) not in DTYPES:
                raise ModelConfigError(f"{name}={getattr(self, name)!r} not in {sorted(DTYPES)}")
        for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ModelConfigError(f"{name}={value!r} must be None or an integer >= 0")
        if self.attention_impl not in ATTENTION_IMPLS:
            raise ModelConfigError(f"attention_impl={self.attention_impl!r} not in {ATTENTION_IMPLS}")

    # ----------------------------------------------------------------- derived values
    @property
    def jnp_dtype(self) -> Any:
        """Compute dtype as a numpy/JAX dtype."""
        return DTYPES[self.dtype]

    @property
    def jnp_param_dtype(self) -> Any:
        """Parameter storage dtype as a numpy/JAX dtype."""
        return DTYPES[self.param_dtype]

    def num_parameters(self) -> int:
        """Number of weights of the model this config describes (tied head counted once)."""
        h, hd = self.hidden_size, self.head_dim
        attn = h * hd * (2 * self.num_attention_heads + 2 * self.num_key_value_heads) + 2 * hd
        mlp = 3 * h * self.intermediate_size
        layer = attn + mlp + 2 * h
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return self.vocab_size * h + self.num_hidden_layers * layer + h + head

    # ----------------------------------------------------------------- (de)serialisation
    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Qwen3Config":
        """Build from a plain mapping of this class's fields (e.g. a ``conf/model`` preset).

        Unknown keys raise :class:`ModelConfigError` naming them; ``_target_``-style Hydra keys
        (leading underscore) are ignored.
        """
        names = {f.name for f in dataclasses.fields(cls)}
        d = {k: v for k, v in dict(d).items() if not str(k).startswith("_")}
        reject_unknown("Qwen3Config", d, names)
        d = dict(d)
        for name in ("rope_theta", "rms_norm_eps"):
            if name in d and isinstance(d[name], (int, str)) and not isinstance(d[name], bool):
                d[name] = float(d[name])  # YAML reads 1e6 as a string and 1000000 as an int
        return cls(**d)

    @classmethod
    def from_yaml(cls, path: str | os.PathLike) -> "Qwen3Config":
        """Read a ``conf/model/*.yaml`` preset: its architecture fields (the keys that say where
        the weights come from, :data:`WEIGHT_SOURCE_KEYS`, are the stage's, not the shape's)."""
        import yaml

        with open(path, encoding="utf-8") as fh:
            d = yaml.safe_load(fh)
        if not isinstance(d, Mapping):
            raise ModelConfigError(f"{path}: expected a mapping of Qwen3Config fields, got {type(d).__name__}")
        return cls.from_dict({k: v for k, v in d.items() if k not in WEIGHT_SOURCE_KEYS})

    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any]) -> "Qwen3Config":
        """Translate a Hugging Face ``config.json`` mapping.

        Reads the RoPE base from ``rope_parameters`` (transformers 5) or the top-level
        ``rope_theta`` (older files). The weights' dtype (``dtype`` or ``torch_dtype``) becomes
        both ``param_dtype`` and ``dtype``: float32 and bfloat16 are kept, anything else
        (float16, missing) becomes float32. Features this implementation does not have
        (attention bias, sliding windows, scaled RoPE, other activations) raise ``ModelConfigError``.
        """
        archs = d.get("architectures")
        model_type = d.get("model_type")
        if archs is not None:
            if "Qwen3ForCausalLM" not in archs:
                raise ModelConfigError(
                    f"unsupported architecture {list(archs)} (model_type={model_type!r}); "
                    "only Qwen3ForCausalLM is supported"
                )
        elif model_type != "qwen3":
            raise ModelConfigError(
                f"unsupported model_type={model_type!r}; only Qwen3ForCausalLM (model_type 'qwen3') "
                "is supported"
            )
        rope = d.get("rope_parameters") or {}
        scaling = d.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
        if rope_type != "default":
            raise ModelConfigError(f"rope_type={rope_type!r} is not supported; only 'default' RoPE")
        theta = rope.get("rope_theta", d.get("rope_theta", 10_000.0))
        if d.get("attention_bias", False):
            raise ModelConfigError("attention_bias=true is not supported (Qwen3 has no attention bias)")
        if d.get("use_sliding_window", False):
            raise ModelConfigError("use_sliding_window=true is not supported")
        if d.get("hidden_act", "silu") != "silu":
            raise ModelConfigError(f"hidden_act={d.get('hidden_act')!r} is not supported; only 'silu'")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
            if name not in d:
                raise ModelConfigError(f"config.json lacks the required field {name!r}")
        heads = int(d["num_attention_heads"])
        weights_dtype = d.get("dtype", d.get("torch_dtype"))
        dtype = weights_dtype if weights_dtype in DTYPES else "float32"
        eos = d.get("eos_token_id")
        if isinstance(eos, (list, tuple)):
            eos = eos[0] if eos else None
        return cls(
            vocab_size=int(d["vocab_size"]),
            hidden_size=int(d["hidden_size"]),
            intermediate_size=int(d["intermediate_size"]),
            num_hidden_layers=int(d["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(d.get("num_key_value_heads") or heads),
            head_dim=int(d.get("head_dim") or int(d["hidden_size"]) // heads),
            rope_theta=float(theta),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            max_position_embeddings=int(d.get("max_position_embeddings", 4096)),
            param_dtype=dtype,
            dtype=dtype,
            bos_token_id=d.get("bos_token_id"),
            eos_token_id=eos,
            pad_token_id=d.get("pad_token_id"),
        )

    def to_hf_dict(self) -> dict[str, Any]:
        """The ``config.json`` mapping transformers 5.24 writes for this architecture, plus the
        keys transformers 4.57 reads (top-level ``rope_theta`` and ``rope_scaling``)."""
        try:
            from importlib.metadata import version

            tf_version = version("transformers")
        except Exception:  # pragma: no cover - transformers is a dependency
            tf_version = "5.24.0"
        return {
            "architectures": ["Qwen3ForCausalLM"],
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": self.bos_token_id,
            "dtype": self.param_dtype,
            "eos_token_id": self.eos_token_id,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "hidden_size": self.hidden_size,
            "initializer_range": INIT_STD,
            "intermediate_size": self.intermediate_size,
            "layer_types": ["full_attention"] * self.num_hidden_layers,
            "max_position_embeddings": self.max_position_embeddings,
            "max_window_layers": self.num_hidden_layers,
            "model_type": "qwen3",
            "num_attention_heads": self.num_attention_heads,
            "num_hidden_layers": self.num_hidden_layers,
            "num_key_value_heads": self.num_key_value_heads,
            "pad_token_id": self.pad_token_id,
            "rms_norm_eps": self.rms_norm_eps,
            # transformers 5 reads the RoPE base from rope_parameters, 4.x from the top-level
            # rope_theta / rope_scaling (without them it takes 10000): write both.
            "rope_parameters": {"rope_theta": float(self.rope_theta), "rope_type": "default"},
            "rope_scaling": None,
            "rope_theta": float(self.rope_theta),
            "sliding_window": None,
            "tie_word_embeddings": self.tie_word_embeddings,
            "transformers_version": tf_version,
            "use_cache": True,
            "use_sliding_window": False,
            "vocab_size": self.vocab_size,
        }

    def to_dict(self) -> dict[str, Any]:
        """Plain mapping of the fields (inverse of :meth:`from_dict`)."""
        return dataclasses.asdict(self)
