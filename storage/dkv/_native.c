/* storage.dkv._native: compiled inner loops of DKV's read path.
 *
 * Loops that cost a Python bytecode per bit, field or entry and dominate point gets and
 * prefix scans (README, "DKV against RocksDB"):
 *
 *   bloom_first(rows, start, key, h) -> int
 *       the first filter row at or after `start` whose key range holds `key` and whose
 *       Bloom filter may contain it; -1 if none.
 *   decode_block(raw, expect) -> (keys, seqs, values)
 *       a decompressed SSTable data block split into parallel lists.
 *   block_get(raw, expect, key) -> (seq, value) | None
 *       a point lookup in a decompressed data block, without building its lists.
 *   block_range(raw, expect, start, end) -> (keys, seqs, values)
 *       the same for only the entries in [start, end): what a scan reads of a block.
 *   merge_live(parts) -> [(key, value)]
 *       one chunk of a scan's merge: newest version per key, tombstones dropped.
 *
 * The pure-Python functions they replace stay in bloom.py, sstable.py and merge.py: they are the
 * reference the tests compare these with, and the fallback where no C compiler was found
 * at install time. Formats are specified there (Bloom policy dkv.bloom.xxh64-dh.v1 in
 * bloom.py; raw_block in sstable.py); a change to either must change both.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static inline uint32_t rd_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t rd_u64(const unsigned char *p) {
    return (uint64_t)rd_u32(p) | (uint64_t)rd_u32(p + 4) << 32;
}

/* memcmp order of bytes objects, as Python's bytes comparison. */
static inline int bytes_cmp(const char *a, Py_ssize_t la, const char *b, Py_ssize_t lb) {
    int c = memcmp(a, b, (size_t)(la < lb ? la : lb));
    if (c) return c;
    return (la > lb) - (la < lb);
}

/* Bloom policy dkv.bloom.xxh64-dh.v1: probe i tests bit (h1 + i*h2) mod m, with
 * h1 = h & 0xFFFFFFFF and h2 = (h >> 32) | 1; bit b is (byte b >> 3) & (1 << (b & 7)). */
static inline int bloom_probe(const unsigned char *bits, uint64_t m, long k, uint64_t h) {
    uint64_t b = (h & 0xFFFFFFFFu) % m;
    uint64_t step = ((h >> 32) | 1u) % m;
    for (long i = 0; i < k; i++) {
        if (!(bits[b >> 3] >> (b & 7) & 1)) return 0;
        b += step;
        if (b >= m) b -= m;
    }
    return 1;
}

static int row_fields(PyObject *row, Py_ssize_t i, PyObject **mn, PyObject **mx,
                      PyObject **bits, uint64_t *m, long *k) {
    if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) < 5) {
        PyErr_Format(PyExc_TypeError, "bloom_first: row %zd is not a (min, max, bits, m, k, ...) tuple", i);
        return -1;
    }
    *mn = PyTuple_GET_ITEM(row, 0);
    *mx = PyTuple_GET_ITEM(row, 1);
    *bits = PyTuple_GET_ITEM(row, 2);
    if (!PyBytes_Check(*mn) || !PyBytes_Check(*mx) || !PyBytes_Check(*bits)) {
        PyErr_Format(PyExc_TypeError, "bloom_first: row %zd: min, max and bits must be bytes", i);
        return -1;
    }
    *m = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(row, 3));
    *k = PyLong_AsLong(PyTuple_GET_ITEM(row, 4));
    if (PyErr_Occurred()) return -1;
    if (*m == 0 || *m > (uint64_t)PyBytes_GET_SIZE(*bits) * 8) {
        PyErr_Format(PyExc_ValueError, "bloom_first: row %zd: m=%llu does not fit %zd filter bytes",
                     i, (unsigned long long)*m, PyBytes_GET_SIZE(*bits));
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(bloom_first_doc,
"bloom_first(rows, start, key, h) -> int\n\n"
"rows: list of tuples (min_key: bytes, max_key: bytes, bits: bytes, m: int, k: int, ...);\n"
"start: first row index to test; key: bytes; h: xxh64(key) (bloom.key_hash).\n"
"Returns the index of the first row >= start with min_key <= key <= max_key whose filter\n"
"may contain key, or -1. Raises TypeError/ValueError on a malformed row.");

static PyObject *bloom_first(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "bloom_first(rows, start, key, h) takes 4 arguments");
        return NULL;
    }
    PyObject *rows = args[0], *key = args[2];
    if (!PyList_Check(rows) || !PyBytes_Check(key)) {
        PyErr_SetString(PyExc_TypeError, "bloom_first: rows must be a list and key bytes");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    uint64_t h = PyLong_AsUnsignedLongLong(args[3]);
    if (PyErr_Occurred()) return NULL;
    const char *kp = PyBytes_AS_STRING(key);
    Py_ssize_t kl = PyBytes_GET_SIZE(key);
    Py_ssize_t n = PyList_GET_SIZE(rows);
    for (Py_ssize_t i = start < 0 ? 0 : start; i < n; i++) {
        PyObject *mn, *mx, *bits;
        uint64_t m;
        long k;
        if (row_fields(PyList_GET_ITEM(rows, i), i, &mn, &mx, &bits, &m, &k) < 0) return NULL;
        if (bytes_cmp(kp, kl, PyBytes_AS_STRING(mn), PyBytes_GET_SIZE(mn)) < 0) continue;
        if (bytes_cmp(kp, kl, PyBytes_AS_STRING(mx), PyBytes_GET_SIZE(mx)) > 0) continue;
        if (bloom_probe((const unsigned char *)PyBytes_AS_STRING(bits), m, k, h))
            return PyLong_FromSsize_t(i);
    }
    return PyLong_FromLong(-1);
}

