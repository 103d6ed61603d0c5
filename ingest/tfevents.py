"""TensorBoard Event/Summary protobuf decoding in bulk (numba kernels over framed records).

Per-record protobuf objects cap a Python reader at a few hundred thousand scalars a second;
these kernels walk the raw bytes once, in machine code, and return flat arrays. Records whose
content needs a full protobuf (text, hparams, file_version) are only flagged here and decoded
by `ingest.tensorboard` from their offsets.
"""

from __future__ import annotations

import numpy as np

from ingest.framing import f32_of_bits, f64_of_bits, grown, masked_crc32c, skip_field, u32, u64, varint
from workbench.jit import njit, njit_without_refcounts

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

FULL = -2  # _decode_summary: no room left for a value

# columns of the int64 `vals` matrix returned by decode_records
VC_REC, VC_TAG_OFF, VC_TAG_LEN, VC_TAG_HASH, VC_PLUGIN_OFF, VC_PLUGIN_LEN, VC_KIND = range(7)
N_VCOLS = 7


@njit_without_refcounts(cache=True, nogil=True)
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


# DataType enum values (tensorflow/core/framework/types.proto)
DT_FLOAT, DT_DOUBLE, DT_INT32, DT_UINT8, DT_INT16, DT_INT8, DT_STRING = 1, 2, 3, 4, 5, 6, 7
DT_INT64, DT_BOOL, DT_BFLOAT16, DT_UINT16, DT_HALF, DT_UINT32, DT_UINT64 = 9, 10, 14, 17, 19, 22, 23


@njit_without_refcounts(cache=True, nogil=True, inline="always")
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


@njit_without_refcounts(cache=True, nogil=True, inline="always")
def _typed_values(buf, p, end, field, wt, dtype, value):
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
            value = f32_of_bits(u32(buf, q))
            q += 4
        elif field == 6:
            if q + 8 > vend:
                return False, p, value, n_vals
            value = f64_of_bits(u64(buf, q))
            q += 8
        else:
            raw, q = varint(buf, q, vend)
            if q < 0:
                return False, p, value, n_vals
            if field == 13:
                if dtype == DT_BFLOAT16:
                    value = f32_of_bits(np.uint32(raw & np.uint64(0xFFFF)) << 16)
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


@njit_without_refcounts(cache=True, nogil=True, inline="always")
def _content_value(buf, c, content_len, dtype, value):
    """The one value of a tensor_content of `dtype`; returns (kind, value), `value` unchanged
    for a content it cannot read."""
    if dtype == DT_FLOAT and content_len == 4:
        value = f32_of_bits(u32(buf, c))
    elif dtype == DT_DOUBLE and content_len == 8:
        value = f64_of_bits(u64(buf, c))
    elif dtype == DT_HALF and content_len == 2:
        value = _half_to_float(np.int64(buf[c]) | (np.int64(buf[c + 1]) << 8))
    elif dtype == DT_BFLOAT16 and content_len == 2:
        value = f32_of_bits((np.uint32(buf[c]) | (np.uint32(buf[c + 1]) << 8)) << 16)
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


@njit_without_refcounts(cache=True, nogil=True)
def _decode_tensor(buf, p, end):
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
            ok, p, value, n = _typed_values(buf, p, end, field, wt, dtype, value)
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
        return _content_value(buf, content_off, content_len, dtype, value)
    if n_vals >= 1 and dtype != 0:
        return V_TENSOR_NUM, value
    return V_TENSOR_OTHER, value


@njit_without_refcounts(cache=True, nogil=True)
def _fnv1a(buf, p, n):
    h = np.uint64(0xCBF29CE484222325)
    for i in range(p, p + n):
        h = (h ^ np.uint64(buf[i])) * np.uint64(0x100000001B3)
    return h


@njit_without_refcounts(cache=True, nogil=True, inline="always")
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


@njit_without_refcounts(cache=True, nogil=True)
def _decode_value(buf, p, end, out, row):
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
            value = f32_of_bits(u32(buf, p))
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
            kind, value = _decode_tensor(buf, p, p + np.int64(ln))
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


