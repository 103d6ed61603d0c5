"""TensorBoard Event/Summary protobuf decoding in bulk (numba kernels over framed records).

Per-record protobuf objects cap a Python reader at a few hundred thousand scalars a second;
these kernels walk the raw bytes once, in machine code, and return flat arrays. Records whose
content needs a full protobuf (text, hparams, file_version) are only flagged here and decoded
by `ingest.tensorboard` from their offsets.
"""

from __future__ import annotations

import numpy as np

from ingest.framing import masked_crc32c, skip_field, u32, u64, varint
from workbench.jit import njit

# --- framing status codes (per record) -------------------------------------------------------
REC_OK = 0
REC_BAD_DATA_CRC = 1
REC_BAD_PROTO = 2

# --- what an Event carries (its oneof `what`) --------------------------------------------------
EV_SUMMARY = 1
EV_FILE_VERSION = 2
EV_SESSION_LOG = 3
EV_GRAPH = 4
EV_OTHER = 5

# --- what a Summary.Value carries ---------------------------------------------------------------
V_SIMPLE = 1  # simple_value (float32)
V_TENSOR_NUM = 2  # a one-element numeric tensor: a scalar when its plugin is "scalars"
V_TENSOR_STR = 3  # a string tensor (text plugin, model config, ...)
V_TENSOR_OTHER = 4  # a multi-element or undecodable tensor
V_HISTO = 5
V_IMAGE = 6
V_AUDIO = 7
V_EMPTY = 8  # metadata only (hparams)

# the kernels' named steps are inlined into their callers (`inline="always"`): one kernel in
# machine code, as if written in one piece, with no call per record or value

# columns of the int64 `vals` matrix returned by decode_records
VC_REC, VC_TAG_OFF, VC_TAG_LEN, VC_TAG_HASH, VC_PLUGIN_OFF, VC_PLUGIN_LEN, VC_KIND = range(7)
N_VCOLS = 7


@njit(cache=True, nogil=True)
def _half_to_float(h):
    s = (h >> 15) & 1
    e = (h >> 10) & 0x1F
    m = h & 0x3FF
    if e == 0:
        v = m * 2.0**-24
    elif e == 31:
        v = np.inf if m == 0 else np.nan
    else:
        v = (1.0 + m / 1024.0) * 2.0 ** (e - 15)
    return -v if s else v


@njit(cache=True, nogil=True)
def _bits_to_f32(bits, s32):
    s32[0] = np.uint32(bits)
    return np.float64(s32.view(np.float32)[0])


@njit(cache=True, nogil=True)
def _bits_to_f64(bits, s64):
    s64[0] = np.uint64(bits)
    return s64.view(np.float64)[0]


# DataType enum values (tensorflow/core/framework/types.proto)
DT_FLOAT, DT_DOUBLE, DT_INT32, DT_UINT8, DT_INT16, DT_INT8, DT_STRING = 1, 2, 3, 4, 5, 6, 7
DT_INT64, DT_BOOL, DT_BFLOAT16, DT_UINT16, DT_HALF, DT_UINT32, DT_UINT64 = 9, 10, 14, 17, 19, 22, 23


@njit(cache=True, nogil=True, inline="always")
def _shape_elements(buf, p, send):
    """The element count of a TensorShapeProto (repeated Dim dim = 2 {int64 size = 1}) in
    buf[p:send]; returns (ok, count)."""
    n_elems = np.int64(1)
    q = p
    while q < send:
        k2, q = varint(buf, q, send)
        if q < 0:
            return False, n_elems
        if (k2 >> np.uint64(3)) == 2 and (k2 & np.uint64(7)) == 2:
            dl, q = varint(buf, q, send)
            dend = q + np.int64(dl)
            if q < 0 or dend > send or dend < q:
                return False, n_elems
            while q < dend and q >= 0:
                k3, q = varint(buf, q, dend)
                if q < 0:
                    return False, n_elems
                if (k3 >> np.uint64(3)) == 1 and (k3 & np.uint64(7)) == 0:
                    sz, q = varint(buf, q, dend)
                    n_elems *= np.int64(sz)
                else:
                    q = skip_field(buf, q, dend, np.int64(k3 & np.uint64(7)))
            q = dend
        else:
            q = skip_field(buf, q, send, np.int64(k2 & np.uint64(7)))
        if q < 0:
            return False, n_elems
    return True, n_elems


