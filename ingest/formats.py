"""The format registry: one line per ingestor, tried in this order by `sniff`.

Order matters where names overlap: structured files (trainer_state.json, ds_config.json) are
claimed before the generic JSON Lines reader, and JSON Lines before the text-log reader
(fairseq's JSON log is a `.log` file).
"""

from __future__ import annotations


def make_ingestors(check_crc: bool = True) -> list:
    from ingest.deepspeed_files import DeepSpeedConfigIngestor, DeepSpeedMonitorCsvIngestor
    from ingest.hf_trainer import HFTrainerIngestor
    from ingest.jsonlog import JsonLinesIngestor
    from ingest.lightning import LightningCsvIngestor, LightningHparamsIngestor
    from ingest.mlflow import MlflowMetricIngestor, MlflowRunMetaIngestor
    from ingest.tensorboard import TensorBoardIngestor
    from ingest.textlog import TextLogIngestor

    return [
        TensorBoardIngestor(check_crc=check_crc),
        MlflowMetricIngestor(),
        MlflowRunMetaIngestor(),
        HFTrainerIngestor(),
        DeepSpeedConfigIngestor(),
        JsonLinesIngestor(),
        DeepSpeedMonitorCsvIngestor(),
        LightningCsvIngestor(),
        LightningHparamsIngestor(),
        TextLogIngestor(),
    ]