PyDoc_STRVAR(bloom_may_contain_doc,
"bloom_may_contain(bits, m, k, h) -> bool\n\n"
"Probes one filter: bits (bytes, m <= 8 * len(bits), m > 0), k probes, h = xxh64(key).\n"
"False only if the key was certainly not added.");

static PyObject *bloom_may_contain(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "bloom_may_contain(bits: bytes, m, k, h)");
        return NULL;
    }
    uint64_t m = PyLong_AsUnsignedLongLong(args[1]);
    long k = PyLong_AsLong(args[2]);
    uint64_t h = PyLong_AsUnsignedLongLong(args[3]);
    if (PyErr_Occurred()) return NULL;
    if (m == 0 || m > (uint64_t)PyBytes_GET_SIZE(args[0]) * 8) {
        PyErr_SetString(PyExc_ValueError, "bloom_may_contain: m does not fit the filter bytes");
        return NULL;
    }
    return PyBool_FromLong(bloom_probe((const unsigned char *)PyBytes_AS_STRING(args[0]), m, k, h));
}

/* Checks the fixed part of a raw block against `expect` and its length; sets *ksum. */
static int block_header(const unsigned char *raw, Py_ssize_t len, Py_ssize_t expect,
                        uint64_t *ksum) {
    if (len < 4) {
        PyErr_Format(PyExc_ValueError, "block of %zd bytes has no entry count", len);
        return -1;
    }
    Py_ssize_t n = (Py_ssize_t)rd_u32(raw);
    if (n != expect) {
        PyErr_Format(PyExc_ValueError, "%zd entries, index says %zd", n, expect);
        return -1;
    }
    /* 17 fixed bytes per entry; 64-bit arithmetic so a huge n cannot overflow. */
    if ((uint64_t)4 + (uint64_t)17 * (uint64_t)n > (uint64_t)len) {
        PyErr_SetString(PyExc_ValueError, "lengths do not add up to the block size");
        return -1;
    }
    uint64_t ks = 0, vs = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        ks += rd_u32(raw + 4 + 4 * i);
        vs += rd_u32(raw + 4 + 4 * n + 4 * i);
    }
    if (4 + 17 * (uint64_t)n + ks + vs != (uint64_t)len) {
        PyErr_SetString(PyExc_ValueError, "lengths do not add up to the block size");
        return -1;
    }
    *ksum = ks;
    return 0;
}

PyDoc_STRVAR(block_get_doc,
"block_get(raw, expect, key) -> (seq, value) | None\n\n"
"Binary search for key in a decompressed data block (format: sstable.py, raw_block)\n"
"without building its lists. Returns (seq, value bytes), (seq, None) for a tombstone, or\n"
"None if absent. Raises ValueError if the block's count or lengths are malformed or the\n"
"entry found has bad flags.");