@njit(cache=True, nogil=True, inline="always")
def _typed_values(buf, p, end, field, wt, dtype, value, s32, s64):
    """A typed repeated numeric field of a TensorProto (float_val 5, double_val 6, int_val 7,
    int64_val 10, bool_val 11, half_val 13, uint32_val 16, uint64_val 17), packed (wt 2) or one
    value; returns (ok, new p, the last value, how many values)."""
    n_vals = 0
    if wt == 2:
        ln, p = varint(buf, p, end)
        vend = p + np.int64(ln)
        if p < 0 or vend > end or vend < p:
            return False, p, value, n_vals
        q = p
        p = vend
    else:
        q = p
        vend = end
    while q < vend:
        if field == 5:
            if q + 4 > vend:
                return False, p, value, n_vals
            value = _bits_to_f32(u32(buf, q), s32)
            q += 4
        elif field == 6:
            if q + 8 > vend:
                return False, p, value, n_vals
            value = _bits_to_f64(u64(buf, q), s64)
            q += 8
        else:
            raw, q = varint(buf, q, vend)
            if q < 0:
                return False, p, value, n_vals
            if field == 13:
                if dtype == DT_BFLOAT16:
                    value = _bits_to_f32(np.uint32(raw & np.uint64(0xFFFF)) << 16, s32)
                else:
                    value = _half_to_float(np.int64(raw & np.uint64(0xFFFF)))
            elif field == 17 or field == 16:
                value = np.float64(raw)
            else:
                value = np.float64(np.int64(raw))
        n_vals += 1
        if wt != 2:
            p = q
            break
    return True, p, value, n_vals


@njit(cache=True, nogil=True, inline="always")
def _content_value(buf, c, content_len, dtype, value, s32, s64):
    """The one value of a tensor_content of `dtype`; returns (kind, value), `value` unchanged
    for a content it cannot read."""
    if dtype == DT_FLOAT and content_len == 4:
        value = _bits_to_f32(u32(buf, c), s32)
    elif dtype == DT_DOUBLE and content_len == 8:
        value = _bits_to_f64(u64(buf, c), s64)
    elif dtype == DT_HALF and content_len == 2:
        value = _half_to_float(np.int64(buf[c]) | (np.int64(buf[c + 1]) << 8))
    elif dtype == DT_BFLOAT16 and content_len == 2:
        value = _bits_to_f32((np.uint32(buf[c]) | (np.uint32(buf[c + 1]) << 8)) << 16, s32)
    elif dtype == DT_INT32 and content_len == 4:
        value = np.float64(np.int32(u32(buf, c)))
    elif dtype == DT_INT64 and content_len == 8:
        value = np.float64(np.int64(u64(buf, c)))
    elif dtype == DT_UINT64 and content_len == 8:
        value = np.float64(u64(buf, c))
    elif dtype == DT_UINT32 and content_len == 4:
        value = np.float64(u32(buf, c))
    elif (dtype == DT_BOOL or dtype == DT_UINT8 or dtype == DT_INT8) and content_len == 1:  # noqa: SIM109 - numba
        value = np.float64(np.int8(buf[c])) if dtype == DT_INT8 else np.float64(buf[c])
    elif dtype == DT_INT16 and content_len == 2:
        value = np.float64(np.int16(np.int64(buf[c]) | (np.int64(buf[c + 1]) << 8)))
    elif dtype == DT_UINT16 and content_len == 2:
        value = np.float64(np.int64(buf[c]) | (np.int64(buf[c + 1]) << 8))
    else:
        return V_TENSOR_OTHER, value
    return V_TENSOR_NUM, value


