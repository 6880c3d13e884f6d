/* Assembly of a range query's matrix JSON (module turboprom._json_native).
 *
 * Why hand-written: Prometheus's exact text (Go FormatFloat values as strings, "<s>.<ms>"
 * timestamps, label maps in order) is produced by no library, and in Python the assembly of a
 * matrix costs about 200 ns per point: a str object per value from splitting orjson's output, then
 * one join per series over interleaved (timestamp, value) pieces. Here the number text still comes
 * from orjson (its shortest round-trip float writer), and the points are copied from it into the
 * response bytes with the timestamps and label maps around them, without a Python object per point.
 *
 * matrix_json(labels, counts, cols, ts, vtext, rare_idx, rare_txt, brackets) -> bytes
 *   labels   list[str], S label maps already in JSON ({"a":"b"})
 *   counts   int64 buffer (S): points of each series, all > 0
 *   cols     int64 buffer (N) or None: the timestamp index of each point (None: point j of every
 *            series uses timestamp j, all series full)
 *   ts       list[str], T timestamp texts
 *   vtext    bytes: orjson's text of the N values, "[v0,v1,...]"
 *   rare_idx int64 buffer (R), ascending: points whose text is given in rare_txt instead (NaN, Inf,
 *            magnitudes orjson writes in exponent form where Go does not, or vice versa)
 *   rare_txt list[str] (R)
 *   brackets bool: enclose the series objects in [ ]
 * Returns the UTF-8 text of turboprom/api_json.py's _matrix_json for the same input (the fallback
 * there is the reference, and tests compare the two byte for byte). Trailing ".0" of integral
 * values is dropped as Go writes them.
 *
 * format_timestamps(ts) -> list[str]
 *   ts       int64 buffer (T) of milliseconds
 * Prometheus's "<s>[.<mmm>]" text of each (the millis always three digits, none when zero, a minus
 * sign before a negative time's magnitude), as turboprom/api_json.py's _format_timestamps_py.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* UTF-8 text of each str of a list (borrowed pointers, valid while the list lives). */
static int utf8_list(PyObject *list, const char ***ptrs, Py_ssize_t **lens, Py_ssize_t *count) {
    if (!PyList_Check(list)) {
        PyErr_SetString(PyExc_TypeError, "expected a list of str");
        return -1;
    }
    Py_ssize_t n = PyList_GET_SIZE(list);
    *ptrs = (const char **)PyMem_Malloc(sizeof(char *) * (size_t)(n ? n : 1));
    *lens = (Py_ssize_t *)PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(n ? n : 1));
    if (!*ptrs || !*lens) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *s = PyList_GET_ITEM(list, i);
        if (!PyUnicode_Check(s)) {
            PyErr_SetString(PyExc_TypeError, "expected a list of str");
            return -1;
        }
        (*ptrs)[i] = PyUnicode_AsUTF8AndSize(s, &(*lens)[i]);
        if (!(*ptrs)[i]) return -1;
    }
    *count = n;
    return 0;
}

