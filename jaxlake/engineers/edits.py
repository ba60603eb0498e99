"""An engineer's answer is an **edit** of the current mixture: keep, re-weight, drop or add.

Every engineer, the LLM and the baselines alike, answers in this one language, the way every
UED method is a policy over one level type. An :class:`Edit` says what happens to the current
:class:`~jaxlake.mixture.Mixture`'s components (numbered ``0 .. n-1`` in its order, as the
summary lists them) and which new components join; :func:`apply_edit` turns it into the next
stage's mixture under the engineer's :class:`EditRules`:

* ``keep``     -- the mixture as it is;
* ``reweight`` -- new relative weights, one per current component (``[1, 2, 1]``);
* ``drop``     -- one component leaves (at most ``max_drop``), the rest keep their weights;
* ``add``      -- up to ``max_add`` new configs of the space, each with its **share** of the
  new mixture (the old components keep at least ``min_keep`` of the mass between them);
* ``replace``  -- drop one and add (from a one-component mixture: a new environment).

``reweight`` weights may ride along with ``drop``, ``add`` and ``replace``. After the edit
every component keeps at least ``floor`` of the mass (:func:`floor_weights`), so nothing that
works disappears by accident: only an explicit drop removes a component. The JSON form, what
the policy and an external endpoint write and what ``engineer.json`` keeps::

    {"edit": "keep"}
    {"edit": "reweight", "weights": [1, 2, 0.5]}
    {"edit": "drop", "drop": 2}
    {"edit": "add", "add": [{"weight": 0.25, "config": {"height": 6, "num_agents": 2}}]}
    {"edit": "replace", "drop": 0, "add": [{"weight": 1.0, "config": {...}}]}

An added config's missing fields keep the current main component's values
(:func:`~jaxlake.mixture.mixture_from_obj`), and it must lie in the engineer's space
(:func:`~jaxlake.engineers.space.check_in_space`); kept components are the run's own and need
not. A whole environment (a config or ``{"mixture": [...]}``, the form of earlier versions)
is read as the edit that turns the current mixture into it (:func:`edit_between`), and so
passes the same rules: from a one-component mixture any single config is a ``replace``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from jaxlake.config import LakeConfig, reject_unknown
from jaxlake.engineers.base import ProposalError
from jaxlake.engineers.space import ANY_EDIT, EditRules, check_in_space
from jaxlake.mixture import Mixture, mixture_from_obj

__all__ = ["ANY_EDIT", "EDIT_KINDS", "Edit", "EditRules", "apply_edit", "check_edit", "edit_between",
           "edit_from_obj", "edit_proposal", "floor_weights", "infer_kind", "is_edit_obj"]

def _key(config: LakeConfig) -> str:
    """A config's identity (LakeConfig is not hashable): its fields as sorted JSON."""
    return json.dumps(config.to_dict(), sort_keys=True)


#: The kinds of edit, in the order constrained decoding offers them.
EDIT_KINDS = ("keep", "reweight", "drop", "add", "replace")
#: The keys each kind may carry beside ``edit`` (required ones first).
_KIND_KEYS = {"keep": ((), ()), "reweight": (("weights",), ()), "drop": (("drop",), ("weights",)),
              "add": (("add",), ("weights",)), "replace": (("drop", "add"), ("weights",))}