@njit(cache=True, nogil=True)
def _decode_tensor(buf, p, end, s32, s64):
    """Decode a TensorProto; returns (kind, value) with kind V_TENSOR_NUM/STR/OTHER."""
    dtype = np.int64(0)
    n_elems = 1
    n_vals = 0
    value = np.nan
    content_off = -1
    content_len = np.int64(0)
    is_string = False
    while p < end:
        key, p = varint(buf, p, end)
        if p < 0:
            return -1, value
        field = key >> np.uint64(3)
        wt = np.int64(key & np.uint64(7))
        if field == 1 and wt == 0:
            d, p = varint(buf, p, end)
            dtype = np.int64(d)
        elif field == 2 and wt == 2:  # TensorShapeProto
            ln, p = varint(buf, p, end)
            send = p + np.int64(ln)
            if p < 0 or send > end or send < p:
                return -1, value
            ok, dims = _shape_elements(buf, p, send)
            if not ok:
                return -1, value
            n_elems *= dims
            p = send
        elif field == 4 and wt == 2:  # tensor_content
            ln, p = varint(buf, p, end)
            if p < 0:
                return -1, value
            content_off = p
            content_len = np.int64(ln)
            if content_len < 0 or p + content_len > end:
                return -1, value
            p = p + content_len
        elif field == 8:  # string_val
            is_string = True
            p = skip_field(buf, p, end, wt)
            n_vals += 1
        elif (
            field == 5
            or field == 6
            or field == 7
            or field == 10
            or field == 11
            or field == 13
            or field == 16
            or field == 17
        ):
            ok, p, value, n = _typed_values(buf, p, end, field, wt, dtype, value, s32, s64)
            if not ok:
                return -1, value
            n_vals += n
        else:
            p = skip_field(buf, p, end, wt)
        if p < 0 or p > end:
            return -1, value
    if is_string or dtype == DT_STRING:
        return V_TENSOR_STR, value
    if n_elems != 1:
        return V_TENSOR_OTHER, value
    if content_off >= 0 and content_len > 0:
        return _content_value(buf, content_off, content_len, dtype, value, s32, s64)
    if n_vals >= 1 and dtype != 0:
        return V_TENSOR_NUM, value
    return V_TENSOR_OTHER, value


@njit(cache=True, nogil=True)
def _fnv1a(buf, p, n):
    h = np.uint64(0xCBF29CE484222325)
    for i in range(p, p + n):
        h = (h ^ np.uint64(buf[i])) * np.uint64(0x100000001B3)
    return h


@njit(cache=True, nogil=True, inline="always")
def _plugin_name(buf, p, mend, out, row):
    """Where SummaryMetadata{plugin_data=1{plugin_name=1}} in buf[p:mend] names the plugin, into
    out[row] (VC_PLUGIN_OFF, VC_PLUGIN_LEN); False when it does not decode."""
    q = p
    while q < mend and q >= 0:
        k2, q = varint(buf, q, mend)
        if q < 0:
            return False
        if (k2 >> np.uint64(3)) == 1 and (k2 & np.uint64(7)) == 2:
            pl, q = varint(buf, q, mend)
            pend = q + np.int64(pl)
            if q < 0 or pend > mend or pend < q:
                return False
            while q < pend and q >= 0:
                k3, q = varint(buf, q, pend)
                if q < 0:
                    return False
                if (k3 >> np.uint64(3)) == 1 and (k3 & np.uint64(7)) == 2:
                    nl, q = varint(buf, q, pend)
                    if q < 0 or q + np.int64(nl) > pend or np.int64(nl) < 0:
                        return False
                    out[row, VC_PLUGIN_OFF] = q
                    out[row, VC_PLUGIN_LEN] = np.int64(nl)
                    q += np.int64(nl)
                else:
                    q = skip_field(buf, q, pend, np.int64(k3 & np.uint64(7)))
            q = pend
        else:
            q = skip_field(buf, q, mend, np.int64(k2 & np.uint64(7)))
    return q >= 0