static PyObject *block_get(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyBytes_Check(args[0]) || !PyBytes_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "block_get(raw: bytes, expect: int, key: bytes)");
        return NULL;
    }
    const unsigned char *raw = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t len = PyBytes_GET_SIZE(args[0]);
    Py_ssize_t expect = PyLong_AsSsize_t(args[1]);
    if (expect == -1 && PyErr_Occurred()) return NULL;
    uint64_t ksum;
    if (block_header(raw, len, expect, &ksum) < 0) return NULL;
    Py_ssize_t n = expect;
    const char *key = PyBytes_AS_STRING(args[2]);
    Py_ssize_t kl = PyBytes_GET_SIZE(args[2]);
    const unsigned char *klens = raw + 4;
    uint64_t kstart = 4 + 17 * (uint64_t)n;
    /* Key offsets: arithmetic for fixed-width keys (the common case), else a prefix sum. */
    uint32_t k0 = n ? rd_u32(klens) : 0;
    int fixed = (uint64_t)k0 * (uint64_t)n == ksum;
    for (Py_ssize_t i = 1; fixed && i < n; i++) fixed = rd_u32(klens + 4 * i) == k0;
    uint64_t stack_offs[257];
    uint64_t *offs = NULL;
    if (!fixed) {
        offs = n < 256 ? stack_offs : PyMem_Malloc(sizeof(uint64_t) * (size_t)(n + 1));
        if (!offs) return PyErr_NoMemory();
        offs[0] = kstart;
        for (Py_ssize_t i = 0; i < n; i++) offs[i + 1] = offs[i] + rd_u32(klens + 4 * i);
    }
    Py_ssize_t lo = 0, hi = n;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) >> 1;
        uint64_t a = fixed ? kstart + (uint64_t)k0 * mid : offs[mid];
        Py_ssize_t ml = fixed ? k0 : (Py_ssize_t)(offs[mid + 1] - offs[mid]);
        if (bytes_cmp((const char *)raw + a, ml, key, kl) < 0) lo = mid + 1;
        else hi = mid;
    }
    int found = 0;
    if (lo < n) {
        uint64_t a = fixed ? kstart + (uint64_t)k0 * lo : offs[lo];
        Py_ssize_t ml = fixed ? k0 : (Py_ssize_t)(offs[lo + 1] - offs[lo]);
        found = bytes_cmp((const char *)raw + a, ml, key, kl) == 0;
    }
    if (offs && offs != stack_offs) PyMem_Free(offs);
    if (!found) Py_RETURN_NONE;
    uint8_t flag = raw[4 + 16 * n + lo];
    uint32_t vl = rd_u32(raw + 4 + 4 * n + 4 * lo);
    if (flag > 1 || (flag && vl)) {
        PyErr_SetString(PyExc_ValueError, flag > 1 ? "unknown entry flags" : "tombstone with a value");
        return NULL;
    }
    uint64_t voff = kstart + ksum;
    for (Py_ssize_t i = 0; i < lo; i++) voff += rd_u32(raw + 4 + 4 * n + 4 * i);
    PyObject *seq = PyLong_FromUnsignedLongLong(rd_u64(raw + 4 + 8 * n + 8 * lo));
    if (!seq) return NULL;
    if (flag) return Py_BuildValue("(NO)", seq, Py_None);
    return Py_BuildValue("(Ny#)", seq, (const char *)raw + voff, (Py_ssize_t)vl);
}

PyDoc_STRVAR(decode_block_doc,
"decode_block(raw, expect) -> (keys, seqs, values)\n\n"
"Splits a decompressed data block (format: sstable.py, raw_block) into parallel lists:\n"
"keys (bytes), seqs (int), values (bytes, or None for a tombstone). expect is the entry\n"
"count the sparse index gives. Raises ValueError naming what is malformed (entry count,\n"
"lengths, flags, a tombstone with a value, keys not strictly ascending).");

