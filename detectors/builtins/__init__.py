"""Built-in detectors: one small class each, explicit keyword parameters, defaults from the
public trainers and monitors each docstring names. Each docstring says which failure kinds the
detector targets and its known false positives, with the backtest's figures at the shipped
defaults (`workbench backtest --summary`): "corpus" is the evaluation corpus of
`python sample_runs/generate.py --corpus` (31 failed runs over 12 kinds and 19 healthy runs of
the plain PyTorch loop, MoE included, the HF Trainer and DeepSpeed fp16; both halves), "samples"
is sample_runs/ (10 failed, 10 healthy). A/B counts runs the detector could be evaluated on.

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

from detectors.builtins.base import Detector
from detectors.builtins.gradients import ClipSaturation, EmaGradSpike, GradientFlow, VanishingGradients
from detectors.builtins.loss import (
    LlmFoundrySpike,
    LossDivergence,
    MegatronSpike,
    OlmoSpike,
    SigmaDrop,
    SigmaSpike,
)
from detectors.builtins.memory import MemoryGrowth, MemoryPressure
from detectors.builtins.moe import BalanceLossShare, MoeImbalance
from detectors.builtins.nonfinite import LossScaleCollapse, NonFinite, NonFiniteGradNorm
from detectors.builtins.patterns import PatternP1, PatternP2, PatternP3, PatternP4
from detectors.builtins.plateaus import LrCollapse, OverfitGap, Overfitting, Plateau
from detectors.rules import Rule

# ---- the registry (one line per detector) --------------------------------------------------------
BUILTINS: list[Detector] = [
    NonFinite(),
    NonFiniteGradNorm(),
    LossScaleCollapse(),
    SigmaSpike(),
    SigmaDrop(),
    OlmoSpike(),
    LossDivergence(),
    LlmFoundrySpike(),
    MegatronSpike(),
    EmaGradSpike(),
    VanishingGradients(),
    GradientFlow(),
    ClipSaturation(),
    PatternP1(),
    PatternP2(),
    PatternP3(),
    PatternP4(),
    Plateau(),
    LrCollapse(),
    Overfitting(),
    OverfitGap(),
    MemoryPressure(),
    MemoryGrowth(),
    MoeImbalance(),
    BalanceLossShare(),
]


def builtin_rules() -> list[Rule]:
    return [d.rule() for d in BUILTINS]
