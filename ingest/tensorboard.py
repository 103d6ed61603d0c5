"""TensorBoard event files (`*tfevents*`): scalars, text, hparams, restarts.

Scalars in all four encodings (simple_value; a one-element `scalars` tensor with float_val,
double_val or tensor_content), decoded in bulk by `ingest.tfevents`. Text summaries become
`text` events (`in_job_alert` under a tag `ALERT/...`: a training job's own alert), hparams
become the run's config, SessionLog START/CHECKPOINT become `resume` / `checkpoint` events.
Histograms (a legacy HistogramProto as torch, tensorboardX and TF1 write them, or TF2's
`histograms`-plugin tensor of [left, right, count] rows) become `histogram` events (the
`histograms` view), in TensorBoard's own bucket form: the legacy proto's bucket i spans
(limit[i-1], limit[i]]; its empty outer buckets are dropped and the first and last kept start
at `min` and end at `max` (its outer limits may be ±DBL_MAX), as TensorBoard's dashboards read
it. Images and audio are counted, not stored. DeepSpeed's TensorBoard monitor logs
`Train/Samples/*` against samples: those tags are put on optimizer steps with the run's
train_batch_size (see `ingest.ds_config`).

Damage is salvaged: a record whose data CRC fails is skipped by its length, a broken length
field is resynchronised on the next whole valid record, and so is a length running past the end
of the file when valid records follow it or the file has stopped growing; all are reported with
byte offsets. An incomplete last record of a growing file is an unfinished write: reading stops
before it and resumes there.

Keras' TensorBoard callback writes one fit into `log_dir/train/` and `log_dir/validation/`, the
same names (`epoch_loss`) in both: the two are one run, `log_dir`, and their tags take the folder
as a prefix (`train/epoch_loss`, `validation/epoch_loss`). Its `epoch_*` series count epochs,
its `batch_*` and `*_vs_iterations` series optimizer steps: a file holding both is reported
(`mixed_step_axes`), once, since a metric on both axes does not line up.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ingest.base import Batch, Evidence, Ingestor, Problem, ReadContext, event
from ingest.ds_config import batch_size_of
from ingest.lines import is_settled
from ingest.textlog.alerts import IN_JOB_ALERT
from workbench.store.points import Points

HISTOGRAM = "histogram"  # the event kind a histogram summary is stored as
SAMPLES_PREFIX = "Train/Samples/"  # DeepSpeed's monitor: these tags count samples, not steps
ALERT_PREFIX = "ALERT/"  # text summaries a training job writes when its own detector fires
# bounded memory: a file is decoded this many bytes at a time (a chunk each). Its buffers then
# stay under glibc's 32 MB mmap threshold and are reused, where 64 MB blocks were mapped and
# faulted in afresh each time: 20 M scalars in 6.2-7.5 s at 0.41 GB peak against 7.2-10.7 s at
# 0.80 GB, in seven alternating pairs
BLOCK_BYTES = 16 << 20
PARALLEL_MIN_RECORDS = 20_000  # below this, a second thread costs more than it saves

_SESSION_STATUS = {1: "START", 2: "STOP", 3: "CHECKPOINT"}
_HPARAMS_END_STATUS = {0: "UNKNOWN", 1: "SUCCESS", 2: "FAILURE", 3: "RUNNING"}
_END_STATUS = {"SUCCESS": "completed", "FAILURE": "crashed"}  # the run's status they are evidence of
KERAS_SPLITS = ("train", "validation")


def keras_log_dir(folder: Path) -> Path | None:
    """The `log_dir` of a Keras fit when `folder` is its `train/` or `validation/`: a folder
    whose only sub-folders with event files are `train/` and maybe `validation/` (a lone `train/`
    only with TF2's `.v2` files: other tools name a run `train` too)."""
    if folder.name not in KERAS_SPLITS:
        return None
    parent = folder.parent
    try:
        splits = {d.name: _event_files(d) for d in parent.iterdir() if d.is_dir()}
    except OSError:
        return None
    splits = {name: files for name, files in splits.items() if files}
    if "train" not in splits or not set(splits) <= set(KERAS_SPLITS):
        return None
    if "validation" in splits or any(f.endswith(".v2") for f in splits["train"]):
        return parent
    return None


def _event_files(folder: Path) -> list[str]:
    try:
        return [f.name for f in folder.iterdir() if "tfevents" in f.name and f.is_file()]
    except OSError:
        return []


class TensorBoardIngestor(Ingestor):
    name = "tensorboard"
    precedence = 30
    appendable = True
    sub_source = True

    def sniff(self, path: Path, head: bytes) -> bool:
        # TensorBoard's IsSummaryEventsFile: "tfevents" in the name, profiler placeholders excluded
        return "tfevents" in path.name and not path.name.endswith(".profile-empty")

    def __init__(self, check_crc: bool = True, threads: int | None = None):
        self.check_crc = check_crc
        self.threads = threads or min(2, os.cpu_count() or 1)

    def read(self, path: Path, start: int, ctx: ReadContext) -> Iterator[Batch]:
        """Decode `path` from byte `start` on, one Batch per block."""
        # the kernels (numba) load with the first event file read, not with the registry: an
        # ingest of JSONL, CSV or console logs never imports numba (the methods below import
        # them where they call them)
        from ingest.framing import CRC_TABLES, frame_records

        plugins = dict(ctx.plugins)
        samples = ctx.state.get("ds_samples", False)
        axes_flagged = ctx.state.get("axes_flagged", False)
        tbs = batch_size_of(ctx.run_config)[0]
        settled = is_settled(path)
        prefix = f"{path.parent.name}/" if keras_log_dir(path.parent) else ""
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            pos = start
            block = BLOCK_BYTES
            while True:
                f.seek(pos)
                data = f.read(block)
                if not data:
                    return
                at_eof = len(data) < block
                buf = np.frombuffer(data, dtype=np.uint8)
                limit = max(size, pos + len(data)) - pos
                offs, lens, end, gaps = frame_records(buf, len(buf), CRC_TABLES, limit, settled)
                if len(offs) == 0 and len(gaps) == 0 and not at_eof:
                    block *= 2  # one record larger than a block: read more
                    continue
                batch = self._decode(path, buf, pos, offs, lens, int(end), gaps, plugins, prefix)
                samples = _samples_to_steps(batch.points, tbs) or samples
                if not axes_flagged and (mixed := _mixed_step_axes(batch.points)):
                    batch.problems.append(Problem(batch.start, "mixed_step_axes", mixed))
                    axes_flagged = True
                state = {"ds_samples": samples, "axes_flagged": axes_flagged}
                batch.state = {k: True for k, v in state.items() if v} or None
                if at_eof and end < len(buf):
                    batch.note = (
                        f"incomplete last record at byte {pos + int(end)} "
                        f"({len(buf) - int(end)} bytes): an unfinished write; the next ingest resumes there"
                    )
                yield batch
                if batch.end == pos or at_eof:
                    return
                pos = batch.end
                block = BLOCK_BYTES

    def config_used(self, run_config: dict, state: dict) -> str | None:
        return str(batch_size_of(run_config)[0]) if state.get("ds_samples") else None

    def run_folder(self, folder: Path) -> Path | None:
        return keras_log_dir(folder)

    # ---------------------------------------------------------------------------------------
    def _decode(self, path, buf, base, offs, lens, end, gaps, plugins, prefix) -> Batch:
        from ingest import tfevents
        from ingest.framing import GAP_PAST_END

        batch = Batch(start=base, end=base + end, records=len(offs))
        for g0, g1, reason in gaps:
            at, skipped = base + int(g0), int(g1 - g0)
            if reason == GAP_PAST_END:
                length = int(np.frombuffer(buf[g0 : g0 + 8].tobytes(), "<u8")[0])
                kind, why = (
                    "bad_length",
                    f"record length {length:,} at byte {at} runs past the end of the file",
                )
            else:
                kind, why = "bad_length_crc", f"record length corrupt at byte {at}"
            to = "to the next valid record" if g1 < len(buf) else "to the end of what was written"
            batch.problems.append(Problem(at, kind, f"{why}; skipped {skipped} bytes {to}"))
        parts = []
        # threads decode consecutive record ranges; their outputs are merged as compact Points
        for lo, (status, what, wall, step, sess, vals, fvals) in self._decode_parallel(buf, offs, lens):
            o, ln = offs[lo : lo + len(status)], lens[lo : lo + len(status)]
            self._record_problems(batch, base, o, ln, status)
            good = status == tfevents.REC_OK
            if batch.first_wall_time is None and good.any():
                batch.first_wall_time = float(wall[np.flatnonzero(good)[0]])
            self._session_events(batch, buf, base, o, ln, what, sess, wall, step, good)
            if len(vals):
                parts.append(self._values(batch, buf, base, o, ln, wall, step, vals, fvals, plugins, prefix))
        if parts:
            batch.points = Points.concat(parts)
        return batch

    def _decode_parallel(self, buf, offs, lens) -> list:
        """[(first record index, decode_records output)] for consecutive record ranges."""
        from ingest import tfevents
        from ingest.framing import CRC_TABLES

        n = len(offs)
        if self.threads < 2 or n < PARALLEL_MIN_RECORDS:
            return [(0, tfevents.decode_records(buf, offs, lens, self.check_crc, CRC_TABLES))]
        cuts = np.linspace(0, n, self.threads + 1).astype(np.int64)
        with ThreadPoolExecutor(self.threads) as pool:
            outs = pool.map(
                lambda ab: tfevents.decode_records(
                    buf, offs[ab[0] : ab[1]], lens[ab[0] : ab[1]], self.check_crc, CRC_TABLES
                ),
                zip(cuts[:-1], cuts[1:], strict=True),
            )
            return list(zip(cuts[:-1].tolist(), outs, strict=True))

    @staticmethod
    def _record_problems(batch, base, offs, lens, status):
        from ingest import tfevents

        for i in np.flatnonzero(status == tfevents.REC_BAD_DATA_CRC):
            batch.problems.append(
                Problem(
                    base + int(offs[i]),
                    "bad_data_crc",
                    f"data CRC mismatch in the record at byte {base + int(offs[i])} "
                    f"(length {int(lens[i])}); record skipped, reading continued",
                )
            )
        for i in np.flatnonzero(status == tfevents.REC_BAD_PROTO):
            batch.problems.append(
                Problem(
                    base + int(offs[i]),
                    "bad_record",
                    f"record at byte {base + int(offs[i])} is not a decodable Event; skipped",
                )
            )

    def _session_events(self, batch, buf, base, offs, lens, what, sess, wall, step, good):
        from ingest import tfevents

        for i in np.flatnonzero(good & (what == tfevents.EV_SESSION_LOG)):
            status = _SESSION_STATUS.get(int(sess[i]))
            if status == "START" and step[i] > 0:
                batch.events.append(
                    event(
                        step[i], wall[i], "resume", "SessionLog START: writer restarted", {}, base + offs[i]
                    )
                )
            elif status == "CHECKPOINT":
                ev = _fullevent(buf, offs[i], lens[i])
                path = ev.session_log.checkpoint_path if ev else ""
                batch.events.append(
                    event(
                        step[i],
                        wall[i],
                        "checkpoint",
                        f"SessionLog CHECKPOINT {path}".strip(),
                        {"checkpoint_path": path},
                        base + offs[i],
                    )
                )
        batch.counts["graphs"] = batch.counts.get("graphs", 0) + int(
            (good & (what == tfevents.EV_GRAPH)).sum()
        )

    def _values(self, batch, buf, base, offs, lens, wall, step, vals, fvals, plugins, prefix) -> Points:
        from ingest import tfevents

        group, first, first_plugin, collided = tfevents.tag_groups(buf, vals)
        if collided:
            # a 64-bit hash collision between two tag names: group by the bytes themselves
            names_all = [
                bytes(buf[o : o + n]) for o, n in vals[:, [tfevents.VC_TAG_OFF, tfevents.VC_TAG_LEN]]
            ]
            _, first, group = np.unique(
                np.array(names_all, dtype=object), return_index=True, return_inverse=True
            )
            with_plugin = np.flatnonzero(vals[:, tfevents.VC_PLUGIN_OFF] >= 0)
            g_with, first_with = np.unique(group[with_plugin], return_index=True)
            first_plugin = np.full(len(first), -1, np.int64)
            first_plugin[g_with] = with_plugin[first_with]
        tags = [
            prefix + _utf8(buf[o : o + n])
            for o, n in zip(vals[first, tfevents.VC_TAG_OFF], vals[first, tfevents.VC_TAG_LEN], strict=True)
        ]
        # the first metadata seen for a tag decides its plugin, for the whole run
        tag_plugin = [plugins.get(t) for t in tags]
        for g in np.flatnonzero(first_plugin >= 0):
            if tag_plugin[g] is None:
                k = first_plugin[g]
                o, n = vals[k, tfevents.VC_PLUGIN_OFF], vals[k, tfevents.VC_PLUGIN_LEN]
                tag_plugin[g] = _utf8(buf[o : o + n])
                batch.plugins[tags[g]] = tag_plugin[g]
                plugins[tags[g]] = tag_plugin[g]
        plugin_class = np.array(
            [tfevents.PLUGIN_CLASS.get(p or "", tfevents.P_OTHER) for p in tag_plugin], np.int8
        )
        code, s_step, s_wall, s_value, text_rows, hparams_rows, histo_rows, counts = tfevents.split_values(
            vals, group, plugin_class, step, wall, fvals
        )
        points = Points(tags, code, s_step, s_wall, s_value)
        # non-scalar values: text and hparams are decoded in full, histograms stored as events, the
        # rest counted
        rec = vals[:, tfevents.VC_REC]
        for k in text_rows:
            i = rec[k]
            ev = _fullevent(buf, offs[i], lens[i])
            tag = tags[group[k]]
            text = _text_of(ev, tag) if ev else ""
            ev_kind = IN_JOB_ALERT if tag.startswith(ALERT_PREFIX) else "text"
            batch.events.append(event(step[i], wall[i], ev_kind, text, {"tag": tag}, base + offs[i]))
        for i in np.unique(rec[hparams_rows]):
            ev = _fullevent(buf, offs[i], lens[i])
            if ev is not None:
                hp = _hparams_of(ev)
                batch.config.update(hp)
                if hp.get("session_status") in _END_STATUS:
                    status = hp["session_status"]
                    message = f"hparams session_end_info: {status}"
                    batch.evidence.append(
                        Evidence(_END_STATUS[status], message, int(step[i]), None, float(wall[i]))
                    )
        for k in histo_rows:
            i = rec[k]
            ev = _fullevent(buf, offs[i], lens[i])
            tag = tags[group[k]]
            histo = _histogram_of(ev, tag) if ev else None
            if histo is not None:
                batch.events.append(event(step[i], wall[i], HISTOGRAM, tag, histo, base + offs[i]))
        # histograms are stored as events and counted as the other summaries are
        for name, c in zip(("histograms", "images", "audio", "other_tensors"), counts.tolist(), strict=True):
            batch.counts[name] = batch.counts.get(name, 0) + c
        return points


def _samples_to_steps(points: Points, tbs: int | None) -> bool:
    """Put DeepSpeed monitor tags (`Train/Samples/*`, x = samples) on optimizer steps, in place;
    whether the batch has any."""
    codes = [i for i, t in enumerate(points.tags) if t.startswith(SAMPLES_PREFIX)]
    if codes and tbs:
        mask = np.isin(points.tag_code, codes)
        points.step[mask] //= tbs
    return bool(codes)


def _mixed_step_axes(points: Points) -> str | None:
    """Keras' epoch-indexed series next to iteration-indexed ones (steps past the epochs), in words."""
    epochs: dict[str, int] = {}
    iterations: dict[str, int] = {}
    for code, tag in enumerate(points.tags):
        name = tag.rsplit("/", 1)[-1]
        axis = epochs if name.startswith("epoch_") else None
        if name.startswith("batch_") or name.endswith("_vs_iterations"):
            axis = iterations
        if axis is not None and len(steps := points.step[points.tag_code == code]):
            axis[tag] = int(steps.max())
    if not epochs or not iterations or max(iterations.values()) <= max(epochs.values()):
        return None
    return (
        f"mixed step axes: {', '.join(sorted(epochs))} count epochs (to {max(epochs.values())}), "
        f"{', '.join(sorted(iterations))} optimizer steps (to {max(iterations.values())}); "
        "one metric on both axes does not line up"
    )


def _utf8(b) -> str:
    return bytes(b).decode("utf-8", errors="replace")


def _fullevent(buf, off, length):
    """Full protobuf decode of one record, for the rare records the kernel only flags."""
    from tensorboard.compat.proto import event_pb2

    ev = event_pb2.Event()
    try:
        ev.ParseFromString(bytes(buf[off + 12 : off + 12 + length]))
    except Exception:  # noqa: BLE001 - the kernel already accepted its framing; be lenient
        return None
    return ev


def _text_of(ev, tag: str) -> str:
    for v in ev.summary.value:
        if v.tag == tag and v.HasField("tensor"):
            return "\n".join(s.decode("utf-8", errors="replace") for s in v.tensor.string_val)
    return ""


def _histogram_of(ev, tag: str) -> dict | None:
    """One histogram as TensorBoard's histogram plugin reads it: buckets as [left, right, count]
    (`left`, `right`, `count`), with the legacy proto's `num`, `min`, `max`, `sum` where written;
    None when the value is neither form (a tensor of another shape)."""
    for v in ev.summary.value:
        if v.tag != tag:
            continue
        if v.HasField("histo"):
            h = v.histo
            limits, counts = list(h.bucket_limit), list(h.bucket)
            filled = [i for i, c in enumerate(counts) if c > 0]
            if not filled or len(limits) != len(counts):
                left: list[float] = []
                right: list[float] = []
                counts = []
            else:  # the outer edges may be ±DBL_MAX: min and max stand for them
                first, last = filled[0], filled[-1]
                inner = limits[first:last]
                left, right, counts = [h.min, *inner], [*inner, h.max], counts[first : last + 1]
            return {
                "left": left,
                "right": right,
                "count": counts,
                "num": h.num,
                "min": h.min,
                "max": h.max,
                "sum": h.sum,
            }
        if v.HasField("tensor"):
            from tensorboard.util import tensor_util

            try:
                rows = tensor_util.make_ndarray(v.tensor).astype(np.float64)
            except (TypeError, ValueError):
                return None
            if rows.ndim != 2 or rows.shape[1] != 3:
                return None
            left, right, counts = (rows[:, j].tolist() for j in range(3))
            return {"left": left, "right": right, "count": counts, "num": float(rows[:, 2].sum())}
    return None


def _hparams_of(ev) -> dict:
    from tensorboard.plugins.hparams import plugin_data_pb2

    out: dict = {}
    for v in ev.summary.value:
        if v.metadata.plugin_data.plugin_name != "hparams":
            continue
        data = plugin_data_pb2.HParamsPluginData()
        try:
            data.ParseFromString(v.metadata.plugin_data.content)
        except Exception:  # noqa: BLE001
            continue
        if data.HasField("session_start_info"):
            hp = {}
            for k, val in data.session_start_info.hparams.items():
                which = val.WhichOneof("kind")
                hp[k] = getattr(val, which) if which else None
            out["hparams"] = hp
        elif data.HasField("session_end_info"):
            out["session_status"] = _HPARAMS_END_STATUS.get(data.session_end_info.status, "UNKNOWN")
        elif data.HasField("experiment"):
            out["hparams_metrics"] = [m.name.tag for m in data.experiment.metric_infos]
    return out
