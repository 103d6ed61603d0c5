"""Writes the event files in this folder with real writers (run once; the files are committed):

    pip install torch==2.13.0 tensorboard && python tests/data/histograms/make_histograms.py

- `torch_run/`: torch 2.13's `SummaryWriter.add_histogram` (a legacy HistogramProto: TensorFlow's
  default exponential bucket limits, empty edge buckets trimmed) for two layers every 10 steps,
  one of them written with `bins="auto"` (numpy's bins), beside a scalar loss;
- `tb_v2_run/`: tensorboard's own TF-free `histogram_pb` (the TF2 `histograms`-plugin tensor of
  [left, right, count] rows, as `tf.summary.histogram` writes it), one tag with 20 buckets and
  one whose values are all equal (one bucket of no width).
"""

from pathlib import Path

import numpy as np

HERE = Path(__file__).parent


def torch_run() -> None:
    from torch.utils.tensorboard import SummaryWriter

    rng = np.random.default_rng(0)
    w = SummaryWriter(str(HERE / "torch_run"))
    for step in range(0, 100, 10):
        w.add_scalar("train/loss", 2.0 / (step + 1), step)
        w.add_histogram("weights/layer_0", rng.normal(0.0, 1.0 + step / 50, 2000), step)
        w.add_histogram("grads/layer_1", rng.standard_t(3, 500) * 0.01, step, bins="auto")
    w.close()


def tb_v2_run() -> None:
    from tensorboard.compat.proto import event_pb2
    from tensorboard.plugins.histogram import summary_v2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    rng = np.random.default_rng(1)
    w = EventFileWriter(str(HERE / "tb_v2_run"))
    for step in range(8):
        for summary in (
            summary_v2.histogram_pb("activations/layer_0", rng.normal(step, 1.0, 300), buckets=20),
            summary_v2.histogram_pb("constant", np.full(50, 0.5)),
        ):
            w.add_event(event_pb2.Event(step=step, wall_time=1_700_000_000.0 + step, summary=summary))
    w.close()


if __name__ == "__main__":
    torch_run()
    tb_v2_run()
