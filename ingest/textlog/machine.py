"""Console and text logs: DeepSpeed, Megatron(-DeepSpeed), nanoGPT, fairseq, HF console dicts.

One line parser for all of them, because real logs mix them (a Megatron-DeepSpeed run prints
iteration lines *and* DeepSpeed OVERFLOW notices; an HF run with DeepSpeed prints both kinds of
progress). The rules that shape the patterns:
- Each line is cleaned as a terminal shows it (text after the last `\\r`, no ANSI codes) and
  patterns are *searched*, because tqdm bars are glued to the front of records.
- The current step is the last step a line stated (`step=`, `iteration N/`, `steps: N`,
  `step:N/T`, `num_updates=`); lines with no step take it; before any step they are counted and
  skipped, except where the step can be counted (below).
- DeepSpeed's engine `step=N` line is the authority: the throughput timer's own
  `global_step=` restarts at 0 when a run resumes, so throughput lines take the engine's step
  when the file has one. The `step=0` line DeepSpeed prints at engine start describes the engine
  before any checkpoint is loaded: when a `Loading checkpoint` line follows before the next
  step, it is dropped, and the count continues from the loaded checkpoint's step.
- An OVERFLOW notice carries no step: it belongs to the step in progress, so it waits for the
  next line that states a step. Each notice is an `overflow` event (attempted and new scale) and
  a point of the derived series `derived/loss_scale`.
- DeepSpeed timers (`wall_clock_breakdown`): the ZeRO optimizer and micro-step timers print
  before the step they time is reported, so they wait for the next step too; the global timer
  line (`fwd | bwd | ... | step`) closes a step. At the default log level (DeepSpeed >= 0.19 prints
  no `step=` lines) the steps are counted from those global lines, and the file's note says so.
- HF / TRL console dicts (`{'loss': '1.156', ..., 'epoch': '0.84'}`) carry no step: with no
  step line in the file, the k-th training dict is step k x `logging_steps` (from the run's
  trainer_state.json, read again once it is known), evaluation dicts take the step of the last
  training dict, and the note says the steps were counted.
- Lines with a timestamp prefix (`[YYYY-MM-DD HH:MM:SS,mmm]` of DeepSpeed, fairseq's and
  loguru's, Megatron's `[YYYY-MM-DD HH:MM:SS]`) give their points a wall time (read as local
  time); the file's first timestamp orders it among the run's other files.
- Fragments never produce values: every pattern needs its full context (`time (ms)` before
  timer items, `iteration N/ M |` before Megatron fields).
The parser state (current step, pending notices, line number) is kept per file between ingests,
so a growing log is read from where the last ingest stopped.
"""

from __future__ import annotations

import ast
import functools
import re
from datetime import datetime
from pathlib import Path

from ingest.base import Batch, Evidence, Problem, ReadContext, event
from ingest.lines import NUM, LineIngestor, LineParser, is_settled, read_head, strip_line, to_float
from workbench.store.points import PointsBuilder

SNIFF_BYTES = 1 << 20  # the script dump at the top of a nanoGPT log can be long

