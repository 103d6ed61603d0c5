"""The TensorBoard kernels' bookkeeping: values grouped by tag in one pass, and room for a
record with many values (the kernels take no reference counts, so they grow in steps)."""

from __future__ import annotations

import numpy as np
from conftest import ingest_paths
from hypothesis import given, settings
from hypothesis import strategies as st
from tensorboardX.proto import summary_pb2
from writers import tbx_summaries

from ingest import tfevents
from ingest.framing import CRC_TABLES, GAP_BAD_LENGTH_CRC, frame_records, masked_crc32c
from workbench.store import Store


def _values(names: list[bytes], hash_of: list[int], rows: list[tuple[int, bool]]):
    """A buffer holding the names and a `vals` matrix of values naming them: (name index, has
    plugin metadata) per row."""
    buf = np.frombuffer(b"".join(names) + b"\0", np.uint8)
    at = np.cumsum([0, *map(len, names)])
    vals = np.zeros((len(rows), tfevents.N_VCOLS), np.int64)
    for r, (i, meta) in enumerate(rows):
        vals[r, tfevents.VC_TAG_OFF], vals[r, tfevents.VC_TAG_LEN] = at[i], len(names[i])
        vals[r, tfevents.VC_TAG_HASH] = hash_of[i]
        vals[r, tfevents.VC_PLUGIN_OFF] = 0 if meta else -1
    return buf, vals


@settings(deadline=None, max_examples=200)
@given(
    n_names=st.integers(1, 120),
    data=st.data(),
)
def test_tag_groups_number_groups_as_np_unique_does(n_names, data):
    """Past 16 and 32 tags the kernel's arrays and table grow; the answer is np.unique's."""
    names = [f"tag/{i}".encode() for i in range(n_names)]
    # hashes from a small range collide now and then: different names, one hash
    hash_of = data.draw(
        st.lists(st.integers(-(2**63), 2**63 - 1) | st.integers(0, 40), min_size=n_names, max_size=n_names)
    )
    rows = data.draw(st.lists(st.tuples(st.integers(0, n_names - 1), st.booleans()), max_size=400))
    buf, vals = _values(names, hash_of, rows)
    group, first, first_plugin, collided = tfevents.tag_groups(buf, vals)
    used = sorted({i for i, _ in rows})
    assert collided == (len({hash_of[i] for i in used}) < len(used))
    _, want_first, want_group = np.unique(
        vals[:, tfevents.VC_TAG_HASH], return_index=True, return_inverse=True
    )
    assert group.tolist() == want_group.ravel().tolist()
    assert first.tolist() == want_first.tolist()
    for g in range(len(first)):
        with_meta = [r for r in range(len(rows)) if group[r] == g and rows[r][1]]
        assert first_plugin[g] == (with_meta[0] if with_meta else -1)


def _summary(tags: list[str], step: int) -> summary_pb2.Summary:
    return summary_pb2.Summary(
        value=[summary_pb2.Summary.Value(tag=t, simple_value=step + k / 1000) for k, t in enumerate(tags)]
    )


def test_a_record_of_many_values_keeps_them_all(tmp_path):
    """One Event with 300 values, then one with 3: the value arrays outgrow their first size
    inside a record, which is decoded again with room."""
    wide = [f"layer{k:03d}/grad_norm" for k in range(300)]
    tbx_summaries(tmp_path / "run", [(1, _summary(wide, 1)), (2, _summary(wide[:3], 2))])
    store = Store(tmp_path / "store")
    ingest_paths(store, tmp_path / "run")
    got = store.query("SELECT tag, step, value FROM scalars_all ORDER BY step, tag").rows()
    want = sorted((t, 1, np.float32(1 + k / 1000).item()) for k, t in enumerate(wide))
    want += sorted((t, 2, np.float32(2 + k / 1000).item()) for k, t in enumerate(wide[:3]))
    assert got == want


def test_a_hash_collision_groups_by_the_names(tmp_path, monkeypatch):
    """When two names share a hash, values are grouped by their bytes: the same points."""
    tags = ["loss", "lr", "grad_norm"]
    tbx_summaries(tmp_path / "run", [(s, _summary(tags, s)) for s in range(1, 6)])
    query = "SELECT tag, step, value FROM scalars_all ORDER BY tag, step"
    plain = Store(tmp_path / "plain")
    ingest_paths(plain, tmp_path / "run")
    grouped = tfevents.tag_groups
    calls = []

    def collided(buf, vals):
        calls.append(len(vals))
        group, first, first_plugin, _ = grouped(buf, vals)
        return np.zeros_like(group), first[:1], first_plugin[:1], True  # as if every hash were one

    monkeypatch.setattr(tfevents, "tag_groups", collided)
    fallback = Store(tmp_path / "fallback")
    ingest_paths(fallback, tmp_path / "run")
    assert calls == [15]
    assert fallback.query(query).rows() == plain.query(query).rows()
    assert len(plain.query(query).rows()) == 15


def _record(payload: bytes) -> bytes:
    """One TFRecord: length, its masked CRC, the payload, the payload's masked CRC."""
    head = np.frombuffer(len(payload).to_bytes(8, "little"), np.uint8)
    body = np.frombuffer(payload, np.uint8)
    return (
        head.tobytes()
        + int(masked_crc32c(head, 0, 8, CRC_TABLES)).to_bytes(4, "little")
        + payload
        + int(masked_crc32c(body, 0, len(body), CRC_TABLES)).to_bytes(4, "little")
    )


def test_framing_outgrows_its_first_room_for_records_and_gaps():
    """Records of 16 bytes (an empty payload) outnumber the room first made for them (a record
    per 32 bytes), and 40 damaged stretches outnumber the 16 gaps first made room for."""
    tiny = [_record(b"") for _ in range(300)]
    data = b"".join(tiny) + b"".join(b"\xff" * 5 + _record(b"x" * 20) for _ in range(40))
    buf = np.frombuffer(data, np.uint8)
    offs, lens, end, gaps = frame_records(buf, len(buf), CRC_TABLES, len(buf), True)
    at = [16 * 300 + 41 * k for k in range(40)]  # where each damaged stretch starts
    assert end == len(buf)
    assert offs.tolist() == [16 * k for k in range(300)] + [a + 5 for a in at]
    assert lens.tolist() == [0] * 300 + [20] * 40
    assert gaps.tolist() == [[a, a + 5, GAP_BAD_LENGTH_CRC] for a in at]
