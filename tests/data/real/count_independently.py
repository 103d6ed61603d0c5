"""Independent counts of the real logs under tests/data/real/, written to expected_counts.json.

Plain python only (json, csv, gzip, re, and tbparse for TensorBoard files): never the
workbench. For each file: per tag (the key as the file writes it), the number of points and a
few spot values (step -> value). `_how` says which lines or records were counted. The reader
tests compare the workbench's stored points with these numbers.

Run from the repository root:  python tests/data/real/count_independently.py
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import re
from pathlib import Path

REAL = Path(__file__).resolve().parent
ROOT = REAL.parents[2]
NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|nan|inf|-inf"


def num(s: str) -> float:
    return float(s.replace(",", ""))


def summarise(series: dict[str, dict[int, float]], how: str, spots: int = 3, lines: dict | None = None) -> dict:
    """{tag: {points, first_step, last_step, spot}} from {tag: {step: value}} (last write wins)."""
    out: dict = {"_how": how}
    for tag, pts in sorted(series.items()):
        steps = sorted(pts)
        picks = sorted({steps[0], steps[len(steps) // 2], steps[-1]}) if spots else []
        entry = {
            "points": len(steps),
            "first_step": steps[0],
            "last_step": steps[-1],
            "spot": {str(s): _jsonable(pts[s]) for s in picks},
        }
        if lines and tag in lines and lines[tag] != len(steps):
            entry["lines"] = lines[tag]  # logged more often than it has steps (ranks printing the same line)
        out[tag] = entry
    return out


def _jsonable(v: float):
    return v if math.isfinite(v) else str(v)


def text(path: Path) -> str:
    data = path.read_bytes()
    if path.name.endswith(".gz"):
        data = gzip.decompress(data)
    return data.decode("utf-8", errors="replace")


def add(series: dict, tag: str, step: int, value: float, lines: dict | None = None) -> None:
    series.setdefault(tag, {})[step] = value
    if lines is not None:
        lines[tag] = lines.get(tag, 0) + 1


# ---- one small counter per format ----------------------------------------------------------
def nanogpt(path: Path) -> dict:
    s: dict = {}
    for line in text(path).splitlines():
        if m := re.match(rf"iter (\d+): loss ({NUM}), time ({NUM})ms(?:, mfu ({NUM})%)?$", line):
            add(s, "loss", int(m[1]), float(m[2]))
            add(s, "time_ms", int(m[1]), float(m[3]))
            if m[4] is not None:
                add(s, "mfu", int(m[1]), float(m[4]))
        elif m := re.match(rf"step (\d+): train loss ({NUM}), val loss ({NUM})$", line):
            add(s, "train_loss", int(m[1]), float(m[2]))
            add(s, "val_loss", int(m[1]), float(m[3]))
    return summarise(s, "nanoGPT `iter N: loss X, time Yms[, mfu Z%]` and `step N: train loss X, val loss Y` lines")


def llama2c(path: Path) -> dict:
    s: dict = {}
    for line in text(path).splitlines():
        if m := re.match(rf"(\d+) \| loss ({NUM}) \| lr ({NUM}) \| ({NUM})ms \| mfu ({NUM})%$", line):
            step = int(m[1])
            for tag, v in zip(("loss", "lr", "time_ms", "mfu"), m.groups()[1:], strict=True):
                add(s, tag, step, float(v))
        elif m := re.match(rf"step (\d+): train loss ({NUM}), val loss ({NUM})$", line):
            add(s, "train_loss", int(m[1]), float(m[2]))
            add(s, "val_loss", int(m[1]), float(m[3]))
    return summarise(s, "llama2.c `N | loss X | lr Y | Tms | mfu Z%` and `step N: train loss X, val loss Y` lines")


def llmc(path: Path) -> dict:
    s: dict = {}
    for line in text(path).splitlines():
        if m := re.match(rf"s:(\d+) (trl|tel|eval):({NUM})(?: lr:({NUM}) norm:({NUM}))?$", line):
            step = int(m[1])
            add(s, m[2], step, float(m[3]))
            if m[4] is not None:
                add(s, "lr", step, float(m[4]))
                add(s, "norm", step, float(m[5]))
    return summarise(s, "llm.c main.log `s:N trl:X [lr:Y norm:Z]`, `s:N tel:X`, `s:N eval:X` lines")


def torchtitan(path: Path) -> dict:
    s: dict = {}
    lines: dict = {}
    pat = re.compile(
        rf"step:\s*(\d+)\s+loss:\s*({NUM})(?:\s+grad_norm:\s*({NUM}))?\s+memory:\s*({NUM})GiB\(({NUM})%\)"
        rf"\s+tps:\s*([\d,]+)\s+tflops:\s*({NUM})\s+mfu:\s*({NUM})%"
    )
    for line in text(path).splitlines():
        if m := pat.search(line):
            step = int(m[1])
            fields = ("loss", "grad_norm", "memory_gib", "memory_pct", "tps", "tflops", "mfu")
            for tag, v in zip(fields, m.groups()[1:], strict=True):
                if v is not None:
                    add(s, tag, step, num(v), lines)
    return summarise(s, "torchtitan `step: N  loss: X [grad_norm: G]  memory: M GiB(P%)  tps: T  tflops: F  mfu: U%` lines", lines=lines)


def olmo(path: Path) -> dict:
    s: dict = {}
    step = None
    for line in text(path).splitlines():
        if m := re.search(r"\[step=(\d+)/\d+", line):
            step = int(m[1])
        elif step is not None and (m := re.match(rf"\s+([\w/ ()]+?)=({NUM}|[\d,]+(?:\.\d+)?)$", line)):
            add(s, m[1].strip(), step, num(m[2]))
    return summarise(s, "OLMo `[step=N/M...]` headers, then the indented `name=value` lines under each")


def fairseq(path: Path) -> dict:
    s: dict = {}
    last = None  # the step of the last line that had one

    def step_of(kv: dict, fallback):
        nonlocal last
        if "num_updates" in kv:
            last = int(kv["num_updates"])
        elif fallback is not None:
            last = fallback
        return last

    for line in text(path).splitlines():
        if "valid on" in line and "|" in line.split("subset", 1)[-1]:
            cells = [c.strip() for c in line.split("subset", 1)[1].split("|")[1:]]
            kv = dict(c.rsplit(" ", 1) for c in cells if " " in c)
            step = step_of(kv, None)
            for k, v in kv.items():
                if step is not None and k != "num_updates" and re.fullmatch(NUM, v):
                    add(s, f"valid/{k}", step, float(v))
        elif m := re.match(r"\| epoch (\d+) \| (.*)$", line):
            cells = [c.strip() for c in m[2].split("|")]
            kv = {}
            for c in cells:
                k, _, v = c.rpartition(" ")
                kv[k.strip()] = v.rstrip("%")
            step = step_of(kv, None)
            for k, v in kv.items():
                if step is not None and k and k != "num_updates" and re.fullmatch(NUM, v):
                    add(s, f"epoch/{k}", step, float(v))
        elif m := re.match(r"\| epoch (\d+):?\s+(\d+) / (\d+) (.*)$", line):
            kv = dict(p.strip().split("=", 1) for p in m[4].split(", ") if "=" in p)
            step = step_of(kv, (int(m[1]) - 1) * int(m[3]) + int(m[2]))
            for k, v in kv.items():
                v = v.split(" ")[0].rstrip("%")
                if k != "num_updates" and re.fullmatch(NUM, v):
                    add(s, f"inner/{k}", step, float(v))
    return summarise(
        s,
        "pre-2020 fairseq progress: `| epoch E | k v | ...` (epoch/), `| epoch E[:] i / n k=v, ...` (inner/), "
        "`| epoch E | valid on 'valid' subset | k v | ...` (valid/); step = num_updates, else (E-1)*n + i on "
        "inner lines, else the step of the last line before (none: not counted)",
    )


def mlperf(path: Path) -> dict:
    events = []
    for line in text(path).splitlines():
        if ":::MLLOG " in line:
            events.append(json.loads(line.split(":::MLLOG ", 1)[1]))
    s: dict = {}
    for key in ("eval_accuracy", "train_loss", "tracked_stats"):
        evs = [e for e in events if e["key"] == key]
        axis = ("step", "samples_count", "step_num", "epoch_num")
        pos = [next((e["metadata"][a] for a in axis if a in (e.get("metadata") or {})), None) for e in evs]
        if None in pos or any(b <= a for a, b in zip(pos, pos[1:], strict=False)):
            pos = list(range(1, len(evs) + 1))  # the position does not advance: logged order
        for e, step in zip(evs, pos, strict=True):
            values = e["value"] if isinstance(e["value"], dict) else {"": e["value"]}
            for k, v in values.items():
                add(s, f"{key}/{k}" if k else key, step, float(v))
    out = summarise(
        s,
        "`:::MLLOG {json}` events of eval_accuracy, train_loss, tracked_stats; step = metadata step / "
        "samples_count / step_num / epoch_num, or 1, 2, ... in logged order when that does not advance",
    )
    for key in ("eval_accuracy",):
        evs = [e for e in events if e["key"] == key]
        out.setdefault("_records", {})[key] = len(evs)  # records, whatever their step
    stop = [e for e in events if e["key"] == "run_stop"]
    out["_run_stop_status"] = (stop[-1].get("metadata") or {}).get("status") if stop else None
    return out


def jsonl(path: Path, step_key: str | None = None) -> dict:
    s: dict = {}
    for line in text(path).splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        key = step_key or next(k for k in ("step", "current_steps") if k in rec)
        step = int(rec[key])
        for k, v in rec.items():
            if k != key and isinstance(v, int | float) and not isinstance(v, bool):
                add(s, k, step, float(v))
    return summarise(s, f"JSON Lines, step = `{step_key or 'step'}`")


def hf_state(path: Path) -> dict:
    state = json.loads(text(path))
    s: dict = {}
    for e in state["log_history"]:
        for k, v in e.items():
            if k not in ("step", "epoch") and isinstance(v, int | float):
                add(s, k, int(e["step"]), float(v))
    out = summarise(s, "trainer_state.json log_history, every entry (final summary included), step = `step`")
    out["_entries"] = len(state["log_history"])
    out["_global_step"], out["_max_steps"] = state.get("global_step"), state.get("max_steps")
    return out


def csv_log(path: Path, step_col: str) -> dict:
    s: dict = {}
    rows = list(csv.DictReader(io.StringIO(text(path))))
    for r in rows:
        step = int(float(r[step_col]))
        for k, v in r.items():
            if k != step_col and v not in ("", None):
                add(s, k, step, float(v))
    return summarise(s, f"CSV rows, step = `{step_col}`")


def tensorboard(folder: Path) -> dict:
    from tbparse import SummaryReader

    reader = SummaryReader(str(folder), pivot=False, extra_columns={"dir_name"})
    out: dict = {
        "_how": "tbparse SummaryReader scalars and 0-d numeric tensors (TF2 tf.summary.scalar), "
        "per sub-folder (dir_name) and tag"
    }
    for df in (reader.scalars, reader.tensors):
        if not len(df):
            continue
        for (d, tag), g in df.groupby(["dir_name", "tag"]):
            try:
                values = [float(v) for v in g["value"]]
            except (TypeError, ValueError):  # a string tensor (the Keras model config)
                continue
            pts = dict(zip(g["step"].astype(int), values, strict=True))
            out[f"{d}/{tag}" if d else tag] = summarise({tag: pts}, "")[tag]
    return out


def lfs_pointer(path: Path) -> dict:
    lines = path.read_text().splitlines()
    assert lines[0] == "version https://git-lfs.github.com/spec/v1"
    fields = dict(line.split(" ", 1) for line in lines[1:])
    return {"_how": "a Git LFS pointer file (no event data)", "_lfs": fields}


def checkpoints(folder: Path) -> dict:
    """Each checkpoint's metadata sha256 against the sha256 of the file and of its archive copy."""
    import hashlib
    import subprocess

    out: dict = {"_how": "sha256 of ckpt_N.pt, of the ckpt_N.pt inside ckpt_N.tar.zst, and ckpt_N.json's sha256"}
    for meta_path in sorted(folder.glob("ckpt_*.json")):
        meta = json.loads(meta_path.read_text())
        pt = meta_path.with_suffix(".pt")
        archived = subprocess.run(
            ["tar", "--zstd", "-xOf", str(meta_path.with_suffix(".tar.zst")), pt.name], capture_output=True, check=True
        ).stdout
        out[meta_path.stem] = {
            "step": meta["step"],
            "metadata_sha256": meta["sha256"],
            "file_sha256": hashlib.sha256(pt.read_bytes()).hexdigest(),
            "archive_sha256": hashlib.sha256(archived).hexdigest(),
        }
    return out


