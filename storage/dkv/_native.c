/* dkvstream.storage.dkv._native: compiled inner loops of DKV's read path and memtable writes.
 *
 * Loops that cost a Python bytecode per bit, field or entry and dominate point gets and
 * prefix scans (docs/benchmarks.md, DKV against RocksDB):
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
 *   merge_spans_live(parts, spans) -> [(key, value)]
 *       merge_live plus the in-range entries of each table's decompressed blocks, read
 *       in place: a short scan's block walk and merge in one call.
 *   merge_spans_columns(parts, spans, drop_tombstones) -> (keys, seqs, values)
 *       the same merge as columns of each key's newest version, tombstones kept or
 *       dropped: one key range of a compaction, for encode_blocks.
 *   encode_blocks(keys, seqs, values, block_bytes) -> (raw_blocks, rows_used)
 *       sorted entries cut into SSTable data blocks and encoded (raw_block), as the
 *       builder's add_columns + _finish_block would: a table flush without a Python
 *       step per block.
 *   entry_ends(keys, values) -> bytes
 *       the cumulative raw bytes of sorted rows as int64s, where the block and table cuts
 *       of a flush or compaction fall, without a Python step per row.
 *   seq_bounds(seqs) -> (min, max)
 *       a table's sequence-number bounds, one C comparison per row.
 *   sort_bytes(keys) -> None
 *       sorts a list of bytes in place in bytes order (the memtable's pending keys):
 *       a C comparison instead of a rich comparison per step.
 *   memtable_put(d, keys, first_seq, values, entry_overhead) -> (new_keys, delta_bytes)
 *       the write path's one loop: d[keys[i]] = (first_seq + i, values[i]) for every i,
 *       in order, with one cold dict probe per write (Memtable.put_batch).
 *   memtable_columns(d, keys) -> (seqs, values)
 *       the memtable entries of sorted keys as columns, one dict lookup per key: a
 *       flush's and a memtable scan's columns (reference: memtable.columns_py).
 *   key_hashes(keys) -> bytes
 *       xxh64 of every key of a table, the Bloom policy's hash (reference: xxhash).
 *   bloom_bits(hashes, m, k) -> bytes
 *       a flush's Bloom filter bits from its keys' xxh64 hashes, walking each key's k
 *       probes (reference: bloom.build_bloom_py, byte-identical).
 *   concat_rows(n, parts) -> [bytes]
 *       n rows, each the concatenation of every part's row (a constant, fixed-width rows
 *       of a buffer, or Arrow-style data + offsets): a bulk state access's DKV keys from
 *       columns, without a Python step per key (reference: state.concat_rows_py, dkvstream.operators.api).
 *   memtable_get_many(d, keys) -> (values, missing)
 *       every key's memtable answer in one loop, and the indices to look up further
 *       (DKV.get_many; reference: memtable.get_many_py).
 *   pack_int_rows(values, fields[, header]) -> [bytes] / unpack_int_rows(raws, fields[, header])
 *       msgpack arrays of int64 fields from and to a row-major int64 buffer: a record
 *       state of int fields read and written as columns (RecordCodec; msgpack-python is
 *       the reference, byte-identical), each after `header` (a RecordCodec schema
 *       version's header; empty by default).
 *
 * The pure-Python functions they replace stay in bloom.py, sstable.py, merge.py and memtable.py: they are the
 * reference the tests compare these with, and the fallback where no C compiler was found
 * at install time. Formats are specified there (Bloom policy dkv.bloom.xxh64-dh.v1 in
 * bloom.py; raw_block in sstable.py); a change to either must change both.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <stdlib.h>

static inline uint32_t rd_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t rd_u64(const unsigned char *p) {
    return (uint64_t)rd_u32(p) | (uint64_t)rd_u32(p + 4) << 32;
}

/* memcmp order of bytes objects, as Python's bytes comparison. Keys are short (16 bytes
 * in the benchmarks, often sharing an 8-byte prefix), where a call to memcmp costs more
 * than the comparison: compare 8 bytes at a time as big-endian words, inline. */
static inline int bytes_cmp(const char *a, Py_ssize_t la, const char *b, Py_ssize_t lb) {
    Py_ssize_t n = la < lb ? la : lb, i = 0;
#if defined(__GNUC__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    for (; i + 8 <= n; i += 8) {
        uint64_t x, y;
        memcpy(&x, a + i, 8);
        memcpy(&y, b + i, 8);
        if (x != y) return __builtin_bswap64(x) < __builtin_bswap64(y) ? -1 : 1;
    }
#endif
    for (; i < n; i++) {
        if (a[i] != b[i]) return (unsigned char)a[i] < (unsigned char)b[i] ? -1 : 1;
    }
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

/* Key and value offsets of a parsed block (n + 1 each; voffs = koffs + n + 1), in `stack`
 * (2 * (STACK_ENTRIES + 1) slots) when the block is small enough, else on the heap.
 * Returns koffs, or NULL with MemoryError set; release with offsets_release. */
static uint64_t *offsets_acquire(const raw_block *b, uint64_t *stack) {
    uint64_t *koffs = b->n < STACK_ENTRIES ? stack
        : PyMem_Malloc(sizeof(uint64_t) * 2 * (size_t)(b->n + 1));
    if (!koffs) {
        PyErr_NoMemory();
        return NULL;
    }
    entry_offsets(b, koffs);
    return koffs;
}

static void offsets_release(uint64_t *koffs, const uint64_t *stack) {
    if (koffs != stack) PyMem_Free(koffs);
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
    uint64_t *koffs = offsets_acquire(&b, stack_offs);
    if (!koffs) return NULL;
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
    offsets_release(koffs, stack_offs);
    return out;
}

/* The entries of a raw block with start <= key < end as entry_lists gives them (start
 * NULL: from the first entry, end NULL: to the last; both bytes otherwise). NULL with an
 * exception set if the block is malformed. */
static PyObject *block_entries(PyObject *raw, PyObject *expect, PyObject *start, PyObject *end) {
    raw_block b;
    if (parse_block(raw, expect, &b) < 0) return NULL;
    uint64_t stack_offs[2 * (STACK_ENTRIES + 1)];
    uint64_t *koffs = offsets_acquire(&b, stack_offs);
    if (!koffs) return NULL;
    Py_ssize_t lo = !start ? 0
        : key_lower_bound(b.raw, koffs, b.n, PyBytes_AS_STRING(start), PyBytes_GET_SIZE(start));
    Py_ssize_t hi = !end ? b.n
        : key_lower_bound(b.raw, koffs, b.n, PyBytes_AS_STRING(end), PyBytes_GET_SIZE(end));
    PyObject *out = entry_lists(&b, koffs, koffs + (b.n + 1), lo, hi < lo ? lo : hi);
    offsets_release(koffs, stack_offs);
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
    return block_entries(args[0], args[1], NULL, NULL);
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
    return block_entries(args[0], args[1], args[2], args[3] == Py_None ? NULL : args[3]);
}

PyDoc_STRVAR(merge_live_doc,
"merge_live(parts) -> list[(key, value)]\n\n"
"parts: list of (keys, seqs, values, lo, hi): three parallel lists and the slice [lo, hi)\n"
"to merge, or (keys, seqs, values) for all of them; keys ascending and unique within a\n"
"part; seqs ints in [0, 2**64); values None for tombstones. Returns\n"
"each key once, ascending, with the value of its highest sequence number, dropping keys\n"
"whose newest version is a tombstone. Raises TypeError/ValueError on malformed parts.");

PyDoc_STRVAR(merge_spans_columns_doc,
"merge_spans_columns(parts, spans, drop_tombstones) -> (keys, seqs, values)\n\n"
"The merge of merge_spans_live (same parts, spans and errors) as parallel lists: every\n"
"key once, ascending, with the sequence number and value (None: tombstone) of its\n"
"newest version; keys whose newest version is a tombstone are left out if\n"
"drop_tombstones is true. A compaction's merge of one key range, whose columns go\n"
"straight to the block encoder.");

PyDoc_STRVAR(merge_spans_live_doc,
"merge_spans_live(parts, spans) -> list[(key, value)]\n\n"
"merge_live over parts plus one source per span (raws, counts, start, end): consecutive\n"
"decompressed data blocks of one table (format: sstable.py, raw_block; counts: their\n"
"entry counts per the sparse index) of which the entries with start <= key < end (end\n"
"None: no bound) are read in place: only the pairs returned become Python objects. A\n"
"short scan's whole block walk and merge in one call. Raises ValueError if a block is\n"
"malformed (as decode_block: count, lengths, flags, a tombstone with a value, keys not\n"
"strictly ascending anywhere in the block) or a span's keys do not ascend across its\n"
"blocks; TypeError/ValueError on malformed parts or spans.");

