"""Live incremental evaluation equals a one-shot replay: runs fed to `detectors.live` a few
steps at a time (random cut points, a second source that lags, events, a writer that resumes
from an earlier step) raise exactly the alerts `detectors.engine.evaluate` raises over the
finished runs, for expression rules of every window kind and the code detectors."""

from __future__ import annotations

import numpy as np
import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from detectors.builtins.gradients import ClipSaturation, GradientFlow
from detectors.builtins.nonfinite import LossScaleCollapse
from detectors.builtins.plateaus import Plateau
from detectors.engine import evaluate
from detectors.live import LiveEvaluator, context
from detectors.rules import Rule
from detectors.series import SeriesData

RULES = [
    Rule("spike", "loss > mean(loss, 8) + 2 * std(loss, 8)", cooldown=4),
    Rule("ema", "grad_norm > 2 * ema(grad_norm, 0.9)", for_steps=2, warmup=5),
    Rule("first", "abs(grad_norm) >= 2 * max_first(grad_norm, 5)"),
    Rule("nan", "not (abs(loss) < 1e308)"),
    Rule("eval", "eval_loss > min(eval_loss, 3)", on="eval_loss"),
    Rule("trend", "loss > eval_loss and slope(loss, 5) > 0 and delta(loss, 2) > 0", for_steps=2),
    Rule("layers", "`gn/layer_*` > 1.5 * ema(`gn/layer_*`, 0.8) and loss > 0"),
    GradientFlow(layer_prefix="gn/layer_", explode=2.0).rule(),
    LossScaleCollapse(overflows=3, window=10).rule(),
    ClipSaturation(window=6, rise=0.5).rule(),
    Plateau(metric="eval_loss", patience=2).rule(),
]
POINTS = {"tag": pl.String, "metric": pl.String, "step": pl.Int64, "value": pl.Float64, "rank": pl.Int64}


class Writer:
    """One run as its writers log it: source `a` (rank 0) logs every tag, source `b` (rank 5,
    lagging) logs `loss` rounded and the overflow events; `a` may restart from an earlier step."""

    def __init__(self, rng, n: int, nan_at: int | None, resume: tuple[int, int] | None):
        self.rng, self.n, self.nan_at, self.resume = rng, n, nan_at, resume
        self.writes: list[tuple] = []  # (tag, step, value, rank) in the order written
        self.events: list[int] = []
        self.pos_a = self.pos_b = 0
        self.restarted = False

    def value(self, tag: str, step: int) -> float:
        t = step / 40
        base = {
            "loss": 2 + np.exp(-t),
            "grad_norm": 1.0,
            "gn/layer_0": 1.0,
            "gn/layer_1": 1.0,
            "eval_loss": 2.3 - t,
        }
        v = base[tag] * float(np.exp(self.rng.normal(0, 0.3))) + (3 if self.rng.random() < 0.03 else 0)
        return float("nan") if tag == "loss" and self.nan_at is not None and step >= self.nan_at else v

    def write_a(self, upto: int) -> None:
        while self.pos_a < upto:
            s = self.pos_a
            if self.resume and not self.restarted and s == self.resume[0]:  # killed; restarted earlier
                self.restarted, self.pos_a = True, self.resume[1]
                continue
            for tag in ("loss", "grad_norm", "gn/layer_0", "gn/layer_1") + (
                ("eval_loss",) if s % 7 == 0 else ()
            ):
                self.writes.append((tag, s, self.value(tag, s), 0))
            self.pos_a += 1

    def write_b(self, upto: int) -> None:
        for s in range(self.pos_b, upto):
            self.writes.append(("loss", s, round(2 + np.exp(-s / 40), 2), 5))
            if self.rng.random() < 0.25:
                self.events.append(s)
        self.pos_b = max(self.pos_b, upto)

    def current(self) -> pl.DataFrame:
        """The store's current points: within a source a later point supersedes every earlier
        one at its step or above; across sources the lowest rank wins."""
        kept: dict[tuple, tuple] = {}
        for tag, step, value, rank in self.writes:
            for k in [k for k in kept if k[0] == tag and k[2] == rank and k[1] >= step]:
                del kept[k]
            kept[(tag, step, rank)] = (tag, step, value, rank)
        rows = sorted(kept.values(), key=lambda r: (r[0], r[1], r[3]))
        frame = pl.DataFrame(
            [(t, t, s, v, r) for t, s, v, r in rows], schema=POINTS, orient="row"
        ).with_columns(source=pl.col("rank").cast(pl.String))
        return frame

    def event_frame(self, lo: int = 0) -> pl.DataFrame:
        return pl.DataFrame(
            {"step": self.events[lo:], "kind": "overflow", "attrs": "{}", "source": "5"},
            schema={"step": pl.Int64, "kind": pl.String, "attrs": pl.String, "source": pl.String},
        )


