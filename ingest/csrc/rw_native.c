/* Remote write 1.0 and 2.0 walks and the ingest-side series reference table (module ingest._rw_native).
 *
 * Why hand-written: no library walks a prometheus.WriteRequest into columns without building a
 * Python object per series; with upb plus numpy (ingest/rw_fast.py, the fallback) the per-request
 * Python work dominated scrape-shaped payloads. This file does one pass over the request bytes
 * without the GIL: every TimeSeries' raw label-field bytes are hashed and looked up in a table of
 * known series (RefTable), and samples are decoded straight into columns. Known series therefore
 * never build label objects; new ones are validated by Python (ingest/remote_write.py) and then
 * inserted. Anything unusual (unknown fields, labels after samples, bad lengths) makes walk_v1
 * return None, and the caller lets the protobuf runtime decide, exactly as the fallback does.
 * Remote write 2.0 (walk_v2) keys a series by its referenced symbols, each as (varint length,
 * bytes), so the key does not depend on the request's symbol numbering; symbols are checked to be
 * UTF-8 as the protobuf runtime checks strings, and anything it would word as an error (a
 * reference out of range, a symbols table not starting with "") is left to it.
 *
 * Concurrency: lookups take a read lock, inserts a write lock (taken without the GIL, so a writer
 * never stalls other Python threads behind a walk in progress).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- growable int64/double columns */
typedef struct {
    int64_t *v;
    Py_ssize_t n, cap;
} Col;

static int col_push(Col *c, int64_t x) {
    if (c->n == c->cap) {
        Py_ssize_t cap = c->cap ? c->cap * 2 : 256;
        int64_t *nv = (int64_t *)realloc(c->v, (size_t)cap * sizeof(int64_t));
        if (!nv) return -1;
        c->v = nv;
        c->cap = cap;
    }
    c->v[c->n++] = x;
    return 0;
}

static PyObject *col_bytes(Col *c) { /* a writable bytearray (numpy views it without a copy) */
    return PyByteArray_FromStringAndSize((const char *)c->v, c->n * (Py_ssize_t)sizeof(int64_t));
}

/* ---------------------------------------------------------------- hashing of raw label bytes */
static inline uint64_t rd64(const uint8_t *p) {
    uint64_t x;
    memcpy(&x, p, 8);
    return x;
}

static inline uint64_t mix(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h;
}

static uint64_t hash_bytes(const uint8_t *p, size_t n) {
    /* one multiply per 8 bytes, a full avalanche at the end: keys are label bytes, not attacker
     * chosen tables (a collision costs a memcmp, never a wrong answer) */
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ n;
    while (n >= 8) {
        h = (h ^ rd64(p)) * 0x9fb21c651e98df25ULL;
        h ^= h >> 32;
        p += 8;
        n -= 8;
    }
    if (n) {
        uint64_t t = 0;
        memcpy(&t, p, n);
        h = (h ^ t) * 0x9fb21c651e98df25ULL;
    }
    return mix(h);
}

/* ---------------------------------------------------------------- the reference table */
typedef struct {
    uint64_t hash;
    int64_t off; /* key bytes in the arena */
    int64_t len;
    int64_t ref; /* -1: empty slot */
} Slot;

typedef struct {
    PyObject_HEAD
    Slot *slots;
    size_t mask; /* slots - 1 (a power of two) */
    int64_t count;
    uint8_t *arena;
    size_t arena_len, arena_cap;
    pthread_rwlock_t lock;
} RefTable;

static int64_t table_find(const RefTable *t, const uint8_t *key, size_t len, uint64_t h) {
    size_t i = (size_t)h & t->mask;
    for (;;) {
        const Slot *s = &t->slots[i];
        if (s->ref < 0) return -1;
        if (s->hash == h && (size_t)s->len == len && memcmp(t->arena + s->off, key, len) == 0) return s->ref;
        i = (i + 1) & t->mask;
    }
}

