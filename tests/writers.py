"""Event files written by real writers (tensorboardX, tensorboard's TF-free writer)."""

from __future__ import annotations

import struct
from pathlib import Path

from tensorboardX import SummaryWriter
from tensorboardX.proto import summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2


def tbx_scalars(logdir: Path, series: dict[str, list[tuple[int, float]]], **kw) -> Path:
    """Write scalars with tensorboardX (encoding A, simple_value); returns the event file."""
    w = SummaryWriter(str(logdir), **kw)
    for tag, points in series.items():
        for step, value in points:
            w.add_scalar(tag, value, step, walltime=1_700_000_000 + step)
    w.close()
    return sorted(Path(logdir).glob("events.out.tfevents.*"))[-1]


def scalar_tensor_summary(tag: str, dtype: str, value: float, *, content: bool) -> summary_pb2.Summary:
    """A `scalars`-plugin tensor Summary as TF2 (tensor_content) or torch new_style writes it."""
    meta = summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars")
    )
    shape = tensor_shape_pb2.TensorShapeProto()
    if dtype == "float":
        t = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, tensor_shape=shape)
        if content:
            t.tensor_content = struct.pack("<f", value)
        else:
            t.float_val.append(value)
    elif dtype == "double":
        t = tensor_pb2.TensorProto(dtype=types_pb2.DT_DOUBLE, tensor_shape=shape)
        if content:
            t.tensor_content = struct.pack("<d", value)
        else:
            t.double_val.append(value)
    elif dtype == "half":
        import numpy as np

        bits = int(np.array([value], np.float16).view(np.uint16)[0])
        t = tensor_pb2.TensorProto(dtype=types_pb2.DT_HALF, tensor_shape=shape)
        t.half_val.append(bits)
    elif dtype == "int64":
        t = tensor_pb2.TensorProto(dtype=types_pb2.DT_INT64, tensor_shape=shape)
        if content:
            t.tensor_content = struct.pack("<q", int(value))
        else:
            t.int64_val.append(int(value))
    else:
        raise ValueError(dtype)
    return summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, metadata=meta, tensor=t)])


def tbx_summaries(logdir: Path, summaries: list[tuple[int, summary_pb2.Summary]]) -> Path:
    """Write Summary protos through tensorboardX's real event-file writer."""
    w = SummaryWriter(str(logdir))
    fw = w._get_file_writer()
    for step, s in summaries:
        fw.add_summary(s, step, walltime=1_700_000_000 + step)
    w.close()
    return sorted(Path(logdir).glob("events.out.tfevents.*"))[-1]


def tb_native_scalars(logdir: Path, tag: str, points: list[tuple[int, float]]) -> Path:
    """Write with tensorboard's TF-free writer (encoding C: float_val tensors)."""
    from tensorboard.summary import Writer

    w = Writer(str(logdir))
    for step, value in points:
        w.add_scalar(tag, value, step)
    w.close()
    return sorted(Path(logdir).glob("events.out.tfevents.*"))[-1]