def points_of(writes) -> pl.DataFrame:
    return pl.DataFrame([(t, t, s, v, r) for t, s, v, r in writes], schema=POINTS, orient="row").with_columns(
        source=pl.col("rank").cast(pl.String)
    )


@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(25, 70),
    cuts=st.lists(st.integers(1, 69), max_size=6),
    lag=st.integers(0, 4),
    nan_at=st.one_of(st.none(), st.integers(10, 60)),
    resume=st.one_of(st.none(), st.tuples(st.integers(20, 60), st.integers(0, 19))),
)
def test_live_incremental_equals_one_shot_replay(seed, n, cuts, lag, nan_at, resume):
    rng = np.random.default_rng(seed)
    writers = {
        r: Writer(np.random.default_rng(seed + i), n, nan_at, resume) for i, r in enumerate(("r0", "r1"))
    }
    live = LiveEvaluator(RULES)
    for cut in [*sorted(c for c in set(cuts) if c < n), n]:
        for run_id, w in writers.items():
            seen_w, seen_e = len(w.writes), len(w.events)
            w.write_a(cut)
            w.write_b(cut if cut == n else max(0, cut - int(rng.integers(0, lag + 1))))
            if not live.add(run_id, points_of(w.writes[seen_w:]), w.event_frame(seen_e)):
                live.reset(run_id)  # earlier steps changed: the watch reloads the run
                assert live.add(run_id, w.current(), w.event_frame())
        _, again = live.evaluate(list(writers))
        for run_id in again:
            live.reset(run_id)
            assert live.add(run_id, writers[run_id].current(), writers[run_id].event_frame())
        live.evaluate(sorted(again))
    for run_id in writers:
        live.mark_final(run_id)
    live.evaluate(list(writers))

    points = pl.concat(
        [
            w.current().unique(["tag", "step"], keep="first").with_columns(run_id=pl.lit(r))
            for r, w in writers.items()
        ]
    )
    events = pl.concat([w.event_frame().with_columns(run_id=pl.lit(r)) for r, w in writers.items()])
    data = SeriesData(points.select("run_id", "tag", "metric", "step", "value"), events.drop("source"))
    replayed = pl.concat([evaluate(rule, data)[0] for rule in RULES]).sort(
        "run_id", "rule", "tag", "step_start"
    )
    got = live.alerts(list(writers)).drop("raised_at").sort("run_id", "rule", "tag", "step_start")
    keys = ["run_id", "rule", "tag", "step_start", "step_fired", "step_end", "message"]
    only_live = got.join(replayed, on=keys, how="anti").select(keys)
    only_replay = replayed.join(got, on=keys, how="anti").select(keys)
    assert got.equals(replayed), f"live only:\n{only_live.rows()}\nreplay only:\n{only_replay.rows()}"


def test_context_is_the_longest_window_plus_one():
    assert context(Rule("t", "loss > mean(loss, 100) + 3 * std(loss, 20)")) == 101
    assert context(Rule("t", "grad_norm > 5 * ema(grad_norm, 0.95)")) == 1  # seeded: no window
    assert context(ClipSaturation(window=50).rule()) == 100
    assert context(Plateau().rule()) is None  # best so far: the whole run
