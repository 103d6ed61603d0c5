"""Rules: a condition plus how it must hold to alert. Loaded from TOML rule files:

[[rule]]
id = "P1"                                    # required
when = "grad_norm < threshold and attn_entropy < 0.3"   # required
for_steps = 5                                # consecutive evaluated steps (default 1)
cooldown = 0                                 # steps after an alert in which a new one merges into it
warmup = 0                                   # evaluated steps ignored at the start of each run
on = "eval_loss"                             # evaluate only where this series is logged (optional)
description = "attention collapse with vanishing gradients"
severity = "critical"
origin = "guides"                            # where the rule comes from (default "workbench")
[rule.params]
threshold = 1e-5
[rule.sweep]                                 # backtest each combination
threshold = [1e-6, 1e-5, 1e-4]
"""

from __future__ import annotations

import itertools
import json
import math
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from detectors import language
from workbench.errors import WorkbenchError

if TYPE_CHECKING:  # for annotations only: loading a rule file imports neither polars nor numba
    import polars as pl

    from detectors.series import SeriesData

ALLOWED_KEYS = {
    "id",
    "when",
    "for_steps",
    "cooldown",
    "warmup",
    "on",
    "description",
    "severity",
    "origin",
    "params",
    "sweep",
}


TIMING = {"for_steps": 1, "cooldown": 0, "warmup": 0}  # whole numbers, at least this
TEXT = ("on", "description", "severity", "origin")
MAX_SWEEP_POINTS = 1000  # combinations of one rule's sweep ...
MAX_FILE_POINTS = 10_000  # ... and of every rule of a file: each is a replay over every run
MAX_FILE_CHARS = 1 << 20


class RuleFileError(WorkbenchError):
    """A rule file or rule text that does not parse; the message points at the rule and column."""


class CodeDetector(Protocol):
    """What a rule asks of the built-in detector it came from (detectors.builtins.base.Detector)."""

    @property
    def grid(self) -> dict: ...
    @property
    def in_ensemble(self) -> bool: ...
    def with_params(self, **kw: Any) -> CodeDetector: ...
    def rule(self) -> Rule: ...
    def conditions(self, data: SeriesData) -> tuple[pl.DataFrame, list[str], list[str]]: ...


@dataclass(frozen=True)
class Rule:
    id: str
    when: str | None  # None for detectors computed in code (see detectors.builtins)
    for_steps: int = 1
    cooldown: int = 0
    warmup: int = 0
    on: str | None = None
    description: str = ""
    severity: str = "warning"
    params: dict = field(default_factory=dict)
    sweep: dict = field(default_factory=dict)
    detector: CodeDetector | None = (
        None  # the built-in detector this rule came from (its code computes it when `when` is None)
    )
    # who published it: olmo-core, llm-foundry, megatron, zclip, wandb, guides, lightning, workbench
    origin: str = "workbench"

    def ast(self):
        """The parsed condition with parameters substituted."""
        numbers = {
            k: v for k, v in self.params.items() if isinstance(v, int | float) and not isinstance(v, bool)
        }
        assert self.when is not None, f"{self.id} is computed in code: it has no condition to parse"
        return language.substitute(language.parse(self.when), numbers)

    @property
    def compares_peers(self) -> bool:
        """Whether it reads a run's peers (`peer_z`), so replay keeps each peer group in one batch."""
        return self.when is not None and language.uses_peers(language.parse(self.when))

    @property
    def params_json(self) -> str:
        keep = {k: v for k, v in self.params.items()}
        for k, default in (("for_steps", 1), ("cooldown", 0), ("warmup", 0)):
            if getattr(self, k) != default:
                keep[k] = getattr(self, k)
        return json.dumps(keep, sort_keys=True)

    def sweep_points(self) -> list[Rule]:
        """One rule per combination of the sweep values (the rule itself when there is no sweep)."""
        if not self.sweep:
            return [self]
        keys = sorted(self.sweep)
        out = []
        for values in itertools.product(*(self.sweep[k] for k in keys)):
            point = dict(zip(keys, values, strict=True))
            if self.detector is not None:  # a built-in: rebuild it with the new parameters
                out.append(self.detector.with_params(**point).rule())
                continue
            fields = {k: point.pop(k) for k in ("for_steps", "cooldown", "warmup") if k in point}
            out.append(replace(self, params={**self.params, **point}, sweep={}, **fields))
        return out


