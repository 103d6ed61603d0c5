"""Hugging Face Trainer output: `trainer_state.json` and `*_results.json`.

`log_history` entries are told apart by their keys: the final summary (`train_loss` or
`total_flos`, appended once at the end), train (`loss`), eval (any `eval_*` key), predict
(`predict_*` / `test_*`). Recent Trainers with `include_num_input_tokens_seen` put
`train_runtime`, `train_tokens_per_second` and `num_input_tokens_seen` into *every* train entry,
so those keys do not mark the summary. Train, eval and predict entries become points at their
`step` (a predict entry has none: it takes the last step logged before it); each eval entry is
also an `eval` event. The final summary and the top-level state (best_metric,
best_model_checkpoint, global_step, max_steps, logging_steps, ...) go to the run's
configuration, and the summary's numbers are points at its step too: TRL logs the last steps'
`entropy`, `mean_token_accuracy` and `num_tokens` there. Its aggregates over the whole run
(`train_loss` is the mean training loss, `train_runtime`, `train_samples_per_second`, ...) are
stored as `summary/<key>`, so that they never sit beside the last logged loss as a second value
of the same metric at one step; only a run that logged no `loss` at all keeps `train_loss` (its
one training-loss point). NaN/Infinity are kept as written (bare JSON tokens). The file
is rewritten at every save, so a changed file is re-read whole. A checkpoint's own
trainer_state.json is a prefix of the run's and is never read as metrics (discovery leaves
checkpoint folders alone).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from ingest.base import Batch, Evidence, Ingestor, Problem, ReadContext, event
from ingest.jsonl import RecordsToPoints
from ingest.lines import JsonError, log_name, read_json_file, to_float, to_step

RESULTS_SUFFIX = "_results.json"


def classify(entry: dict) -> str:
    if "train_loss" in entry or "total_flos" in entry:
        return "final"
    if "loss" in entry:
        return "train"
    if any(k.startswith("eval_") for k in entry):
        return "eval"
    if any(k.startswith(("predict_", "test_")) for k in entry):
        return "predict"
    return "other"


# The final summary's aggregates over the whole run, not values of its last step.
SUMMARY_KEYS = frozenset(
    ("train_loss", "train_runtime", "train_samples_per_second", "train_steps_per_second")
    + ("train_tokens_per_second", "total_flos")
)


def summary_points(entry: dict, logged_loss: bool) -> dict:
    """The final entry with its aggregates renamed `summary/<key>` (`train_loss` kept when the
    run logged no other training loss)."""
    keep = set() if logged_loss else {"train_loss"}
    return {(f"summary/{k}" if k in SUMMARY_KEYS and k not in keep else k): v for k, v in entry.items()}


class HFTrainerIngestor(Ingestor):
    name = "hf_trainer"
    precedence = 10
    needs_head = True

    def sniff(self, path: Path, head: bytes) -> bool:
        name = log_name(path)
        if name.endswith("trainer_state.json"):
            return b'"log_history"' in head or b"{" in head[:10]
        return name.endswith(RESULTS_SUFFIX) and head.lstrip()[:1] == b"{"

    def read(self, path: Path, start: int, ctx: ReadContext) -> Iterator[Batch]:
        batch = Batch(start=0, end=path.stat().st_size)
        try:
            state = read_json_file(path)  # keeps the bare NaN HF can write
        except JsonError as e:
            batch.problems.append(
                Problem(e.lineno, "bad_json", f"line {e.lineno} column {e.colno}: {e.msg}; file skipped")
            )
            yield batch
            return
        if not isinstance(state, dict):
            batch.problems.append(Problem(1, "bad_json", "not a JSON object; file skipped"))
            yield batch
            return
        if log_name(path).endswith(RESULTS_SUFFIX):
            split = log_name(path)[: -len(RESULTS_SUFFIX)]
            batch.config = {"results": {split: state}}
            batch.records = 1
            yield batch
            return
        conv = RecordsToPoints({})
        kinds = {"train": 0, "eval": 0, "predict": 0, "final": 0, "other": 0}
        last_step, logged_loss = None, False
        for i, entry in enumerate(state.get("log_history") or []):
            if not isinstance(entry, dict):
                batch.problems.append(Problem(i, "bad_entry", f"log_history[{i}] is not an object; skipped"))
                continue
            kind = classify(entry)
            kinds[kind] += 1
            batch.records += 1
            try:
                step = to_step(entry.get("step"))
            except ValueError as e:
                batch.problems.append(Problem(i, "bad_step", f"log_history[{i}]: {e}; skipped"))
                continue
            if kind == "final":  # the run's summary, and the last logging step's other metrics
                batch.config["trainer_summary"] = entry
                entry = summary_points(entry, logged_loss)
            logged_loss = logged_loss or (kind == "train" and "loss" in entry)
            if step is None and kind in ("predict", "final") and last_step is not None:
                step = last_step
            if step is None:
                batch.problems.append(Problem(i, "no_step", f"log_history[{i}] has no step; skipped"))
                continue
            last_step = step
            conv.add(entry, step=step, skip=("step",))
            if kind == "eval":
                metrics = {k: v for k, v in entry.items() if k.startswith("eval_")}
                batch.events.append(event(step, None, "eval", "evaluation", metrics, i))
        batch.points = conv.points()
        batch.config["trainer_state"] = {k: v for k, v in state.items() if k != "log_history"}
        batch.evidence = _end_of_run(state, "trainer_summary" in batch.config)
        batch.counts = {f"log_history_{k}": v for k, v in kinds.items() if v}
        yield batch


def _end_of_run(state: dict, summary: bool) -> list[Evidence]:
    """The Trainer appends its final summary once, at the end of training, and writes a
    trainer_state.json at every checkpoint: one short of max_steps without the summary is a
    checkpoint's snapshot (a `checkpoint-N/` copied alone, a Hub repository of one), which says
    nothing of how the run went on: status `checkpoint`, never `crashed`."""
    try:
        step = to_step(state.get("global_step"))
    except ValueError:
        step = None
    max_steps = to_float(state.get("max_steps"))
    if summary:
        return [Evidence("completed", "HF Trainer wrote its final summary", step)]
    if step is None or max_steps is None:
        return []
    if step >= max_steps:
        return [Evidence("completed", f"HF Trainer reached max_steps {max_steps:g}", step)]
    message = (
        f"trainer_state.json of a checkpoint at global_step {step} of max_steps {max_steps:g} (no final "
        "summary): how the run went on is not in these files"
    )
    return [Evidence("checkpoint", message, step)]