/* The part of one data block a span reads: entries [lo, hi). */
typedef struct {
    const unsigned char *raw, *seqp, *flags;
    const uint64_t *koffs, *voffs;
    Py_ssize_t lo, hi;
} block_view;

/* One sorted source of a merge: a slice of a column batch (keys != NULL), or a span of
 * raw blocks (blk[cur .. nblk)), read in place. */
typedef struct {
    PyObject **keys, **seqs, **values;
    block_view *blk;
    Py_ssize_t nblk, cur;
    Py_ssize_t pos, hi;  /* in the column batch, or in blk[cur] */
} merge_src;

static inline void src_key(const merge_src *s, const char **p, Py_ssize_t *len) {
    if (s->blk) {
        const block_view *b = &s->blk[s->cur];
        *p = (const char *)b->raw + b->koffs[s->pos];
        *len = (Py_ssize_t)(b->koffs[s->pos + 1] - b->koffs[s->pos]);
    } else {
        PyObject *k = s->keys[s->pos];
        *p = PyBytes_AS_STRING(k);
        *len = PyBytes_GET_SIZE(k);
    }
}

static inline int src_seq(const merge_src *s, uint64_t *seq) {
    if (s->blk) {
        *seq = rd_u64(s->blk[s->cur].seqp + 8 * s->pos);
        return 0;
    }
    *seq = PyLong_AsUnsignedLongLong(s->seqs[s->pos]);
    return *seq == (uint64_t)-1 && PyErr_Occurred() ? -1 : 0;
}

/* Moves s to its next entry, into the next block of a span with entries in range. */
static inline void src_advance(merge_src *s) {
    if (++s->pos < s->hi || !s->blk) return;
    while (++s->cur < s->nblk) {
        if (s->blk[s->cur].lo < s->blk[s->cur].hi) {
            s->pos = s->blk[s->cur].lo;
            s->hi = s->blk[s->cur].hi;
            return;
        }
    }
    s->cur = s->nblk - 1;  /* exhausted: pos == hi */
}

/* Checks part i (a tuple (keys, seqs, values[, lo, hi])) and points s at it. */
static int parse_part(PyObject *t, Py_ssize_t i, merge_src *s) {
    if (!PyTuple_Check(t) || (PyTuple_GET_SIZE(t) != 5 && PyTuple_GET_SIZE(t) != 3)
        || !PyList_Check(PyTuple_GET_ITEM(t, 0))
        || !PyList_Check(PyTuple_GET_ITEM(t, 1)) || !PyList_Check(PyTuple_GET_ITEM(t, 2))) {
        PyErr_Format(PyExc_TypeError, "merge_live: part %zd is not (keys, seqs, values[, lo, hi])", i);
        return -1;
    }
    PyObject *k = PyTuple_GET_ITEM(t, 0), *sq = PyTuple_GET_ITEM(t, 1), *v = PyTuple_GET_ITEM(t, 2);
    Py_ssize_t n = PyList_GET_SIZE(k), lo = 0, hi = n;
    if (PyTuple_GET_SIZE(t) == 5) {
        lo = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, 3));
        hi = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, 4));
        if (PyErr_Occurred()) return -1;
    }
    if (PyList_GET_SIZE(sq) != n || PyList_GET_SIZE(v) != n || lo < 0 || hi > n || lo > hi) {
        PyErr_Format(PyExc_ValueError, "merge_live: part %zd: lengths or bounds disagree", i);
        return -1;
    }
    for (Py_ssize_t j = lo; j < hi; j++) {
        if (!PyBytes_Check(PyList_GET_ITEM(k, j))) {
            PyErr_Format(PyExc_TypeError, "merge_live: part %zd: key %zd is not bytes", i, j);
            return -1;
        }
    }
    s->keys = ((PyListObject *)k)->ob_item;
    s->seqs = ((PyListObject *)sq)->ob_item;
    s->values = ((PyListObject *)v)->ob_item;
    s->pos = lo;
    s->hi = hi;
    return 0;
}

/* Whether t is a (raws: list, counts: list of the same length, start: bytes, end: bytes |
 * None) span tuple. */
static int is_span(PyObject *t) {
    return PyTuple_Check(t) && PyTuple_GET_SIZE(t) == 4 && PyList_Check(PyTuple_GET_ITEM(t, 0))
        && PyList_Check(PyTuple_GET_ITEM(t, 1))
        && PyList_GET_SIZE(PyTuple_GET_ITEM(t, 0)) == PyList_GET_SIZE(PyTuple_GET_ITEM(t, 1))
        && PyBytes_Check(PyTuple_GET_ITEM(t, 2))
        && (PyTuple_GET_ITEM(t, 3) == Py_None || PyBytes_Check(PyTuple_GET_ITEM(t, 3)));
}

/* Checks span i's blocks as decode_block does, computes their offsets into *offs
 * (advanced past them) and views into *views (advanced likewise), and points s at the
 * span's first entry in range. */
static int parse_span(PyObject *t, Py_ssize_t i, merge_src *s, uint64_t **offs,
                      block_view **views) {
    if (!is_span(t)) {
        PyErr_Format(PyExc_TypeError, "merge_spans_live: span %zd is not (raws: list, counts: "
                     "list, start: bytes, end: bytes | None) with one count per block", i);
        return -1;
    }
    PyObject *raws = PyTuple_GET_ITEM(t, 0), *counts = PyTuple_GET_ITEM(t, 1);
    PyObject *start = PyTuple_GET_ITEM(t, 2), *end = PyTuple_GET_ITEM(t, 3);
    Py_ssize_t nblk = PyList_GET_SIZE(raws);
    s->blk = *views;
    s->nblk = nblk;
    *views += nblk;
    const char *prev = NULL;  /* the last in-range key of the span's previous blocks */
    Py_ssize_t prev_len = 0;
    for (Py_ssize_t j = 0; j < nblk; j++) {
        PyObject *raw = PyList_GET_ITEM(raws, j);
        if (!PyBytes_Check(raw)) {
            PyErr_Format(PyExc_TypeError, "merge_spans_live: span %zd: block %zd is not bytes", i, j);
            return -1;
        }
        raw_block b;
        if (parse_block(raw, PyList_GET_ITEM(counts, j), &b) < 0) return -1;
        uint64_t *koffs = *offs;
        *offs += 2 * (b.n + 1);
        entry_offsets(&b, koffs);
        for (Py_ssize_t e = 1; e < b.n; e++) {
            if (bytes_cmp((const char *)b.raw + koffs[e - 1], (Py_ssize_t)(koffs[e] - koffs[e - 1]),
                          (const char *)b.raw + koffs[e], (Py_ssize_t)(koffs[e + 1] - koffs[e])) >= 0) {
                PyErr_SetString(PyExc_ValueError, "keys out of order");
                return -1;
            }
        }
        block_view *v = &s->blk[j];
        v->raw = b.raw;
        v->seqp = b.seqs;
        v->flags = b.flags;
        v->koffs = koffs;
        v->voffs = koffs + (b.n + 1);
        v->lo = key_lower_bound(b.raw, koffs, b.n, PyBytes_AS_STRING(start), PyBytes_GET_SIZE(start));
        v->hi = end == Py_None ? b.n
            : key_lower_bound(b.raw, koffs, b.n, PyBytes_AS_STRING(end), PyBytes_GET_SIZE(end));
        if (v->hi < v->lo) v->hi = v->lo;
        if (v->lo < v->hi) {
            const char *first = (const char *)b.raw + koffs[v->lo];
            if (prev && bytes_cmp(prev, prev_len, first,
                                  (Py_ssize_t)(koffs[v->lo + 1] - koffs[v->lo])) >= 0) {
                PyErr_Format(PyExc_ValueError, "span %zd: keys out of order across blocks", i);
                return -1;
            }
            prev = (const char *)b.raw + koffs[v->hi - 1];
            prev_len = (Py_ssize_t)(koffs[v->hi] - koffs[v->hi - 1]);
        }
    }
    s->cur = -1;
    s->pos = s->hi = 0;
    if (nblk) {
        s->cur = 0;
        s->pos = s->blk[0].lo;
        s->hi = s->blk[0].hi;
        if (s->pos >= s->hi) {
            s->pos = s->hi - 1;  /* src_advance steps onto the next block in range */
            src_advance(s);
        }
    }
    return 0;
}

/* What a merge returns: (key, value) pairs of live keys (merge_live, merge_spans_live),
 * or (keys, seqs, values) columns of every key's newest version, tombstones kept or
 * dropped (merge_spans_columns: a compaction's output run). */
typedef enum { MERGE_PAIRS_LIVE, MERGE_COLUMNS, MERGE_COLUMNS_LIVE } merge_mode;