static int table_grow(RefTable *t) {
    size_t n = (t->mask + 1) * 2;
    Slot *ns = (Slot *)malloc(n * sizeof(Slot));
    if (!ns) return -1;
    for (size_t i = 0; i < n; i++) ns[i].ref = -1;
    for (size_t i = 0; i <= t->mask; i++) {
        Slot *s = &t->slots[i];
        if (s->ref < 0) continue;
        size_t j = (size_t)s->hash & (n - 1);
        while (ns[j].ref >= 0) j = (j + 1) & (n - 1);
        ns[j] = *s;
    }
    free(t->slots);
    t->slots = ns;
    t->mask = n - 1;
    return 0;
}

static PyObject *RefTable_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    RefTable *t = (RefTable *)type->tp_alloc(type, 0);
    if (!t) return NULL;
    t->mask = 63; /* small: one table per tenant and protocol; it doubles as series arrive */
    t->slots = (Slot *)malloc((t->mask + 1) * sizeof(Slot));
    if (!t->slots) {
        Py_DECREF(t);
        return PyErr_NoMemory();
    }
    for (size_t i = 0; i <= t->mask; i++) t->slots[i].ref = -1;
    pthread_rwlock_init(&t->lock, NULL);
    return (PyObject *)t;
}

static void RefTable_dealloc(RefTable *t) {
    free(t->slots);
    free(t->arena);
    pthread_rwlock_destroy(&t->lock);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static Py_ssize_t RefTable_len(RefTable *t) { return (Py_ssize_t)t->count; }

/* insert(key: bytes) -> ref: the key's reference, inserted (next dense number) if new. */
static PyObject *RefTable_insert(RefTable *t, PyObject *arg) {
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0) return NULL;
    const uint8_t *key = (const uint8_t *)b.buf;
    size_t len = (size_t)b.len;
    uint64_t h = hash_bytes(key, len);
    int64_t ref;
    int oom = 0;
    Py_BEGIN_ALLOW_THREADS
    pthread_rwlock_wrlock(&t->lock);
    ref = table_find(t, key, len, h);
    if (ref < 0) {
        if ((size_t)(t->count + 1) * 2 > t->mask + 1 && table_grow(t) < 0) oom = 1;
        if (!oom && t->arena_len + len > t->arena_cap) {
            size_t cap = t->arena_cap ? t->arena_cap : 65536;
            while (cap < t->arena_len + len) cap *= 2;
            uint8_t *na = (uint8_t *)realloc(t->arena, cap);
            if (!na) oom = 1;
            else {
                t->arena = na;
                t->arena_cap = cap;
            }
        }
        if (!oom) {
            memcpy(t->arena + t->arena_len, key, len);
            size_t i = (size_t)h & t->mask;
            while (t->slots[i].ref >= 0) i = (i + 1) & t->mask;
            ref = t->count++;
            t->slots[i] = (Slot){h, (int64_t)t->arena_len, (int64_t)len, ref};
            t->arena_len += len;
        }
    }
    pthread_rwlock_unlock(&t->lock);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    if (oom) return PyErr_NoMemory();
    return PyLong_FromLongLong(ref);
}

/* ---------------------------------------------------------------- protobuf walk */
typedef struct {
    Col refs, key_off, key_len; /* per TimeSeries */
    Col sample_ts, ts, val;     /* per Sample (val holds float64 bits) */
    Col ex_ts, ex_off, ex_len;  /* per Exemplar */
    Col meta_off, meta_len;     /* per top-level MetricMetadata */
    int64_t n_hist;
} Out;

static void out_free(Out *o) {
    Col *cols[] = {&o->refs, &o->key_off, &o->key_len, &o->sample_ts, &o->ts, &o->val,
                   &o->ex_ts, &o->ex_off, &o->ex_len, &o->meta_off, &o->meta_len};
    for (size_t i = 0; i < sizeof(cols) / sizeof(cols[0]); i++) free(cols[i]->v);
}

/* Varint at *p (< end): 0 on success. */
static inline int varint(const uint8_t **p, const uint8_t *end, uint64_t *out) {
    uint64_t r = 0;
    const uint8_t *q = *p;
    for (int shift = 0; shift < 70; shift += 7) {
        if (q >= end) return -1;
        uint8_t b = *q++;
        if (shift == 63 && b > 1) return -1;
        r |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80) {
            *p = q;
            *out = r;
            return 0;
        }
    }
    return -1;
}