@njit(cache=True, nogil=True)
def _decode_value(buf, p, end, out, row, s32, s64):
    """Decode one Summary.Value into out[row]; returns (ok, value)."""
    out[row, VC_TAG_OFF] = p
    out[row, VC_TAG_LEN] = 0
    out[row, VC_PLUGIN_OFF] = -1
    out[row, VC_PLUGIN_LEN] = 0
    kind = V_EMPTY
    value = np.nan
    while p < end:
        key, p = varint(buf, p, end)
        if p < 0:
            return False, value
        field = key >> np.uint64(3)
        wt = np.int64(key & np.uint64(7))
        if field == 1 and wt == 2:
            ln, p = varint(buf, p, end)
            if p < 0 or np.int64(ln) < 0 or p + np.int64(ln) > end:
                return False, value
            out[row, VC_TAG_OFF] = p
            out[row, VC_TAG_LEN] = np.int64(ln)
            p += np.int64(ln)
        elif field == 2 and wt == 5:
            if p + 4 > end:
                return False, value
            value = _bits_to_f32(u32(buf, p), s32)
            kind = V_SIMPLE
            p += 4
        elif field == 9 and wt == 2:  # SummaryMetadata
            ln, p = varint(buf, p, end)
            mend = p + np.int64(ln)
            if p < 0 or mend > end or mend < p:
                return False, value
            if not _plugin_name(buf, p, mend, out, row):
                return False, value
            p = mend
        elif field == 8 and wt == 2:
            ln, p = varint(buf, p, end)
            if p < 0 or np.int64(ln) < 0 or p + np.int64(ln) > end:
                return False, value
            kind, value = _decode_tensor(buf, p, p + np.int64(ln), s32, s64)
            if kind < 0:
                return False, value
            p += np.int64(ln)
        elif (field == 3 or field == 5) and wt == 2:
            kind = V_HISTO
            p = skip_field(buf, p, end, wt)
        elif field == 4 and wt == 2:
            kind = V_IMAGE
            p = skip_field(buf, p, end, wt)
        elif field == 6 and wt == 2:
            kind = V_AUDIO
            p = skip_field(buf, p, end, wt)
        else:
            p = skip_field(buf, p, end, wt)
        if p < 0 or p > end:
            return False, value
    out[row, VC_KIND] = kind
    out[row, VC_TAG_HASH] = np.int64(_fnv1a(buf, out[row, VC_TAG_OFF], out[row, VC_TAG_LEN]))
    return True, value


@njit(cache=True, nogil=True, inline="always")
def _decode_summary(buf, p, send, rec, vals, fvals, nv, s32, s64):
    """The Summary.Values of record `rec` in buf[p:send], appended to vals/fvals from row `nv`
    (grown as needed); returns (new p, or -1 when a value does not decode, vals, fvals, nv)."""
    while p < send:
        k2, p = varint(buf, p, send)
        if p < 0:
            break
        if (k2 >> np.uint64(3)) == 1 and (k2 & np.uint64(7)) == 2:
            vl, p = varint(buf, p, send)
            if p < 0 or np.int64(vl) < 0 or p + np.int64(vl) > send:
                p = -1
                break
            if nv == vals.shape[0]:
                cap = 2 * vals.shape[0]
                nvals = np.empty((cap, N_VCOLS), np.int64)
                nvals[:nv] = vals[:nv]
                vals = nvals
                nf = np.empty(cap, np.float64)
                nf[:nv] = fvals[:nv]
                fvals = nf
            vals[nv, VC_REC] = rec
            good, v = _decode_value(buf, p, p + np.int64(vl), vals, nv, s32, s64)
            if not good:
                p = -1
                break
            fvals[nv] = v
            nv += 1
            p += np.int64(vl)
        else:
            p = skip_field(buf, p, send, np.int64(k2 & np.uint64(7)))
            if p < 0:
                break
    return p, vals, fvals, nv