/* Appends the newest version of a key (s's current entry, key bk/bkl) to the output
 * columns. Returns -1 with an exception set on failure. */
static int emit_column_row(const merge_src *s, const char *bk, Py_ssize_t bkl, PyObject *keys,
                           PyObject *seqs, PyObject *values) {
    PyObject *key, *seq, *v;
    if (s->blk) {
        const block_view *b = &s->blk[s->cur];
        key = PyBytes_FromStringAndSize(bk, bkl);
        seq = PyLong_FromUnsignedLongLong(rd_u64(b->seqp + 8 * s->pos));
        if (b->flags[s->pos]) {
            v = Py_None;
            Py_INCREF(v);
        } else {
            v = PyBytes_FromStringAndSize((const char *)b->raw + b->voffs[s->pos],
                                          (Py_ssize_t)(b->voffs[s->pos + 1] - b->voffs[s->pos]));
        }
    } else {
        key = s->keys[s->pos];
        seq = s->seqs[s->pos];
        v = s->values[s->pos];
        Py_INCREF(key);
        Py_INCREF(seq);
        Py_INCREF(v);
    }
    int rc = -1;
    if (key && seq && v && PyList_Append(keys, key) == 0 && PyList_Append(seqs, seq) == 0
        && PyList_Append(values, v) == 0)
        rc = 0;
    Py_XDECREF(key);
    Py_XDECREF(seq);
    Py_XDECREF(v);
    return rc;
}

/* The merge of merge_live, merge_spans_live and merge_spans_columns; spans may be NULL. */
static PyObject *merge_sources(PyObject *parts, PyObject *spans, merge_mode mode) {
    if (!PyList_Check(parts) || (spans && !PyList_Check(spans))) {
        PyErr_SetString(PyExc_TypeError, "merge_live: parts (and spans) must be lists");
        return NULL;
    }
    Py_ssize_t np = PyList_GET_SIZE(parts), nsp = spans ? PyList_GET_SIZE(spans) : 0;
    Py_ssize_t ns = np + nsp;
    /* One allocation for every block's offset arrays and one for the views: a block
     * header's count bounds its entries (it is checked against the block's size before any
     * offset is written). */
    size_t slots = 0, nviews = 0;
    for (Py_ssize_t i = 0; i < nsp; i++) {
        PyObject *t = PyList_GET_ITEM(spans, i);
        if (!is_span(t)) continue;  /* parse_span raises */
        PyObject *raws = PyTuple_GET_ITEM(t, 0);
        for (Py_ssize_t j = 0; j < PyList_GET_SIZE(raws); j++) {
            PyObject *raw = PyList_GET_ITEM(raws, j);
            nviews++;
            if (!PyBytes_Check(raw)) continue;
            Py_ssize_t len = PyBytes_GET_SIZE(raw);
            size_t n = len >= 4 ? rd_u32((const unsigned char *)PyBytes_AS_STRING(raw)) : 0;
            if ((uint64_t)4 + 17 * (uint64_t)n > (uint64_t)len) n = 0;  /* parse_block rejects it */
            slots += 2 * (n + 1);
        }
    }
    merge_src *src = PyMem_Calloc(ns ? (size_t)ns : 1, sizeof(merge_src));
    Py_ssize_t *ties = PyMem_Malloc((ns ? (size_t)ns : 1) * sizeof(Py_ssize_t));
    block_view *views = PyMem_Malloc((nviews ? nviews : 1) * sizeof(block_view));
    uint64_t *offs = PyMem_Malloc((slots ? slots : 1) * sizeof(uint64_t));
    PyObject *out = NULL, *out_seqs = NULL, *out_values = NULL;  /* columns: out holds the keys */
    if (!src || !ties || !views || !offs) {
        PyErr_NoMemory();
        goto done;
    }
    uint64_t *next_offs = offs;
    block_view *next_view = views;
    for (Py_ssize_t i = 0; i < np; i++)
        if (parse_part(PyList_GET_ITEM(parts, i), i, &src[i]) < 0) goto done;
    for (Py_ssize_t i = 0; i < nsp; i++)
        if (parse_span(PyList_GET_ITEM(spans, i), i, &src[np + i], &next_offs, &next_view) < 0)
            goto done;
    out = PyList_New(0);
    if (!out) goto done;
    if (mode != MERGE_PAIRS_LIVE) {
        out_seqs = PyList_New(0);
        out_values = PyList_New(0);
        if (!out_seqs || !out_values) goto fail;
    }
    for (;;) {
        /* best: the source with the smallest key, the newest version of it; ties: the
         * other sources at that key, which skip it. */
        Py_ssize_t best = -1, nties = 0;
        const char *bk = NULL;
        Py_ssize_t bkl = 0;
        for (Py_ssize_t i = 0; i < ns; i++) {
            if (src[i].pos >= src[i].hi) continue;
            const char *k;
            Py_ssize_t kl;
            src_key(&src[i], &k, &kl);
            int c = best < 0 ? -1 : bytes_cmp(k, kl, bk, bkl);
            if (c == 0) {  /* same key in two sources: the higher sequence number wins */
                uint64_t a, b;
                if (src_seq(&src[i], &a) < 0 || src_seq(&src[best], &b) < 0) goto fail;
                if (a > b) {
                    ties[nties++] = best;
                    best = i;
                    bk = k;
                } else {
                    ties[nties++] = i;
                }
            } else if (c < 0) {
                best = i;
                bk = k;
                bkl = kl;
                nties = 0;
            }
        }
        if (best < 0) break;
        merge_src *s = &src[best];
        if (mode != MERGE_PAIRS_LIVE) {
            int tomb = s->blk ? s->blk[s->cur].flags[s->pos] != 0 : s->values[s->pos] == Py_None;
            if (!(tomb && mode == MERGE_COLUMNS_LIVE)
                && emit_column_row(s, bk, bkl, out, out_seqs, out_values) < 0)
                goto fail;
            for (Py_ssize_t t = 0; t < nties; t++) src_advance(&src[ties[t]]);
            src_advance(s);
            continue;
        }
        PyObject *key = NULL, *v = NULL;
        if (s->blk) {
            const block_view *b = &s->blk[s->cur];
            if (!b->flags[s->pos]) {
                key = PyBytes_FromStringAndSize(bk, bkl);
                v = PyBytes_FromStringAndSize((const char *)b->raw + b->voffs[s->pos],
                                              (Py_ssize_t)(b->voffs[s->pos + 1] - b->voffs[s->pos]));
                if (!key || !v) {
                    Py_XDECREF(key);
                    Py_XDECREF(v);
                    goto fail;
                }
            }
        } else if (s->values[s->pos] != Py_None) {
            key = s->keys[s->pos];
            v = s->values[s->pos];
            Py_INCREF(key);
            Py_INCREF(v);
        }
        if (key) {
            PyObject *pair = PyTuple_New(2);
            if (!pair) {
                Py_DECREF(key);
                Py_DECREF(v);
                goto fail;
            }
            PyTuple_SET_ITEM(pair, 0, key);
            PyTuple_SET_ITEM(pair, 1, v);
            /* Two bytes objects cannot form a cycle: untrack the pair now, as CPython's
             * collector would at its first pass, so results a caller keeps never make
             * full collections (which traverse the whole heap) more frequent. */
            PyObject_GC_UnTrack(pair);
            int rc = PyList_Append(out, pair);
            Py_DECREF(pair);
            if (rc < 0) goto fail;
        }
        for (Py_ssize_t t = 0; t < nties; t++) src_advance(&src[ties[t]]);
        src_advance(s);
    }
    PyObject_GC_UnTrack(out);  /* holds untracked pairs, or bytes, only; see above */
    if (mode != MERGE_PAIRS_LIVE) {
        /* bytes, ints and None: nothing for the cyclic collector (as entry_lists) */
        PyObject_GC_UnTrack(out_seqs);
        PyObject_GC_UnTrack(out_values);
        out = Py_BuildValue("(NNN)", out, out_seqs, out_values);
    }
    goto done;
fail:
    Py_CLEAR(out);
    Py_XDECREF(out_seqs);
    Py_XDECREF(out_values);
done:
    PyMem_Free(src);
    PyMem_Free(ties);
    PyMem_Free(views);
    PyMem_Free(offs);
    return out;
}

static PyObject *merge_live(PyObject *self, PyObject *parts) {
    return merge_sources(parts, NULL, MERGE_PAIRS_LIVE);
}

static PyObject *merge_spans_live(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "merge_spans_live(parts, spans) takes 2 arguments");
        return NULL;
    }
    return merge_sources(args[0], args[1], MERGE_PAIRS_LIVE);
}