static PyObject *decode_block(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "decode_block(raw: bytes, expect: int)");
        return NULL;
    }
    const unsigned char *raw = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t len = PyBytes_GET_SIZE(args[0]);
    Py_ssize_t expect = PyLong_AsSsize_t(args[1]);
    if (expect == -1 && PyErr_Occurred()) return NULL;
    uint64_t ksum;
    if (block_header(raw, len, expect, &ksum) < 0) return NULL;
    Py_ssize_t n = expect;
    const unsigned char *klens = raw + 4, *vlens = raw + 4 + 4 * n;
    const unsigned char *seqp = raw + 4 + 8 * n, *flags = raw + 4 + 16 * n;
    uint64_t kstart = 4 + 17 * (uint64_t)n;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (flags[i] > 1) {
            PyErr_SetString(PyExc_ValueError, "unknown entry flags");
            return NULL;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (flags[i] && rd_u32(vlens + 4 * i)) {
            PyErr_SetString(PyExc_ValueError, "tombstone with a value");
            return NULL;
        }
    }
    PyObject *keys = PyList_New(n), *seqs = PyList_New(n), *values = PyList_New(n);
    if (!keys || !seqs || !values) goto fail;
    const unsigned char *kp = raw + kstart, *vp = raw + kstart + ksum;
    const unsigned char *prev = NULL;
    uint32_t prevlen = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t kl = rd_u32(klens + 4 * i), vl = rd_u32(vlens + 4 * i);
        if (prev != NULL && bytes_cmp((const char *)prev, prevlen, (const char *)kp, kl) >= 0) {
            PyErr_SetString(PyExc_ValueError, "keys out of order");
            goto fail;
        }
        PyObject *k = PyBytes_FromStringAndSize((const char *)kp, kl);
        if (!k) goto fail;
        PyList_SET_ITEM(keys, i, k);
        PyObject *s = PyLong_FromUnsignedLongLong(rd_u64(seqp + 8 * i));
        if (!s) goto fail;
        PyList_SET_ITEM(seqs, i, s);
        PyObject *v;
        if (flags[i]) {
            v = Py_None;
            Py_INCREF(v);
        } else {
            v = PyBytes_FromStringAndSize((const char *)vp, vl);
            if (!v) goto fail;
        }
        PyList_SET_ITEM(values, i, v);
        prev = kp;
        prevlen = kl;
        kp += kl;
        vp += vl;
    }
    return Py_BuildValue("(NNN)", keys, seqs, values);
fail:
    Py_XDECREF(keys);
    Py_XDECREF(seqs);
    Py_XDECREF(values);
    return NULL;
}