@dataclass(frozen=True)
class Edit:
    """One edit of a mixture of ``n`` components (see the module docstring).

    Attributes:
      kind: one of :data:`EDIT_KINDS`.
      weights: ``n`` new relative weights of the current components, or None (unchanged).
      drop: indices of the dropped components (empty: none).
      add: ``(share, config)`` of each new component.
    """

    kind: str
    weights: Optional[tuple] = None
    drop: tuple = ()
    add: tuple = ()

    def to_obj(self) -> dict:
        """The JSON form (``engineer.json``'s ``edit``)."""
        out: dict[str, Any] = {"edit": self.kind}
        if self.weights is not None:
            out["weights"] = [round(float(w), 6) for w in self.weights]
        if self.drop:
            out["drop"] = self.drop[0] if len(self.drop) == 1 else list(self.drop)
        if self.add:
            out["add"] = [{"weight": round(float(w), 6), "config": c.to_dict()} for w, c in self.add]
        return out

    def describe(self) -> str:
        """One short line: ``add 2 (shares 0.25, 0.25)``, ``drop #3``, ``reweight [1, 2]``."""
        bits = []
        if self.kind == "keep":
            return "keep"
        if self.weights is not None:
            bits.append("reweight [" + ", ".join(f"{w:.2g}" for w in self.weights) + "]")
        if self.drop:
            bits.append("drop " + ", ".join(f"#{i}" for i in self.drop))
        if self.add:
            bits.append(f"add {len(self.add)}")
        return f"{self.kind}: " + "; ".join(bits)


def infer_kind(weights: Optional[Sequence[float]], drop: Sequence[int], add: Sequence[Any]) -> str:
    """The kind an edit's contents make (``replace`` when it both drops and adds)."""
    if drop and add:
        return "replace"
    if add:
        return "add"
    if drop:
        return "drop"
    return "reweight" if weights is not None else "keep"