static PyObject *merge_spans_columns(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError,
                        "merge_spans_columns(parts, spans, drop_tombstones) takes 3 arguments");
        return NULL;
    }
    int drop = PyObject_IsTrue(args[2]);
    if (drop < 0) return NULL;
    return merge_sources(args[0], args[1], drop ? MERGE_COLUMNS_LIVE : MERGE_COLUMNS);
}

/* A key to sort with its first 16 bytes as two big-endian words: most comparisons are
 * decided by the words, in the array, without following the pointer to the key. */
typedef struct {
    uint64_t w0, w1;
    PyObject *key;
} sort_item;

static inline uint64_t be_word(const unsigned char *p, Py_ssize_t len, Py_ssize_t at) {
    uint64_t w = 0;
    for (int b = 0; b < 8; b++) w = w << 8 | (at + b < len ? p[at + b] : 0);
    return w;
}

static int cmp_sort_items(const void *a, const void *b) {
    const sort_item *x = (const sort_item *)a, *y = (const sort_item *)b;
    if (x->w0 != y->w0) return x->w0 < y->w0 ? -1 : 1;
    if (x->w1 != y->w1) return x->w1 < y->w1 ? -1 : 1;
    /* Equal words: zero padding may hide a length difference; compare the keys. */
    return bytes_cmp(PyBytes_AS_STRING(x->key), PyBytes_GET_SIZE(x->key), PyBytes_AS_STRING(y->key),
                     PyBytes_GET_SIZE(y->key));
}

/* sort_bytes(keys) -> None: sorts a list of bytes objects in place, in the order of
 * Python's bytes comparison (equal keys keep no particular order; memtable keys are
 * distinct). */
PyDoc_STRVAR(sort_bytes_doc,
"sort_bytes(keys) -> None\n\n"
"Sorts keys (a list of exact bytes objects) in place in Python's bytes order.\n"
"Raises TypeError (naming the index and type) if an item is not bytes; the list\n"
"is then unchanged.");
static PyObject *sort_bytes(PyObject *self, PyObject *keys) {
    if (!PyList_Check(keys)) {
        PyErr_SetString(PyExc_TypeError, "sort_bytes(list of bytes)");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(keys);
    sort_item *items = PyMem_New(sort_item, n ? n : 1); /* NULL on size overflow too */
    if (items == NULL) return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = PyList_GET_ITEM(keys, i);
        if (!PyBytes_CheckExact(k)) {
            PyMem_Free(items);
            PyErr_Format(PyExc_TypeError, "sort_bytes: item %zd must be bytes, got %.80s", i, Py_TYPE(k)->tp_name);
            return NULL;
        }
        const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(k);
        Py_ssize_t len = PyBytes_GET_SIZE(k);
        items[i].w0 = be_word(p, len, 0);
        items[i].w1 = be_word(p, len, 8);
        items[i].key = k;
    }
    qsort(items, (size_t)n, sizeof(sort_item), cmp_sort_items);
    /* Only the order of the list's own items changes: no reference count moves. */
    PyObject **slots = ((PyListObject *)keys)->ob_item;
    for (Py_ssize_t i = 0; i < n; i++) slots[i] = items[i].key;
    PyMem_Free(items);
    Py_RETURN_NONE;
}

/* encode_blocks(keys, seqs, values, block_bytes) -> (raw_blocks, rows_used)
 * Cuts rows 0.. into data blocks the way SSTableBuilder.add does (a block ends with the
 * row that brings its entry bytes, 17 + key + value per row, to block_bytes or more) and
 * encodes each complete block as raw_block (sstable.py). Rows after the last complete
 * block are not encoded: rows_used says where they start. values[i] None = tombstone. */
PyDoc_STRVAR(encode_blocks_doc,
"encode_blocks(keys, seqs, values, block_bytes) -> (raw_blocks, rows_used)\n\n"
"keys: list of bytes; seqs: list of int (uint64); values: list of bytes or None\n"
"(tombstone), all of one length; block_bytes: int, the block cut of\n"
"SSTableBuilder. Returns raw_blocks, a list of bytes (one raw_block per complete\n"
"block, as sstable.py encodes it), and rows_used, an int: rows from there on are\n"
"not encoded. Raises TypeError (row and type named) for a key that is not bytes or\n"
"a value that is neither bytes nor None, OverflowError for a key or value over\n"
"4 GiB - 1 bytes or a seq outside uint64, ValueError if the lists differ in length.");
static PyObject *encode_blocks(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyList_Check(args[0]) || !PyList_Check(args[1]) || !PyList_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "encode_blocks(list, list, list, int)");
        return NULL;
    }
    PyObject *keys = args[0], *seqs = args[1], *values = args[2];
    Py_ssize_t block_bytes = PyLong_AsSsize_t(args[3]);
    if (block_bytes == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(keys);
    if (PyList_GET_SIZE(seqs) != n || PyList_GET_SIZE(values) != n) {
        PyErr_SetString(PyExc_ValueError, "keys, seqs and values differ in length");
        return NULL;
    }
    PyObject *blocks = PyList_New(0);
    if (blocks == NULL) return NULL;
    Py_ssize_t start = 0, acc = 0, kbytes = 0, vbytes = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = PyList_GET_ITEM(keys, i), *v = PyList_GET_ITEM(values, i);
        if (!PyBytes_CheckExact(k)) {
            PyErr_Format(PyExc_TypeError, "encode_blocks: row %zd: key must be bytes, got %.80s", i,
                         Py_TYPE(k)->tp_name);
            goto fail;
        }
        if (v != Py_None && !PyBytes_CheckExact(v)) {
            PyErr_Format(PyExc_TypeError, "encode_blocks: row %zd: value must be bytes or None, got %.80s", i,
                         Py_TYPE(v)->tp_name);
            goto fail;
        }
        Py_ssize_t kl = PyBytes_GET_SIZE(k), vl = v == Py_None ? 0 : PyBytes_GET_SIZE(v);
        /* Lengths are stored as uint32: a longer one would be truncated under a valid CRC. */
        if ((size_t)kl > UINT32_MAX || (size_t)vl > UINT32_MAX) {
            PyErr_Format(PyExc_OverflowError, "encode_blocks: row %zd: key (%zd bytes) or value (%zd bytes) "
                         "is over the 4 GiB - 1 limit of an SSTable entry", i, kl, vl);
            goto fail;
        }
        acc += 17 + kl + vl;
        kbytes += kl;
        vbytes += vl;
        if (acc < block_bytes) continue;
        Py_ssize_t m = i + 1 - start;
        if (m > (PY_SSIZE_T_MAX - 4 - kbytes - vbytes) / 17) {
            PyErr_Format(PyExc_OverflowError, "encode_blocks: block ending at row %zd is too large", i);
            goto fail;
        }
        PyObject *raw = PyBytes_FromStringAndSize(NULL, 4 + 17 * m + kbytes + vbytes);
        if (raw == NULL) goto fail;
        unsigned char *p = (unsigned char *)PyBytes_AS_STRING(raw);
        unsigned char *kl_p = p + 4, *vl_p = p + 4 + 4 * m, *seq_p = p + 4 + 8 * m, *fl_p = p + 4 + 16 * m;
        unsigned char *kd = p + 4 + 17 * m, *vd = kd + kbytes;
        uint32_t m32 = (uint32_t)m;
        for (int b = 0; b < 4; b++) p[b] = (unsigned char)(m32 >> (8 * b));
        for (Py_ssize_t r = start; r <= i; r++) {
            PyObject *rk = PyList_GET_ITEM(keys, r), *rv = PyList_GET_ITEM(values, r);
            uint32_t a = (uint32_t)PyBytes_GET_SIZE(rk), c = rv == Py_None ? 0 : (uint32_t)PyBytes_GET_SIZE(rv);
            unsigned long long sq = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(seqs, r));
            if (sq == (unsigned long long)-1 && PyErr_Occurred()) { Py_DECREF(raw); goto fail; }
            for (int b = 0; b < 4; b++) { kl_p[b] = (unsigned char)(a >> (8 * b)); vl_p[b] = (unsigned char)(c >> (8 * b)); }
            for (int b = 0; b < 8; b++) seq_p[b] = (unsigned char)(sq >> (8 * b));
            *fl_p++ = rv == Py_None ? 1 : 0;
            kl_p += 4; vl_p += 4; seq_p += 8;
            memcpy(kd, PyBytes_AS_STRING(rk), a); kd += a;
            if (c) { memcpy(vd, PyBytes_AS_STRING(rv), c); vd += c; }
        }
        int rc = PyList_Append(blocks, raw);
        Py_DECREF(raw);
        if (rc < 0) goto fail;
        start = i + 1;
        acc = kbytes = vbytes = 0;
    }
    return Py_BuildValue("(Nn)", blocks, start);
