"""Writing synthetic runs straight into a store (benchmarks only: real ingest is timed elsewhere)."""

from __future__ import annotations

from workbench.store.points import Points


def write_run(w, run_id: str, points: Points) -> None:
    """One run as one chunk, with the manifest row a real ingest would have written."""
    path = f"/bench/{run_id}"
    w.add_chunk(run_id, path, "tensorboard", 0, 1, points)
    w.set_file(
        {
            "path": path,
            "run_id": run_id,
            "format": "tensorboard",
            "status": "ok",
            "size": 1,
            "mtime_ns": 0,
            "consumed": 1,
            "content_sig": "",
            "first_wall_time": 1.7e9,
            "records": len(points),
            "points": len(points),
            "problems": 0,
            "note": None,
            "contents": None,
            "state": None,
            "ingested_at": 0.0,
        }
    )
