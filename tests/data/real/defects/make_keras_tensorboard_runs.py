"""Keras 3 (TensorFlow backend, CPU) fits logged by the TensorBoard callback, for issue #24's
defects 5 and 10: one `fit` writes `logs/train/` and `logs/validation/` event files.

- `d05_keras_tb_validation/`: `TensorBoard(update_freq="epoch")`: `epoch_loss` in both
  folders, the validation one being the validation loss.
- `d10_keras_mixed_axes/`: `TensorBoard(update_freq=5)`: `train/` holds `batch_*` tags at the
  optimizer step next to `epoch_*` tags at the epoch; `validation/` holds
  `evaluation_*_vs_iterations` at the step next to `epoch_*` at the epoch.

Run: OMP_NUM_THREADS=1 KERAS_BACKEND=tensorflow python make_keras_tensorboard_runs.py OUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

import keras
import numpy as np


def fit(logdir: Path, update_freq) -> None:
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(640, 8)).astype("float32")
    y = (x[:, :4].sum(axis=1) > 0).astype("int32")
    xv = rng.normal(size=(128, 8)).astype("float32")
    yv = (xv[:, :4].sum(axis=1) > 0).astype("int32")
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)])
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    model.fit(
        x,
        y,
        batch_size=32,
        epochs=6,
        validation_data=(xv, yv),
        verbose=2,
        callbacks=[keras.callbacks.TensorBoard(log_dir=str(logdir), update_freq=update_freq, profile_batch=0)],
    )


def main(out: Path) -> None:
    fit(out / "d05_keras_tb_validation" / "logs", "epoch")
    fit(out / "d10_keras_mixed_axes" / "logs", 5)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
