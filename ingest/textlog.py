"""Console and text logs: DeepSpeed, Megatron(-DeepSpeed), nanoGPT, fairseq, HF console dicts.

One line parser for all of them, because real logs mix them (a Megatron-DeepSpeed run prints
iteration lines *and* DeepSpeed OVERFLOW notices; an HF run with DeepSpeed prints both kinds of
progress). The rules that shape the patterns:
- Each line is cleaned as a terminal shows it (text after the last `\\r`, no ANSI codes) and
  patterns are *searched*, because tqdm bars are glued to the front of records.
- The current step is the last step a line stated (`step=`, `global_step=`, `iteration N/`,
  `steps: N`, `step:N/T`, `num_updates=`); lines with no step take it; before any step they are
  counted and skipped.
- An OVERFLOW notice carries no step: it belongs to the step in progress, so it waits for the
  next line that states a step. Each notice is an `overflow` event (attempted and new scale) and
  a point of the derived series `derived/loss_scale`.
- Fragments never produce values: every pattern needs its full context (`time (ms)` before
  timer items, `iteration N/ M |` before Megatron fields).
The parser state (current step, pending notices, line number) is kept per file between ingests,
so a growing log is read from where the last ingest stopped.
"""

from __future__ import annotations

import ast
import functools
import re
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
HF_DICT = re.compile(r"^\s*(?P<d>\{'[A-Za-z_/]+': .*\})\s*$")  # anchored: config dumps are dicts too
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
    r"|Traceback|emory|ALLOC|imeout|timed out|Flops Profiler|\{'| \| | - "
)
SNIFF = (DS_PREFIX, OVERFLOW, MEG_ITER, NANOGPT, FAIRSEQ, HF_DICT, RECOVERY, DS_PIPE, TIMER)
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