fail:
    Py_DECREF(blocks);
    return NULL;
}

PyDoc_STRVAR(entry_ends_doc,
"entry_ends(keys, values) -> bytes\n\n"
"keys: list of bytes; values: list of bytes or None (tombstone), of the same length.\n"
"Returns len(keys) native int64s: element i is the raw bytes of rows 0..i as an\n"
"SSTable counts them (17 + key length + value length per row; a tombstone's value\n"
"counts 0), where a block or table cut falls (reference: sstable.entry_ends).\n"
"Raises TypeError (row and type named) for a key that is not bytes or a value that is\n"
"neither bytes nor None, ValueError if the lists differ in length.");
static PyObject *entry_ends(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyList_Check(args[0]) || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "entry_ends(keys: list, values: list)");
        return NULL;
    }
    PyObject *keys = args[0], *values = args[1];
    Py_ssize_t n = PyList_GET_SIZE(keys);
    if (PyList_GET_SIZE(values) != n) {
        PyErr_SetString(PyExc_ValueError, "entry_ends: keys and values differ in length");
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int64_t));
    if (!out) return NULL;
    int64_t *ends = (int64_t *)PyBytes_AS_STRING(out), acc = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = PyList_GET_ITEM(keys, i), *v = PyList_GET_ITEM(values, i);
        if (!PyBytes_Check(k) || (v != Py_None && !PyBytes_Check(v))) {
            PyErr_Format(PyExc_TypeError, "entry_ends: row %zd: key must be bytes and value bytes or None, "
                         "got %.80s and %.80s", i, Py_TYPE(k)->tp_name, Py_TYPE(v)->tp_name);
            Py_DECREF(out);
            return NULL;
        }
        acc += 17 + PyBytes_GET_SIZE(k) + (v == Py_None ? 0 : PyBytes_GET_SIZE(v));
        ends[i] = acc;
    }
    return out;
}

PyDoc_STRVAR(seq_bounds_doc,
"seq_bounds(seqs) -> (min, max)\n\n"
"seqs: a non-empty list of ints in [0, 2**64). Returns the smallest and the largest:\n"
"a table's sequence-number bounds without a rich comparison per row. Raises\n"
"ValueError for an empty list, TypeError or OverflowError (row named) for an item that\n"
"is not an int in range.");
static PyObject *seq_bounds(PyObject *self, PyObject *seqs) {
    if (!PyList_Check(seqs)) {
        PyErr_SetString(PyExc_TypeError, "seq_bounds(seqs: list of int)");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(seqs);
    if (!n) {
        PyErr_SetString(PyExc_ValueError, "seq_bounds: no sequence numbers");
        return NULL;
    }
    uint64_t lo = UINT64_MAX, hi = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = PyList_GET_ITEM(seqs, i);
        if (!PyLong_Check(o)) {
            PyErr_Format(PyExc_TypeError, "seq_bounds: row %zd: seq must be int, got %.80s", i,
                         Py_TYPE(o)->tp_name);
            return NULL;
        }
        unsigned long long q = PyLong_AsUnsignedLongLong(o);
        if (q == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Format(PyExc_OverflowError, "seq_bounds: row %zd: seq outside [0, 2**64)", i);
            return NULL;
        }
        if (q < lo) lo = q;
        if (q > hi) hi = q;
    }
    return Py_BuildValue("(KK)", (unsigned long long)lo, (unsigned long long)hi);
}

/* memtable_put(d, keys, first_seq, values, entry_overhead) -> (new_keys, delta_bytes)
 * Memtable.put once per row, in order: d[keys[i]] = (first_seq + i, values[i]); new_keys
 * lists the keys not in d before (each once), delta_bytes is the change of the memtable's
 * approximate size under Memtable.put's accounting. The old entry is looked up first, so
 * the store finds the slot in cache: one cold probe per write, not two as a get pass
 * followed by dict.update costs. */
PyDoc_STRVAR(memtable_put_doc,
"memtable_put(d, keys, first_seq, values, entry_overhead) -> (new_keys, delta_bytes)\n\n"
"d: the memtable's dict key -> (seq, value); keys: list of bytes; first_seq: int,\n"
"the seq of row 0 (row i gets first_seq + i); values: list of bytes or None\n"
"(delete); entry_overhead: int, bytes counted per new key. Returns new_keys, the\n"
"list of keys not in d before (each once), and delta_bytes, an int: the change of\n"
"the memtable's approximate size. Every row is checked before d changes: raises\n"
"TypeError (row and type named) for a key that is not exactly bytes or a value\n"
"that is neither bytes nor None, ValueError if the lists differ in length.");
static PyObject *memtable_put(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyDict_Check(args[0]) || !PyList_Check(args[1]) || !PyList_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "memtable_put(dict, list, int, list, int)");
        return NULL;
    }
    PyObject *d = args[0], *keys = args[1], *values = args[3];
    long long seq = PyLong_AsLongLong(args[2]);
    if (seq == -1 && PyErr_Occurred()) return NULL;
    long long overhead = PyLong_AsLongLong(args[4]);
    if (overhead == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(keys);
    if (PyList_GET_SIZE(values) != n) {
        PyErr_SetString(PyExc_ValueError, "keys and values differ in length");
        return NULL;
    }
    /* A type error must not leave rows 0..i-1 in d without their new-key list and size
     * (a scan or flush would miss them): check every row first. Exact bytes only: a
     * subclass's Python __hash__/__eq__ could run inside the dict calls below and change
     * the lists whose items are borrowed here. */
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i), *value = PyList_GET_ITEM(values, i);
        if (!PyBytes_CheckExact(key)) {
            PyErr_Format(PyExc_TypeError, "memtable_put: row %zd: key must be bytes, got %.80s", i,
                         Py_TYPE(key)->tp_name);
            return NULL;
        }
        if (value != Py_None && !PyBytes_CheckExact(value)) {
            PyErr_Format(PyExc_TypeError, "memtable_put: row %zd: value must be bytes or None, got %.80s", i,
                         Py_TYPE(value)->tp_name);
            return NULL;
        }
    }
    PyObject *fresh = PyList_New(0);
    if (fresh == NULL) return NULL;
    long long delta = 0;
    for (Py_ssize_t i = 0; i < n; i++, seq++) {
        PyObject *key = PyList_GET_ITEM(keys, i), *value = PyList_GET_ITEM(values, i);
        Py_ssize_t vlen = value == Py_None ? 0 : PyBytes_GET_SIZE(value);
        PyObject *old = PyDict_GetItemWithError(d, key); /* borrowed */
        if (old == NULL) {
            if (PyErr_Occurred() || PyList_Append(fresh, key) < 0) goto fail;
            delta += PyBytes_GET_SIZE(key) + vlen + overhead;
        } else {
            PyObject *ov = PyTuple_Check(old) && PyTuple_GET_SIZE(old) == 2 ? PyTuple_GET_ITEM(old, 1) : NULL;
            delta += vlen - (ov != NULL && PyBytes_Check(ov) ? PyBytes_GET_SIZE(ov) : 0);
        }
        PyObject *s = PyLong_FromLongLong(seq);
        if (s == NULL) goto fail;
        PyObject *entry = PyTuple_New(2);
        if (entry == NULL) { Py_DECREF(s); goto fail; }
        Py_INCREF(value);
        PyTuple_SET_ITEM(entry, 0, s);
        PyTuple_SET_ITEM(entry, 1, value);
        int rc = PyDict_SetItem(d, key, entry);
        Py_DECREF(entry);
        if (rc < 0) goto fail;
    }
    return Py_BuildValue("(NL)", fresh, delta);
fail:
    Py_DECREF(fresh);
    return NULL;
}

/* memtable_columns(d, keys) -> (seqs, values)
 * For a list of keys all present in d (a memtable dict of key -> (seq, value)): the seqs
 * and values in key order, one dict lookup per key (Memtable.columns_py is the
 * reference). A missing key raises KeyError, a malformed entry TypeError. */
PyDoc_STRVAR(memtable_columns_doc, "memtable_columns(d, keys) -> (seqs, values)");
static PyObject *memtable_columns(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyDict_Check(args[0]) || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "memtable_columns(dict, list)");
        return NULL;
    }
    PyObject *d = args[0], *keys = args[1];
    Py_ssize_t n = PyList_GET_SIZE(keys);
    PyObject *seqs = PyList_New(n), *values = PyList_New(n);
    if (seqs == NULL || values == NULL) goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i);
        PyObject *e = PyDict_GetItemWithError(d, key); /* borrowed */
        if (e == NULL) {
            if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, key);
            goto fail;
        }
        if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 2) {
            PyErr_SetString(PyExc_TypeError, "memtable entries must be (seq, value) tuples");
            goto fail;
        }
        PyObject *sq = PyTuple_GET_ITEM(e, 0), *v = PyTuple_GET_ITEM(e, 1);
        Py_INCREF(sq);
        Py_INCREF(v);
        PyList_SET_ITEM(seqs, i, sq);
        PyList_SET_ITEM(values, i, v);
    }
    return Py_BuildValue("(NN)", seqs, values);