static PyObject *matrix_json(PyObject *self, PyObject *args) {
    PyObject *labels, *cols_obj, *ts, *rare_txt;
    Py_buffer counts = {0}, cols = {0}, vtext = {0}, rare_idx = {0};
    int brackets;
    if (!PyArg_ParseTuple(args, "O!y*OO!y*y*O!p", &PyList_Type, &labels, &counts, &cols_obj, &PyList_Type, &ts,
                          &vtext, &rare_idx, &PyList_Type, &rare_txt, &brackets))
        return NULL;
    PyObject *result = NULL;
    const char **lp = NULL, **tp = NULL, **rp = NULL;
    Py_ssize_t *ll = NULL, *tl = NULL, *rl = NULL;
    Py_ssize_t S, T, R;
    int have_cols = cols_obj != Py_None;
    if (have_cols && PyObject_GetBuffer(cols_obj, &cols, PyBUF_SIMPLE) < 0) goto done;
    if (utf8_list(labels, &lp, &ll, &S) < 0 || utf8_list(ts, &tp, &tl, &T) < 0 || utf8_list(rare_txt, &rp, &rl, &R) < 0)
        goto done;
    if (counts.len != S * (Py_ssize_t)sizeof(int64_t) || rare_idx.len != R * (Py_ssize_t)sizeof(int64_t)) {
        PyErr_SetString(PyExc_ValueError, "counts / rare_idx do not match labels / rare_txt");
        goto done;
    }
    const int64_t *cnt = (const int64_t *)counts.buf;
    const int64_t *col = have_cols ? (const int64_t *)cols.buf : NULL;
    const int64_t *ri = (const int64_t *)rare_idx.buf;
    Py_ssize_t N = 0;
    for (Py_ssize_t s = 0; s < S; s++) {
        if (cnt[s] <= 0 || (!have_cols && cnt[s] != T)) {
            PyErr_SetString(PyExc_ValueError, "bad point count");
            goto done;
        }
        N += cnt[s];
    }
    if (have_cols && cols.len != N * (Py_ssize_t)sizeof(int64_t)) {
        PyErr_SetString(PyExc_ValueError, "cols does not match counts");
        goto done;
    }
    const char *v = (const char *)vtext.buf;
    Py_ssize_t vn = vtext.len;
    if (vn < 2 || v[0] != '[' || v[vn - 1] != ']') {
        PyErr_SetString(PyExc_ValueError, "vtext is not a JSON array");
        goto done;
    }
    /* Two passes over the same points: the first sizes the text exactly (so the answer is written
     * once, straight into the bytes object returned: no growing buffer, no copy of a big answer),
     * the second writes it. */
    char *o = NULL;
    Py_ssize_t total = 0;
    for (int pass = 0; pass < 2; pass++) {
        Py_ssize_t pos = 1, j = 0, r = 0, n = 0; /* pos: start of point j's number in vtext */
#define EMIT(src, len) do { if (pass) memcpy(o + n, (src), (size_t)(len)); n += (len); } while (0)
        if (brackets) EMIT("[", 1);
        for (Py_ssize_t s = 0; s < S; s++) {
            EMIT(s ? ",{\"metric\":" : "{\"metric\":", s ? 11 : 10);
            EMIT(lp[s], ll[s]);
            EMIT(",\"values\":[", 11);
            for (int64_t k = 0; k < cnt[s]; k++, j++) {
                if (pos >= vn) {
                    PyErr_SetString(PyExc_ValueError, "vtext holds fewer values than counts");
                    goto done;
                }
                Py_ssize_t e = pos;
                while (e < vn - 1 && v[e] != ',') e++;
                int64_t c = col ? col[j] : k;
                if (c < 0 || c >= T) {
                    PyErr_SetString(PyExc_ValueError, "timestamp index out of range");
                    goto done;
                }
                EMIT(k ? ",[" : "[", k ? 2 : 1);
                EMIT(tp[c], tl[c]);
                EMIT(",\"", 2);
                if (r < R && ri[r] == j) {
                    EMIT(rp[r], rl[r]);
                    r++;
                } else {
                    Py_ssize_t len = e - pos;
                    if (len >= 2 && v[e - 2] == '.' && v[e - 1] == '0') len -= 2; /* Go writes 3, not 3.0 */
                    EMIT(v + pos, len);
                }
                EMIT("\"]", 2);
                pos = e + 1;
            }
            EMIT("]}", 2);
        }
        if (brackets) EMIT("]", 1);
#undef EMIT
        if (j != N || r != R) {
            PyErr_SetString(PyExc_ValueError, "rare_idx does not match the points");
            goto done;
        }
        if (!pass) {
            total = n;
            result = PyBytes_FromStringAndSize(NULL, total);
            if (!result) goto done;
            o = PyBytes_AS_STRING(result);
        }
    }
done:
    if (PyErr_Occurred()) Py_CLEAR(result);
    PyMem_Free(lp); PyMem_Free(ll);
    PyMem_Free(tp); PyMem_Free(tl);
    PyMem_Free(rp); PyMem_Free(rl);
    PyBuffer_Release(&counts);
    if (have_cols && cols.obj) PyBuffer_Release(&cols);
    PyBuffer_Release(&vtext);
    PyBuffer_Release(&rare_idx);
    return result;
}

static PyObject *format_timestamps(PyObject *self, PyObject *arg) {
    Py_buffer b = {0};
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0) return NULL;
    if (b.len % (Py_ssize_t)sizeof(int64_t)) {
        PyBuffer_Release(&b);
        PyErr_SetString(PyExc_ValueError, "expected an int64 buffer");
        return NULL;
    }
    Py_ssize_t n = b.len / (Py_ssize_t)sizeof(int64_t);
    const int64_t *t = (const int64_t *)b.buf;
    PyObject *out = PyList_New(n);
    if (!out) {
        PyBuffer_Release(&b);
        return NULL;
    }
    char buf[32];
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t x = t[i];
        /* magnitude as unsigned: INT64_MIN has no positive int64 */
        uint64_t a = x < 0 ? (uint64_t)0 - (uint64_t)x : (uint64_t)x;
        uint64_t sec = a / 1000, frac = a % 1000;
        char *e = buf + sizeof buf, *p = e;
        if (frac) {
            *--p = (char)('0' + frac % 10);
            *--p = (char)('0' + frac / 10 % 10);
            *--p = (char)('0' + frac / 100);
            *--p = '.';
        }
        do {
            *--p = (char)('0' + sec % 10);
            sec /= 10;
        } while (sec);
        if (x < 0) *--p = '-';
        PyObject *s = PyUnicode_FromStringAndSize(p, e - p);
        if (!s) {
            Py_DECREF(out);
            PyBuffer_Release(&b);
            return NULL;
        }
        PyList_SET_ITEM(out, i, s);
    }
    PyBuffer_Release(&b);
    return out;
}

static PyMethodDef methods[] = {
    {"matrix_json", matrix_json, METH_VARARGS, "The series objects of a matrix result as JSON text (see the file header)."},
    {"format_timestamps", format_timestamps, METH_O, "Prometheus's text of int64 millisecond timestamps (see the file header)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "turboprom._json_native",
                                    "Matrix JSON assembly and timestamp text for the HTTP API (turboprom/api_json.py).", -1, methods};

PyMODINIT_FUNC PyInit__json_native(void) { return PyModule_Create(&module); }
