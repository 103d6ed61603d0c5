"""The format registry: one line per ingestor, tried in this order by `sniff`.

Order matters where names overlap: structured files (trainer_state.json, ds_config.json) are
claimed before the generic JSON Lines reader, and JSON Lines before the text-log reader
(fairseq's JSON log is a `.log` file). Which source wins a (run, tag, step) two sources share
is each ingestor's own `precedence`, not this order.
"""

from __future__ import annotations

from ingest.base import Ingestor
from ingest.deepspeed_monitor import DeepSpeedMonitorCsvIngestor
from ingest.ds_config import DeepSpeedConfigIngestor
from ingest.hf_trainer import HFTrainerIngestor
from ingest.jsonl import JsonLinesIngestor
from ingest.keras_csv import KerasCsvLoggerIngestor
from ingest.lightning import LightningCsvIngestor, LightningHparamsIngestor
from ingest.mlflow import MlflowMetricIngestor, MlflowRunMetaIngestor
from ingest.mlperf import MlperfIngestor
from ingest.tensorboard import TensorBoardIngestor
from ingest.textlog.ingestor import TextLogIngestor
from ingest.wandb_offline import WandbRunIngestor


def make_ingestors(check_crc: bool = True) -> list[Ingestor]:
    return [
        TensorBoardIngestor(check_crc=check_crc),
        MlflowMetricIngestor(),
        MlflowRunMetaIngestor(),
        WandbRunIngestor(),
        HFTrainerIngestor(),
        DeepSpeedConfigIngestor(),
        JsonLinesIngestor(),
        DeepSpeedMonitorCsvIngestor(),
        LightningCsvIngestor(),
        KerasCsvLoggerIngestor(),
        LightningHparamsIngestor(),
        MlperfIngestor(),
        TextLogIngestor(),
    ]


def precedence(ingestors: list[Ingestor]) -> list[str]:
    """Names of the formats that write points, strongest first (see Ingestor.precedence)."""
    ranked = sorted((i.precedence, i.name) for i in ingestors if i.precedence is not None)
    return [name for _, name in ranked]