def _is_number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _is_whole(v, least: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= least


def _sweep_size(sweep) -> int:
    """How many combinations a [rule.sweep] table makes (1 for none, or one not yet checked)."""
    if not isinstance(sweep, dict):
        return 1
    return math.prod(len(v) if isinstance(v, list) else 1 for v in sweep.values())


def _check_table(t: dict, where: str) -> None:
    """Every key of a [[rule]] table of the right type, before anything reads it."""
    unknown = set(t) - ALLOWED_KEYS
    if unknown:
        raise RuleFileError(f"{where}: unknown keys {sorted(unknown)}; allowed: {sorted(ALLOWED_KEYS)}")
    for key in ("id", "when"):
        if not isinstance(t.get(key), str) or not t[key].strip():
            raise RuleFileError(f"{where}: '{key}' is required (a string)")
    where = f"{where} ({t['id']})"
    for key, least in TIMING.items():
        if key in t and not _is_whole(t[key], least):
            raise RuleFileError(f"{where}: '{key}' must be a whole number >= {least}, got {t[key]!r}")
    for key in TEXT:
        if key in t and not isinstance(t[key], str):
            raise RuleFileError(f"{where}: '{key}' must be a string, got {t[key]!r}")
    if "on" in t and not t["on"].strip():
        raise RuleFileError(f"{where}: 'on' must name a metric or tag")
    params, sweep = t.get("params", {}), t.get("sweep", {})
    if not isinstance(params, dict) or not isinstance(sweep, dict):
        raise RuleFileError(f"{where}: [rule.params] maps names to numbers; [rule.sweep] maps names to lists")
    for k, v in params.items():
        if not _is_number(v):
            raise RuleFileError(f"{where}: params.{k} must be a finite number, got {v!r}")
    for k, values in sweep.items():
        if not isinstance(values, list) or not values:
            raise RuleFileError(f"{where}: sweep.{k} must be a non-empty list of numbers")
        for v in values:
            ok = _is_whole(v, TIMING[k]) if k in TIMING else _is_number(v)
            if not ok:
                want = f"whole numbers >= {TIMING[k]}" if k in TIMING else "finite numbers"
                raise RuleFileError(f"{where}: sweep.{k} must list {want}, got {v!r}")
    size = _sweep_size(sweep)
    if size > MAX_SWEEP_POINTS:
        raise RuleFileError(
            f"{where}: the sweep has {size:,} combinations; the limit is {MAX_SWEEP_POINTS:,} "
            "(sweep fewer values, or split it over several rules)"
        )


def rule_from_table(t: dict, where: str) -> Rule:
    _check_table(t, where)
    params, sweep = t.get("params", {}), t.get("sweep", {})
    rule = Rule(
        id=t["id"],
        when=t["when"],
        for_steps=t.get("for_steps", 1),
        cooldown=t.get("cooldown", 0),
        warmup=t.get("warmup", 0),
        on=t.get("on"),
        description=t.get("description", ""),
        severity=t.get("severity", "warning"),
        params=params,
        sweep=sweep,
        origin=t.get("origin", "workbench"),
    )
    where = f"{where} ({rule.id})"
    try:
        tree = language.parse(t["when"])
        values = {k: [v] for k, v in params.items()} | sweep  # every value a parameter takes
        language.check_numbers(tree, t["when"], values)
    except language.RuleSyntaxError as e:
        raise RuleFileError(f"{where}: {e}") from None
    known = set(params) | set(sweep)
    for k in sweep:
        if k not in TIMING and k not in {n.name for n in language.names(tree)}:
            raise RuleFileError(f"{where}: sweep parameter '{k}' does not appear in 'when'")
        if k not in TIMING and k not in params:
            raise RuleFileError(
                f"{where}: sweep parameter '{k}' needs a value in [rule.params] too (replay runs the rule at it)"
            )
    globs = {n.name for n in language.names(language.substitute(tree, dict.fromkeys(known, 0))) if n.is_glob}
    if len(globs) > 1:
        raise RuleFileError(f"{where}: at most one tag glob per rule, found {sorted(globs)}")
    if not language.names(language.substitute(tree, dict.fromkeys(known, 0))):
        shadow = sorted({n.name for n in language.names(tree)} & known)
        why = (
            f"its names {shadow} are all parameters ([rule.params]); rename a parameter that shadows a metric"
            if shadow
            else "it compares numbers only"
        )
        raise RuleFileError(f"{where}: 'when' reads no series ({why}); a rule needs a metric or tag to watch")
    if not language.is_boolean(tree):
        raise RuleFileError(
            f"{where}: 'when' must be a condition (a comparison, and/or/not), got an arithmetic expression"
        )
    return rule


def describe(rules: list[Rule]) -> list[dict]:
    """One row per rule for listing: id, condition, timing, parameters, sweep, origin, description."""
    return [
        {
            "id": r.id,
            "when": r.when or "(computed in code)",
            "for_steps": r.for_steps,
            "cooldown": r.cooldown,
            "params": json.dumps(r.params),
            "sweep": json.dumps(r.sweep) if r.sweep else "",
            "origin": r.origin,
            "description": " ".join((r.description or "").split()),
        }
        for r in rules
    ]


def load_rule_file(path: str | Path) -> list[Rule]:
    """Rules from a TOML file; RuleFileError says what is wrong and where."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise RuleFileError(f"{path}: no such rule file") from None
    return rules_from_text(text, str(path))


def rules_from_text(text: str, where: str = "rules") -> list[Rule]:
    """Rules from the text of a TOML rule file (`where` names it in messages)."""
    if len(text) > MAX_FILE_CHARS:
        raise RuleFileError(
            f"{where}: {len(text):,} characters; a rule file holds at most {MAX_FILE_CHARS:,}"
        )
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise RuleFileError(f"{where}: not valid TOML: {e}") from None
    tables = data.get("rule", [])
    if not isinstance(tables, list) or not tables:
        raise RuleFileError(f"{where}: no [[rule]] tables found")
    if not all(isinstance(t, dict) for t in tables):
        raise RuleFileError(f"{where}: [[rule]] must be tables")
    for i, t in enumerate(tables):
        _check_table(t, f"{where}: rule #{i + 1}")
    points = sum(_sweep_size(t.get("sweep")) for t in tables)
    if points > MAX_FILE_POINTS:
        raise RuleFileError(
            f"{where}: {len(tables):,} rules with {points:,} sweep points in all; the limit is "
            f"{MAX_FILE_POINTS:,} (split the file)"
        )
    rules = [rule_from_table(t, f"{where}: rule #{i + 1}") for i, t in enumerate(tables)]
    ids = [r.id for r in rules]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise RuleFileError(f"{where}: duplicate rule ids {dupes}")
    return rules