fail:
    Py_XDECREF(seqs);
    Py_XDECREF(values);
    return NULL;
}

/* bloom_bits(hashes, m, k) -> bytes
 * The bit array of a Bloom filter of m bits (m a positive multiple of 8) with k probes
 * over keys whose xxh64 hashes are the native-endian uint64 buffer hashes: probe i of
 * hash h sets bit (h1 + i*h2) mod m, h1 = h & 0xFFFFFFFF, h2 = (h >> 32) | 1, bit b in
 * byte b >> 3 at mask 1 << (b & 7) (bloom.py; build_bloom_py is the reference). */
/* XXH64 (seed 0), the hash of Bloom policy dkv.bloom.xxh64-dh.v1, from the xxHash
 * specification (doc/xxhash_spec.md of Cyan4973/xxHash); equal to xxhash.xxh64_intdigest. */
#define XXH_P1 0x9E3779B185EBCA87ULL
#define XXH_P2 0xC2B2AE3D27D4EB4FULL
#define XXH_P3 0x165667B19E3779F9ULL
#define XXH_P4 0x85EBCA77C2B2AE63ULL
#define XXH_P5 0x27D4EB2F165667C5ULL

static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static inline uint64_t xxh64_round(uint64_t acc, uint64_t lane) {
    return rotl64(acc + lane * XXH_P2, 31) * XXH_P1;
}

static inline uint64_t xxh64_merge(uint64_t acc, uint64_t v) {
    return (acc ^ xxh64_round(0, v)) * XXH_P1 + XXH_P4;
}

static uint64_t xxh64(const unsigned char *p, size_t len) {
    const unsigned char *end = p + len;
    uint64_t h;
    if (len >= 32) {
        uint64_t v1 = XXH_P1 + XXH_P2, v2 = XXH_P2, v3 = 0, v4 = (uint64_t)0 - XXH_P1;
        for (; p + 32 <= end; p += 32) {
            v1 = xxh64_round(v1, rd_u64(p));
            v2 = xxh64_round(v2, rd_u64(p + 8));
            v3 = xxh64_round(v3, rd_u64(p + 16));
            v4 = xxh64_round(v4, rd_u64(p + 24));
        }
        h = rotl64(v1, 1) + rotl64(v2, 7) + rotl64(v3, 12) + rotl64(v4, 18);
        h = xxh64_merge(h, v1);
        h = xxh64_merge(h, v2);
        h = xxh64_merge(h, v3);
        h = xxh64_merge(h, v4);
    } else {
        h = XXH_P5;
    }
    h += (uint64_t)len;
    for (; p + 8 <= end; p += 8) h = rotl64(h ^ xxh64_round(0, rd_u64(p)), 27) * XXH_P1 + XXH_P4;
    if (p + 4 <= end) {
        h = rotl64(h ^ (uint64_t)rd_u32(p) * XXH_P1, 23) * XXH_P2 + XXH_P3;
        p += 4;
    }
    for (; p < end; p++) h = rotl64(h ^ *p * XXH_P5, 11) * XXH_P1;
    h ^= h >> 33;
    h *= XXH_P2;
    h ^= h >> 29;
    h *= XXH_P3;
    h ^= h >> 32;
    return h;
}

PyDoc_STRVAR(key_hashes_doc,
"key_hashes(keys) -> bytes\n\n"
"keys: list of bytes. Returns len(keys) native uint64s, xxh64(key, seed=0) of each:\n"
"the h of Bloom policy dkv.bloom.xxh64-dh.v1 (bloom.py) for a whole table's keys,\n"
"without a Python call per key. Raises TypeError (row and type named) for a key that\n"
"is not bytes.");
static PyObject *key_hashes(PyObject *self, PyObject *keys) {
    if (!PyList_Check(keys)) {
        PyErr_SetString(PyExc_TypeError, "key_hashes(keys: list of bytes)");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(keys);
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(uint64_t));
    if (!out) return NULL;
    uint64_t *h = (uint64_t *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = PyList_GET_ITEM(keys, i);
        if (!PyBytes_Check(k)) {
            PyErr_Format(PyExc_TypeError, "key_hashes: row %zd: key must be bytes, got %.80s", i,
                         Py_TYPE(k)->tp_name);
            Py_DECREF(out);
            return NULL;
        }
        h[i] = xxh64((const unsigned char *)PyBytes_AS_STRING(k), (size_t)PyBytes_GET_SIZE(k));
    }
    return out;
}

PyDoc_STRVAR(bloom_bits_doc, "bloom_bits(hashes, m, k) -> bytes");
static PyObject *bloom_bits(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "bloom_bits(hashes, m, k)");
        return NULL;
    }
    unsigned long long m = PyLong_AsUnsignedLongLong(args[1]);
    if (m == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    long k = PyLong_AsLong(args[2]);
    if (k == -1 && PyErr_Occurred()) return NULL;
    if (m == 0 || m % 8 != 0 || k < 1) {
        PyErr_SetString(PyExc_ValueError, "bloom_bits: m must be a positive multiple of 8, k >= 1");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    if (view.len % 8 != 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "bloom_bits: hashes must be a buffer of uint64");
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(m / 8));
    if (out == NULL) { PyBuffer_Release(&view); return NULL; }
    unsigned char *bits = (unsigned char *)PyBytes_AS_STRING(out);
    memset(bits, 0, (size_t)(m / 8));
    Py_ssize_t n = view.len / 8;
    const unsigned char *hp = (const unsigned char *)view.buf;
    for (Py_ssize_t j = 0; j < n; j++) {
        uint64_t h;
        memcpy(&h, hp + 8 * j, 8);
        /* Same incremental walk as the probe: (h1 + i*h2) mod m. */
        uint64_t b = (h & 0xFFFFFFFFu) % m, step = ((h >> 32) | 1) % m;
        for (long i = 0; i < k; i++) {
            bits[b >> 3] |= (unsigned char)(1u << (b & 7));
            b += step;
            if (b >= m) b -= m;
        }
    }
    PyBuffer_Release(&view);
    return out;
}

/* ---- Batched state access: keys built from columns, memtable reads, int records ---- */

/* One part of concat_rows: a constant, fixed-width rows or variable-width rows. */
typedef struct {
    Py_buffer data;
    Py_buffer offs; /* variable: int64 offsets, rows + 1 of them */
    int has_data, has_offs;
    Py_ssize_t width; /* fixed: bytes per row; -1 constant; -2 variable */
} concat_part;

static void concat_parts_release(concat_part *parts, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        if (parts[i].has_data) PyBuffer_Release(&parts[i].data);
        if (parts[i].has_offs) PyBuffer_Release(&parts[i].offs);
    }
    PyMem_Free(parts);
}

/* concat_rows(n, parts) -> list of n bytes
 * Row i is the concatenation of every part's row i. A part is bytes (the same in every
 * row), (data, width) with width an int (row i is data[i*width:(i+1)*width]) or
 * (data, offsets) with offsets a buffer of n + 1 native int64 (row i is
 * data[offsets[i]:offsets[i+1]], Arrow's binary layout). data is any C-contiguous
 * buffer. Raises ValueError if a part is too short for n rows or its offsets are out of
 * order or outside data, TypeError for a malformed part. */