@njit(cache=True, nogil=True, inline="always")
def _session_status(buf, p, lend, sess, rec):
    """SessionLog{status=1} in buf[p:lend] into sess[rec] (a damaged one ends where it breaks)."""
    q = p
    while q < lend and q >= 0:
        k2, q = varint(buf, q, lend)
        if q < 0:
            break
        if (k2 >> np.uint64(3)) == 1 and (k2 & np.uint64(7)) == 0:
            st, q = varint(buf, q, lend)
            sess[rec] = np.int8(st & np.uint64(0x7F))
        else:
            q = skip_field(buf, q, lend, np.int64(k2 & np.uint64(7)))


@njit(cache=True, nogil=True)
def decode_records(buf, offs, lens, check_crc, tables):
    """Decode the Events at the given record offsets.

    Returns per record: status, what (EV_*), wall_time, step, session_status; and per
    Summary.Value: an int64 matrix (columns VC_*) and a float64 value array.
    """
    n = offs.shape[0]
    status = np.zeros(n, np.int8)
    what = np.zeros(n, np.int8)
    wall = np.full(n, np.nan)
    step = np.zeros(n, np.int64)
    sess = np.zeros(n, np.int8)
    vals = np.empty((n + 16, N_VCOLS), np.int64)
    fvals = np.empty(n + 16, np.float64)
    s32 = np.empty(1, np.uint32)
    s64 = np.empty(1, np.uint64)
    nv = 0
    for i in range(n):
        p = offs[i] + 12
        end = p + lens[i]
        if check_crc and masked_crc32c(buf, p, lens[i], tables) != u32(buf, end):
            status[i] = REC_BAD_DATA_CRC
            continue
        row0 = nv
        ok = True
        while p < end:
            key, p = varint(buf, p, end)
            if p < 0:
                ok = False
                break
            field = key >> np.uint64(3)
            wt = np.int64(key & np.uint64(7))
            if field == 1 and wt == 1:
                if p + 8 > end:
                    ok = False
                    break
                wall[i] = _bits_to_f64(u64(buf, p), s64)
                p += 8
            elif field == 2 and wt == 0:
                s, p = varint(buf, p, end)
                step[i] = np.int64(s)
            elif field == 5 and wt == 2:
                what[i] = EV_SUMMARY
                ln, p = varint(buf, p, end)
                send = p + np.int64(ln)
                if p < 0 or send > end or send < p:
                    ok = False
                    break
                p, vals, fvals, nv = _decode_summary(buf, p, send, i, vals, fvals, nv, s32, s64)
                if p < 0:
                    ok = False
                    break
            elif field == 3 and wt == 2:
                what[i] = EV_FILE_VERSION
                p = skip_field(buf, p, end, wt)
            elif field == 7 and wt == 2:
                what[i] = EV_SESSION_LOG
                ln, p = varint(buf, p, end)
                lend = p + np.int64(ln)
                if p < 0 or lend > end or lend < p:
                    ok = False
                    break
                _session_status(buf, p, lend, sess, i)
                p = lend
            elif (field == 4 or field == 9) and wt == 2:
                what[i] = EV_GRAPH
                p = skip_field(buf, p, end, wt)
            else:
                if field == 6 or field == 8:
                    what[i] = EV_OTHER
                p = skip_field(buf, p, end, wt)
            if p < 0 or p > end:
                ok = False
                break
        if not ok:
            status[i] = REC_BAD_PROTO
            nv = row0  # drop any values of a record that did not decode whole
    return status, what, wall, step, sess, vals[:nv], fvals[:nv]


@njit(cache=True, nogil=True)
def tags_equal(buf, vals, rep_off, rep_len, group):
    """True when every value's tag bytes equal its group representative's (hash collision check)."""
    for r in range(vals.shape[0]):
        g = group[r]
        ln = vals[r, VC_TAG_LEN]
        if ln != rep_len[g]:
            return False
        a = vals[r, VC_TAG_OFF]
        b = rep_off[g]
        for j in range(ln):
            if buf[a + j] != buf[b + j]:
                return False
    return True
