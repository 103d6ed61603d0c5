"""Built-in detectors: one small class each, explicit keyword parameters, defaults from the
public trainers and monitors each docstring names. Each docstring says which failure kinds the
detector targets and, in words, its known false positives; the measured figures are the
backtest's (`workbench backtest --summary`), not the docstrings'.

A new built-in: a frozen dataclass subclassing `Detector` (base.py) in the module of its
section (nonfinite, loss, gradients, patterns, plateaus, memory, moe), with a `when` text in
the rule language or `conditions(data)` in code, a `grid` for `--tune`; then one line in
`BUILTINS` below.

Detectors that know training:
- fp16 dynamic loss scaling: a NaN/Inf gradient norm on a step the loss scaler skipped is
  normal; grad-norm baselines skip non-finite values; an alarm needs a storm of consecutive
  skips or the loss scale at its floor.
- warm-up: sigma rules stay quiet until their window has filled and, when the run logs a
  learning rate, until its warm-up has ended (the first logged lr not above the largest before).
- spikes: `loss_spike` flags any spike; `loss_divergence` only one the loss does not recover
  from (its EMA still well above its best `for_steps` steps later).

Most compile to the rule language (so they replay through the same engine and are causal by
construction); those that need state (best-so-far, baselines that skip flagged or non-finite
points, lr warm-up, events, tags found by pattern) compute their condition in code. Every
detector has `id`, `params`, `rule()`, `with_params(**kw)` and a `grid` that `workbench backtest
--tune` picks among; code detectors also `conditions(data)` returning (frame rid, key, step,
cond, _l0.., leaf texts, evaluable runs).
"""

from __future__ import annotations

from detectors.builtins import gradients, loss, memory, moe, nonfinite, patterns, plateaus
from detectors.builtins.base import Detector
from detectors.rules import Rule

# The registry: one line per detector, in the order reports list them.
BUILTINS: list[Detector] = [
    nonfinite.NonFinite(),
    nonfinite.NonFiniteGradNorm(),
    nonfinite.HfNanFiltered(),
    nonfinite.LossScaleCollapse(),
    loss.RobustLossSpike(),
    loss.SigmaSpike(),
    loss.SigmaDrop(),
    loss.OlmoSpike(),
    loss.LossDivergence(),
    loss.LlmFoundrySpike(),
    loss.MegatronSpike(),
    gradients.RobustGradSpike(),
    gradients.EmaGradSpike(),
    gradients.ZClip(),
    gradients.VanishingGradients(),
    gradients.GradientFlow(),
    gradients.ClipSaturation(),
    patterns.PatternP1(),
    patterns.PatternP2(),
    patterns.PatternP3(),
    patterns.PatternP3Accuracy(),
    patterns.PatternP4(),
    plateaus.Plateau(),
    plateaus.LrCollapse(),
    plateaus.Overfitting(),
    plateaus.OverfitGap(),
    memory.MemoryPressure(),
    memory.MemoryGrowth(),
    memory.MemoryJump(),
    moe.MoeImbalance(),
    moe.BalanceLossShare(),
]


def ensemble_builtins() -> list[Detector]:
    """The built-ins the any-of ensemble is made of (published alarms at their own defaults,
    such as ZClip's, are scored beside them but stay out)."""
    return [d for d in BUILTINS if d.in_ensemble]


def builtin_rules() -> list[Rule]:
    return [d.rule() for d in BUILTINS]