@njit_without_refcounts(cache=True, nogil=True, inline="always")
def _decode_summary(buf, p, send, rec, vals, fvals, nv):
    """The Summary.Values of record `rec` in buf[p:send], written to vals/fvals from row `nv`;
    returns (new p, or -1 when a value does not decode, or FULL when vals has no room left; nv)."""
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
                return FULL, nv
            vals[nv, VC_REC] = rec
            good, v = _decode_value(buf, p, p + np.int64(vl), vals, nv)
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
    return p, nv


@njit_without_refcounts(cache=True, nogil=True, inline="always")
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
    i, nv = _decode_into(
        buf, offs, lens, 0, check_crc, tables, status, what, wall, step, sess, vals, fvals, 0
    )
    while i < n:  # record i's values did not fit: twice the room, and on from record i
        vals, fvals = grown(vals, nv), grown(fvals, nv)
        i, nv = _decode_into(
            buf, offs, lens, i, check_crc, tables, status, what, wall, step, sess, vals, fvals, nv
        )
    return status, what, wall, step, sess, vals[:nv], fvals[:nv]


@njit_without_refcounts(cache=True, nogil=True)
def _decode_into(buf, offs, lens, i, check_crc, tables, status, what, wall, step, sess, vals, fvals, nv):
    """decode_records' loop, from record i with nv values written, into arrays it is given: no
    array is made here, so the loop takes no reference count (an atomic operation, contended
    when threads share the buffer). Returns (i, nv): i < n when record i's values found vals
    full (its values are dropped; decode again from it with more room)."""
    n = offs.shape[0]
    while i < n:
        p = offs[i] + 12
        end = p + lens[i]
        if check_crc and masked_crc32c(buf, p, lens[i], tables) != u32(buf, end):
            status[i] = REC_BAD_DATA_CRC
            i += 1
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
                wall[i] = f64_of_bits(u64(buf, p))
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
                p, nv = _decode_summary(buf, p, send, i, vals, fvals, nv)
                if p == FULL:
                    return i, row0
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
        i += 1
    return n, nv


# what the plugin a tag's first metadata names makes of its values (tag_plugin_class)
P_OTHER, P_SCALARS, P_TEXT, P_HPARAMS, P_HISTOGRAMS = 0, 1, 2, 3, 4
PLUGIN_CLASS = {"scalars": P_SCALARS, "text": P_TEXT, "hparams": P_HPARAMS, "histograms": P_HISTOGRAMS}


@njit(cache=True, nogil=True)
def tag_groups(buf, vals):
    """Group Summary.Values by tag in one pass (an open-addressing table on the tag hash).

    Returns (group per value, first value of each group, first value of each group that carries
    plugin metadata or -1, collided): groups are numbered in the order of their hashes, as
    np.unique numbers them. `collided`: two different tag names share a hash (then group by the
    names themselves).
    """
    n = vals.shape[0]
    group = np.empty(n, np.int64)
    first, first_plugin, hashes = np.empty(16, np.int64), np.empty(16, np.int64), np.empty(16, np.int64)
    table = np.full(64, -1, np.int64)  # slot -> group; kept at most half full
    r, k, collided = _group_into(buf, vals, 0, 0, False, group, first, first_plugin, hashes, table)
    while r < n:  # value r starts a group there is no room for
        if k == first.shape[0]:
            first, first_plugin, hashes = grown(first, k), grown(first_plugin, k), grown(hashes, k)
        if 2 * (k + 1) > table.shape[0]:
            table = np.full(4 * table.shape[0], -1, np.int64)
            mask = table.shape[0] - 1
            for j in range(k):
                t = hashes[j] & mask
                while table[t] >= 0:
                    t = (t + 1) & mask
                table[t] = j
        r, k, collided = _group_into(buf, vals, r, k, collided, group, first, first_plugin, hashes, table)
    order = np.argsort(hashes[:k], kind="mergesort")
    rank = np.empty(k, np.int64)
    rank[order] = np.arange(k)
    for r in range(n):
        group[r] = rank[group[r]]
    return group, first[:k][order], first_plugin[:k][order], collided