PyDoc_STRVAR(concat_rows_doc,
"concat_rows(n, parts) -> list of n bytes\n\n"
"Row i is the concatenation of each part's row i. A part is bytes (a constant),\n"
"(data, width: int) (fixed-width rows of a buffer) or (data, offsets) (offsets: a\n"
"buffer of n + 1 native int64, Arrow's binary layout). Raises ValueError when a part\n"
"does not hold n rows or its offsets are decreasing or outside data.");
static PyObject *concat_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "concat_rows(int, list)");
        return NULL;
    }
    Py_ssize_t n = PyLong_AsSsize_t(args[0]);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "concat_rows: negative row count");
        return NULL;
    }
    PyObject *plist = args[1];
    Py_ssize_t np_ = PyList_GET_SIZE(plist);
    concat_part *parts = PyMem_Calloc(np_ > 0 ? np_ : 1, sizeof(concat_part));
    if (parts == NULL) return PyErr_NoMemory();
    PyObject *out = NULL;
    for (Py_ssize_t j = 0; j < np_; j++) {
        PyObject *p = PyList_GET_ITEM(plist, j);
        concat_part *c = &parts[j];
        if (PyBytes_Check(p)) {
            if (PyObject_GetBuffer(p, &c->data, PyBUF_SIMPLE) < 0) goto done;
            c->has_data = 1;
            c->width = -1;
            continue;
        }
        if (!PyTuple_Check(p) || PyTuple_GET_SIZE(p) != 2) {
            PyErr_Format(PyExc_TypeError, "concat_rows: part %zd must be bytes or a (data, width | offsets) tuple", j);
            goto done;
        }
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(p, 0), &c->data, PyBUF_C_CONTIGUOUS) < 0) goto done;
        c->has_data = 1;
        PyObject *second = PyTuple_GET_ITEM(p, 1);
        if (PyLong_Check(second)) {
            c->width = PyLong_AsSsize_t(second);
            if (c->width == -1 && PyErr_Occurred()) goto done;
            if (c->width < 0 || (c->width > 0 && c->data.len / c->width < n)) {
                PyErr_Format(PyExc_ValueError, "concat_rows: part %zd holds %zd bytes, not %zd rows of %zd", j,
                             c->data.len, n, c->width);
                goto done;
            }
        } else {
            if (PyObject_GetBuffer(second, &c->offs, PyBUF_C_CONTIGUOUS) < 0) goto done;
            c->has_offs = 1;
            c->width = -2;
            if (c->offs.len < (Py_ssize_t)((n + 1) * sizeof(int64_t))) {
                PyErr_Format(PyExc_ValueError, "concat_rows: part %zd has fewer than %zd offsets", j, n + 1);
                goto done;
            }
            const int64_t *o = (const int64_t *)c->offs.buf;
            for (Py_ssize_t i = 0; i < n; i++) {
                if (o[i] < 0 || o[i] > o[i + 1] || o[i + 1] > c->data.len) {
                    PyErr_Format(PyExc_ValueError, "concat_rows: part %zd: offsets of row %zd outside its data", j, i);
                    goto done;
                }
            }
        }
    }
    out = PyList_New(n);
    if (out == NULL) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t len = 0;
        for (Py_ssize_t j = 0; j < np_; j++) {
            const concat_part *c = &parts[j];
            if (c->width == -1) len += c->data.len;
            else if (c->width == -2) len += ((const int64_t *)c->offs.buf)[i + 1] - ((const int64_t *)c->offs.buf)[i];
            else len += c->width;
        }
        PyObject *row = PyBytes_FromStringAndSize(NULL, len);
        if (row == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        char *w = PyBytes_AS_STRING(row);
        for (Py_ssize_t j = 0; j < np_; j++) {
            const concat_part *c = &parts[j];
            const char *src = (const char *)c->data.buf;
            Py_ssize_t l;
            if (c->width == -1) {
                l = c->data.len;
            } else if (c->width == -2) {
                const int64_t *o = (const int64_t *)c->offs.buf;
                src += o[i];
                l = o[i + 1] - o[i];
            } else {
                src += i * c->width;
                l = c->width;
            }
            memcpy(w, src, l);
            w += l;
        }
        PyList_SET_ITEM(out, i, row);
    }
done:
    concat_parts_release(parts, np_);
    return out;
}

/* memtable_get_many(d, keys) -> (values, missing)
 * The memtable's answer for every key of the list keys, one dict lookup each: values[i]
 * is the value of keys[i] (None for a tombstone or a missing key); missing lists, in
 * order, the indices i the memtable knows nothing about (to be looked up further). */
PyDoc_STRVAR(memtable_get_many_doc,
"memtable_get_many(d, keys) -> (values, missing)\n\n"
"d: a memtable dict key -> (seq, value | None); keys: list of bytes. values[i]: the\n"
"value of keys[i], None for a tombstone or absence; missing: the indices, ascending,\n"
"of the keys d does not hold. Raises TypeError for a malformed entry.");
static PyObject *memtable_get_many(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyDict_Check(args[0]) || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "memtable_get_many(dict, list)");
        return NULL;
    }
    PyObject *d = args[0], *keys = args[1];
    Py_ssize_t n = PyList_GET_SIZE(keys);
    PyObject *values = PyList_New(n), *missing = PyList_New(0);
    if (values == NULL || missing == NULL) goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *e = PyDict_GetItemWithError(d, PyList_GET_ITEM(keys, i)); /* borrowed */
        PyObject *v = Py_None;
        if (e == NULL) {
            if (PyErr_Occurred()) goto fail;
            PyObject *ix = PyLong_FromSsize_t(i);
            if (ix == NULL) goto fail;
            int rc = PyList_Append(missing, ix);
            Py_DECREF(ix);
            if (rc < 0) goto fail;
        } else {
            if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 2) {
                PyErr_SetString(PyExc_TypeError, "memtable entries must be (seq, value) tuples");
                goto fail;
            }
            v = PyTuple_GET_ITEM(e, 1);
        }
        Py_INCREF(v);
        PyList_SET_ITEM(values, i, v);
    }
    return Py_BuildValue("(NN)", values, missing);
fail:
    Py_XDECREF(values);
    Py_XDECREF(missing);
    return NULL;
}

/* msgpack's shortest encoding of a signed 64-bit int, as msgpack-python's Packer writes
 * it (positive: fixint, uint8/16/32/64; negative: fixint, int8/16/32/64). */
static char *mp_int(char *w, int64_t v) {
    if (v >= 0) {
        uint64_t u = (uint64_t)v;
        if (u < 128) { *w++ = (char)u; return w; }
        if (u < 256) { *w++ = (char)0xcc; *w++ = (char)u; return w; }
        if (u < 65536) { *w++ = (char)0xcd; *w++ = (char)(u >> 8); *w++ = (char)u; return w; }
        if (u < 4294967296ULL) {
            *w++ = (char)0xce;
            for (int s = 24; s >= 0; s -= 8) *w++ = (char)(u >> s);
            return w;
        }
        *w++ = (char)0xcf;
        for (int s = 56; s >= 0; s -= 8) *w++ = (char)(u >> s);
        return w;
    }
    if (v >= -32) { *w++ = (char)(uint8_t)(int8_t)v; return w; }
    uint64_t u = (uint64_t)v;
    if (v >= -128) { *w++ = (char)0xd0; *w++ = (char)u; return w; }
    if (v >= -32768) { *w++ = (char)0xd1; *w++ = (char)(u >> 8); *w++ = (char)u; return w; }
    if (v >= -2147483648LL) {
        *w++ = (char)0xd2;
        for (int s = 24; s >= 0; s -= 8) *w++ = (char)(u >> s);
        return w;
    }
    *w++ = (char)0xd3;
    for (int s = 56; s >= 0; s -= 8) *w++ = (char)(u >> s);
    return w;
}

/* The optional `header` argument of pack_int_rows/unpack_int_rows: bytes of at most
 * MAX_ROW_HEADER (RecordCodec's schema-version header is 3). 0 ok, -1 error set. */
#define MAX_ROW_HEADER 16
static int row_header(PyObject *const *args, Py_ssize_t nargs, const char *fn,
                      const char **h, Py_ssize_t *hlen) {
    *h = "";
    *hlen = 0;
    if (nargs < 3) return 0;
    if (!PyBytes_Check(args[2]) || PyBytes_GET_SIZE(args[2]) > MAX_ROW_HEADER) {
        PyErr_Format(PyExc_TypeError, "%s: header must be bytes of at most %d", fn, MAX_ROW_HEADER);
        return -1;
    }
    *h = PyBytes_AS_STRING(args[2]);
    *hlen = PyBytes_GET_SIZE(args[2]);
    return 0;
}

/* pack_int_rows(values, fields[, header]) -> list of bytes
 * values: a C-contiguous buffer of native int64, row-major, fields per row (1..15);
 * row i becomes `header` and the msgpack array of its fields, byte for byte what
 * msgpack-python's packb([...]) writes after it (RecordCodec.encode_rows of int64 fields). */