class _Parser(LineParser):
    """Per-file parser state; `feed` one line at a time."""

    def __init__(self, path: Path, ctx: ReadContext):
        super().__init__(path, ctx)
        state = ctx.state
        self.step = state.get("step")
        self.no_step = state.get("no_step", 0)
        self.pending = state.get("pending", [])  # overflow notices waiting for their step
        self.builder = PointsBuilder()
        self.events: list[dict] = []
        self.problems: list[Problem] = []
        self.config: dict = {}
        self.records = 0
        self.flops: dict | None = None
        self.last_crash: dict | None = None
        self.kinds: dict[str, int] = {}  # records parsed, by kind (kept in the file's contents)
        self.no_step_reported = self.no_step

    def state(self) -> dict:
        return {"step": self.step, "line": self.line, "no_step": self.no_step, "pending": self.pending}

    def point(self, tag: str, value: float | None, step: int | None = None) -> None:
        step = self.step if step is None else step
        if value is None:
            return
        if step is None:
            self.no_step += 1
            return
        self.builder.add(tag, step, value)

    def at_step(self, step: int) -> None:
        """A line stated the step in progress: place the notices that were waiting for it."""
        self.step = step
        for p in self.pending:
            self.events.append(event(step, None, "overflow", p["message"], p["attrs"], p["line"]))
            if p["attrs"].get("new_scale") is not None:
                self.point("derived/loss_scale", p["attrs"]["new_scale"], step)
        self.pending = []

    def place_pending_at_end(self) -> None:
        """The log is finished: notices with no later step line belong to the last step seen."""
        for p in self.pending:
            attrs = {**p["attrs"], "step_placed": "last step before the notice (no later step line came)"}
            self.events.append(event(self.step, None, "overflow", p["message"], attrs, p["line"]))
            if p["attrs"].get("new_scale") is not None and self.step is not None:
                self.point("derived/loss_scale", p["attrs"]["new_scale"], self.step)
        self.pending = []

    def end_block(self, batch: Batch, last: bool) -> None:
        if last and self.pending and is_settled(self.path):
            self.place_pending_at_end()
        batch.points = self.builder.take()
        batch.events, self.events = self.events, []
        batch.problems, self.problems = self.problems, []
        batch.config, self.config = self.config, {}
        batch.records, self.records = self.records, 0
        batch.evidence = [
            _evidence(e) for e in batch.events if e["kind"] in ("min_loss_scale", "crash", "oom")
        ]
        if self.pending:
            batch.note = f"{len(self.pending)} OVERFLOW notices wait for the next line that states a step"
        batch.counts, self.kinds = self.kinds, {}
        if self.no_step > self.no_step_reported:
            batch.counts["values_before_first_step"] = self.no_step - self.no_step_reported
            self.no_step_reported = self.no_step

    # ------------------------------------------------------------------------------------
    def feed(self, raw: str, batch: Batch) -> None:
        line = strip_line(raw)
        if not line.strip():
            return
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
            self.at_step(step)
            self.point("skipped", float(m["skipped"]))
            for i, v in enumerate(x for x in m["lr"].split(",") if x.strip()):
                self.point("lr" if i == 0 else f"lr/{i}", to_float(v))
            self.point("mom", _first_momentum(m["mom"]))
            return "ds_progress"
        if "SamplesPerSec" in line:
            if m := DS_TPUT.search(line):
                self.at_step(int(m["global_step"]))
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
            for item in TIMER_ITEM.finditer(m["body"]):
                self.point(f"time/{item['name'].strip()}", float(item["ms"]))
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
                        None,
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
                step = to_float(d.get("step"))
                for k, v in d.items():
                    if k != "step":
                        self.point(k, to_float(v), None if step is None else int(step))
                return "hf_dict"
        if " - " in line and (m := LOGURU.match(line)) and (lm := LOGURU_LOSS.search(m["msg"])):
            self.point("loss", float(lm["loss"]))
            return "loguru_loss"
        return None

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
            self.pending.append({"message": m.group(0), "attrs": attrs, "line": self.line})
            return "overflow"
        if m := OVERFLOW_FP16.search(line):
            attrs = {
                "variant": "reduce",
                "source": "fp16_optimizer",
                "attempted_scale": _num(m["scale"]),
                "new_scale": _num(m["new_scale"]),
            }
            self.pending.append({"message": m.group(0), "attrs": attrs, "line": self.line})
            return "overflow"
        if m := GRAD_OVERFLOW.search(line):
            self.events.append(
                event(int(m["iter"]), None, "overflow", m.group(0), {"variant": "grad_overflow"}, self.line)
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
                    None,
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
            self.events.append(event(step, None, "checkpoint", line.strip(), {"path": m["path"]}, self.line))
            return "checkpoint"
        if "heckpoint" in line and (m := CKPT_LOAD.search(line)):
            gs = CKPT_STEP.search(m["path"])
            step = int(next(g for g in gs.groups() if g)) if gs else None
            self.events.append(event(step, None, "resume", line.strip(), {"path": m["path"]}, self.line))
            return "checkpoint_load"
        if "loss scale already at minimum" in line and MIN_SCALE.search(line):
            self.place_pending_at_end()  # the run dies inside the step in progress
            self.events.append(event(self.step, None, "min_loss_scale", line.strip(), {}, self.line))
            return "min_loss_scale"
        if line.startswith(TRACEBACK):
            self.place_pending_at_end()
            self.last_crash = event(self.step, None, "crash", "Traceback", {}, self.line)
            self.events.append(self.last_crash)
            return "crash"
        if ("memory" in line or "Memory" in line or "ALLOC" in line) and OOM.search(line):
            self.events.append(event(self.step, None, "oom", line.strip()[:500], {}, self.line))
            return "oom"
        if ("imeout" in line or "timed out" in line) and NCCL_TIMEOUT.search(line):
            self.events.append(
                event(self.step, None, "text", line.strip()[:500], {"reason": "nccl_timeout"}, self.line)
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

    def sniff(self, path: Path, head: bytes) -> bool:
        name = path.name.lower().removesuffix(".gz")
        if not (name.endswith(TEXT_SUFFIXES) or "stdout" in name or "stderr" in name):
            return False
        text = read_head(path, SNIFF_BYTES).decode("utf-8", errors="replace")
        lines = [strip_line(line) for line in text.splitlines()]
        return any(p.search(line) for p in SNIFF for line in lines)


def _evidence(e: dict) -> Evidence:
    """How a run ended, from a min-loss-scale exit, a traceback or an out-of-memory line."""
    if e["kind"] == "min_loss_scale":
        where = "?" if e["step"] is None else e["step"]
        return Evidence(
            "diverged",
            f"loss scale hit its minimum (DeepSpeed exit) at step {where}",
            e["step"],
            "fp16_overflow",
        )
    return Evidence("crashed", f"crash in the log: {e['message']}", e["step"], e["kind"])
