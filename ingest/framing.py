"""Binary framing shared by record formats: CRC-32C, little-endian integers, TFRecord record
framing, and protobuf varints (numba kernels over a uint8 buffer).

A TFRecord is `uint64 length | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)`
(tensorflow/core/lib/io/record_writer.cc); the CRC is CRC-32C (Castagnoli) rotated and offset
("masked") so that CRCs of CRCs stay well distributed. Protobuf fields are `varint key` then a
payload whose length depends on the wire type (0 varint, 1 fixed64, 2 length-delimited, 5 fixed32).
"""

from __future__ import annotations

import numpy as np
from numba import types
from numba.extending import intrinsic

from workbench.jit import njit, njit_without_refcounts

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


@njit_without_refcounts(cache=True, nogil=True)
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


@njit_without_refcounts(cache=True, nogil=True)
def masked_crc32c(buf, start, n, tables):
    crc = crc32c(buf, start, n, tables)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & np.uint32(0xFFFFFFFF)


@njit_without_refcounts(cache=True, nogil=True)
def u32(buf, p):
    return (
        np.uint32(buf[p])
        | (np.uint32(buf[p + 1]) << 8)
        | (np.uint32(buf[p + 2]) << 16)
        | (np.uint32(buf[p + 3]) << 24)
    )


@intrinsic
def _float32_bits(typingctx, bits):
    sig = types.float64(types.uint32)

    def codegen(context, builder, signature, args):
        f32 = builder.bitcast(args[0], context.get_value_type(types.float32))
        return builder.fpext(f32, context.get_value_type(types.float64))

    return sig, codegen


@intrinsic
def _float64_bits(typingctx, bits):
    sig = types.float64(types.uint64)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.float64))

    return sig, codegen


@njit(cache=True, nogil=True)
def f32_of_bits(bits):
    """The float32 whose IEEE bits are `bits`, as a float64: a register move (a scratch array's
    `.view` made an array, with its reference counts, per value)."""
    return _float32_bits(np.uint32(bits))  # type: ignore[call-arg]  # numba passes typingctx


@njit(cache=True, nogil=True)
def f64_of_bits(bits):
    """The float64 whose IEEE bits are `bits`."""
    return _float64_bits(np.uint64(bits))  # type: ignore[call-arg]


@njit_without_refcounts(cache=True, nogil=True)
def u64(buf, p):
    return np.uint64(u32(buf, p)) | (np.uint64(u32(buf, p + 4)) << np.uint64(32))


@njit_without_refcounts(cache=True, nogil=True)
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


@njit_without_refcounts(cache=True, nogil=True)
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
    offs = np.empty(n // 32 + 16, np.int64)  # grown when records average under 32 bytes
    lens = np.empty(offs.shape[0], np.int64)
    gaps = np.empty((16, 3), np.int64)
    k, g, p, full = _frame_into(buf, n, tables, limit, settled, offs, lens, gaps, 0, 0, np.int64(0))
    while full != _ROOM:
        if full == _RECORDS_FULL:
            offs, lens = grown(offs, k), grown(lens, k)
        else:
            gaps = grown(gaps, g)
        k, g, p, full = _frame_into(buf, n, tables, limit, settled, offs, lens, gaps, k, g, p)
    return offs[:k], lens[:k], p, gaps[:g]


_ROOM, _RECORDS_FULL, _GAPS_FULL = 0, 1, 2


@njit(cache=True, nogil=True)
def grown(a, k):
    """`a` with twice the rows, its first k kept: the room a kernel that writes into arrays it
    is given gets when it runs out."""
    out = np.empty((2 * a.shape[0],) + a.shape[1:], a.dtype)
    out[:k] = a[:k]
    return out


@njit_without_refcounts(cache=True, nogil=True)
def _frame_into(buf, n, tables, limit, settled, offs, lens, gaps, k, g, p):
    """frame_records' walk from p, with k records and g gaps found, into arrays it is given (no
    array made, so no reference counts taken per record). Returns (k, g, p, _ROOM when the
    walk ended, else which array is full: grow it and walk on from p)."""
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
                return k, g, p, _GAPS_FULL
            gaps[g, 0] = p
            gaps[g, 1] = q
            gaps[g, 2] = reason
            g += 1
            p = q
            continue
        if k == offs.shape[0]:
            return k, g, p, _RECORDS_FULL
        offs[k] = p
        lens[k] = np.int64(length)
        k += 1
        p += 16 + np.int64(length)
    return k, g, p, _ROOM


@njit_without_refcounts(cache=True, nogil=True)
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


@njit_without_refcounts(cache=True, nogil=True)
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