def keras_csv(path: Path) -> dict:
    """Keras CSVLogger with append=True: each fit restarts its epoch at 0; the run's step is the
    number of epochs trained before the row (the fits follow each other)."""
    rows = list(csv.DictReader(io.StringIO(text(path))))
    s: dict = {}
    for i, r in enumerate(rows):
        assert int(r["epoch"]) == 0 or int(r["epoch"]) == int(rows[i - 1]["epoch"]) + 1
        for k, v in r.items():
            if v != "":
                add(s, k, i, float(v))
    return summarise(s, "Keras CSVLogger rows; step = epochs trained before the row (fits restart at epoch 0)")


def plain_lines(path: Path, sep: str) -> dict:
    """`step 120 | loss 2.3 | ...` (sep '|'), `step: 120 loss: 2.3 ...` (':'), `step=120 loss=2.3` ('=')."""
    s: dict = {}
    for line in text(path).splitlines():
        if sep == "|":
            cells = [c.strip().split(" ", 1) for c in line.split("|")]
            if not line.startswith("step ") or any(len(c) != 2 for c in cells):
                continue
            kv = dict(cells)
        else:
            kv = dict(re.findall(rf"(\w+){re.escape(sep)}\s*({NUM})", line))
            if "step" not in kv:
                continue
        step = int(kv.pop("step"))
        for k, v in kv.items():
            add(s, k, step, float(v))
    return summarise(s, f"progress lines `step{sep}N key{sep}value ...`")


