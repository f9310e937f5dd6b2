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

/* A decompressed data block whose count and lengths block_header checked. */
typedef struct {
    const unsigned char *raw, *klens, *vlens, *seqs, *flags;
    Py_ssize_t n;
    uint64_t ksum;
} raw_block;

/* Checks the header and every entry's flags (0 = value, 1 = tombstone without a value). */
static int parse_block(PyObject *raw_obj, PyObject *expect_obj, raw_block *b) {
    b->raw = (const unsigned char *)PyBytes_AS_STRING(raw_obj);
    Py_ssize_t expect = PyLong_AsSsize_t(expect_obj);
    if (expect == -1 && PyErr_Occurred()) return -1;
    if (block_header(b->raw, PyBytes_GET_SIZE(raw_obj), expect, &b->ksum) < 0) return -1;
    Py_ssize_t n = b->n = expect;
    b->klens = b->raw + 4;
    b->vlens = b->raw + 4 + 4 * n;
    b->seqs = b->raw + 4 + 8 * n;
    b->flags = b->raw + 4 + 16 * n;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (b->flags[i] > 1) {
            PyErr_SetString(PyExc_ValueError, "unknown entry flags");
            return -1;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (b->flags[i] && rd_u32(b->vlens + 4 * i)) {
            PyErr_SetString(PyExc_ValueError, "tombstone with a value");
            return -1;
        }
    }
    return 0;
}

/* Parallel lists of entries [lo, hi) at the given key/value offsets (n + 1 each);
 * raises ValueError if their keys are not strictly ascending. */
static PyObject *entry_lists(const raw_block *b, const uint64_t *koffs, const uint64_t *voffs,
                             Py_ssize_t lo, Py_ssize_t hi) {
    const unsigned char *raw = b->raw;
    PyObject *keys = PyList_New(hi - lo), *seqs = PyList_New(hi - lo), *values = PyList_New(hi - lo);
    if (!keys || !seqs || !values) goto fail;
    for (Py_ssize_t i = lo; i < hi; i++) {
        Py_ssize_t kl = (Py_ssize_t)(koffs[i + 1] - koffs[i]);
        if (i > lo && bytes_cmp((const char *)raw + koffs[i - 1], (Py_ssize_t)(koffs[i] - koffs[i - 1]),
                                (const char *)raw + koffs[i], kl) >= 0) {
            PyErr_SetString(PyExc_ValueError, "keys out of order");
            goto fail;
        }
        PyObject *k = PyBytes_FromStringAndSize((const char *)raw + koffs[i], kl);
        if (!k) goto fail;
        PyList_SET_ITEM(keys, i - lo, k);
        PyObject *sq = PyLong_FromUnsignedLongLong(rd_u64(b->seqs + 8 * i));
        if (!sq) goto fail;
        PyList_SET_ITEM(seqs, i - lo, sq);
        PyObject *v;
        if (b->flags[i]) {
            v = Py_None;
            Py_INCREF(v);
        } else {
            v = PyBytes_FromStringAndSize((const char *)raw + voffs[i], (Py_ssize_t)(voffs[i + 1] - voffs[i]));
            if (!v) goto fail;
        }
        PyList_SET_ITEM(values, i - lo, v);
    }
    /* Lists of bytes, ints and None that DKV only reads: untracked, they cost the cyclic
     * collector nothing (each scan or get makes several). Callers must not put containers
     * in them. */
    PyObject_GC_UnTrack(keys);
    PyObject_GC_UnTrack(seqs);
    PyObject_GC_UnTrack(values);
    return Py_BuildValue("(NNN)", keys, seqs, values);
fail:
    Py_XDECREF(keys);
    Py_XDECREF(seqs);
    Py_XDECREF(values);
    return NULL;
}

/* Key and value offsets of every entry (n + 1 each) into koffs (2 * (n + 1) slots). */
static void entry_offsets(const raw_block *b, uint64_t *koffs) {
    Py_ssize_t n = b->n;
    uint64_t *voffs = koffs + (n + 1);
    koffs[0] = 4 + 17 * (uint64_t)n;
    voffs[0] = koffs[0] + b->ksum;
    for (Py_ssize_t i = 0; i < n; i++) {
        koffs[i + 1] = koffs[i] + rd_u32(b->klens + 4 * i);
        voffs[i + 1] = voffs[i] + rd_u32(b->vlens + 4 * i);
    }
}

