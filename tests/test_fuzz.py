"""Hypothesis: damaged event files never raise out of ingest and never invent a point."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import DATA, ingest_paths
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest import tfevents
from ingest.framing import CRC_TABLES, frame_records
from workbench.store import Store

pytestmark = pytest.mark.slow  # ~1 min: CI runs them; `-m "not slow"` skips them while iterating

ORIGINAL = (DATA / "generated/tbx_run/run_a/events.out.tfevents.1796036286.vm").read_bytes()
NATIVE = (DATA / "generated/tb_native_run/events.out.tfevents.1796036290.vm.17224.0").read_bytes()


damage = st.tuples(
    st.lists(st.tuples(st.integers(0, len(ORIGINAL) - 1), st.integers(1, 255)), max_size=6),
    st.integers(0, len(ORIGINAL)),
)


def _points_of(tmp, data: bytes) -> list[tuple]:
    (tmp / "run").mkdir()
    (tmp / "run/events.out.tfevents.1.host").write_bytes(data)
    store = Store(tmp / "store")
    ingest_paths(store, tmp / "run")
    return store.query("SELECT tag, step, value FROM scalars_all").rows()


@pytest.fixture(scope="module")
def original_points(tmp_path_factory) -> dict[bytes, set[tuple]]:
    """The points of each undamaged file as ingest reads them: once per file, not per example."""
    return {base: set(_points_of(tmp_path_factory.mktemp("ref"), base)) for base in (ORIGINAL, NATIVE)}


@settings(deadline=None, max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(damage=damage, base=st.sampled_from([ORIGINAL, NATIVE]))
def test_damaged_file_never_raises_and_invents_nothing(tmp_path_factory, original_points, damage, base):
    flips, cut = damage
    data = bytearray(base[: min(cut, len(base))])
    for pos, xor in flips:
        if pos < len(data):
            data[pos] ^= xor
    got = _points_of(tmp_path_factory.mktemp("fuzz"), bytes(data))
    assert set(got) <= original_points[base]
    assert len(got) == len(set(got))


@settings(deadline=None, max_examples=300)
@given(data=st.binary(max_size=600), prefix=st.sampled_from([b"", ORIGINAL[:40], NATIVE[:200]]))
def test_kernels_survive_arbitrary_bytes_without_crc(data, prefix):
    """With CRC checks off, garbage reaches the protobuf decoder: it must stay in bounds."""
    buf = np.frombuffer(prefix + data, np.uint8)
    offs, lens, end, gaps = frame_records(buf, len(buf), CRC_TABLES, len(buf), True)
    assert 0 <= end <= len(buf)
    tfevents.decode_records(buf, offs, lens, False, CRC_TABLES)
    # also decode arbitrary bytes as if they were a record payload
    framed = np.concatenate([np.zeros(12, np.uint8), buf, np.zeros(4, np.uint8)])
    tfevents.decode_records(framed, np.array([0]), np.array([len(buf)]), False, CRC_TABLES)
