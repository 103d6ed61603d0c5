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
[rule.params]
threshold = 1e-5
[rule.sweep]                                 # backtest each combination
threshold = [1e-6, 1e-5, 1e-4]
"""

from __future__ import annotations

import itertools
import json
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path

from detectors import language
from workbench.errors import WorkbenchError

ALLOWED_KEYS = {
    "id",
    "when",
    "for_steps",
    "cooldown",
    "warmup",
    "on",
    "description",
    "severity",
    "params",
    "sweep",
}


class RuleFileError(WorkbenchError):
    """A rule file or rule text that does not parse; the message points at the rule and column."""


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
    detector: object = (
        None  # the built-in detector this rule came from (its code computes it when `when` is None)
    )

    def ast(self):
        """The parsed condition with parameters substituted."""
        numbers = {
            k: v for k, v in self.params.items() if isinstance(v, int | float) and not isinstance(v, bool)
        }
        return language.substitute(language.parse(self.when), numbers)

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


def rule_from_table(t: dict, where: str) -> Rule:
    unknown = set(t) - ALLOWED_KEYS
    if unknown:
        raise RuleFileError(f"{where}: unknown keys {sorted(unknown)}; allowed: {sorted(ALLOWED_KEYS)}")
    for key in ("id", "when"):
        if not isinstance(t.get(key), str) or not t[key].strip():
            raise RuleFileError(f"{where}: '{key}' is required (a string)")
    for key in ("for_steps", "cooldown", "warmup"):
        if key in t and (not isinstance(t[key], int) or t[key] < (1 if key == "for_steps" else 0)):
            raise RuleFileError(
                f"{where} ({t['id']}): '{key}' must be a whole number{' >= 1' if key == 'for_steps' else ' >= 0'}"
            )
    params = t.get("params", {})
    sweep = t.get("sweep", {})
    if (
        not isinstance(params, dict)
        or not isinstance(sweep, dict)
        or any(not isinstance(v, list) or not v for v in sweep.values())
    ):
        raise RuleFileError(
            f"{where} ({t['id']}): [rule.params] maps names to numbers; [rule.sweep] maps names to lists"
        )
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
    )
    try:
        tree = language.parse(rule.when)
    except language.RuleSyntaxError as e:
        raise RuleFileError(f"{where} ({rule.id}): {e}") from None
    known = set(params) | set(sweep)
    for k in sweep:
        if k not in ("for_steps", "cooldown", "warmup") and k not in {n.name for n in language.names(tree)}:
            raise RuleFileError(f"{where} ({rule.id}): sweep parameter '{k}' does not appear in 'when'")
    globs = {n.name for n in language.names(language.substitute(tree, dict.fromkeys(known, 0))) if n.is_glob}
    if len(globs) > 1:
        raise RuleFileError(f"{where} ({rule.id}): at most one tag glob per rule, found {sorted(globs)}")
    if not language.is_boolean(tree):
        raise RuleFileError(
            f"{where} ({rule.id}): 'when' must be a condition (a comparison, and/or/not), got an arithmetic expression"
        )
    return rule


def describe(rules: list[Rule]) -> list[dict]:
    """One row per rule for listing: id, condition, timing, parameters, sweep, description."""
    return [
        {
            "id": r.id,
            "when": r.when or "(computed in code)",
            "for_steps": r.for_steps,
            "cooldown": r.cooldown,
            "params": json.dumps(r.params),
            "sweep": json.dumps(r.sweep) if r.sweep else "",
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
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise RuleFileError(f"{where}: not valid TOML: {e}") from None
    tables = data.get("rule", [])
    if not isinstance(tables, list) or not tables:
        raise RuleFileError(f"{where}: no [[rule]] tables found")
    rules = [rule_from_table(t, f"{where}: rule #{i + 1}") for i, t in enumerate(tables)]
    ids = [r.id for r in rules]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise RuleFileError(f"{where}: duplicate rule ids {dupes}")
    return rules
