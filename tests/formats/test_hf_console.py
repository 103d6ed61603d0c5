"""HF Trainer / TRL / LLaMA-Factory console dicts: no step on the line, values often strings."""

from __future__ import annotations

import logging
from datetime import datetime

from conftest import ingest_paths
from real_samples import settle


def test_llamafactory_logger_prefix_is_read_with_its_time(tmp_store, tmp_path):
    """LLaMA-Factory logs the Trainer's dicts through its own formatter (llamafactory/extras/logging.py)."""
    run = tmp_path / "r"
    run.mkdir()
    handler = logging.FileHandler(run / "running_log.txt")
    handler.setFormatter(
        logging.Formatter(
            "[%(levelname)s|%(asctime)s] %(name)s:%(lineno)s >> %(message)s", "%Y-%m-%d %H:%M:%S"
        )
    )
    log = logging.getLogger("logging.py")
    log.propagate = False
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    for i, loss in enumerate((2.2818, 2.2647, 2.1)):
        log.info(str({"loss": loss, "learning_rate": 2.5e-06 * (i + 1), "epoch": 0.29 * (i + 1)}))
    log.info(str({"train_runtime": 100.0, "train_loss": 2.2, "epoch": 0.87}))
    handler.close()
    log.removeHandler(handler)
    settle(run / "running_log.txt")
    ingest_paths(tmp_store, run)
    loss = tmp_store.query("SELECT step, value, wall_time FROM scalars WHERE tag = 'loss' ORDER BY step")
    assert loss["step"].to_list() == [1, 2, 3] and loss["value"].to_list() == [2.2818, 2.2647, 2.1]
    assert abs(loss["wall_time"][0] - datetime.now().timestamp()) < 120  # from the prefix, local time
    assert tmp_store.query("SELECT status FROM runs")["status"][0] == "completed"


def test_values_with_no_step_anywhere_are_a_problem_not_silence(tmp_store, tmp_path):
    """A loguru-style log of losses only: no line states a step, none can be counted."""
    run = tmp_path / "r"
    run.mkdir()
    (run / "train.log").write_text(
        "".join(
            f"2024-05-01 10:00:0{i}.000 | INFO     | train:step:42 - Loss: {2.0 - i / 10}\n" for i in range(5)
        )
    )
    settle(run / "train.log")
    report = ingest_paths(tmp_store, run)
    assert [(p.kind, "5 values" in p.message) for _, p in report.problems] == [("no_step", True)]
    assert tmp_store.query("SELECT count(*) n FROM scalars")["n"][0] == 0