def _number(value: Any, where: str, low: float, high: float, low_open: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
        raise ProposalError(f"{where}={value!r} must be a number")
    v = float(value)
    if (v <= low if low_open else v < low) or v > high:
        raise ProposalError(f"{where}={value!r} not in {'(' if low_open else '['}{low:g}, {high:g}]")
    return v


def is_edit_obj(obj: Any) -> bool:
    """Whether an answer object is written as an edit (it has ``edit``, ``weights``, ``drop``
    or ``add``) rather than as a whole environment."""
    return isinstance(obj, Mapping) and any(k in obj for k in ("edit", "weights", "drop", "add"))


def edit_from_obj(obj: Any, current: Mixture, base: Optional[LakeConfig] = None) -> Edit:
    """An answer object as an :class:`Edit` of ``current``.

    An edit object (:func:`is_edit_obj`) is read field by field, every error naming the
    field (``drop=5 not a component index: the mixture has components 0..3``); a whole
    environment is read as :func:`edit_between` the current mixture and it. Added configs'
    missing fields keep ``base``'s values (default: the current main component)."""
    current = Mixture.of(current)
    base = base or current.main
    if not is_edit_obj(obj):
        return edit_between(current, mixture_from_obj(obj, base))
    reject_unknown("edit", obj, ("edit", "weights", "drop", "add"), ProposalError)
    n = len(current)
    weights = None
    if obj.get("weights") is not None:
        ws = obj["weights"]
        if not isinstance(ws, (list, tuple)) or len(ws) != n:
            raise ProposalError(f"weights must be a list of {n} numbers, one per current component (0..{n - 1}), "
                                f"got {ws!r}")
        weights = tuple(_number(w, f"weights[{i}]", 0.0, 1e6) for i, w in enumerate(ws))
    drop: tuple = ()
    if obj.get("drop") is not None:
        d = obj["drop"]
        items = list(d) if isinstance(d, (list, tuple)) else [d]
        for i in items:
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n:
                raise ProposalError(f"drop={i!r} is not a component index: the mixture has components 0..{n - 1}")
        if len(set(items)) != len(items):
            raise ProposalError(f"drop={d!r} names a component twice")
        drop = tuple(int(i) for i in items)
    add: tuple = ()
    if obj.get("add") is not None:
        a = obj["add"]
        if not isinstance(a, (list, tuple)):
            raise ProposalError(f"add must be a list of {{\"weight\": share, \"config\": {{...}}}}, got {type(a).__name__}")
        items = []
        for j, comp in enumerate(a):
            if not isinstance(comp, Mapping) or "config" not in comp:
                raise ProposalError(f"add[{j}] must be an object {{\"weight\": share, \"config\": {{...}}}}")
            reject_unknown(f"add[{j}]", comp, ("weight", "config"), ProposalError)
            share = _number(comp.get("weight", 1.0 / max(len(a), 1)), f"add[{j}].weight", 0.0, 1.0)
            config = mixture_from_obj(comp["config"], base).main if isinstance(comp["config"], Mapping) else None
            if config is None:
                raise ProposalError(f"add[{j}].config must be an object of config fields")
            items.append((share, config))
        add = tuple(items)
    kind = obj.get("edit")
    inferred = infer_kind(weights, drop, add)
    if kind is None:
        kind = inferred
    if kind not in EDIT_KINDS:
        raise ProposalError(f"edit={kind!r} not in {list(EDIT_KINDS)}")
    required, optional = _KIND_KEYS[kind]
    given = [k for k in ("weights", "drop", "add") if obj.get(k) is not None]
    missing = [k for k in required if k not in given]
    if missing:
        raise ProposalError(f"edit={kind!r} needs {' and '.join(repr(k) for k in missing)}")
    extra = [k for k in given if k not in required + optional]
    if extra:
        raise ProposalError(f"edit={kind!r} takes no {' or '.join(repr(k) for k in extra)} "
                            f"(that is edit={inferred!r})")
    if kind == "add" and not add or kind == "replace" and not add:
        raise ProposalError(f"edit={kind!r}: add is empty")
    return Edit(kind, weights, drop, add)


def edit_between(current: Mixture, target: Mixture) -> Edit:
    """The edit that turns ``current`` into ``target``: components of ``current`` absent from
    ``target`` are dropped, ``target``'s new configs are added with their target weights as
    shares, and the kept ones take their target weights (applied under :data:`ANY_EDIT` it
    gives ``target`` back, up to the order of components)."""
    current, target = Mixture.of(current), Mixture.of(target)
    tw: dict = {}
    configs: dict = {}
    for w, c in target:
        tw[_key(c)] = tw.get(_key(c), 0.0) + w
        configs.setdefault(_key(c), c)
    drop = tuple(i for i, (_, c) in enumerate(current) if _key(c) not in tw)
    seen = {_key(c) for c in current.configs}
    add = tuple((w, configs[k]) for k, w in tw.items() if k not in seen)
    kept = [i for i in range(len(current)) if i not in drop]
    weights = None
    if kept:
        new = [tw.get(_key(c), 0.0) for _, c in current]
        old = list(current.weights)
        ks = sum(new[i] for i in kept)
        os_ = sum(old[i] for i in kept)
        if any(abs(new[i] / ks - old[i] / os_) > 1e-9 for i in kept):
            weights = tuple(new[i] if i in kept else 1.0 for i in range(len(current)))
    if not drop and not add:
        return Edit("reweight" if weights is not None else "keep", weights)
    return Edit(infer_kind(weights, drop, add), weights, drop, add)


def floor_weights(weights: Sequence[float], floor: float) -> list[float]:
    """``weights`` (summing to one) with each at least ``floor`` (at most ``1 / n``), the mass
    taken from the heavier ones in proportion: the smallest change that meets the floor."""
    w = [float(x) for x in weights]
    n = len(w)
    floor = min(float(floor), 1.0 / n) if n else 0.0
    if floor <= 0 or n == 0:
        return w
    fixed = [False] * n
    for _ in range(n):
        low = [i for i in range(n) if not fixed[i] and w[i] < floor - 1e-12]
        if not low:
            break
        for i in low:
            w[i], fixed[i] = floor, True
        free = [i for i in range(n) if not fixed[i]]
        room = 1.0 - floor * sum(fixed)
        mass = sum(w[i] for i in free)
        for i in free:
            w[i] = w[i] * room / mass if mass > 0 else room / len(free)
    return w


def apply_edit(current: Mixture, edit: Edit, rules: EditRules = EditRules()) -> Mixture:
    """The mixture ``edit`` makes of ``current`` under ``rules``: re-weighted, the dropped
    components removed, the added ones given their shares (scaled down so the kept ones keep
    ``min_keep``; the whole mass when nothing is kept), an added config equal to a kept one
    merged into it, then every weight floored (:func:`floor_weights`). Does not check the
    rules' counts: :func:`check_edit` does."""
    current = Mixture.of(current)
    base = list(edit.weights) if edit.weights is not None else list(current.weights)
    kept = [(base[i], c) for i, (_, c) in enumerate(current) if i not in edit.drop]
    shares = [float(s) for s, _ in edit.add]
    total_add = sum(shares)
    if not kept:
        pairs = [(s / total_add, c) for s, (_, c) in zip(shares, edit.add)]
    else:
        room = 1.0 - float(rules.min_keep)
        if total_add > room and total_add > 0:
            shares = [s * room / total_add for s in shares]
            total_add = room
        mass = sum(w for w, _ in kept)
        pairs = [(w / mass * (1.0 - total_add), c) for w, c in kept]
        pairs += [(s, c) for s, (_, c) in zip(shares, edit.add)]
    merged: dict = {}
    order = []
    for w, c in pairs:
        if _key(c) not in merged:
            order.append(c)
            merged[_key(c)] = 0.0
        merged[_key(c)] += w
    weights = floor_weights([merged[_key(c)] for c in order], rules.floor)
    return Mixture(list(zip(weights, order)))


def check_edit(edit: Edit, current: Mixture, space: Any, rules: EditRules) -> Mixture:
    """Raise :class:`ProposalError` unless ``edit`` is allowed on ``current`` under ``rules``
    with every added config in ``space`` (:func:`~jaxlake.engineers.space.check_in_space`);
    return the edited mixture."""
    current = Mixture.of(current)
    n = len(current)
    if edit.kind not in rules.kinds(n):
        allowed = rules.kinds(n)
        raise ProposalError(f"edit={edit.kind!r} is not allowed on a mixture of {n} component(s); allowed: {allowed}")
    if len(edit.drop) > rules.max_drop:
        raise ProposalError(f"the edit drops {len(edit.drop)} components; at most {rules.max_drop} "
                            f"(engineer.space.edits.max_drop)")
    if len(edit.add) > rules.max_add:
        raise ProposalError(f"the edit adds {len(edit.add)} components; at most {rules.max_add} "
                            f"(engineer.space.edits.max_add)")
    if len(edit.drop) >= n and not edit.add:
        raise ProposalError("the edit drops every component and adds none: the mixture would be empty")
    for j, (_, config) in enumerate(edit.add):
        try:
            check_in_space(Mixture.of(config), space, 1)
        except ProposalError as err:
            raise ProposalError(f"add[{j}]: {str(err).replace('config.', '', 1)}") from None
    out = apply_edit(current, edit, rules)
    if len(out) > rules.max_components:
        raise ProposalError(f"the edited mixture has {len(out)} components; at most {rules.max_components} "
                            f"(engineer.space.edits.max_components): drop one, or add fewer")
    return out


def edit_proposal(ctx: Any, edit: Edit, reason: str, space: Any = None, rules: Optional[EditRules] = None,
                  record: Optional[dict] = None, state: Optional[dict] = None) -> Any:
    """The :class:`~jaxlake.engineers.base.Proposal` of ``edit`` on ``ctx.current``: checked
    against ``space`` and its rules when ``space`` is given (:func:`check_edit`), else applied
    under ``rules``; the decision is ``kept`` when the mixture does not change."""
    from jaxlake.engineers.base import Proposal
    from jaxlake.mixture import same_mixture

    if space is not None:
        mixture = check_edit(edit, ctx.current, space, rules or space.edits)
    else:
        mixture = apply_edit(ctx.current, edit, rules or EditRules())
    decision = "kept" if same_mixture(mixture, ctx.current, 1e-6) else "proposed"
    return Proposal(mixture, decision, reason, record=dict(record or {}), state=dict(state or {}), edit=edit)