/* Lower bound of key in the block's key column: the first index whose key is >= key. */
static Py_ssize_t key_lower_bound(const unsigned char *raw, const uint64_t *offs, Py_ssize_t n,
                                  const char *key, Py_ssize_t kl) {
    Py_ssize_t lo = 0, hi = n;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) >> 1;
        if (bytes_cmp((const char *)raw + offs[mid], (Py_ssize_t)(offs[mid + 1] - offs[mid]),
                      key, kl) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

PyDoc_STRVAR(block_range_doc,
"block_range(raw, expect, start, end) -> (keys, seqs, values)\n\n"
"Like decode_block, but only the entries with start <= key < end (end None: no bound),\n"
"found by binary search: a scan touching a block builds objects for its own entries\n"
"only. Raises ValueError for a malformed count, lengths or flags, or keys of the range\n"
"not strictly ascending.");

static PyObject *block_range(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyBytes_Check(args[0]) || !PyBytes_Check(args[2])
        || (args[3] != Py_None && !PyBytes_Check(args[3]))) {
        PyErr_SetString(PyExc_TypeError,
                        "block_range(raw: bytes, expect: int, start: bytes, end: bytes | None)");
        return NULL;
    }
    const unsigned char *raw = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t len = PyBytes_GET_SIZE(args[0]);
    Py_ssize_t expect = PyLong_AsSsize_t(args[1]);
    if (expect == -1 && PyErr_Occurred()) return NULL;
    uint64_t ksum;
    if (block_header(raw, len, expect, &ksum) < 0) return NULL;
    Py_ssize_t n = expect;
    const unsigned char *klens = raw + 4, *vlens = raw + 4 + 4 * n;
    const unsigned char *seqp = raw + 4 + 8 * n, *flags = raw + 4 + 16 * n;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (flags[i] > 1) {
            PyErr_SetString(PyExc_ValueError, "unknown entry flags");
            return NULL;
        }
        if (flags[i] && rd_u32(vlens + 4 * i)) {
            PyErr_SetString(PyExc_ValueError, "tombstone with a value");
            return NULL;
        }
    }
    uint64_t stack_offs[2 * 257];
    uint64_t *koffs = n < 256 ? stack_offs : PyMem_Malloc(sizeof(uint64_t) * 2 * (size_t)(n + 1));
    if (!koffs) return PyErr_NoMemory();
    uint64_t *voffs = koffs + (n + 1);
    koffs[0] = 4 + 17 * (uint64_t)n;
    voffs[0] = koffs[0] + ksum;
    for (Py_ssize_t i = 0; i < n; i++) {
        koffs[i + 1] = koffs[i] + rd_u32(klens + 4 * i);
        voffs[i + 1] = voffs[i] + rd_u32(vlens + 4 * i);
    }
    Py_ssize_t lo = key_lower_bound(raw, koffs, n, PyBytes_AS_STRING(args[2]),
                                    PyBytes_GET_SIZE(args[2]));
    Py_ssize_t hi = args[3] == Py_None ? n
        : key_lower_bound(raw, koffs, n, PyBytes_AS_STRING(args[3]), PyBytes_GET_SIZE(args[3]));
    if (hi < lo) hi = lo;
    PyObject *keys = PyList_New(hi - lo), *seqs = PyList_New(hi - lo), *values = PyList_New(hi - lo);
    if (!keys || !seqs || !values) goto fail;
    for (Py_ssize_t i = lo; i < hi; i++) {
        if (i > lo && bytes_cmp((const char *)raw + koffs[i - 1], (Py_ssize_t)(koffs[i] - koffs[i - 1]),
                                (const char *)raw + koffs[i], (Py_ssize_t)(koffs[i + 1] - koffs[i])) >= 0) {
            PyErr_SetString(PyExc_ValueError, "keys out of order");
            goto fail;
        }
        PyObject *k = PyBytes_FromStringAndSize((const char *)raw + koffs[i], (Py_ssize_t)(koffs[i + 1] - koffs[i]));
        if (!k) goto fail;
        PyList_SET_ITEM(keys, i - lo, k);
        PyObject *sq = PyLong_FromUnsignedLongLong(rd_u64(seqp + 8 * i));
        if (!sq) goto fail;
        PyList_SET_ITEM(seqs, i - lo, sq);
        PyObject *v;
        if (flags[i]) {
            v = Py_None;
            Py_INCREF(v);
        } else {
            v = PyBytes_FromStringAndSize((const char *)raw + voffs[i], (Py_ssize_t)(voffs[i + 1] - voffs[i]));
            if (!v) goto fail;
        }
        PyList_SET_ITEM(values, i - lo, v);
    }
    if (koffs != stack_offs) PyMem_Free(koffs);
    return Py_BuildValue("(NNN)", keys, seqs, values);
fail:
    if (koffs != stack_offs) PyMem_Free(koffs);
    Py_XDECREF(keys);
    Py_XDECREF(seqs);
    Py_XDECREF(values);
    return NULL;
}

PyDoc_STRVAR(merge_live_doc,
"merge_live(parts) -> list[(key, value)]\n\n"
"parts: list of (keys, seqs, values, lo, hi): three parallel lists and the slice [lo, hi)\n"
"to merge, or (keys, seqs, values) for all of them; keys ascending and unique within a\n"
"part; values None for tombstones. Returns\n"
"each key once, ascending, with the value of its highest sequence number, dropping keys\n"
"whose newest version is a tombstone. Raises TypeError/ValueError on malformed parts.");

typedef struct {
    PyObject **keys, **seqs, **values;
    Py_ssize_t pos, hi;
} merge_part;