@njit_without_refcounts(cache=True, nogil=True)
def _group_into(buf, vals, r, k, collided, group, first, first_plugin, hashes, table):
    """tag_groups' pass from value r, with k groups found, into arrays it is given (no reference
    counts taken per value); returns (r, k, collided): r < n when value r starts a group that
    has no room (grow the group arrays or the table, and go on from r)."""
    n = vals.shape[0]
    mask = table.shape[0] - 1
    while r < n:
        h = vals[r, VC_TAG_HASH]
        s = h & mask
        while table[s] >= 0 and hashes[table[s]] != h:
            s = (s + 1) & mask
        g = table[s]
        if g < 0:
            if k == first.shape[0] or 2 * (k + 1) > table.shape[0]:
                return r, k, collided
            g = k
            first[g] = r
            first_plugin[g] = -1
            hashes[g] = h
            table[s] = g
            k += 1
        elif not collided:
            a, b, ln = vals[r, VC_TAG_OFF], vals[first[g], VC_TAG_OFF], vals[r, VC_TAG_LEN]
            if ln != vals[first[g], VC_TAG_LEN]:
                collided = True
            else:
                for j in range(ln):
                    if buf[a + j] != buf[b + j]:
                        collided = True
                        break
        if first_plugin[g] < 0 and vals[r, VC_PLUGIN_OFF] >= 0:
            first_plugin[g] = r
        group[r] = g
        r += 1
    return r, k, collided


# what split_values' first pass finds of a value (bits, several may hold)
_SCALAR, _TEXT, _HPARAMS, _HISTO = 1, 2, 4, 8


@njit(cache=True, nogil=True)
def split_values(vals, group, plugin_class, step, wall, fvals):
    """Sort Summary.Values by what they are, in two passes (what each is and how many, then
    fill).

    `plugin_class`: per tag group, P_*. Returns the scalars (tag code, step, wall time, value);
    the rows of the values that are text, of hparams' tags, and histograms; and the counts of
    the values that are none of scalar, text or hparams: [histograms, images, audio, other
    tensors].
    """
    n = vals.shape[0]
    flags = np.zeros(n, np.int8)
    counts = np.zeros(4, np.int64)
    sizes = np.zeros(4, np.int64)  # scalars, text, hparams, histograms
    for r in range(n):
        kind = vals[r, VC_KIND]
        cls = plugin_class[group[r]]
        f = 0
        if kind == V_SIMPLE or (kind == V_TENSOR_NUM and cls == P_SCALARS):
            f |= _SCALAR
        if cls == P_TEXT and kind == V_TENSOR_STR:
            f |= _TEXT
        if cls == P_HPARAMS:
            f |= _HPARAMS
        if kind == V_HISTO or (cls == P_HISTOGRAMS and kind == V_TENSOR_OTHER):
            f |= _HISTO
        flags[r] = f
        for b in range(4):
            sizes[b] += (f >> b) & 1
        if f & (_SCALAR | _TEXT | _HPARAMS) == 0:
            if f & _HISTO:
                counts[0] += 1
            elif kind == V_IMAGE:
                counts[1] += 1
            elif kind == V_AUDIO:
                counts[2] += 1
            elif kind in (V_TENSOR_NUM, V_TENSOR_STR, V_TENSOR_OTHER):
                counts[3] += 1
    code = np.empty(sizes[0], np.int32)
    s_step = np.empty(sizes[0], np.int64)
    s_wall = np.empty(sizes[0], np.float64)
    s_value = np.empty(sizes[0], np.float64)
    text_rows = np.empty(sizes[1], np.int64)
    hparams_rows = np.empty(sizes[2], np.int64)
    histo_rows = np.empty(sizes[3], np.int64)
    i = t = h = m = 0
    for r in range(n):
        f = flags[r]
        if f & _SCALAR:
            rec = vals[r, VC_REC]
            code[i] = group[r]
            s_step[i] = step[rec]
            s_wall[i] = wall[rec]
            s_value[i] = fvals[r]
            i += 1
        if f & _TEXT:
            text_rows[t] = r
            t += 1
        if f & _HPARAMS:
            hparams_rows[h] = r
            h += 1
        if f & _HISTO:
            histo_rows[m] = r
            m += 1
    return code, s_step, s_wall, s_value, text_rows, hparams_rows, histo_rows, counts
