"""The rule engine: a rule evaluated over loaded series exactly as it would have fired live,
vectorised with polars.

For each rule and each evaluation unit (a run, or a run and a tag when the rule has a glob):
1. Series leaves (a metric, or a window function of one) are computed on that series' own
   logged points, using only points at or before each step (causal by construction).
2. They are aligned on a grid of steps: the union of their steps, or the steps of the `on`
   series; a sparse series contributes its latest value at or before each step (as-of join).
3. The condition is evaluated row-wise. NaN compares false; a value missing at a step is null
   and the condition is then false.
4. Runs of consecutive true steps become alerts once they last `for_steps` steps: `step_start`
   (rising edge), `step_fired` (where `for_steps` was reached), `step_end` (last true step).
   Alerts whose firing comes within `cooldown` steps of the previous alert's end merge into it.
No Python loop touches individual steps.

Where each step lives: the loaded points, `detectors/series.py`; the leaves and their window
kernels, `detectors/windows.py`; the condition and its grid, `detectors/compiler.py`; the
streaks, `detectors/streaks.py`, the code a live watch (`detectors/live.py`) runs too.
"""

from __future__ import annotations

import polars as pl

from detectors.compiler import rule_conditions
from detectors.rules import Rule
from detectors.series import SeriesData
from detectors.streaks import alerts_from


def evaluate(rule: Rule, data: SeriesData) -> tuple[pl.DataFrame, list[str]]:
    """Alerts of one rule (one parameter point) over the loaded runs, and the runs where it was
    evaluable. Raises ReplayError when it is evaluable nowhere."""
    frame, texts, runs_ok = rule_conditions(rule, data)
    return alerts_from(rule, frame, texts, data), runs_ok
