"""Typed settings of one training stage, resolved once from the Hydra config.

:meth:`StageConfig.from_cfg` reads the groups a stage uses (``train``, ``reward``,
``prompt``, ``model``, ``logger``/``wandb``) once, at the entry point, into frozen
dataclasses (:class:`TrainConfig`, :class:`ModelConfig`, :class:`jaxlake.metrics.
LoggerConfig`) that the trainer passes down; nothing below it reads the raw config. Every
field is checked when built, and an unknown or out-of-range field raises ``ValueError``
naming it (``train.grpo.group_size=1 must be an integer >= 2``, ``unknown model field(s)
['hidden']``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Union

from jaxlake.config import cfg_get, reject_unknown, to_plain
from jaxlake.metrics import LoggerConfig
from llm.rl.dynamic import DynamicSamplingConfig
from llm.rl.grpo import GRPOLossConfig
from llm.rl.optim import OptimConfig
from llm.model.logprobs import DEFAULT_CHUNK as DEFAULT_LOGPROB_CHUNK
from llm.model.config import DTYPES, Qwen3Config, REMAT_POLICIES, WEIGHT_SOURCE_KEYS
from llm.game.prompts import PromptConfig
from llm.game.rewards import RewardConfig
from llm.model.sharding import MeshConfig


def _from_mapping(cls, values: Optional[Mapping[str, Any]], where: str):
    """Build a dataclass from a mapping; unknown keys raise naming the section."""
    values = dict(values or {})
    reject_unknown(where, values, (f.name for f in dataclasses.fields(cls)), ValueError)
    return cls(**values)


def _train_part(cls, values: Optional[Mapping[str, Any]], where: str):
    """:func:`_from_mapping` for a part of the ``train`` group: its range errors, which name
    the field within the part (``grpo.steps=-1 ...``), name it from the top (``train.grpo.steps``)."""
    try:
        return _from_mapping(cls, values, where)
    except ValueError as err:
        part = where.split(".", 1)[1] + "."
        msg = str(err)
        if msg.startswith(part):
            raise ValueError(f"train.{msg}") from None
        raise


def _positive_int(where: str, value: Any, low: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{where}={value!r} must be an integer >= {low}")


def _number_in(where: str, value: Any, low: float, high: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise ValueError(f"{where}={value!r} not a number in [{low:g}, {high:g}]")


@dataclasses.dataclass(frozen=True)
class WarmStartConfig:
    """Supervised warm start on reference-planner plans (see :mod:`llm.training.warmstart`).

    ``batch_size`` lakes per step; ``micro_batches`` for gradient accumulation; lakes the
    planner cannot solve take no loss. ``steps`` is 0 by default: the default model is the
    pretrained planner (``+recipe=from_scratch`` asks for 300). ``blocked_share`` in [0, 1]:
    at least this share of each batch are lakes where some agent's straight walk meets a hole
    (:func:`llm.training.warmstart.select_blocked`; 0: the lakes as drawn). ``detour_share`` in
    [0, 1]: at least this share are lakes whose reference path steps away from a goal
    (:func:`llm.training.experiments.detour.detour_lakes`: dead ends the trace must walk around), taken
    before the blocked ones. ``crowded_share`` in [0, 1]: at least this share are lakes where
    one agent's way toward its goal meets another agent (:func:`llm.training.warmstart.crowded_lakes`:
    the lakes whose ``crowd`` trace writes an agent mark), taken after the detours. ``mark_weight`` >= 1:
    the loss weight of the hole marks of style ``checks`` against 1 for every other target
    token (:func:`llm.training.warmstart.token_weights`). ``pack_rows`` > 0: the batch's lakes
    packed into that many rows of the padded row's width (:mod:`llm.training.packing`; 0:
    one lake a row); a multiple of ``micro_batches``.
    """

    enabled: bool = True
    steps: int = 0
    batch_size: int = 32
    micro_batches: int = 1
    optim: OptimConfig = OptimConfig(lr=3e-3, warmup_steps=20)
    checkpoint_every: int = 50
    keep_checkpoints: int = 2
    log_every: int = 1
    blocked_share: float = 0.0
    detour_share: float = 0.0
    crowded_share: float = 0.0
    mark_weight: float = 1.0
    pack_rows: int = 0

    def __post_init__(self) -> None:
        _positive_int("warmstart.steps", self.steps, 0)
        for name in ("blocked_share", "detour_share", "crowded_share"):
            _number_in(f"warmstart.{name}", getattr(self, name), 0.0, 1.0)
        _number_in("warmstart.mark_weight", self.mark_weight, 1, 100)
        _positive_int("warmstart.batch_size", self.batch_size)
        _positive_int("warmstart.micro_batches", self.micro_batches)
        _positive_int("warmstart.checkpoint_every", self.checkpoint_every)
        _positive_int("warmstart.keep_checkpoints", self.keep_checkpoints)
        if self.batch_size % self.micro_batches:
            raise ValueError(f"warmstart.batch_size={self.batch_size} must be divisible by micro_batches={self.micro_batches}")
        _positive_int("warmstart.pack_rows", self.pack_rows, 0)
        if self.pack_rows and (self.pack_rows > self.batch_size or self.pack_rows % self.micro_batches):
            raise ValueError(f"warmstart.pack_rows={self.pack_rows} must be at most batch_size={self.batch_size} and "
                             f"divisible by micro_batches={self.micro_batches}")


@dataclasses.dataclass(frozen=True)
class GuidanceConfig:
    """``train.grpo.guidance`` (:mod:`llm.training.guidance`).

    Attributes:
      enabled: put the reference planner's completion into each group of a sampling round
        in which no completion succeeded (and whose lake the planner solves within the
        round's token width). ``"auto"`` (``conf/train/default.yaml``) is resolved by
        :class:`TrainConfig`: on where the reference completion has the policy's form (a
        plan-only prompt, or a think block the warm start templates), off where the prompt
        thinks in the model's own words (``prompt.reasoning.warmstart=false``).
      rows: how many of such a group's ``G`` completions (its last ones) are replaced; at
        least 1 and less than ``G`` (checked against ``group_size`` by the GRPO config), so a
        guided group still holds the policy's own failures to push down.
    """

    enabled: Union[bool, str] = False
    rows: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool) and self.enabled != "auto":
            raise ValueError(f"grpo.guidance.enabled={self.enabled!r} must be true, false or auto")
        if isinstance(self.rows, bool) or not isinstance(self.rows, int) or self.rows < 1:
            raise ValueError(f"grpo.guidance.rows={self.rows!r} must be an integer >= 1")


@dataclasses.dataclass(frozen=True)
class AnchorConfig:
    """``train.grpo.anchor``: the supervised anchor of the GRPO update (InstructGPT's PPO-ptx).

    Each GRPO step also draws ``lakes`` fresh lakes of the stage's *warm-start* environment
    (the stage's own, or with ``pipeline.warmstart_env=space`` every config the engineer may
    choose), writes the reference planner's completions as the warm start does
    (``train.warmstart``'s ``blocked_share``, ``detour_share``, ``crowded_share``, ``mark_weight``
    and trace style), and adds ``weight`` times their token-mean NLL to the GRPO loss: one optimizer step
    on the summed gradient (:func:`llm.rl.updates.make_grpo_update`). ``weight`` 0 (the
    default) turns it off and costs nothing. ``screen_lakes`` > 0 draws that many lakes
    instead, decodes them greedily with the current policy and keeps ``lakes`` of them, the
    greedy decode's failures first (:func:`llm.training.experiments.screen.screen_lakes`): the anchor then
    teaches where the policy is wrong rather than where it is already right.
    """

    weight: float = 0.0
    lakes: int = 16
    screen_lakes: int = 0

    def __post_init__(self) -> None:
        _number_in("grpo.anchor.weight", self.weight, 0, 100)
        _positive_int("grpo.anchor.lakes", self.lakes)
        _positive_int("grpo.anchor.screen_lakes", self.screen_lakes, 0)
        if 0 < self.screen_lakes < self.lakes:
            raise ValueError(f"grpo.anchor.screen_lakes={self.screen_lakes} must be 0 (off) or >= grpo.anchor.lakes="
                             f"{self.lakes} (the anchor keeps lakes of the lakes it screens)")

    @property
    def enabled(self) -> bool:
        return self.weight > 0.0


@dataclasses.dataclass(frozen=True)
class ScreenConfig:
    """``train.grpo.screen``: greedy screening of each sampling round's lakes.

    With ``lakes`` > 0 every sampling round draws ``lakes`` fresh lakes of the stage's
    environment instead of ``lakes_per_step``, decodes each once greedily (the suite's
    decoding), scores the plans in the simulator, and keeps ``lakes_per_step`` of them: the
    lakes the greedy decode fails first, in drawing order, then the others
    (:mod:`llm.training.experiments.screen`). The groups then sample where the greedy choice is wrong, so
    a successful sample's advantage pushes the greedy decode itself. ``0`` (the default) draws
    ``lakes_per_step`` lakes and trains on them all.
    """

    lakes: int = 0

    def __post_init__(self) -> None:
        _positive_int("grpo.screen.lakes", self.lakes, 0)

    @property
    def enabled(self) -> bool:
        return self.lakes > 0


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
    """GRPO settings: ``lakes_per_step`` groups of ``group_size`` completions per step.

    The defaults here are plain GRPO with 8 lakes a step; ``conf/train/default.yaml`` (what
    ``python -m jaxlake.run`` trains with) adds the novice's recipe: 16 lakes a step and
    ``guidance.enabled: auto`` (docs/research/novice.md).

    ``dynamic_sampling``: DAPO's refill of the batch with informative groups, in at most
    ``max_rounds`` sampling rounds (:mod:`llm.rl.dynamic`). ``guidance``: the reference
    planner's completion in each group where no sample succeeded (:mod:`llm.training.guidance`).
    ``anchor``: the reference planner's completions of lakes of the warm-start environment,
    their NLL added to the loss (:class:`AnchorConfig`). ``screen``: each round's lakes chosen
    from more, the greedy decode's failures first (:class:`ScreenConfig`).
    """

    enabled: bool = True
    steps: int = 30
    lakes_per_step: int = 8
    group_size: int = 8
    mu: int = 1
    micro_batches: int = 1
    optim: OptimConfig = OptimConfig(lr=1e-4, warmup_steps=3)
    loss: GRPOLossConfig = GRPOLossConfig()
    dynamic_sampling: DynamicSamplingConfig = DynamicSamplingConfig(enabled=True)  # conf/train/default.yaml's
    guidance: GuidanceConfig = GuidanceConfig()
    anchor: AnchorConfig = AnchorConfig()
    screen: ScreenConfig = ScreenConfig()
    max_new_tokens: int = 32
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    compute_entropy: bool = True
    checkpoint_every: int = 10
    keep_checkpoints: int = 2
    eval_every: int = 0
    logprob_chunk: int = DEFAULT_LOGPROB_CHUNK
    remat: str = "full"

    def __post_init__(self) -> None:
        _positive_int("grpo.steps", self.steps, 0)
        _positive_int("grpo.lakes_per_step", self.lakes_per_step)
        _positive_int("grpo.group_size", self.group_size, 2)
        _positive_int("grpo.mu", self.mu)
        _positive_int("grpo.micro_batches", self.micro_batches)
        _positive_int("grpo.max_new_tokens", self.max_new_tokens)
        _positive_int("grpo.checkpoint_every", self.checkpoint_every)
        _positive_int("grpo.keep_checkpoints", self.keep_checkpoints)
        _positive_int("grpo.eval_every", self.eval_every, 0)
        _positive_int("grpo.logprob_chunk", self.logprob_chunk)
        if self.remat not in REMAT_POLICIES:
            raise ValueError(f"grpo.remat={self.remat!r} not in {REMAT_POLICIES}")
        if not self.temperature > 0:
            raise ValueError(f"grpo.temperature={self.temperature} must be > 0 (GRPO samples; 0 is greedy)")
        if self.top_k != 0 or self.top_p != 1.0:
            # the loss would need the filtered distribution's log-probs (a renormalised
            # support per token); GRPO trains on the temperature-scaled distribution only
            raise ValueError(f"grpo.top_k={self.top_k} / grpo.top_p={self.top_p}: GRPO samples from the "
                             "temperature-scaled distribution only (top_k=0, top_p=1.0), so the ratio, KL "
                             "and entropy refer to the distribution that drew the tokens")
        if self.guidance.enabled and self.guidance.rows >= self.group_size:
            raise ValueError(f"grpo.guidance.rows={self.guidance.rows} must be less than grpo.group_size="
                             f"{self.group_size} (a guided group keeps some of the policy's own completions)")
        if self.anchor.enabled and self.anchor.lakes % self.micro_batches:
            raise ValueError(f"grpo.anchor.lakes={self.anchor.lakes} must be divisible by micro_batches="
                             f"{self.micro_batches} (each micro-batch takes its share of the anchor's rows)")
        if self.screen.enabled and self.screen.lakes < self.lakes_per_step:
            raise ValueError(f"grpo.screen.lakes={self.screen.lakes} must be 0 (off) or >= lakes_per_step="
                             f"{self.lakes_per_step} (a round keeps lakes_per_step of the lakes it screens)")
        rows = self.lakes_per_step * self.group_size
        if rows % self.micro_batches:
            raise ValueError(
                f"grpo.lakes_per_step * group_size = {rows} must be divisible by micro_batches={self.micro_batches}"
            )

    @property
    def rows(self) -> int:
        return self.lakes_per_step * self.group_size


#: Where engineer self-play's contexts come from (``SelfPlayConfig.contexts``).
SELFPLAY_CONTEXTS = ("stage", "scripted")


@dataclasses.dataclass(frozen=True)
class SelfPlayConfig:
    """``train.engineer_selfplay``: the engineer's role learned by proposing, in the same GRPO
    steps as the plans (:mod:`llm.engineer.selfplay`).

    Every ``every``-th GRPO step that trains, the policy answers the engineer's prompt of the
    stage's context (the last summary: the previous stage's, or the starting policy's at stage
    1) ``proposals`` times, sampled at ``temperature`` (its analysis too, when it reasons); each
    proposal's reward is the **learnability** of the current policy on it: ``4 * p * (1 - p)``
    averaged over ``lakes`` fresh lakes of the proposed mixture, ``p`` the success of
    ``samples`` sampled plans a lake (rollouts only, no training). The proposals' rewards,
    z-scored among them (0 when they tie), weight their answers' token log-likelihood: a
    REINFORCE term added to the GRPO loss at ``weight`` in the same update (one optimizer
    step; :class:`llm.rl.updates.GRPOIterations`'s auxiliary batch). ``enabled`` false (the
    default) costs nothing. It is the loop's auxiliary loss, so ``grpo.anchor`` must be off.

    ``contexts``: ``stage`` answers the stage's own context (the summary that chose its
    environment) at every self-play step; ``scripted`` answers a fresh context each step, the
    summary of a scripted policy of drawn skill and failure profile on one of ``mixtures``
    environments around the stage's (:class:`jaxlake.engineers.contexts.ContextPool`), each
    proposal rewarded by the learnability of *that* policy on ``lakes x samples`` fresh lakes
    of it (:meth:`ContextPool.learnability`: the policy's expected success, no LLM rollouts).
    The answer then pays only where it follows the context.
    """

    enabled: bool = False
    every: int = 2
    proposals: int = 4
    lakes: int = 4
    samples: int = 4
    temperature: float = 1.0
    weight: float = 0.5
    contexts: str = "stage"
    mixtures: int = 16

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ValueError(f"engineer_selfplay.enabled={self.enabled!r} must be true or false")
        if self.contexts not in SELFPLAY_CONTEXTS:
            raise ValueError(f"engineer_selfplay.contexts={self.contexts!r} must be one of {list(SELFPLAY_CONTEXTS)}")
        _positive_int("engineer_selfplay.mixtures", self.mixtures)
        _positive_int("engineer_selfplay.every", self.every)
        _positive_int("engineer_selfplay.proposals", self.proposals, 2)
        _positive_int("engineer_selfplay.lakes", self.lakes)
        _positive_int("engineer_selfplay.samples", self.samples, 2)
        _number_in("engineer_selfplay.weight", self.weight, 0, 100)
        if not self.temperature > 0:
            raise ValueError(f"engineer_selfplay.temperature={self.temperature} must be > 0 (proposals are sampled)")


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """Held-out evaluation: ``num_lakes`` lakes of the stage's environment, greedy decoding."""

    num_lakes: int = 64
    batch_size: int = 64
    seed: int = 1_000_003
    max_new_tokens: Optional[int] = None  # None: grpo.max_new_tokens

    def __post_init__(self) -> None:
        _positive_int("eval.num_lakes", self.num_lakes, 0)
        _positive_int("eval.batch_size", self.batch_size)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything one stage needs besides the environment and the model."""

    seed: int = 0
    warmstart: WarmStartConfig = WarmStartConfig()
    grpo: GRPOConfig = GRPOConfig()
    eval: EvalConfig = EvalConfig()
    reward: RewardConfig = RewardConfig()
    prompt: PromptConfig = PromptConfig()
    max_prompt_tokens: Optional[int] = None
    prompt_bucket: int = 16
    progress: bool = True
    export_hf: bool = True
    plot: bool = True
    distributed: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    mesh: MeshConfig = MeshConfig()
    engineer_selfplay: SelfPlayConfig = SelfPlayConfig()

    @classmethod
    def from_dict(cls, train: Mapping[str, Any], reward: Optional[Mapping[str, Any]] = None,
                  prompt: Optional[Mapping[str, Any]] = None) -> "TrainConfig":
        """From the Hydra groups ``train``, ``reward`` and ``prompt`` (plain mappings)."""
        t = dict(train)
        ws = dict(t.pop("warmstart", {}) or {})
        if "optim" in ws:
            ws["optim"] = _from_mapping(OptimConfig, ws["optim"], "train.warmstart.optim")
        g = dict(t.pop("grpo", {}) or {})
        if "optim" in g:
            g["optim"] = _from_mapping(OptimConfig, g["optim"], "train.grpo.optim")
        if "loss" in g:
            loss = dict(g["loss"] or {})
            if "dynamic_sampling" in loss:
                raise ValueError("train.grpo.loss.dynamic_sampling moved: set train.grpo.dynamic_sampling.enabled "
                                 "(and .max_rounds, the refill's sampling rounds)")
            g["loss"] = _from_mapping(GRPOLossConfig, loss, "train.grpo.loss")
        if "dynamic_sampling" in g:
            g["dynamic_sampling"] = _from_mapping(DynamicSamplingConfig, g["dynamic_sampling"],
                                                  "train.grpo.dynamic_sampling")
        if "guidance" in g:
            g["guidance"] = _from_mapping(GuidanceConfig, g["guidance"], "train.grpo.guidance")
        if "anchor" in g:
            g["anchor"] = _train_part(AnchorConfig, g["anchor"], "train.grpo.anchor")
        if "screen" in g:
            g["screen"] = _train_part(ScreenConfig, g["screen"], "train.grpo.screen")
        ev = dict(t.pop("eval", {}) or {})
        sp = dict(t.pop("engineer_selfplay", {}) or {})
        t["distributed"] = dict(t.get("distributed") or {})
        t["mesh"] = MeshConfig.from_dict(t.get("mesh"))
        out = _from_mapping(cls, t, "train")
        return dataclasses.replace(
            out,
            warmstart=_train_part(WarmStartConfig, ws, "train.warmstart"),
            grpo=_train_part(GRPOConfig, g, "train.grpo"),
            eval=_train_part(EvalConfig, ev, "train.eval"),
            engineer_selfplay=_train_part(SelfPlayConfig, sp, "train.engineer_selfplay"),
            reward=RewardConfig.from_dict(reward or {}),
            prompt=PromptConfig.from_dict(prompt) if prompt is not None else PromptConfig(),
        )

    def __post_init__(self) -> None:
        r = self.prompt.reasoning
        if self.engineer_selfplay.enabled and self.grpo.anchor.enabled:
            raise ValueError("train.engineer_selfplay.enabled=true and train.grpo.anchor.weight > 0: both are the GRPO "
                             "update's auxiliary batch; turn one off")
        if self.engineer_selfplay.enabled and self.engineer_selfplay.proposals % self.grpo.micro_batches:
            raise ValueError(f"train.engineer_selfplay.proposals={self.engineer_selfplay.proposals} must be divisible "
                             f"by train.grpo.micro_batches={self.grpo.micro_batches}")
        if self.grpo.guidance.enabled == "auto":  # resolved once, here: every reader sees a bool
            on = not (r.enabled and not r.warmstart)
            object.__setattr__(self, "grpo", dataclasses.replace(
                self.grpo, guidance=dataclasses.replace(self.grpo.guidance, enabled=on)))
        if self.grpo.guidance.enabled and r.enabled and not r.warmstart:
            # the guided completion is the warm start's target; a model that thinks in its own
            # words has no templated think block to be shown
            raise ValueError("train.grpo.guidance.enabled=true needs prompt.reasoning.warmstart=true when the "
                             "prompt thinks (the guided completion is the warm start's templated think block "
                             "and plan)")


#: ``model`` fields that are not :class:`llm.model.config.Qwen3Config` fields.
MODEL_SOURCE_FIELDS = WEIGHT_SOURCE_KEYS  # (llm.model.config: a preset's keys that are not the architecture)
#: Qwen3Config fields a stage never takes from ``model`` for a fresh architecture (the
#: tokenizer decides them).
_TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The ``model`` group: where a stage's starting policy comes from, and its precision.

    Attributes:
      path: a Hugging Face Qwen3 folder (weights and tokenizer); ``None``: the embedded
        default model (:mod:`llm.game.default`).
      pretrained: without ``path``, start from a pretrained tiny policy shipped in the
        package (``True``: the one ``shipped`` names, :func:`llm.game.default.shipped_dir`;
        ``python -m jaxlake.pretrain`` made it) or from fresh weights (``False``: training from scratch).
      shipped: which shipped policy (:data:`llm.game.default.SHIPPED_DIRS`): ``novice`` (the
        default start, ``conf/start/novice.yaml``) or ``planner`` (the expert, ``start=planner``).
      dtype / param_dtype: compute and storage (master) dtype (names of
        :data:`llm.model.config.DTYPES`); the AdamW moments follow ``param_dtype``. ``None`` keeps
        the checkpoint's ``config.json``. The ``qwen3_*`` presets train bfloat16 compute on
        float32 master weights and moments (12 bytes per parameter of state, README's
        Precision section).
      architecture: the other :class:`llm.model.config.Qwen3Config` fields given (``None`` values
        dropped). Without ``path``, an architecture that differs from the embedded default's
        builds fresh weights of that shape with the game tokenizer.
    """

    path: Optional[str] = None
    dtype: Optional[str] = None
    param_dtype: Optional[str] = None
    architecture: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    pretrained: bool = True
    shipped: str = "novice"

    def __post_init__(self) -> None:
        from llm.game.default import check_shipped

        if not isinstance(self.pretrained, bool):
            raise ValueError(f"model.pretrained={self.pretrained!r} must be true or false")
        check_shipped(self.shipped)
        for name in ("dtype", "param_dtype"):
            value = getattr(self, name)
            if value is not None and value not in DTYPES:
                raise ValueError(f"model.{name}={value!r} not in {sorted(DTYPES)}")
        fields = {f.name for f in dataclasses.fields(Qwen3Config)} - {"dtype", "param_dtype"}
        reject_unknown("model.architecture", self.architecture, fields, ValueError)

    @classmethod
    def from_dict(cls, model: Optional[Mapping[str, Any]]) -> "ModelConfig":
        """From the plain ``model`` group (``None``: the embedded default); unknown keys raise
        naming them."""
        values = {k: v for k, v in dict(model or {}).items() if v is not None}
        known = set(MODEL_SOURCE_FIELDS) | {f.name for f in dataclasses.fields(Qwen3Config)}
        reject_unknown("model", values, known, ValueError)
        path = values.pop("path", None)
        pretrained = values.pop("pretrained", True)
        shipped = values.pop("shipped", "novice")
        dtype, param_dtype = values.pop("dtype", None), values.pop("param_dtype", None)
        return cls(path=str(path) if path else None, dtype=str(dtype) if dtype else None,
                   param_dtype=str(param_dtype) if param_dtype else None, architecture=values, pretrained=pretrained,
                   shipped=str(shipped))

    def precision(self) -> dict[str, str]:
        """The ``dtype`` / ``param_dtype`` overrides of a Hugging Face load (only those set)."""
        return {k: v for k, v in (("dtype", self.dtype), ("param_dtype", self.param_dtype)) if v}

    def fresh_architecture(self) -> dict[str, Any]:
        """The Qwen3Config fields this config sets for a model built from scratch: the
        architecture and the dtypes, without the special token ids."""
        arch = {k: v for k, v in self.architecture.items() if k not in _TOKEN_IDS}
        return {**arch, **self.precision()}


@dataclasses.dataclass(frozen=True)
class StageConfig:
    """Everything :func:`llm.training.stage.train_stage` reads from the Hydra config, typed.

    Attributes:
      train: the ``train`` group with ``reward`` and ``prompt`` (:class:`TrainConfig`).
      model: the ``model`` group (:class:`ModelConfig`).
      logger: metrics back ends and W&B settings (``logger``, ``wandb``).
      record: the ``train`` group as given (plain data): the run configuration the metrics
        back ends record.
    """

    train: TrainConfig = TrainConfig()
    model: ModelConfig = ModelConfig()
    logger: LoggerConfig = LoggerConfig()
    record: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_cfg(cls, cfg: Any) -> "StageConfig":
        """From a Hydra ``DictConfig`` or a plain mapping with the groups ``train``, ``reward``,
        ``prompt``, ``model``, ``logger`` and ``wandb`` (each optional: defaults)."""
        train = to_plain(cfg_get(cfg, "train", {})) or {}
        return cls(
            train=TrainConfig.from_dict(train, to_plain(cfg_get(cfg, "reward")), to_plain(cfg_get(cfg, "prompt"))),
            model=ModelConfig.from_dict(to_plain(cfg_get(cfg, "model"))),
            logger=LoggerConfig.from_cfg(cfg),
            record=train,
        )
