"""Training-log workbench: ingest training logs, replay and backtest alert rules, explore."""