PyDoc_STRVAR(pack_int_rows_doc,
"pack_int_rows(values, fields, header=b'') -> list of bytes\n\n"
"values: buffer of native int64, row-major, fields (1..15) per row. Row i: header and the\n"
"msgpack array of its fields as msgpack.packb writes it. Raises ValueError for a bad field\n"
"count or a buffer that is not whole rows.");
static PyObject *pack_int_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 && nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "pack_int_rows(buffer, int[, bytes])");
        return NULL;
    }
    const char *h;
    Py_ssize_t hlen;
    if (row_header(args, nargs, "pack_int_rows", &h, &hlen) < 0) return NULL;
    long f = PyLong_AsLong(args[1]);
    if (f == -1 && PyErr_Occurred()) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    PyObject *out = NULL;
    Py_ssize_t row_bytes = (Py_ssize_t)(f * sizeof(int64_t));
    if (f < 1 || f > 15 || view.len % row_bytes) {
        PyErr_Format(PyExc_ValueError, "pack_int_rows: %zd bytes are not rows of %ld int64 fields (1..15)",
                     view.len, f);
        goto done;
    }
    Py_ssize_t n = view.len / row_bytes;
    out = PyList_New(n);
    if (out == NULL) goto done;
    char buf[MAX_ROW_HEADER + 1 + 15 * 9];
    memcpy(buf, h, hlen);
    for (Py_ssize_t i = 0; i < n; i++) {
        const int64_t *r = (const int64_t *)view.buf + i * f;
        char *w = buf + hlen;
        *w++ = (char)(0x90 | f);
        for (long j = 0; j < f; j++) {
            int64_t v;
            memcpy(&v, r + j, sizeof v);
            w = mp_int(w, v);
        }
        PyObject *b = PyBytes_FromStringAndSize(buf, w - buf);
        if (b == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        PyList_SET_ITEM(out, i, b);
    }
done:
    PyBuffer_Release(&view);
    return out;
}

/* One msgpack int or nil at p (end e); 0 ok, 1 nil, -1 not an int/nil or truncated. */
static int mp_read_int(const unsigned char **pp, const unsigned char *e, int64_t *v) {
    const unsigned char *p = *pp;
    if (p >= e) return -1;
    unsigned char t = *p++;
    int len = 0, sign = 0;
    if (t < 0x80) { *v = t; *pp = p; return 0; }
    if (t >= 0xe0) { *v = (int8_t)t; *pp = p; return 0; }
    if (t == 0xc0) { *v = 0; *pp = p; return 1; }
    switch (t) {
    case 0xcc: len = 1; break;
    case 0xcd: len = 2; break;
    case 0xce: len = 4; break;
    case 0xcf: len = 8; break;
    case 0xd0: len = 1; sign = 1; break;
    case 0xd1: len = 2; sign = 1; break;
    case 0xd2: len = 4; sign = 1; break;
    case 0xd3: len = 8; sign = 1; break;
    default: return -1;
    }
    if (e - p < len) return -1;
    uint64_t u = 0;
    for (int k = 0; k < len; k++) u = (u << 8) | p[k];
    if (t == 0xcf && u > (uint64_t)INT64_MAX) return -1; /* beyond int64 */
    if (sign && len < 8) {
        uint64_t m = 1ULL << (8 * len - 1);
        u = (u ^ m) - m; /* sign-extend */
    }
    *v = (int64_t)u;
    *pp = p + len;
    return 0;
}

/* unpack_int_rows(raws, fields[, header]) -> (values, valid, present) | None
 * raws: list of bytes or None, each `header` and a msgpack array of `fields` ints or nils
 * (pack_int_rows' rows, RecordCodec's encoding of int fields). values: bytes of
 * len(raws) * fields native int64 (0 where null), valid: bytes of one 0/1 per field
 * (0: the row is None or the field nil), present: one 0/1 per row (0: None). None if
 * some value is not such an array (the caller decodes those rows the general way). */
PyDoc_STRVAR(unpack_int_rows_doc,
"unpack_int_rows(raws, fields, header=b'') -> (values, valid, present) | None\n\n"
"raws: list of bytes or None, each header and a msgpack array of `fields` int or nil. values:\n"
"bytes, len(raws) * fields native int64 (0 where null); valid: bytes, a 0/1 per field\n"
"(0 for None rows and nil fields); present: bytes, a 0/1 per row (0 for None). None\n"
"when a value is not such an array.");
static PyObject *unpack_int_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if ((nargs != 2 && nargs != 3) || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "unpack_int_rows(list, int[, bytes])");
        return NULL;
    }
    const char *h;
    Py_ssize_t hlen;
    if (row_header(args, nargs, "unpack_int_rows", &h, &hlen) < 0) return NULL;
    long f = PyLong_AsLong(args[1]);
    if (f == -1 && PyErr_Occurred()) return NULL;
    if (f < 1 || f > 15) {
        PyErr_SetString(PyExc_ValueError, "unpack_int_rows: fields must be 1..15");
        return NULL;
    }
    PyObject *raws = args[0];
    Py_ssize_t n = PyList_GET_SIZE(raws);
    PyObject *values = PyBytes_FromStringAndSize(NULL, n * f * (Py_ssize_t)sizeof(int64_t));
    PyObject *valid = PyBytes_FromStringAndSize(NULL, n * f);
    PyObject *present = PyBytes_FromStringAndSize(NULL, n);
    if (values == NULL || valid == NULL || present == NULL) goto fail;
    int64_t *vo = (int64_t *)PyBytes_AS_STRING(values);
    char *ok = PyBytes_AS_STRING(valid);
    char *here = PyBytes_AS_STRING(present);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *raw = PyList_GET_ITEM(raws, i);
        here[i] = raw != Py_None;
        if (raw == Py_None) {
            memset(vo + i * f, 0, f * sizeof(int64_t));
            memset(ok + i * f, 0, f);
            continue;
        }
        if (!PyBytes_Check(raw)) goto other;
        const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(raw);
        const unsigned char *e = p + PyBytes_GET_SIZE(raw);
        if (e - p < hlen || memcmp(p, h, hlen) != 0) goto other;
        p += hlen;
        if (p >= e || *p != (unsigned char)(0x90 | f)) goto other;
        p++;
        for (long j = 0; j < f; j++) {
            int64_t v;
            int rc = mp_read_int(&p, e, &v);
            if (rc < 0) goto other;
            vo[i * f + j] = v;
            ok[i * f + j] = rc == 0;
        }
        if (p != e) goto other;
    }
    return Py_BuildValue("(NNN)", values, valid, present);
other:
    Py_DECREF(values);
    Py_DECREF(valid);
    Py_DECREF(present);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(values);
    Py_XDECREF(valid);
    Py_XDECREF(present);
    return NULL;
}

static PyMethodDef methods[] = {
    {"bloom_first", (PyCFunction)(void (*)(void))bloom_first, METH_FASTCALL, bloom_first_doc},
    {"bloom_may_contain", (PyCFunction)(void (*)(void))bloom_may_contain, METH_FASTCALL,
     bloom_may_contain_doc},
    {"decode_block", (PyCFunction)(void (*)(void))decode_block, METH_FASTCALL, decode_block_doc},
    {"block_get", (PyCFunction)(void (*)(void))block_get, METH_FASTCALL, block_get_doc},
    {"block_range", (PyCFunction)(void (*)(void))block_range, METH_FASTCALL, block_range_doc},
    {"merge_live", (PyCFunction)merge_live, METH_O, merge_live_doc},
    {"merge_spans_live", (PyCFunction)(void (*)(void))merge_spans_live, METH_FASTCALL,
     merge_spans_live_doc},
    {"merge_spans_columns", (PyCFunction)(void (*)(void))merge_spans_columns, METH_FASTCALL,
     merge_spans_columns_doc},
    {"seq_bounds", (PyCFunction)seq_bounds, METH_O, seq_bounds_doc},
    {"entry_ends", (PyCFunction)(void (*)(void))entry_ends, METH_FASTCALL, entry_ends_doc},
    {"memtable_put", (PyCFunction)(void (*)(void))memtable_put, METH_FASTCALL, memtable_put_doc},
    {"encode_blocks", (PyCFunction)(void (*)(void))encode_blocks, METH_FASTCALL, encode_blocks_doc},
    {"sort_bytes", (PyCFunction)sort_bytes, METH_O, sort_bytes_doc},
    {"memtable_columns", (PyCFunction)(void (*)(void))memtable_columns, METH_FASTCALL,
     memtable_columns_doc},
    {"key_hashes", (PyCFunction)key_hashes, METH_O, key_hashes_doc},
    {"bloom_bits", (PyCFunction)(void (*)(void))bloom_bits, METH_FASTCALL, bloom_bits_doc},
    {"concat_rows", (PyCFunction)(void (*)(void))concat_rows, METH_FASTCALL, concat_rows_doc},
    {"memtable_get_many", (PyCFunction)(void (*)(void))memtable_get_many, METH_FASTCALL,
     memtable_get_many_doc},
    {"pack_int_rows", (PyCFunction)(void (*)(void))pack_int_rows, METH_FASTCALL, pack_int_rows_doc},
    {"unpack_int_rows", (PyCFunction)(void (*)(void))unpack_int_rows, METH_FASTCALL, unpack_int_rows_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "dkvstream.storage.dkv._native",
    "Compiled inner loops of DKV (Bloom probes, data block decoding, memtable writes).", -1, methods,
};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