DS_PREFIX = re.compile(
    r"\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2},\d{3}\] \[(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\] \[[^:\]\s]+:\d+:[^\]\s]+\] "
)
DS_STEP = re.compile(
    r"\bstep=(?P<step>\d+), skipped=(?P<skipped>\d+), lr=\[(?P<lr>[^\]]*)\], mom=(?P<mom>\[.*\])\s*$"
)
DS_TPUT = re.compile(
    rf"epoch=(?P<epoch>\d+)/micro_step=(?P<micro_step>\d+)/global_step=(?P<global_step>\d+), RunningAvgSamplesPerSec=(?P<avg>{NUM}), "
    rf"CurrSamplesPerSec=(?P<cur>{NUM}), MemAllocated=(?P<mem>{NUM})GB, MaxMemAllocated=(?P<maxmem>{NUM})GB"
)
DS_TPUT_OLD = re.compile(
    rf"(?<![\w/.])(?P<epoch>\d+)/(?P<step>\d+), (?:SamplesPerSec=(?P<sps>{NUM})|RunningAvgSamplesPerSec=(?P<avg>{NUM}), "
    rf"CurrSamplesPerSec=(?P<cur>{NUM}))(?:, MemAllocated=(?P<mem>{NUM})GB, MaxMemAllocated=(?P<maxmem>{NUM})GB)?"
)
DS_PIPE = re.compile(
    rf"^steps: (?P<step>\d+) loss: (?P<loss>{NUM}) (?P<extra>(?:\S+: {NUM} )*)iter time \(s\): (?P<iter_s>{NUM}) "
    rf"(?:samples|real_logs)/sec: (?P<sps>{NUM})\s*$"
)
TIMER = re.compile(rf"(?:^|\s|\] )(?:rank=(?P<rank>\d+) )?time \(ms\)(?P<body>(?: \| [^|:]+: {NUM})*)\s*$")
TIMER_ITEM = re.compile(rf" \| (?P<name>[^|:]+): (?P<ms>{NUM})")
OVERFLOW = re.compile(
    rf"\[(?P<tag>deepspeed|deepscale)\] OVERFLOW! (?:Rank (?P<rank>\d+) )?Skipping step\.(?: Attempted loss scal\s*e: (?P<scale>{NUM})"
    rf"(?:, reducing to (?P<new_scale>{NUM})|, but hysteresis is (?P<hyst>\d+)\. Reducing hysteresis to (?P<new_hyst>\d+)))?"
)
OVERFLOW_FP16 = re.compile(
    rf"(?:\[deepspeed\] fp16 dynamic loss scale overflow!|Overflow detected\.) Skipping step\. Attempted loss scale: (?P<scale>{NUM}), "
    rf"reducing to (?P<new_scale>{NUM})"
)
GRAD_OVERFLOW = re.compile(r"Grad overflow on iteration:? ?(?P<iter>\d+)")
MIN_SCALE = re.compile(r"Current loss scale already at minimum")
# one per save in every DeepSpeed version ("... is ready now" is gone in 0.19)
CKPT_SAVED = re.compile(r"Saving model checkpoint: (?P<path>\S+)")
CKPT_STEP = re.compile(r"global_step(\d+)|checkpoint-(\d+)|iter_0*(\d+)|(?:ckpt|step)[_-]?(\d+)")
CKPT_LOAD = re.compile(
    r"(?:Begin Load checkpoint from|[Ll]oading (?:model )?checkpoint(?: from)?:?)\s+(?P<path>\S+)"
)
LOGURU = re.compile(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d{3} \| [A-Z]+\s*\| \S+ - (?P<msg>.*)$")
LOGURU_LOSS = re.compile(rf"(?:\[Rank -?\d+\] )?Loss: (?P<loss>{NUM})\s*$")
# anchored (config dumps are dicts too), after at most a logger's prefix (LLaMA-Factory:
# `[INFO|2024-11-26 22:09:01] logging.py:157 >> {'loss': ...}`)
HF_DICT = re.compile(r"^\s*(?:\[[^\]]{1,60}\]\s*[\w.]+:\d+\s*>>\s*)?(?P<d>\{'[A-Za-z_/]+': .*\})\s*$")
MEG_ITER = re.compile(
    r"^\s*(?:\[default\d+\]:\s*)?(?:\[(?P<ts>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d+)?)\]\s*)?"
    r"iteration\s+(?P<iter>\d+)/\s*(?P<train_iters>\d+) \|(?P<rest>.*)$"
)
MEG_FIELD = re.compile(rf"\s*(?P<key>[^|:]+?):\s+(?P<val>{NUM})\s*\|")
MEG_VALID = re.compile(r"validation loss at (?P<where>.*?) \| (?P<rest>.*)$")
MEG_VALID_FIELD = re.compile(rf"(?P<key>[^|]+?) (?P<kind>value|PPL): (?P<val>{NUM})\s*\|")
NANOGPT = re.compile(r"^step:(?P<step>\d+)/(?P<total>\d+)(?P<kv>(?: [A-Za-z_]+:\S+)+)\s*$")
NANOGPT_KV = re.compile(rf" (?P<key>[A-Za-z_]+):(?P<val>{NUM})(?P<unit>[A-Za-z%]*)")
FAIRSEQ = re.compile(
    r"^(?P<ts>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}) \| (?P<level>[A-Z]+) \| (?P<name>[\w.]+) \| (?P<msg>.*)$"
)
FAIRSEQ_INNER = re.compile(r"^epoch (?P<epoch>\d+):\s+(?P<i>\d+) / (?P<n>\d+) (?P<kv>.*)$")
FAIRSEQ_KV = re.compile(r"(?P<key>[\w/]+)=(?P<val>[^,\s]+)")
FAIRSEQ_EPOCH = re.compile(rf"\| (?P<key>[\w/]+) (?P<val>{NUM})(?= \||\s*$)")
RECOVERY = re.compile(r"\[(?P<step>\d+)\] RECOVERY TRIGGERED: (?P<pattern>\S+) - (?P<changes>\{.*\})\s*$")
OOM = re.compile(r"CUDA out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED|\bout of memory\b")
NCCL_TIMEOUT = re.compile(r"Watchdog caught collective operation timeout|NCCL.*(?:[Tt]imeout|timed out)")
TRACEBACK = "Traceback (most recent call last):"
LINE_TIME = re.compile(r"^\[?(?:[A-Z]+\|)?(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(?:[,.](\d{1,6}))?")
DS_CONFIG_ITEM = re.compile(
    r"\[config\.py:\d+:print\]\s+(?P<key>train_batch_size|train_micro_batch_size_per_gpu|"
    r"gradient_accumulation_steps|world_size)\s+\.+\s+(?P<val>\d+)\s*$"
)
LAUNCHER_EXIT = re.compile(r"Process \d+ exits successfully")
FLOPS_HEADER = re.compile(r"^-{5,} DeepSpeed Flops Profiler -{5,}\s*$")
FLOPS_MAX_LINES = 80  # the summary is ~40 lines; never let a stray banner swallow the log
FLOPS_STEP = re.compile(r"Profile Summary at step (?P<step>\d+)")
FLOPS_KV = re.compile(rf"^(?P<key>[A-Za-z][^:]*?):\s+(?P<val>{NUM})\s*(?P<unit>[A-Za-z/%]*)\s*$")
FLOPS_END = "Aggregated Profile per GPU"
UNIT_PREFIX = {"T": 1e12, "G": 1e9, "M": 1e6, "K": 1e3, "k": 1e3, "m": 1e-3, "u": 1e-6}
UNIT_BASES = {"", "MACs", "FLOPS", "flops", "s"}

# every rule needs one of these substrings: lines with none are skipped in one C-level search
TRIGGER = re.compile(
    r"step|SamplesPerSec|time \(ms\)|iteration|verflow|OVERFLOW|RECOVERY|heckpoint|minimum"
    r"|Traceback|emory|ALLOC|imeout|timed out|Flops Profiler|\{'| \| | - |config\.py|exits successfully"
)
LOGURU_LOSS_LINE = re.compile(
    LOGURU.pattern[:-1].replace("(?P<msg>.*)", rf"(?:\[Rank -?\d+\] )?Loss: {NUM}\s*") + "$"
)
SNIFF = (DS_PREFIX, OVERFLOW, MEG_ITER, NANOGPT, FAIRSEQ, HF_DICT, RECOVERY, DS_PIPE, TIMER, LOGURU_LOSS_LINE)
TEXT_SUFFIXES = (".log", ".txt", ".out", ".err", ".stdout", ".stderr")


@functools.lru_cache(maxsize=256)
def _first_momentum(text: str) -> float | None:
    """beta1 of the first param group from `[(0.9, 0.999)]` or `[[0.9, 0.999]]` (repeats: cached)."""
    try:
        mom = ast.literal_eval(text)
        return to_float(mom[0][0] if isinstance(mom[0], list | tuple) else mom[0])
    except (ValueError, SyntaxError, IndexError, TypeError):
        return None


def _num(s: str | None) -> float | None:
    return None if s is None else float(s)


@functools.lru_cache(maxsize=4096)
def _epoch_seconds(day: str, clock: str) -> float:
    return datetime.strptime(f"{day} {clock}", "%Y-%m-%d %H:%M:%S").timestamp()


def line_time(line: str) -> float | None:
    """The wall time of a line with a timestamp prefix (local time), else None."""
    if not (line[:1].isdigit() or line[:1] == "[") or not (m := LINE_TIME.match(line)):
        return None
    frac = float("0." + m[3]) if m[3] else 0.0
    return _epoch_seconds(m[1], m[2]) + frac


# DeepSpeed engine and ZeRO/fp16 optimizer timer names (wall_clock_breakdown); other tools'
# timers (Megatron's `forward-compute`, ...) print after the step they time and take its step
DS_GLOBAL_TIMERS = {"fwd", "bwd", "bwd_inner", "bwd_allreduce", "forward", "backward", "backward_inner"}
DS_GLOBAL_TIMERS |= {"backward_allreduce", "step"}
DS_TIMERS = DS_GLOBAL_TIMERS | {n + "_microstep" for n in DS_GLOBAL_TIMERS}
DS_TIMERS |= {
    "optimizer_allgather",
    "optimizer_gradients",
    "optimizer_step",
    "compute_norm",
    "overflow_check",
}
DS_TIMERS |= {"unscale_and_clip", "basic_step", "update_fp16"}


def _is_global_timer(names: list[str]) -> bool:
    """DeepSpeed's per-step global timers (`fwd | bwd | ... | step`); micro-step and optimizer
    timers print before the step they belong to is over."""
    return "step" in names and set(names) <= DS_GLOBAL_TIMERS


class _Parser(LineParser):
    """Per-file parser state; `feed` one line at a time."""

    def __init__(self, path: Path, ctx: ReadContext):
        super().__init__(path, ctx)
        state = ctx.state
        self.step = state.get("step")
        self.no_step = state.get("no_step", 0)
        self.pending = state.get("pending", [])  # overflow notices waiting for their step
        self.pending_values = state.get(
            "pending_values", []
        )  # [tag, value, wall]: timers waiting for their step
        self.explicit = state.get("explicit", False)  # a progress line stated a step (not the init report)
        self.init_values = state.get(
            "init_values", []
        )  # the engine-start `step=0` report, kept until we know
        self.timer_step = state.get("timer_step")  # the step DeepSpeed's global timer lines count
        self.awaiting_global = state.get("awaiting_global", False)
        self.timer_rank = state.get("timer_rank")
        self.counted = state.get("counted", 0)  # HF dicts placed by counting
        self.timers_counted = state.get("timers_counted", False)  # steps counted from global timer lines
        self.logging_steps = _logging_steps(ctx.run_config)
        self.wall = float("nan")  # of the line being read
        self.first_wall = state.get("first_wall")
        self.builder = PointsBuilder()
        self.events: list[dict] = []
        self.problems: list[Problem] = []
        self.config: dict = {}
        self.records = 0
        self.flops: dict | None = None
        self.last_crash: dict | None = None
        self.kinds: dict[str, int] = {}  # records parsed, by kind (kept in the file's contents)
        self.no_step_reported = self.no_step
        self.placed = state.get("placed", 0)  # points stored from this file so far

    def state(self) -> dict:
        return {
            "step": self.step,
            "line": self.line,
            "no_step": self.no_step,
            "pending": self.pending,
            "pending_values": self.pending_values,
            "explicit": self.explicit,
            "init_values": self.init_values,
            "timer_step": self.timer_step,
            "awaiting_global": self.awaiting_global,
            "timer_rank": self.timer_rank,
            "counted": self.counted,
            "timers_counted": self.timers_counted,
            "placed": self.placed,
            "first_wall": self.first_wall,
        }

    def point(
        self, tag: str, value: float | None, step: int | None = None, wall: float | None = None
    ) -> None:
        step = self.step if step is None else step
        if value is None:
            return
        if step is None:
            self.no_step += 1
            return
        self.builder.add(tag, step, value, self.wall if wall is None else wall)

    def at_step(self, step: int) -> None:
        """A line stated the step in progress: place what was waiting for it."""
        self.step = step
        self._release_init()
        for p in self.pending:
            self.events.append(event(step, p.get("wall"), "overflow", p["message"], p["attrs"], p["line"]))
            if p["attrs"].get("new_scale") is not None:
                self.point("derived/loss_scale", p["attrs"]["new_scale"], step, p.get("wall"))
        self.pending = []
        self._place_values(step)

    def _place_values(self, step: int | None) -> None:
        for tag, value, wall in self.pending_values:
            self.point(tag, value, step, float("nan") if wall is None else wall)
        self.pending_values = []

    def _release_init(self) -> None:
        """The engine-start report is step 0 of a fresh run (no checkpoint was loaded after it)."""
        for tag, value, wall in self.init_values:
            self.point(tag, value, 0, float("nan") if wall is None else wall)
        self.init_values = []

    def place_pending_at_end(self) -> None:
        """The log is finished: what still waits for a step belongs to the last step seen."""
        last = self.step if self.timer_step is None else max(self.step or 0, self.timer_step)
        for p in self.pending:
            attrs = {**p["attrs"], "step_placed": "last step before the notice (no later step line came)"}
            self.events.append(event(last, p.get("wall"), "overflow", p["message"], attrs, p["line"]))
            if p["attrs"].get("new_scale") is not None and last is not None:
                self.point("derived/loss_scale", p["attrs"]["new_scale"], last, p.get("wall"))
        self.pending = []
        self._release_init()
        self._place_values(last)

    def end_block(self, batch: Batch, last: bool) -> None:
        if last and (self.pending or self.pending_values or self.init_values) and is_settled(self.path):
            self.place_pending_at_end()
        batch.first_wall_time = self.first_wall
        batch.points = self.builder.take()
        batch.events, self.events = self.events, []
        batch.problems, self.problems = self.problems, []
        batch.config, self.config = self.config, {}
        batch.records, self.records = self.records, 0
        batch.evidence = [
            _evidence(e) for e in batch.events if e["kind"] in ("min_loss_scale", "crash", "oom", "finished")
        ]
        if self.pending:
            batch.note = f"{len(self.pending)} OVERFLOW notices wait for the next line that states a step"
        elif self.counted and not self.explicit:
            per = (
                f"x logging_steps {self.logging_steps}"
                if self.logging_steps
                else "(logging_steps unknown: step = count)"
            )
            batch.note = f"no line states a step: {self.counted} console dicts placed by counting {per}"
        elif self.timers_counted:
            batch.note = "no line states a step: steps counted from DeepSpeed's global timer lines"
        batch.counts, self.kinds = self.kinds, {}
        if self.no_step > self.no_step_reported:
            batch.counts["values_before_first_step"] = self.no_step - self.no_step_reported
            self.no_step_reported = self.no_step
        self.placed += len(batch.points)
        if last and self.no_step and not self.placed and is_settled(self.path):
            # a log full of values and no step to put them on: say so, never store silently nothing
            batch.problems.append(
                Problem(
                    self.line,
                    "no_step",
                    f"{self.no_step} values in this log but no line states or counts a step; none stored "
                    "(a step per line, DeepSpeed's step= lines or its timers, or HF dicts are needed)",
                )
            )

    # ------------------------------------------------------------------------------------
    def feed(self, raw: str, batch: Batch) -> None:
        line = strip_line(raw)
        if not line.strip():
            return
        wall = line_time(line)
        self.wall = float("nan") if wall is None else wall
        if wall is not None and self.first_wall is None:
            self.first_wall = wall
        if self.flops is not None and self._flops_line(line):
            return
        if self.last_crash is not None and self._traceback_line(line):
            return
        if not TRIGGER.search(line):
            return
        for kind in (
            self._progress(line) or self._megatron(line) or self._other_formats(line),
            self._deepspeed_notices(line),
            self._events(line),
        ):
            if kind:
                self.records += 1
                self.kinds[kind] = self.kinds.get(kind, 0) + 1

    def _progress(self, line: str) -> str | None:
        if "step=" in line and "skipped=" in line and (m := DS_STEP.search(line)):
            step = int(m["step"])
            values = [("skipped", float(m["skipped"]))]
            values += [
                ("lr" if i == 0 else f"lr/{i}", to_float(v))
                for i, v in enumerate(x for x in m["lr"].split(",") if x.strip())
            ]
            values.append(("mom", _first_momentum(m["mom"])))
            if (
                step == 0 and not self.explicit
            ):  # the engine-start report: step 0 unless a checkpoint loads next
                self.step, self.timer_step, self.awaiting_global = 0, 0, False
                self.init_values = [[t, v, self.wall] for t, v in values if v is not None]
                return "ds_progress"
            self.at_step(step)
            self.explicit, self.timer_step, self.awaiting_global = True, step, True
            for tag, value in values:
                self.point(tag, value)
            return "ds_progress"
        if "SamplesPerSec" in line:
            if m := DS_TPUT.search(line):
                if not self.explicit:  # its global_step restarts on resume: only without engine steps
                    self.at_step(int(m["global_step"]))
                    self.timer_step, self.awaiting_global = int(m["global_step"]), True
                self.point("RunningAvgSamplesPerSec", _num(m["avg"]))
                self.point("CurrSamplesPerSec", _num(m["cur"]))
                self.point("MemAllocated", _num(m["mem"]))
                self.point("MaxMemAllocated", _num(m["maxmem"]))
                return "ds_throughput"
            if m := DS_TPUT_OLD.search(line):
                if self.step is None:
                    self.at_step(int(m["step"]))
                self.point("SamplesPerSec", _num(m["sps"] or m["avg"]))
                self.point("CurrSamplesPerSec", _num(m["cur"]))
                self.point("MemAllocated", _num(m["mem"]))
                self.point("MaxMemAllocated", _num(m["maxmem"]))
                return "ds_throughput_old"
        if line.startswith("steps: ") and (m := DS_PIPE.match(line)):
            step = int(m["step"])
            self.at_step(step)
            self.point("loss", _num(m["loss"]))
            for k, v in re.findall(rf"(\S+): ({NUM}) ", m["extra"]):
                self.point(k, float(v))
            self.point("iter time (s)", _num(m["iter_s"]))
            self.point("samples/sec", _num(m["sps"]))
            return "ds_pipeline"
        if "time (ms)" in line and (m := TIMER.search(line)):
            rank = m["rank"] or "0"
            if self.timer_rank is None:
                self.timer_rank = rank
            if rank != self.timer_rank:  # every rank prints its timers: keep one rank's
                return "timer_other_rank"
            items = [(item["name"].strip(), float(item["ms"])) for item in TIMER_ITEM.finditer(m["body"])]
            if not {name for name, _ in items} <= DS_TIMERS:
                for name, ms in items:
                    self.point(f"time/{name}", ms)
                return "timer"
            self.pending_values += [[f"time/{name}", ms, self.wall] for name, ms in items]
            if _is_global_timer([name for name, _ in items]):
                if self.awaiting_global:
                    step, self.awaiting_global = self.timer_step, False
                else:
                    self.timer_step = step = (self.timer_step if self.timer_step is not None else 0) + 1
                    self.timers_counted = not self.explicit
                self.at_step(step)
            return "timer"
        return None

    def _megatron(self, line: str) -> str | None:
        if "iteration" not in line:
            return None
        if m := MEG_ITER.match(line):
            it = int(m["iter"])
            self.at_step(it)
            rest, fields = m["rest"], {}
            pos = 0
            while fm := MEG_FIELD.match(rest, pos):
                fields[fm["key"].strip()] = float(fm["val"])
                pos = fm.end()
            tail = rest[pos:].strip()
            for k, v in fields.items():
                self.point(k, v, it)
            if tail:
                self.problems.append(
                    Problem(
                        self.line,
                        "truncated_line",
                        f"line {self.line}: iteration {it} ends mid-field ({tail!r}); kept {len(fields)} complete fields",
                    )
                )
            elif "lm loss" not in fields:
                self.events.append(
                    event(
                        it,
                        self.wall,
                        "nan_window",
                        f"iteration {it}: no lm loss (every iteration in the window skipped or NaN)",
                        {"fields": fields},
                        self.line,
                    )
                )
            return "megatron_iteration"
        if m := MEG_VALID.search(line):
            where = re.search(r"iteration (\d+)", m["where"])
            step = int(where[1]) if where else self.step
            for fm in MEG_VALID_FIELD.finditer(m["rest"] + "|" if not m["rest"].endswith("|") else m["rest"]):
                key = fm["key"].strip().lstrip("| ").strip()
                self.point(
                    f"validation/{key}" + (" PPL" if fm["kind"] == "PPL" else ""), float(fm["val"]), step
                )
            return "megatron_validation"
        return None

    def _other_formats(self, line: str) -> str | None:
        if line.startswith("step:") and (m := NANOGPT.match(line)):
            step = int(m["step"])
            self.at_step(step)
            for kv in NANOGPT_KV.finditer(m["kv"]):
                self.point(kv["key"], float(kv["val"]))
            return "nanogpt_step"
        if " | " in line and (m := FAIRSEQ.match(line)):
            msg = m["msg"]
            if inner := FAIRSEQ_INNER.match(msg):
                kv = {k: to_float(v) for k, v in FAIRSEQ_KV.findall(inner["kv"])}
                if kv.get("num_updates") is not None:
                    self.at_step(int(kv["num_updates"]))
                for k, v in kv.items():
                    if k != "num_updates":
                        self.point(k, v)
                return "fairseq_train_inner"
            if m["name"] in ("train", "valid") and msg.startswith("epoch"):
                for fm in FAIRSEQ_EPOCH.finditer(msg):
                    key = fm["key"]
                    self.point(key if key.startswith(m["name"]) else f"{m['name']}/{key}", float(fm["val"]))
                return "fairseq_epoch"
            return None
        if "{'" in line and (m := HF_DICT.match(line)):
            # bare nan/inf are not Python literals: quote them, to_float reads them back
            text = re.sub(r"(?<![\w'])(-?(?:nan|inf))(?![\w'])", r"'\1'", m["d"])
            try:
                d = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                return None
            if isinstance(d, dict):
                return self._hf_dict(d, line)
        if " - " in line and (m := LOGURU.match(line)) and (lm := LOGURU_LOSS.search(m["msg"])):
            self.point("loss", float(lm["loss"]))
            return "loguru_loss"
        return None

    def _hf_dict(self, d: dict, line: str) -> str:
        """An HF / TRL console dict. Its step: its own, else the file's step, else counted."""
        if "train_loss" in d and "loss" not in d:  # the Trainer's final summary, printed once
            self.config["console_summary"] = {k: to_float(v) for k, v in d.items()}
            self.events.append(event(self.step, self.wall, "finished", line.strip()[:500], {}, self.line))
            return "hf_summary"
        step = to_float(d.get("step"))
        if step is not None:
            step = int(step)
        elif not self.explicit and "loss" in d:  # a training log: the k-th is step k x logging_steps
            self.counted += 1
            self.step = step = self.counted * (self.logging_steps or 1)
        for k, v in d.items():
            if k != "step":
                self.point(k, to_float(v), step)
        return "hf_dict"

    def _deepspeed_notices(self, line: str) -> str | None:
        if "verflow" not in line and "OVERFLOW" not in line:
            return None
        if m := OVERFLOW.search(line):
            attrs = {
                "variant": "hysteresis" if m["hyst"] else ("reduce" if m["new_scale"] else "skip"),
                "source": m["tag"],
                "attempted_scale": _num(m["scale"]),
                "new_scale": _num(m["new_scale"]),
            }
            if m["hyst"]:
                attrs.update(hysteresis=int(m["hyst"]), new_hysteresis=int(m["new_hyst"]))
            self.pending.append(
                {"message": m.group(0), "attrs": attrs, "line": self.line, "wall": _finite(self.wall)}
            )
            return "overflow"
        if m := OVERFLOW_FP16.search(line):
            attrs = {
                "variant": "reduce",
                "source": "fp16_optimizer",
                "attempted_scale": _num(m["scale"]),
                "new_scale": _num(m["new_scale"]),
            }
            self.pending.append(
                {"message": m.group(0), "attrs": attrs, "line": self.line, "wall": _finite(self.wall)}
            )
            return "overflow"
        if m := GRAD_OVERFLOW.search(line):
            self.events.append(
                event(
                    int(m["iter"]), self.wall, "overflow", m.group(0), {"variant": "grad_overflow"}, self.line
                )
            )
            return "overflow"
        return None

    def _events(self, line: str) -> str | None:
        if "RECOVERY TRIGGERED" in line and (m := RECOVERY.search(line)):
            try:
                changes = ast.literal_eval(m["changes"])
            except (ValueError, SyntaxError):
                changes = m["changes"]
            self.events.append(
                event(
                    int(m["step"]),
                    self.wall,
                    "recovery",
                    line.strip(),
                    {"pattern": m["pattern"], "changes": changes},
                    self.line,
                )
            )
            return "recovery"
        if "Saving model checkpoint" in line and (m := CKPT_SAVED.search(line)):
            gs = CKPT_STEP.search(m["path"])
            step = int(next(g for g in gs.groups() if g)) if gs else self.step
            self.events.append(
                event(step, self.wall, "checkpoint", line.strip(), {"path": m["path"]}, self.line)
            )
            return "checkpoint"
        if "heckpoint" in line and (m := CKPT_LOAD.search(line)):
            gs = CKPT_STEP.search(m["path"])
            step = int(next(g for g in gs.groups() if g)) if gs else None
            self.events.append(event(step, self.wall, "resume", line.strip(), {"path": m["path"]}, self.line))
            if not self.explicit and self.timer_step is not None:
                # after DeepSpeed's engine-start report: it described the engine before this load
                self.init_values = []
                if step is not None:
                    self.timer_step, self.awaiting_global = step, False
            return "checkpoint_load"
        if "config.py" in line and (m := DS_CONFIG_ITEM.search(line)):
            self.config.setdefault("deepspeed_engine", {})[m["key"]] = int(m["val"])
            return "ds_config_dump"
        if "exits successfully" in line and LAUNCHER_EXIT.search(line):
            self.events.append(event(self.step, self.wall, "finished", line.strip()[:500], {}, self.line))
            return "launcher_exit"
        if "loss scale already at minimum" in line and MIN_SCALE.search(line):
            self.place_pending_at_end()  # the run dies inside the step in progress
            self.events.append(event(self.step, self.wall, "min_loss_scale", line.strip(), {}, self.line))
            return "min_loss_scale"
        if line.startswith(TRACEBACK):
            self.place_pending_at_end()
            self.last_crash = event(self.step, self.wall, "crash", "Traceback", {}, self.line)
            self.events.append(self.last_crash)
            return "crash"
        if ("memory" in line or "Memory" in line or "ALLOC" in line) and OOM.search(line):
            self.events.append(event(self.step, self.wall, "oom", line.strip()[:500], {}, self.line))
            return "oom"
        if ("imeout" in line or "timed out" in line) and NCCL_TIMEOUT.search(line):
            self.events.append(
                event(self.step, self.wall, "text", line.strip()[:500], {"reason": "nccl_timeout"}, self.line)
            )
            return "nccl_timeout"
        if "Flops Profiler" in line and FLOPS_HEADER.match(line):
            self.flops = {"_lines": 0}
            return "flops_profile"
        return None

    def _traceback_line(self, line: str) -> bool:
        """The first unindented line after a traceback is the exception: it names the crash.
        Returns True when the line was that exception (it is then no record of its own)."""
        if line.startswith((" ", "\t", TRACEBACK)):
            return line.startswith((" ", "\t"))
        self.last_crash["message"] = line.strip()[:500]
        if OOM.search(line):
            self.last_crash["kind"] = "oom"
        self.last_crash = None
        return True

    def _flops_line(self, line: str) -> bool:
        self.flops["_lines"] += 1
        if FLOPS_END in line or self.flops["_lines"] > FLOPS_MAX_LINES:
            self.flops.pop("_lines")
            self.config["flops_profile"] = self.flops
            self.flops = None
            return True
        if m := FLOPS_STEP.search(line):
            self.flops["step"] = int(m["step"])
            return True
        if m := FLOPS_KV.match(line.strip()):
            key = m["key"].split("=")[0].strip()
            unit = m["unit"]
            # "10.43 MMACs" is mega-MACs, "21.16 M" mega, "34.09 us" micro-seconds; "MACs" has no prefix
            scaled = unit[:1] in UNIT_PREFIX and unit[1:] in UNIT_BASES and unit not in UNIT_BASES
            self.flops[key] = float(m["val"]) * (UNIT_PREFIX[unit[0]] if scaled else 1.0)
            self.flops[key + " (unit)"] = unit[1:] if scaled else unit
            return True
        return False


class TextLogIngestor(LineIngestor):
    name = "text_log"
    precedence = 90
    parser = _Parser

    def config_used(self, run_config: dict, state: dict) -> str | None:
        return f"logging_steps {_logging_steps(run_config)}" if state.get("counted") else None

    def sniff(self, path: Path, head: bytes) -> bool:
        name = path.name.lower().removesuffix(".gz")
        if not (name.endswith(TEXT_SUFFIXES) or "stdout" in name or "stderr" in name):
            return False
        text = read_head(path, SNIFF_BYTES).decode("utf-8", errors="replace")
        lines = [strip_line(line) for line in text.splitlines()]
        return any(p.search(line) for p in SNIFF for line in lines)


def _evidence(e: dict) -> Evidence:
    """How a run ended: a min-loss-scale exit, a traceback, an out-of-memory line, or a clean end
    (the launcher's `exits successfully`, HF's final summary)."""
    step, wall = e["step"], e["wall_time"]
    if e["kind"] == "finished":
        return Evidence("completed", f"the log says it finished: {e['message']}", step, None, wall)
    if e["kind"] == "min_loss_scale":
        where = "?" if step is None else step
        message = f"loss scale hit its minimum (DeepSpeed exit) at step {where}"
        return Evidence("diverged", message, step, "fp16_overflow", wall)
    return Evidence("crashed", f"crash in the log: {e['message']}", step, e["kind"], wall)


def _finite(x: float) -> float | None:
    return None if x != x else x


def _logging_steps(run_config: dict) -> int | None:
    """The HF Trainer's logging_steps, when the run's trainer_state.json has been read."""
    value = to_float((run_config.get("trainer_state") or {}).get("logging_steps"))
    return int(value) if value and value >= 1 else None