/* Blocks of fewer entries keep their offset arrays on the stack. */
#define STACK_ENTRIES 256

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

PyDoc_STRVAR(block_get_doc,
"block_get(raw, expect, key) -> (seq, value) | None\n\n"
"Binary search for key in a decompressed data block (format: sstable.py, raw_block)\n"
"without building its lists. Returns (seq, value bytes), (seq, None) for a tombstone, or\n"
"None if absent. Raises ValueError if the block's count, lengths or flags are malformed.");

static PyObject *block_get(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyBytes_Check(args[0]) || !PyBytes_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "block_get(raw: bytes, expect: int, key: bytes)");
        return NULL;
    }
    raw_block b;
    if (parse_block(args[0], args[1], &b) < 0) return NULL;
    uint64_t stack_offs[2 * (STACK_ENTRIES + 1)];
    uint64_t *koffs = b.n < STACK_ENTRIES ? stack_offs
        : PyMem_Malloc(sizeof(uint64_t) * 2 * (size_t)(b.n + 1));
    if (!koffs) return PyErr_NoMemory();
    entry_offsets(&b, koffs);
    const char *key = PyBytes_AS_STRING(args[2]);
    Py_ssize_t kl = PyBytes_GET_SIZE(args[2]);
    Py_ssize_t i = key_lower_bound(b.raw, koffs, b.n, key, kl);
    PyObject *out;
    if (i == b.n || bytes_cmp((const char *)b.raw + koffs[i], (Py_ssize_t)(koffs[i + 1] - koffs[i]),
                              key, kl) != 0) {
        out = Py_None;
        Py_INCREF(out);
    } else {
        PyObject *seq = PyLong_FromUnsignedLongLong(rd_u64(b.seqs + 8 * i));
        const uint64_t *voffs = koffs + (b.n + 1);
        out = !seq ? NULL
            : b.flags[i] ? Py_BuildValue("(NO)", seq, Py_None)
            : Py_BuildValue("(Ny#)", seq, (const char *)b.raw + voffs[i],
                            (Py_ssize_t)(voffs[i + 1] - voffs[i]));
    }
    if (koffs != stack_offs) PyMem_Free(koffs);
    return out;
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
    raw_block b;
    if (parse_block(args[0], args[1], &b) < 0) return NULL;
    uint64_t stack_offs[2 * (STACK_ENTRIES + 1)];
    uint64_t *koffs = b.n < STACK_ENTRIES ? stack_offs
        : PyMem_Malloc(sizeof(uint64_t) * 2 * (size_t)(b.n + 1));
    if (!koffs) return PyErr_NoMemory();
    entry_offsets(&b, koffs);
    PyObject *out = entry_lists(&b, koffs, koffs + (b.n + 1), 0, b.n);
    if (koffs != stack_offs) PyMem_Free(koffs);
    return out;
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
    raw_block b;
    if (parse_block(args[0], args[1], &b) < 0) return NULL;
    uint64_t stack_offs[2 * (STACK_ENTRIES + 1)];
    uint64_t *koffs = b.n < STACK_ENTRIES ? stack_offs
        : PyMem_Malloc(sizeof(uint64_t) * 2 * (size_t)(b.n + 1));
    if (!koffs) return PyErr_NoMemory();
    entry_offsets(&b, koffs);
    Py_ssize_t lo = key_lower_bound(b.raw, koffs, b.n, PyBytes_AS_STRING(args[2]),
                                    PyBytes_GET_SIZE(args[2]));
    Py_ssize_t hi = args[3] == Py_None ? b.n
        : key_lower_bound(b.raw, koffs, b.n, PyBytes_AS_STRING(args[3]), PyBytes_GET_SIZE(args[3]));
    PyObject *out = entry_lists(&b, koffs, koffs + (b.n + 1), lo, hi < lo ? lo : hi);
    if (koffs != stack_offs) PyMem_Free(koffs);
    return out;
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
            /* Two bytes objects cannot form a cycle: untrack the pair now, as CPython's
             * collector would at its first pass, so results a caller keeps never make
             * full collections (which traverse the whole heap) more frequent. */
            PyObject_GC_UnTrack(pair);
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
    PyObject_GC_UnTrack(out);  /* holds untracked pairs only; see above */
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
