"""The guides' patterns P1-P4 (the rule set of detectors/guides.toml), as built-ins."""

from __future__ import annotations

from dataclasses import dataclass

from detectors.builtins.base import Detector


@dataclass(frozen=True)
class PatternP1(Detector):
    """The guides' P1: grad_norm < 1e-5 and attention entropy < 0.3 for 5 steps (attention
    collapse with vanishing gradients). Targets attention_collapse, but late (the gradients
    take long to fall below 1e-5; vanishing_gradients sees it sooner). Converged easy tasks
    also have peaked attention."""

    grad_threshold: float = 1e-5
    entropy_threshold: float = 0.3
    for_steps: int = 5
    id = "P1_attention_collapse"
    origin = "guides"
    severity = "critical"
    grid = {"grad_threshold": [1e-7, 1e-5, 1e-3, 1e-2]}

    def when(self):
        return f"grad_norm < {self.grad_threshold} and attn_entropy < {self.entropy_threshold}"


@dataclass(frozen=True)
class PatternP2(Detector):
    """The guides' P2: FFN input std < 0.005 and LayerNorm input std < 0.05 for 5 steps (dead
    or saturated FFN: every token reaches the FFN as the same vector). Per layer (glob).
    Targets dead_ffn, some steps after the onset (the stds decay slowly)."""

    ffn_threshold: float = 0.005
    ln_threshold: float = 0.05
    for_steps: int = 5
    id = "P2_dead_ffn"
    origin = "guides"
    severity = "critical"
    grid = {"ffn_threshold": [0.005, 0.05, 0.2]}

    def when(self):
        return f"`ffn_input_std/*` < {self.ffn_threshold} and ln_input_std < {self.ln_threshold}"


@dataclass(frozen=True)
class PatternP3(Detector):
    """The guides' P3: train loss falling while the eval metric moves < 0.001, for 10 evals
    (evaluated at eval steps). Targets overfitting with a flat eval metric, a kind the
    evaluation runs do not hold (their overfitting runs' eval loss rises); early in training,
    evals that barely move are normal."""

    eval_metric: str = "eval_loss"
    min_move: float = 0.001
    train_window: int = 50
    for_steps: int = 10
    id = "P3_eval_stalled"
    origin = "guides"

    @property
    def on(self):
        return self.eval_metric

    def when(self):
        return f"slope(loss, {self.train_window}) < 0 and abs(delta({self.eval_metric}, 1)) < {self.min_move}"


@dataclass(frozen=True)
class PatternP3Accuracy(PatternP3):
    """The guides' P3 on an eval accuracy or F1 (`eval_accuracy`: HF's eval_accuracy, Keras'
    val_accuracy, Lightning's val_acc) where a run logs one: train loss falling while it moves
    < 0.001 for 10 evals. Runs without one are listed as not evaluable (the rule as skipped,
    with why, when no run has one)."""

    eval_metric: str = "eval_accuracy"
    id = "P3_eval_accuracy_stalled"


@dataclass(frozen=True)
class PatternP4(Detector):
    """The guides' P4: memory more than 3 GB above its minimum of the last `window` values while
    grad_norm < 1e-3 (a leak while training stalls). Metric `memory_gb` (the process memory;
    accelerator memory is `memory_allocated_gb`). Targets memory_blowup, some steps after the
    jump (the gradients must fall first). A leak without vanishing gradients (memory_leak) is
    not its case."""

    jump_gb: float = 3.0
    window: int = 50
    grad_threshold: float = 1e-3
    id = "P4_memory_jump"
    origin = "guides"
    severity = "critical"

    def when(self):
        return f"memory_gb - min(memory_gb, {self.window}) > {self.jump_gb} and grad_norm < {self.grad_threshold}"
