"""The format registry: one line per ingestor, tried in this order by `sniff`."""

from __future__ import annotations


def make_ingestors(check_crc: bool = True) -> list:
    from ingest.tensorboard import TensorBoardIngestor

    return [TensorBoardIngestor(check_crc=check_crc)]
