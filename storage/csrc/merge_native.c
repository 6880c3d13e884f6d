/* Two-way merge of (series id, timestamp, value) columns sorted by (sid, ts) (module
 * storage._merge_native).
 *
 * Why hand-written: the head keeps its rows as sorted runs and merges them as they grow (an LSM,
 * storage/head.py), so every sample is rewritten about log2(head rows / rows per seal) times, up to
 * ~12 times over a 2 h head. numpy has no merge of two sorted arrays: the vectorized scatter in
 * storage/columns.py makes six passes and an index array per merge (~60-90 ns per row moved), a
 * stable argsort of the concatenation is no faster; one linear pass here moves a row in a few ns.
 *
 * merge2(a_sid, a_ts, a_val, b_sid, b_ts, b_val, out_sid, out_ts, out_val) -> int
 *   a_*, b_*  contiguous 8-byte buffers (int64, int64, float64), each part sorted by (sid, ts)
 *   out_*     writable contiguous 8-byte buffers of at least len(a) + len(b) items
 * Writes the rows of both parts sorted by (sid, ts); a row whose key equals the row written just
 * before it is dropped, so on a key in both parts the row of ``a`` is kept (the caller passes the
 * part that wins first). Returns the number of rows written. Values are copied bit for bit (stale
 * NaN markers survive). Runs without the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static int get_in(PyObject *o, Py_buffer *b, const char *what) {
    if (PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (b->itemsize != 8 || b->len % 8 != 0) {
        PyErr_Format(PyExc_ValueError, "%s: expected a contiguous buffer of 8-byte items", what);
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

static int get_out(PyObject *o, Py_buffer *b, const char *what) {
    if (PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) return -1;
    if (b->itemsize != 8 || b->len % 8 != 0) {
        PyErr_Format(PyExc_ValueError, "%s: expected a writable contiguous buffer of 8-byte items", what);
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

static PyObject *merge2(PyObject *self, PyObject *args) {
    PyObject *o[9];
    if (!PyArg_ParseTuple(args, "OOOOOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &o[8]))
        return NULL;
    static const char *names[9] = {"a_sid", "a_ts", "a_val", "b_sid", "b_ts", "b_val", "out_sid", "out_ts", "out_val"};
    Py_buffer b[9];
    int got = 0;
    PyObject *result = NULL;
    for (; got < 9; got++) {
        if ((got < 6 ? get_in(o[got], &b[got], names[got]) : get_out(o[got], &b[got], names[got])) < 0) goto done;
    }
    Py_ssize_t na = b[0].len / 8, nb = b[3].len / 8;
    if (b[1].len / 8 != na || b[2].len / 8 != na || b[4].len / 8 != nb || b[5].len / 8 != nb) {
        PyErr_SetString(PyExc_ValueError, "merge2: the columns of a part differ in length");
        goto done;
    }
    if (b[6].len / 8 < na + nb || b[7].len / 8 < na + nb || b[8].len / 8 < na + nb) {
        PyErr_SetString(PyExc_ValueError, "merge2: the output columns are shorter than both parts");
        goto done;
    }
    const int64_t *as = b[0].buf, *at = b[1].buf, *bs = b[3].buf, *bt = b[4].buf;
    const uint64_t *av = b[2].buf, *bv = b[5].buf;  /* values as bits: copied, never compared */
    int64_t *os = b[6].buf, *ot = b[7].buf;
    uint64_t *ov = b[8].buf;
    Py_ssize_t i = 0, j = 0, n = 0;
    Py_BEGIN_ALLOW_THREADS
    while (i < na || j < nb) {
        int take_a;
        if (i >= na) take_a = 0;
        else if (j >= nb) take_a = 1;
        else take_a = as[i] < bs[j] || (as[i] == bs[j] && at[i] <= bt[j]);
        int64_t s, t;
        uint64_t v;
        if (take_a) { s = as[i]; t = at[i]; v = av[i]; i++; }
        else { s = bs[j]; t = bt[j]; v = bv[j]; j++; }
        if (n && os[n - 1] == s && ot[n - 1] == t) continue;  /* a repeated key: the first one stays */
        os[n] = s; ot[n] = t; ov[n] = v; n++;
    }
    Py_END_ALLOW_THREADS
    result = PyLong_FromSsize_t(n);
done:
    for (int k = 0; k < got; k++) PyBuffer_Release(&b[k]);
    return result;
}

static PyMethodDef methods[] = {
    {"merge2", merge2, METH_VARARGS, "Merge two (sid, ts, val) parts sorted by (sid, ts) into the out buffers; returns the row count."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_merge_native", NULL, -1, methods};

PyMODINIT_FUNC PyInit__merge_native(void) { return PyModule_Create(&module); }