/* A length-delimited field's payload [*p, *p + len) within end. */
static inline int length(const uint8_t **p, const uint8_t *end, uint64_t *len) {
    if (varint(p, end, len) < 0) return -1;
    return *len <= (uint64_t)(end - *p) ? 0 : -1;
}

enum { OK = 0, UNUSUAL = 1, NOMEM = 2 };

static int walk_sample(const uint8_t *p, const uint8_t *end, Out *o, int64_t ts_index) {
    uint64_t bits = 0, t = 0;
    while (p < end) {
        uint64_t tag;
        if (varint(&p, end, &tag) < 0) return UNUSUAL;
        if (tag == 0x09) { /* value: double */
            if (end - p < 8) return UNUSUAL;
            bits = rd64(p);
            p += 8;
        } else if (tag == 0x10) { /* timestamp: int64 varint */
            if (varint(&p, end, &t) < 0) return UNUSUAL;
        } else {
            return UNUSUAL;
        }
    }
    if (col_push(&o->sample_ts, ts_index) || col_push(&o->ts, (int64_t)t) || col_push(&o->val, (int64_t)bits)) return NOMEM;
    return OK;
}

static int walk_series(const RefTable *t, const uint8_t *base, const uint8_t *p, const uint8_t *end, Out *o) {
    int64_t index = o->refs.n;
    const uint8_t *start = p, *label_end = p;
    int in_labels = 1;
    while (p < end) {
        uint64_t tag, len;
        if (varint(&p, end, &tag) < 0 || (tag & 7) != 2 || length(&p, end, &len) < 0) return UNUSUAL;
        const uint8_t *payload = p;
        p += len;
        switch (tag) {
        case 0x0A: /* Label: must come before everything else (every encoder writes them first) */
            if (!in_labels) return UNUSUAL;
            label_end = p;
            break;
        case 0x12: /* Sample */
            in_labels = 0;
            {
                int r = walk_sample(payload, p, o, index);
                if (r) return r;
            }
            break;
        case 0x1A: /* Exemplar: decoded by Python (sparse) */
            in_labels = 0;
            if (col_push(&o->ex_ts, index) || col_push(&o->ex_off, payload - base) || col_push(&o->ex_len, (int64_t)len)) return NOMEM;
            break;
        case 0x22: /* native histogram: counted, refused */
            in_labels = 0;
            o->n_hist++;
            break;
        default:
            return UNUSUAL;
        }
    }
    size_t klen = (size_t)(label_end - start);
    int64_t ref = table_find(t, start, klen, hash_bytes(start, klen));
    if (col_push(&o->refs, ref) || col_push(&o->key_off, start - base) || col_push(&o->key_len, (int64_t)klen)) return NOMEM;
    return OK;
}

static int walk_request(const RefTable *t, const uint8_t *base, size_t n, Out *o) {
    const uint8_t *p = base, *end = base + n;
    while (p < end) {
        uint64_t tag, len;
        if (varint(&p, end, &tag) < 0 || (tag & 7) != 2 || length(&p, end, &len) < 0) return UNUSUAL;
        const uint8_t *payload = p;
        p += len;
        if (tag == 0x0A) { /* TimeSeries */
            int r = walk_series(t, base, payload, p, o);
            if (r) return r;
        } else if (tag == 0x1A) { /* MetricMetadata */
            if (col_push(&o->meta_off, payload - base) || col_push(&o->meta_len, (int64_t)len)) return NOMEM;
        } else {
            return UNUSUAL;
        }
    }
    return OK;
}

/* walk_v1(data) -> None (unusual encoding: use the protobuf runtime) or a tuple of bytearrays
 * (int64 columns unless noted): refs (-1 = unknown series), key_off, key_len per TimeSeries;
 * sample_ts, timestamps, values (float64) per Sample; exemplar ts/off/len; metadata off/len;
 * and the number of native histogram samples. Offsets index ``data``. */
