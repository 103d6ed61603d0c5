"""DeepSpeed's console: engine progress, throughput, pipeline steps, timers, fp16 overflow
notices, the config dump, the launcher's exit and the flops profiler.

- The engine's `step=N` line is the authority: the throughput timer's own `global_step=`
  restarts at 0 when a run resumes, so throughput lines take the engine's step when the file
  has one. The `step=0` line printed at engine start describes the engine before any
  checkpoint is loaded: it is held (`TextParser.init_values`) until the next step shows
  whether a load came between.
- An OVERFLOW notice carries no step: it belongs to the step in progress, so it waits for the
  next line that states a step. Each notice is an `overflow` event (attempted and new scale)
  and a point of the derived series `derived/loss_scale`.
- Timers (`wall_clock_breakdown`): the ZeRO optimizer and micro-step timers print before the
  step they time is reported, so they wait for the next step too; the global timer line
  (`fwd | bwd | ... | step`) closes a step. At the default log level (DeepSpeed >= 0.19 prints
  no `step=` lines) the steps are counted from those global lines, and the file's note says so.
- Fragments never produce values: `time (ms)` must come before timer items.
"""

from __future__ import annotations

import ast
import functools
import re

from ingest.lines import NUM, to_float
from ingest.textlog.machine import Dialect, TextParser