def deepspeed_console(path: Path) -> dict:
    """DeepSpeed's `step=N, skipped=K, lr=[...]` lines, and its checkpoint loads."""
    s: dict = {}
    loads = []
    for i, line in enumerate(text(path).splitlines(), 1):
        if m := re.search(r"\] step=(\d+), skipped=(\d+), lr=\[([^\]]+)\]", line):
            add(s, "skipped", int(m[1]), float(m[2]))
            add(s, "lr", int(m[1]), float(m[3].split(",")[0]))
        elif m := re.search(r"Begin Load checkpoint from \S*global_step(\d+)/(\S+)\.\.\.", line):
            loads.append({"line": i, "step": int(m[1]), "file": m[2]})
    out = summarise(s, "DeepSpeed `step=N, skipped=K, lr=[x]` lines; `Begin Load checkpoint from .../global_stepN/FILE...` lines")
    out["_checkpoint_loads"] = loads
    return out


def wandb_logged(path: Path) -> dict:
    """What the training loop passed to wandb.log (its own record), for the run's .wandb history."""
    return jsonl(path, "step") | {"_how": "the loop's own record of each wandb.log call (step = `step`)"}


# ---- what is counted -------------------------------------------------------------------
def counts() -> dict:
    out: dict = {}

    def put(rel: str, result: dict) -> None:
        out[f"tests/data/real/{rel}"] = result

    for f in sorted((REAL / "nanogpt_console").glob("*.log")):
        put(f"nanogpt_console/{f.name}", nanogpt(f))
    for f in sorted((REAL / "llama2c_console").glob("*.log")):
        put(f"llama2c_console/{f.name}", llama2c(f))
    for f in sorted((REAL / "llmc_main_log").glob("*.log")):
        put(f"llmc_main_log/{f.name}", llmc(f))
    for f in sorted((REAL / "torchtitan").glob("*.log")):
        put(f"torchtitan/{f.name}", torchtitan(f))
    for f in sorted((REAL / "olmo_console").glob("*.log")):
        put(f"olmo_console/{f.name}", olmo(f))
    for f in sorted((REAL / "fairseq_progress").glob("*.log")):
        put(f"fairseq_progress/{f.name}", fairseq(f))
    for f in sorted((REAL / "mlperf").glob("*.txt")):
        put(f"mlperf/{f.name}", mlperf(f))
    for f in sorted((REAL / "wandb_offline").glob("*/*.logged.jsonl")):
        put(f"wandb_offline/{f.parent.name}/{f.name}", wandb_logged(f))
    d03 = REAL / "defects/d03_gz"
    for f in sorted((d03 / "hf_whisper").glob("*.gz")):
        if f.name.startswith("trainer_state"):
            put(f"defects/d03_gz/hf_whisper/{f.name}", hf_state(f))
    put("defects/d03_gz/lightning_version_0/metrics.csv.gz", csv_log(d03 / "lightning_version_0/metrics.csv.gz", "step"))
    put("defects/d03_gz/keras_csvlogger/training.log.gz", keras_csv(d03 / "keras_csvlogger/training.log.gz"))
    put("defects/d07_llamafactory_throughput/trainer_log.jsonl", jsonl(REAL / "defects/d07_llamafactory_throughput/trainer_log.jsonl", "current_steps"))
    for name in ("d05_keras_tb_validation", "d10_keras_mixed_axes"):
        put(f"defects/{name}/logs", tensorboard(REAL / "defects" / name / "logs"))
    d01 = REAL / "defects/d01_checkpoints_output_dir/checkpoints"
    put("defects/d01_checkpoints_output_dir/checkpoints/trainer_state.json", hf_state(d01 / "trainer_state.json"))
    put("defects/d01_checkpoints_output_dir/checkpoints/runs", tensorboard(d01 / "runs"))
    for where in ("checkpoint-40", "hub_repo_root"):
        rel = f"defects/d06_checkpoint_alone/{where}/trainer_state.json"
        put(rel, hf_state(REAL / rel))
    for name in ("only_final_train_loss", "trl_sft_last_entry"):
        put(f"defects/d08_final_entry/{name}/trainer_state.json", hf_state(REAL / f"defects/d08_final_entry/{name}/trainer_state.json"))
    for f in sorted((REAL / "defects/d09_lfs_pointer/runs").glob("*/events.out.tfevents.*")):
        put(f"defects/d09_lfs_pointer/runs/{f.parent.name}/{f.name}", lfs_pointer(f))
    put("defects/d09_lfs_pointer/trainer_state.json", hf_state(REAL / "defects/d09_lfs_pointer/trainer_state.json"))
    d16 = REAL / "defects/d16_checkpoint_sha_mismatch"
    put("defects/d16_checkpoint_sha_mismatch/checkpoints", checkpoints(d16 / "checkpoints"))
    put("defects/d16_checkpoint_sha_mismatch/metrics.jsonl", jsonl(d16 / "metrics.jsonl"))
    d11 = REAL / "defects/d11_deepspeed_resume_after_ckpt150"
    for name in ("stdout.log", "resume.stdout.log"):
        put(f"defects/d11_deepspeed_resume_after_ckpt150/{name}", deepspeed_console(d11 / name))
    custom = REAL / "custom_names"
    for key in ("it", "iter", "iteration", "global_step", "_step", "trainer/global_step", "batch"):
        folder = f"jsonl_{key.replace('/', '_')}"
        put(f"custom_names/{folder}/metrics.jsonl", jsonl(custom / folder / "metrics.jsonl", key))
    put("custom_names/tb_tutorial_names", tensorboard(custom / "tb_tutorial_names"))
    for name in ("slm_training", "dreamer_fetch_reach"):
        put(f"public_jsonl/{name}/metrics.jsonl", jsonl(REAL / "public_jsonl" / name / "metrics.jsonl"))
    for style, sep in (("pipes", "|"), ("colon", ":"), ("equals", "=")):
        put(f"custom_names/console_{style}/stdout.log", plain_lines(custom / f"console_{style}/stdout.log", sep))
    return out


if __name__ == "__main__":
    result = counts()
    (REAL / "expected_counts.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(f"{len(result)} files counted -> {REAL / 'expected_counts.json'}")
