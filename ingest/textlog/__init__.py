"""Console and text logs: DeepSpeed, Megatron(-DeepSpeed), nanoGPT, llama2.c, llm.c, torchtitan,
OLMo, fairseq, HF console dicts, loguru, and generic progress lines.

`machine.py` is the state machine every dialect shares: the step in progress, what waits for
the next step, wall times from timestamp prefixes, events and how the run ended. Each dialect
is one module holding its regexes and line handlers as a `Dialect` (`deepspeed.py`,
`megatron.py`, `nanogpt.py`, `llama2c.py`, `llmc.py`, `torchtitan.py`, `olmo.py`, `fairseq.py`,
`hf_console.py`, `loguru.py`; `checkpoints.py` and `crashes.py` hold the lines any dialect's
run prints; `progress.py`, the fallback for generic `key value` progress lines, goes last). `ingestor.py` lists them in `DIALECTS`,
the order a line is offered to them, and is the reader the format registry knows.

A new dialect: a module like `nanogpt.py` (patterns, a `values` handler that calls
`p.at_step(step)` and `p.point(tag, value)`, a `DIALECT`), one line in `DIALECTS` (a
catch-all dialect goes last), tests in `tests/formats/`.
"""
