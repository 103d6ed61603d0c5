"""Binary framing shared by record formats: CRC-32C, little-endian integers, TFRecord record
framing, and protobuf varints (numba kernels over a uint8 buffer).

A TFRecord is `uint64 length | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)`
(tensorflow/core/lib/io/record_writer.cc); the CRC is CRC-32C (Castagnoli) rotated and offset
("masked") so that CRCs of CRCs stay well distributed. Protobuf fields are `varint key` then a
payload whose length depends on the wire type (0 varint, 1 fixed64, 2 length-delimited, 5 fixed32).
"""

from __future__ import annotations

import numpy as np

from workbench.jit import njit

_MASK_DELTA = np.uint32(0xA282EAD8)


def _crc_tables() -> np.ndarray:
    """Slicing-by-8 tables for CRC-32C (Castagnoli, reflected polynomial 0x82F63B78)."""
    t = np.zeros((8, 256), dtype=np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t[0, i] = c
    for k in range(1, 8):
        for i in range(256):
            t[k, i] = (t[k - 1, i] >> 8) ^ t[0, t[k - 1, i] & 0xFF]
    return t


CRC_TABLES = _crc_tables()


@njit(cache=True, nogil=True)
def crc32c(buf, start, n, tables):
    crc = np.uint32(0xFFFFFFFF)
    i = start
    end = start + n
    while i + 8 <= end:
        lo = crc ^ (
            np.uint32(buf[i])
            | (np.uint32(buf[i + 1]) << 8)
            | (np.uint32(buf[i + 2]) << 16)
            | (np.uint32(buf[i + 3]) << 24)
        )
        crc = (
            tables[7, lo & 0xFF]
            ^ tables[6, (lo >> 8) & 0xFF]
            ^ tables[5, (lo >> 16) & 0xFF]
            ^ tables[4, lo >> 24]
            ^ tables[3, buf[i + 4]]
            ^ tables[2, buf[i + 5]]
            ^ tables[1, buf[i + 6]]
            ^ tables[0, buf[i + 7]]
        )
        i += 8
    while i < end:
        crc = tables[0, (crc ^ np.uint32(buf[i])) & 0xFF] ^ (crc >> 8)
        i += 1
    return crc ^ np.uint32(0xFFFFFFFF)


@njit(cache=True, nogil=True)
def masked_crc32c(buf, start, n, tables):
    crc = crc32c(buf, start, n, tables)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & np.uint32(0xFFFFFFFF)


@njit(cache=True, nogil=True)
def u32(buf, p):
    return (
        np.uint32(buf[p])
        | (np.uint32(buf[p + 1]) << 8)
        | (np.uint32(buf[p + 2]) << 16)
        | (np.uint32(buf[p + 3]) << 24)
    )


@njit(cache=True, nogil=True)
def u64(buf, p):
    return np.uint64(u32(buf, p)) | (np.uint64(u32(buf, p + 4)) << np.uint64(32))


@njit(cache=True, nogil=True)
def header_ok(buf, p, n, tables):
    """A plausible record header at p: length CRC valid and the whole record inside the buffer."""
    if p + 12 > n:
        return False
    if masked_crc32c(buf, p, 8, tables) != u32(buf, p + 8):
        return False
    length = u64(buf, p)
    if length > np.uint64(n - p - 16):
        return False
    return masked_crc32c(buf, p + 12, np.int64(length), tables) == u32(buf, p + 12 + np.int64(length))


GAP_BAD_LENGTH_CRC = 0  # the length field's CRC fails
GAP_PAST_END = 1  # a length field with a valid CRC that runs past the end of the file


@njit(cache=True, nogil=True)
def _next_record(buf, p, n, tables):
    """The next position after p where a whole valid record starts, or n."""
    q = p + 1
    while q + 12 <= n and not header_ok(buf, q, n, tables):
        q += 1
    return q if q + 12 <= n else n


@njit(cache=True, nogil=True)
def frame_records(buf, n, tables, limit, settled):
    """Walk the record chain of buf[:n], where `limit` bytes remain from buf[0] to the end of
    the file and `settled`: the file has stopped growing.

    Returns (offsets, lengths, end, gaps): offsets/lengths of the complete records (offset of the
    data payload is offset + 12); `end` is where reading must resume next time (the start of an
    incomplete trailing record, or n); `gaps` is a (k, 3) array of skipped byte ranges and why
    (GAP_*), resynchronised on the next position whose header and data CRCs both hold: after a
    bad length CRC, or after a length running past the end of the file when complete records
    follow or the file has stopped growing (else it is an unfinished write, read next time).
    """
    cap = 1024
    offs = np.empty(cap, np.int64)
    lens = np.empty(cap, np.int64)
    gaps = np.empty((16, 3), np.int64)
    k = 0
    g = 0
    p = np.int64(0)
    while p + 12 <= n:
        reason = -1
        if masked_crc32c(buf, p, 8, tables) != u32(buf, p + 8):
            reason = GAP_BAD_LENGTH_CRC
        else:
            length = u64(buf, p)
            if n - p - 16 < 0 or length > np.uint64(n - p - 16):  # not all in this buffer
                if limit - p - 16 >= 0 and length <= np.uint64(limit - p - 16):
                    break  # the rest is in the file (read more), or an unfinished write
                reason = GAP_PAST_END
        if reason >= 0:
            # framing lost: the next position that is a whole valid record; nothing valid
            # after a bad length CRC means a corrupt tail, not an unfinished write
            q = _next_record(buf, p, n, tables)
            if reason == GAP_PAST_END and q == n and not settled:
                break  # maybe a writer mid-record: read it again next time
            if g == gaps.shape[0]:
                ng = np.empty((g * 2, 3), np.int64)
                ng[:g] = gaps[:g]
                gaps = ng
            gaps[g, 0] = p
            gaps[g, 1] = q
            gaps[g, 2] = reason
            g += 1
            p = q
            continue
        if k == cap:
            cap *= 2
            no = np.empty(cap, np.int64)
            nl = np.empty(cap, np.int64)
            no[:k] = offs[:k]
            nl[:k] = lens[:k]
            offs = no
            lens = nl
        offs[k] = p
        lens[k] = np.int64(length)
        k += 1
        p += 16 + np.int64(length)
    return offs[:k], lens[:k], p, gaps[:g]


@njit(cache=True, nogil=True)
def varint(buf, p, end):
    """Returns (value, new_p); new_p == -1 on a malformed varint."""
    result = np.uint64(0)
    shift = np.uint64(0)
    while p < end:
        b = buf[p]
        p += 1
        result |= np.uint64(b & 0x7F) << shift
        if b < 0x80:
            return result, p
        shift += np.uint64(7)
        if shift >= np.uint64(64):
            return result, -1
    return result, -1


@njit(cache=True, nogil=True)
def skip_field(buf, p, end, wt):
    """Skip a field of wire type wt; returns the new position or -1."""
    if wt == 0:
        _, p = varint(buf, p, end)
        return p
    if wt == 1:
        return p + 8 if p + 8 <= end else -1
    if wt == 5:
        return p + 4 if p + 4 <= end else -1
    if wt == 2:
        ln, p = varint(buf, p, end)
        if p < 0 or np.int64(ln) < 0 or p + np.int64(ln) > end:
            return -1
        return p + np.int64(ln)
    return -1