static PyObject *merge_live(PyObject *self, PyObject *parts) {
    if (!PyList_Check(parts)) {
        PyErr_SetString(PyExc_TypeError, "merge_live: parts must be a list");
        return NULL;
    }
    Py_ssize_t np = PyList_GET_SIZE(parts);
    merge_part *p = PyMem_Calloc(np ? (size_t)np : 1, sizeof(merge_part));
    if (!p) return PyErr_NoMemory();
    PyObject *out = NULL;
    for (Py_ssize_t i = 0; i < np; i++) {
        PyObject *t = PyList_GET_ITEM(parts, i);
        if (!PyTuple_Check(t) || (PyTuple_GET_SIZE(t) != 5 && PyTuple_GET_SIZE(t) != 3)
            || !PyList_Check(PyTuple_GET_ITEM(t, 0))
            || !PyList_Check(PyTuple_GET_ITEM(t, 1)) || !PyList_Check(PyTuple_GET_ITEM(t, 2))) {
            PyErr_Format(PyExc_TypeError, "merge_live: part %zd is not (keys, seqs, values[, lo, hi])", i);
            goto done;
        }
        PyObject *k = PyTuple_GET_ITEM(t, 0), *s = PyTuple_GET_ITEM(t, 1), *v = PyTuple_GET_ITEM(t, 2);
        Py_ssize_t n = PyList_GET_SIZE(k), lo = 0, hi = n;
        if (PyTuple_GET_SIZE(t) == 5) {
            lo = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, 3));
            hi = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, 4));
            if (PyErr_Occurred()) goto done;
        }
        if (PyList_GET_SIZE(s) != n || PyList_GET_SIZE(v) != n || lo < 0 || hi > n || lo > hi) {
            PyErr_Format(PyExc_ValueError, "merge_live: part %zd: lengths or bounds disagree", i);
            goto done;
        }
        for (Py_ssize_t j = lo; j < hi; j++) {
            if (!PyBytes_Check(PyList_GET_ITEM(k, j))) {
                PyErr_Format(PyExc_TypeError, "merge_live: part %zd: key %zd is not bytes", i, j);
                goto done;
            }
        }
        p[i].keys = ((PyListObject *)k)->ob_item;
        p[i].seqs = ((PyListObject *)s)->ob_item;
        p[i].values = ((PyListObject *)v)->ob_item;
        p[i].pos = lo;
        p[i].hi = hi;
    }
    out = PyList_New(0);
    if (!out) goto done;
    for (;;) {
        Py_ssize_t best = -1;
        PyObject *bk = NULL;
        for (Py_ssize_t i = 0; i < np; i++) {
            if (p[i].pos >= p[i].hi) continue;
            PyObject *k = p[i].keys[p[i].pos];
            int c = best < 0 ? -1 : bytes_cmp(PyBytes_AS_STRING(k), PyBytes_GET_SIZE(k),
                                              PyBytes_AS_STRING(bk), PyBytes_GET_SIZE(bk));
            if (c == 0) {  /* same key in two parts: the higher sequence number wins */
                int newer = PyObject_RichCompareBool(p[i].seqs[p[i].pos],
                                                     p[best].seqs[p[best].pos], Py_GT);
                if (newer < 0) goto fail;
                c = newer ? -1 : 1;
            }
            if (c < 0) {
                best = i;
                bk = k;
            }
        }
        if (best < 0) break;
        PyObject *v = p[best].values[p[best].pos];
        if (v != Py_None) {
            PyObject *pair = PyTuple_Pack(2, bk, v);
            if (!pair) goto fail;
            int rc = PyList_Append(out, pair);
            Py_DECREF(pair);
            if (rc < 0) goto fail;
        }
        /* Skip every older version of bk (after reading it: bk is borrowed from its part). */
        for (Py_ssize_t i = 0; i < np; i++) {
            if (i == best || p[i].pos >= p[i].hi) continue;
            PyObject *k = p[i].keys[p[i].pos];
            if (bytes_cmp(PyBytes_AS_STRING(k), PyBytes_GET_SIZE(k), PyBytes_AS_STRING(bk),
                          PyBytes_GET_SIZE(bk)) == 0)
                p[i].pos++;
        }
        p[best].pos++;
    }
    goto done;
fail:
    Py_CLEAR(out);
done:
    PyMem_Free(p);
    return out;
}

static PyMethodDef methods[] = {
    {"bloom_first", (PyCFunction)(void (*)(void))bloom_first, METH_FASTCALL, bloom_first_doc},
    {"bloom_may_contain", (PyCFunction)(void (*)(void))bloom_may_contain, METH_FASTCALL,
     bloom_may_contain_doc},
    {"decode_block", (PyCFunction)(void (*)(void))decode_block, METH_FASTCALL, decode_block_doc},
    {"block_get", (PyCFunction)(void (*)(void))block_get, METH_FASTCALL, block_get_doc},
    {"block_range", (PyCFunction)(void (*)(void))block_range, METH_FASTCALL, block_range_doc},
    {"merge_live", (PyCFunction)merge_live, METH_O, merge_live_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "storage.dkv._native",
    "Compiled inner loops of DKV's read path (Bloom probes, data block decoding).", -1, methods,
};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