PREFIX = re.compile(
    r"\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2},\d{3}\] \[(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\] \[[^:\]\s]+:\d+:[^\]\s]+\] "
)
STEP = re.compile(
    r"\bstep=(?P<step>\d+), skipped=(?P<skipped>\d+), lr=\[(?P<lr>[^\]]*)\], mom=(?P<mom>\[.*\])\s*$"
)
TPUT = re.compile(
    rf"epoch=(?P<epoch>\d+)/micro_step=(?P<micro_step>\d+)/global_step=(?P<global_step>\d+), RunningAvgSamplesPerSec=(?P<avg>{NUM}), "
    rf"CurrSamplesPerSec=(?P<cur>{NUM}), MemAllocated=(?P<mem>{NUM})GB, MaxMemAllocated=(?P<maxmem>{NUM})GB"
)
TPUT_OLD = re.compile(
    rf"(?<![\w/.])(?P<epoch>\d+)/(?P<step>\d+), (?:SamplesPerSec=(?P<sps>{NUM})|RunningAvgSamplesPerSec=(?P<avg>{NUM}), "
    rf"CurrSamplesPerSec=(?P<cur>{NUM}))(?:, MemAllocated=(?P<mem>{NUM})GB, MaxMemAllocated=(?P<maxmem>{NUM})GB)?"
)
PIPE = re.compile(
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
CONFIG_ITEM = re.compile(
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

# engine and ZeRO/fp16 optimizer timer names (wall_clock_breakdown); other tools' timers
# (Megatron's `forward-compute`, ...) print after the step they time and take its step
GLOBAL_TIMERS = {"fwd", "bwd", "bwd_inner", "bwd_allreduce", "forward", "backward", "backward_inner"}
GLOBAL_TIMERS |= {"backward_allreduce", "step"}
TIMERS = GLOBAL_TIMERS | {n + "_microstep" for n in GLOBAL_TIMERS}
TIMERS |= {
    "optimizer_allgather",
    "optimizer_gradients",
    "optimizer_step",
    "compute_norm",
    "overflow_check",
}
TIMERS |= {"unscale_and_clip", "basic_step", "update_fp16"}


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


def _is_global_timer(names: list[str]) -> bool:
    """The per-step global timers (`fwd | bwd | ... | step`); micro-step and optimizer timers
    print before the step they belong to is over."""
    return "step" in names and set(names) <= GLOBAL_TIMERS


# ---- values ----------------------------------------------------------------------------------
def values(p: TextParser, line: str) -> str | None:
    if "step=" in line and "skipped=" in line and (m := STEP.search(line)):
        return _engine_step(p, m)
    if "SamplesPerSec" in line:
        if m := TPUT.search(line):
            return _throughput(p, m)
        if m := TPUT_OLD.search(line):
            return _throughput_old(p, m)
    if line.startswith("steps: ") and (m := PIPE.match(line)):
        return _pipeline_step(p, m)
    if "time (ms)" in line and (m := TIMER.search(line)):
        return _timers(p, m)
    return None


def _engine_step(p: TextParser, m: re.Match) -> str:
    step = int(m["step"])
    found: list[tuple[str, float | None]] = [("skipped", float(m["skipped"]))]
    found += [
        ("lr" if i == 0 else f"lr/{i}", to_float(v))
        for i, v in enumerate(x for x in m["lr"].split(",") if x.strip())
    ]
    found.append(("mom", _first_momentum(m["mom"])))
    if step == 0 and not p.explicit:  # the engine-start report: step 0 unless a checkpoint loads next
        p.step, p.timer_step, p.awaiting_global = 0, 0, False
        p.init_values = [[t, v, p.wall] for t, v in found if v is not None]
        return "ds_progress"
    p.at_step(step)
    p.explicit, p.timer_step, p.awaiting_global = True, step, True
    for tag, value in found:
        p.point(tag, value)
    return "ds_progress"


def _throughput(p: TextParser, m: re.Match) -> str:
    if not p.explicit:  # its global_step restarts on resume: only without engine steps
        p.at_step(int(m["global_step"]))
        p.timer_step, p.awaiting_global = int(m["global_step"]), True
    p.point("RunningAvgSamplesPerSec", _num(m["avg"]))
    p.point("CurrSamplesPerSec", _num(m["cur"]))
    p.point("MemAllocated", _num(m["mem"]))
    p.point("MaxMemAllocated", _num(m["maxmem"]))
    return "ds_throughput"


def _throughput_old(p: TextParser, m: re.Match) -> str:
    if p.step is None:
        p.at_step(int(m["step"]))
    p.point("SamplesPerSec", _num(m["sps"] or m["avg"]))
    p.point("CurrSamplesPerSec", _num(m["cur"]))
    p.point("MemAllocated", _num(m["mem"]))
    p.point("MaxMemAllocated", _num(m["maxmem"]))
    return "ds_throughput_old"


def _pipeline_step(p: TextParser, m: re.Match) -> str:
    step = int(m["step"])
    p.at_step(step)
    p.point("loss", _num(m["loss"]))
    for k, v in re.findall(rf"(\S+): ({NUM}) ", m["extra"]):
        p.point(k, float(v))
    p.point("iter time (s)", _num(m["iter_s"]))
    p.point("samples/sec", _num(m["sps"]))
    return "ds_pipeline"


def _timers(p: TextParser, m: re.Match) -> str:
    rank = m["rank"] or "0"
    if p.timer_rank is None:
        p.timer_rank = rank
    if rank != p.timer_rank:  # every rank prints its timers: keep one rank's
        return "timer_other_rank"
    items = [(item["name"].strip(), float(item["ms"])) for item in TIMER_ITEM.finditer(m["body"])]
    if not {name for name, _ in items} <= TIMERS:
        for name, ms in items:
            p.point(f"time/{name}", ms)
        return "timer"
    p.pending_values += [[f"time/{name}", ms, p.wall] for name, ms in items]
    if _is_global_timer([name for name, _ in items]):
        if p.awaiting_global:
            step, p.awaiting_global = p.timer_step, False
            assert step is not None  # awaiting_global is set together with timer_step
        else:
            p.timer_step = step = (p.timer_step if p.timer_step is not None else 0) + 1
            p.timers_counted = not p.explicit
        p.at_step(step)
    return "timer"


# ---- notices: loss-scale overflows, which wait for their step ---------------------------------
def notice(p: TextParser, line: str) -> str | None:
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
        p.wait_for_step(m.group(0), attrs)
        return "overflow"
    if m := OVERFLOW_FP16.search(line):
        attrs = {
            "variant": "reduce",
            "source": "fp16_optimizer",
            "attempted_scale": _num(m["scale"]),
            "new_scale": _num(m["new_scale"]),
        }
        p.wait_for_step(m.group(0), attrs)
        return "overflow"
    if m := GRAD_OVERFLOW.search(line):
        p.add_event(int(m["iter"]), "overflow", m.group(0), {"variant": "grad_overflow"})
        return "overflow"
    return None


# ---- events: the config dump, the launcher's exit, the minimum loss scale, the flops profile ---
def run_event(p: TextParser, line: str) -> str | None:
    if "config.py" in line and (m := CONFIG_ITEM.search(line)):
        p.config.setdefault("deepspeed_engine", {})[m["key"]] = int(m["val"])
        return "ds_config_dump"
    if "exits successfully" in line and LAUNCHER_EXIT.search(line):
        p.add_event(p.step, "finished", line.strip()[:500])
        return "launcher_exit"
    if "loss scale already at minimum" in line and MIN_SCALE.search(line):
        p.place_pending_at_end()  # the run dies inside the step in progress
        p.add_event(p.step, "min_loss_scale", line.strip())
        return "min_loss_scale"
    if "Flops Profiler" in line and FLOPS_HEADER.match(line):
        p.flops = {"_lines": 0}
        return "flops_profile"
    return None


def flops_line(p: TextParser, line: str) -> bool:
    """A line of the flops profile summary opened by its header (kept in the run's config)."""
    if p.flops is None:
        return False
    p.flops["_lines"] += 1
    if FLOPS_END in line or p.flops["_lines"] > FLOPS_MAX_LINES:
        p.flops.pop("_lines")
        p.config["flops_profile"] = p.flops
        p.flops = None
        return True
    if m := FLOPS_STEP.search(line):
        p.flops["step"] = int(m["step"])
        return True
    if m := FLOPS_KV.match(line.strip()):
        key = m["key"].split("=")[0].strip()
        unit = m["unit"]
        # "10.43 MMACs" is mega-MACs, "21.16 M" mega, "34.09 us" micro-seconds; "MACs" has no prefix
        scaled = unit[:1] in UNIT_PREFIX and unit[1:] in UNIT_BASES and unit not in UNIT_BASES
        p.flops[key] = float(m["val"]) * (UNIT_PREFIX[unit[0]] if scaled else 1.0)
        p.flops[key + " (unit)"] = unit[1:] if scaled else unit
        return True
    return False


DIALECT = Dialect(
    "deepspeed",
    sniff=(PREFIX, OVERFLOW, PIPE, TIMER),
    triggers=(
        "step",
        "SamplesPerSec",
        r"time \(ms\)",
        "verflow",
        "OVERFLOW",
        "minimum",
        "Flops Profiler",
        r"config\.py",
        "exits successfully",
    ),
    values=values,
    notice=notice,
    event=run_event,
    block=flops_line,
)