static PyObject *RefTable_walk_v1(RefTable *t, PyObject *arg) {
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0) return NULL;
    Out o;
    memset(&o, 0, sizeof(o));
    int r;
    Py_BEGIN_ALLOW_THREADS
    pthread_rwlock_rdlock(&t->lock);
    r = walk_request(t, (const uint8_t *)b.buf, (size_t)b.len, &o);
    pthread_rwlock_unlock(&t->lock);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    if (r != OK) {
        out_free(&o);
        if (r == NOMEM) return PyErr_NoMemory();
        Py_RETURN_NONE;
    }
    PyObject *res = Py_BuildValue("(NNNNNNNNNNNL)", col_bytes(&o.refs), col_bytes(&o.key_off), col_bytes(&o.key_len),
                                  col_bytes(&o.sample_ts), col_bytes(&o.ts), col_bytes(&o.val), col_bytes(&o.ex_ts),
                                  col_bytes(&o.ex_off), col_bytes(&o.ex_len), col_bytes(&o.meta_off),
                                  col_bytes(&o.meta_len), (long long)o.n_hist);
    out_free(&o);
    return res;
}

/* ---------------------------------------------------------------- remote write 2.0 */
/* Strict UTF-8 (as upb checks proto3 strings): no overlongs, no surrogates, <= U+10FFFF. */
static int utf8_ok(const uint8_t *p, size_t n) {
    const uint8_t *end = p + n;
    while (p < end) {
        uint8_t c = *p;
        if (c < 0x80) {
            p++;
            continue;
        }
        size_t k;
        uint32_t cp;
        if (c >= 0xC2 && c <= 0xDF) k = 1, cp = c & 0x1F;
        else if (c >= 0xE0 && c <= 0xEF) k = 2, cp = c & 0x0F;
        else if (c >= 0xF0 && c <= 0xF4) k = 3, cp = c & 0x07;
        else return 0;
        if ((size_t)(end - p) <= k) return 0;
        for (size_t j = 1; j <= k; j++) {
            if ((p[j] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (p[j] & 0x3F);
        }
        if ((k == 2 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (k == 3 && (cp < 0x10000 || cp > 0x10FFFF))) return 0;
        p += k + 1;
    }
    return 1;
}

typedef struct {
    Col sym_off, sym_len;     /* the symbols table */
    Col ts_off, ts_len;       /* TimeSeries messages, in order */
    Col meta_type, meta_help, meta_unit; /* per TimeSeries; type -1: no metadata field */
    uint8_t *key;             /* scratch: one series' key */
    size_t key_cap;
    Col new_keys_len;         /* keys of unknown series, concatenated in new_keys */
    uint8_t *new_keys;
    size_t new_keys_len_total, new_keys_cap;
} Out2;

static int bytes_append(uint8_t **buf, size_t *len, size_t *cap, const uint8_t *p, size_t n) {
    if (*len + n > *cap) {
        size_t c = *cap ? *cap : 4096;
        while (c < *len + n) c *= 2;
        uint8_t *nb = (uint8_t *)realloc(*buf, c);
        if (!nb) return -1;
        *buf = nb;
        *cap = c;
    }
    memcpy(*buf + *len, p, n);
    *len += n;
    return 0;
}

static int walk_metadata_v2(const uint8_t *p, const uint8_t *end, int64_t *type, int64_t *help, int64_t *unit) {
    while (p < end) {
        uint64_t tag, v;
        if (varint(&p, end, &tag) < 0 || (tag & 7) != 0 || varint(&p, end, &v) < 0) return UNUSUAL;
        if (tag == 0x08) *type = (int64_t)(int32_t)(uint32_t)v; /* enum: int32 */
        else if (tag == 0x18) *help = (int64_t)(uint32_t)v;
        else if (tag == 0x20) *unit = (int64_t)(uint32_t)v;
        else return UNUSUAL;
    }
    return OK;
}

static int walk_series_v2(const RefTable *t, const uint8_t *base, const uint8_t *p, const uint8_t *end, Out *o, Out2 *o2) {
    int64_t index = o->refs.n;
    size_t nsym = (size_t)o2->sym_off.n, klen = 0;
    int64_t mtype = -1, mhelp = 0, munit = 0;
    int seen_refs = 0;
    while (p < end) {
        uint64_t tag, len;
        if (varint(&p, end, &tag) < 0) return UNUSUAL;
        if (tag == 0x30) { /* created_timestamp: not used */
            uint64_t v;
            if (varint(&p, end, &v) < 0) return UNUSUAL;
            continue;
        }
        if ((tag & 7) != 2 || length(&p, end, &len) < 0) return UNUSUAL;
        const uint8_t *payload = p;
        p += len;
        switch (tag) {
        case 0x0A: /* labels_refs, packed: the key is every referenced symbol as (varint length, bytes) */
            if (seen_refs++) return UNUSUAL; /* split packed runs: let the runtime concatenate them */
            for (const uint8_t *q = payload; q < p;) {
                uint64_t r;
                if (varint(&q, p, &r) < 0) return UNUSUAL;
                r = (uint32_t)r;
                if (r >= nsym) return UNUSUAL;
                const uint8_t *sym = base + o2->sym_off.v[r];
                size_t sl = (size_t)o2->sym_len.v[r];
                if (klen + sl + 10 > o2->key_cap) {
                    size_t c = o2->key_cap ? o2->key_cap : 1024;
                    while (c < klen + sl + 10) c *= 2;
                    uint8_t *nk = (uint8_t *)realloc(o2->key, c);
                    if (!nk) return NOMEM;
                    o2->key = nk;
                    o2->key_cap = c;
                }
                uint64_t x = sl;
                do {
                    o2->key[klen++] = (uint8_t)((x & 0x7F) | (x > 0x7F ? 0x80 : 0));
                    x >>= 7;
                } while (x);
                memcpy(o2->key + klen, sym, sl);
                klen += sl;
            }
            break;
        case 0x12: {
            int r = walk_sample(payload, p, o, index);
            if (r) return r;
            break;
        }
        case 0x1A:
            o->n_hist++;
            break;
        case 0x22:
            if (col_push(&o->ex_ts, index) || col_push(&o->ex_off, payload - base) || col_push(&o->ex_len, (int64_t)len)) return NOMEM;
            break;
        case 0x2A: { /* repeated occurrences merge, as in protobuf */
            if (mtype < 0) mtype = 0;
            int r = walk_metadata_v2(payload, p, &mtype, &mhelp, &munit);
            if (r) return r;
            break;
        }
        default:
            return UNUSUAL;
        }
    }
    int64_t ref = table_find(t, o2->key, klen, hash_bytes(o2->key, klen));
    if (col_push(&o->refs, ref) || col_push(&o2->meta_type, mtype) || col_push(&o2->meta_help, mhelp) || col_push(&o2->meta_unit, munit))
        return NOMEM;
    if (ref < 0) {
        if (col_push(&o->key_off, (int64_t)o2->new_keys_len_total) || col_push(&o->key_len, (int64_t)klen) ||
            bytes_append(&o2->new_keys, &o2->new_keys_len_total, &o2->new_keys_cap, o2->key, klen) < 0)
            return NOMEM;
    } else if (col_push(&o->key_off, 0) || col_push(&o->key_len, -1)) {
        return NOMEM;
    }
    return OK;
}

static int walk_request_v2(const RefTable *t, const uint8_t *base, size_t n, Out *o, Out2 *o2) {
    const uint8_t *p = base, *end = base + n;
    while (p < end) { /* symbols may follow the series: collect both first */
        uint64_t tag, len;
        if (varint(&p, end, &tag) < 0 || (tag & 7) != 2 || length(&p, end, &len) < 0) return UNUSUAL;
        const uint8_t *payload = p;
        p += len;
        if (tag == 0x22) {
            if (!utf8_ok(payload, len)) return UNUSUAL;
            if (col_push(&o2->sym_off, payload - base) || col_push(&o2->sym_len, (int64_t)len)) return NOMEM;
        } else if (tag == 0x2A) {
            if (col_push(&o2->ts_off, payload - base) || col_push(&o2->ts_len, (int64_t)len)) return NOMEM;
        } else {
            return UNUSUAL;
        }
    }
    if (o2->sym_off.n && o2->sym_len.v[0] != 0) return UNUSUAL; /* the runtime path names this error */
    for (Py_ssize_t i = 0; i < o2->ts_off.n; i++) {
        const uint8_t *q = base + o2->ts_off.v[i];
        int r = walk_series_v2(t, base, q, q + o2->ts_len.v[i], o, o2);
        if (r) return r;
    }
    return OK;
}

static void out2_free(Out2 *o) {
    Col *cols[] = {&o->sym_off, &o->sym_len, &o->ts_off, &o->ts_len, &o->meta_type, &o->meta_help, &o->meta_unit, &o->new_keys_len};
    for (size_t i = 0; i < sizeof(cols) / sizeof(cols[0]); i++) free(cols[i]->v);
    free(o->key);
    free(o->new_keys);
}

/* walk_v2(data) -> None (unusual: use the protobuf runtime) or a tuple: refs; key_off, key_len
 * (into new_keys, len -1 for known series); sample_ts, timestamps, values; exemplar ts/off/len;
 * sym_off, sym_len; meta_type (-1: none), meta_help, meta_unit per TimeSeries; new_keys (bytes);
 * native histogram count. */
static PyObject *RefTable_walk_v2(RefTable *t, PyObject *arg) {
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0) return NULL;
    Out o;
    Out2 o2;
    memset(&o, 0, sizeof(o));
    memset(&o2, 0, sizeof(o2));
    int r;
    Py_BEGIN_ALLOW_THREADS
    pthread_rwlock_rdlock(&t->lock);
    r = walk_request_v2(t, (const uint8_t *)b.buf, (size_t)b.len, &o, &o2);
    pthread_rwlock_unlock(&t->lock);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    PyObject *res = NULL;
    if (r == OK) {
        res = Py_BuildValue("(NNNNNNNNNNNNNNNL)", col_bytes(&o.refs), col_bytes(&o.key_off), col_bytes(&o.key_len),
                            col_bytes(&o.sample_ts), col_bytes(&o.ts), col_bytes(&o.val), col_bytes(&o.ex_ts),
                            col_bytes(&o.ex_off), col_bytes(&o.ex_len), col_bytes(&o2.sym_off), col_bytes(&o2.sym_len),
                            col_bytes(&o2.meta_type), col_bytes(&o2.meta_help), col_bytes(&o2.meta_unit),
                            PyBytes_FromStringAndSize((const char *)o2.new_keys, (Py_ssize_t)o2.new_keys_len_total),
                            (long long)o.n_hist);
    }
    out_free(&o);
    out2_free(&o2);
    if (r == NOMEM) return PyErr_NoMemory();
    if (r == UNUSUAL) Py_RETURN_NONE;
    return res;
}

/* ---------------------------------------------------------------- text exposition (scrape bodies) */
/* walk_text(body) -> None, or the sample lines as columns with every series text (`name` or
 * `name{...}` as written) looked up in this table: refs, key_off, key_len, value bits, timestamp,
 * has_ts, line number per sample line, and the comment lines joined by '\n' (bytes). It takes only
 * the plain shape exporters write (text format 0.0.4): ASCII outside quoted label values, no
 * control characters but tab and newline, names `[a-zA-Z_:][a-zA-Z0-9_:]*` directly followed by
 * `{` or blanks, decimal values (or NaN, +Inf, -Inf, Inf), integer millisecond timestamps, no `#`
 * after a series, no "# EOF" line (OpenMetrics). Anything else returns None and the caller's parser
 * (ingest/text_format.py) decides, with its messages: the result, when there is one, is the one that
 * parser gives (tests/test_ingest_text_native.py). */
typedef struct {
    Col refs, key_off, key_len, val, ts, has_ts, line;
    uint8_t *comments;
    size_t c_len, c_cap;
} TextOut;

static void text_out_free(TextOut *o) {
    free(o->refs.v), free(o->key_off.v), free(o->key_len.v), free(o->val.v), free(o->ts.v), free(o->has_ts.v);
    free(o->line.v), free(o->comments);
}

static inline int is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
static inline int name_start(uint8_t c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':'; }
static inline int name_char(uint8_t c) { return name_start(c) || is_digit(c); }

/* A decimal float token: [+-]?(d+(.d*)?|.d+)([eE][+-]?d+)?, or NaN / +Inf / -Inf / Inf. */
static int parse_value(const uint8_t *p, size_t n, double *out) {
    if ((n == 3 && memcmp(p, "NaN", 3) == 0)) return *out = NAN, 1;
    if ((n == 3 && memcmp(p, "Inf", 3) == 0) || (n == 4 && memcmp(p, "+Inf", 4) == 0)) return *out = INFINITY, 1;
    if (n == 4 && memcmp(p, "-Inf", 4) == 0) return *out = -INFINITY, 1;
    if (n == 0 || n > 64) return 0;
    size_t i = 0, digits = 0;
    if (p[i] == '+' || p[i] == '-') i++;
    while (i < n && is_digit(p[i])) i++, digits++;
    if (i < n && p[i] == '.') {
        i++;
        while (i < n && is_digit(p[i])) i++, digits++;
    }
    if (!digits) return 0;
    if (i < n && (p[i] == 'e' || p[i] == 'E')) {
        i++;
        if (i < n && (p[i] == '+' || p[i] == '-')) i++;
        size_t e = 0;
        while (i < n && is_digit(p[i])) i++, e++;
        if (!e) return 0;
    }
    if (i != n) return 0;
    char buf[65];
    memcpy(buf, p, n);
    buf[n] = 0;
    *out = strtod(buf, NULL); /* correctly rounded, as Python's float() and Arrow's cast */
    return 1;
}

/* An integer timestamp: -?d{1,18}. */
static int parse_ts(const uint8_t *p, size_t n, int64_t *out) {
    size_t i = 0;
    int neg = 0;
    if (n && p[0] == '-') neg = 1, i = 1;
    if (n - i < 1 || n - i > 18) return 0;
    int64_t v = 0;
    for (; i < n; i++) {
        if (!is_digit(p[i])) return 0;
        v = v * 10 + (p[i] - '0');
    }
    *out = neg ? -v : v;
    return 1;
}

static int walk_text_body(const RefTable *t, const uint8_t *b, size_t n, TextOut *o) {
    size_t pos = 0;
    int64_t line = 0;
    for (size_t i = 0; i < n; i++) { /* one check for what this walk leaves to the parser */
        uint8_t c = b[i];
        if (c < 0x20 && c != '\t' && c != '\n') return UNUSUAL;
        if (c >= 0x80) {
            if (!utf8_ok(b, n)) return UNUSUAL; /* the parser names the byte offset */
            break;
        }
    }
    while (pos < n) {
        size_t end = pos;
        while (end < n && b[end] != '\n') end++;
        line++;
        size_t i = pos;
        while (i < end && (b[i] == ' ' || b[i] == '\t')) i++;
        if (i == end) { /* blank */
        } else if (b[i] == '#') {
            if (end - pos == 5 && memcmp(b + pos, "# EOF", 5) == 0) return UNUSUAL;
            size_t len = end - pos + 1;
            if (o->c_len + len > o->c_cap) {
                size_t cap = o->c_cap ? o->c_cap : 4096;
                while (cap < o->c_len + len) cap *= 2;
                uint8_t *nc = (uint8_t *)realloc(o->comments, cap);
                if (!nc) return NOMEM;
                o->comments = nc, o->c_cap = cap;
            }
            memcpy(o->comments + o->c_len, b + pos, end - pos);
            o->c_len += end - pos;
            o->comments[o->c_len++] = '\n';
        } else {
            if (!name_start(b[i])) return UNUSUAL;
            size_t k0 = i;
            while (i < end && name_char(b[i])) i++;
            if (i < end && b[i] == '{') {
                i++;
                for (;;) {
                    if (i >= end) return UNUSUAL;
                    uint8_t c = b[i];
                    if (c == '}') break;
                    if (c == '"') {
                        i++;
                        while (i < end && b[i] != '"') {
                            if (b[i] == '\\') i++;
                            i++;
                        }
                        if (i >= end) return UNUSUAL;
                    } else if (c >= 0x80 || c == '#') {
                        return UNUSUAL;
                    }
                    i++;
                }
                i++; /* past '}' */
            }
            size_t k1 = i;
            size_t sp = i;
            while (i < end && (b[i] == ' ' || b[i] == '\t')) i++;
            if (i == sp || i == end) return UNUSUAL;
            size_t v0 = i;
            while (i < end && b[i] != ' ' && b[i] != '\t') i++;
            double v;
            if (!parse_value(b + v0, i - v0, &v)) return UNUSUAL;
            while (i < end && (b[i] == ' ' || b[i] == '\t')) i++;
            int64_t ts = 0, has = 0;
            if (i < end) {
                size_t t0 = i;
                while (i < end && b[i] != ' ' && b[i] != '\t') i++;
                if (!parse_ts(b + t0, i - t0, &ts)) return UNUSUAL;
                has = 1;
                while (i < end && (b[i] == ' ' || b[i] == '\t')) i++;
                if (i != end) return UNUSUAL;
            }
            int64_t bits;
            memcpy(&bits, &v, 8);
            size_t klen = k1 - k0;
            int64_t ref = table_find(t, b + k0, klen, hash_bytes(b + k0, klen));
            if (col_push(&o->refs, ref) || col_push(&o->key_off, (int64_t)k0) || col_push(&o->key_len, (int64_t)klen) ||
                col_push(&o->val, bits) || col_push(&o->ts, ts) || col_push(&o->has_ts, has) || col_push(&o->line, line))
                return NOMEM;
        }
        pos = end + 1;
    }
    return OK;
}

static PyObject *RefTable_walk_text(RefTable *t, PyObject *arg) {
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0) return NULL;
    TextOut o;
    memset(&o, 0, sizeof(o));
    int r;
    Py_BEGIN_ALLOW_THREADS
    pthread_rwlock_rdlock(&t->lock);
    r = walk_text_body(t, (const uint8_t *)b.buf, (size_t)b.len, &o);
    pthread_rwlock_unlock(&t->lock);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    if (r != OK) {
        text_out_free(&o);
        if (r == NOMEM) return PyErr_NoMemory();
        Py_RETURN_NONE;
    }
    PyObject *res = Py_BuildValue("(NNNNNNNN)", col_bytes(&o.refs), col_bytes(&o.key_off), col_bytes(&o.key_len),
                                  col_bytes(&o.val), col_bytes(&o.ts), col_bytes(&o.has_ts), col_bytes(&o.line),
                                  PyBytes_FromStringAndSize((const char *)o.comments, (Py_ssize_t)o.c_len));
    text_out_free(&o);
    return res;
}

static PyMethodDef RefTable_methods[] = {
    {"walk_v1", (PyCFunction)RefTable_walk_v1, METH_O,
     "walk_v1(data) -> None or the request's columns (see ingest/rw_native.py)"},
    {"walk_v2", (PyCFunction)RefTable_walk_v2, METH_O,
     "walk_v2(data) -> None or the remote write 2.0 request's columns (see ingest/series_refs.py)"},
    {"walk_text", (PyCFunction)RefTable_walk_text, METH_O,
     "walk_text(body) -> None or a text exposition body's sample columns (see ingest/text_native.py)"},
    {"insert", (PyCFunction)RefTable_insert, METH_O, "insert(key) -> the series reference of these raw label bytes"},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods RefTable_as_sequence = {.sq_length = (lenfunc)RefTable_len};

static PyTypeObject RefTableType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ingest._rw_native.RefTable",
    .tp_basicsize = sizeof(RefTable),
    .tp_dealloc = (destructor)RefTable_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Known series by their raw remote-write label bytes -> dense references, and the walk that looks them up.",
    .tp_methods = RefTable_methods,
    .tp_as_sequence = &RefTable_as_sequence,
    .tp_new = RefTable_new,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "ingest._rw_native",
                                    "Compiled remote-write 1.0 walk and series reference table.", -1, NULL};

PyMODINIT_FUNC PyInit__rw_native(void) {
    if (PyType_Ready(&RefTableType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&RefTableType);
    if (PyModule_AddObject(m, "RefTable", (PyObject *)&RefTableType) < 0) {
        Py_DECREF(&RefTableType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
