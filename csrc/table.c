/* Version 2.0's tensor table (schemas/FORMAT.md section 15-16), checked and turned into arrays in one
 * pass over the decoded entries: the twin of graphsvc/document.py's _checked_table, which the tests
 * compare it with.
 *
 * It only ever says "every rule holds" (and returns the arrays) or "look closer" (None): it accepts
 * a table only in the layout a writer gives it (payloads in table order), and it never words an
 * error. When it returns None, document.py checks the table entry by entry (_checked_table) and
 * raises the FormatError that names the first broken rule, so the message of a bad file is the same
 * with or without this extension.
 */
#include "native.h"

#include <limits.h>
#include <math.h>

/* The most dimensions a shape may have: graphsvc.graph.MAX_DIMENSIONS. The module exports it as
 * MAX_DIMENSIONS, and tests/test_format_v2.py holds the two equal. */
#define MAX_DIMENSIONS 32

typedef struct {
    long long node, offset;
    int which;      /* 0: value, 1: gradient */
    PyObject *entry; /* borrowed: the table's list [node, which, dtype, shape, offset, nbytes] */
    PyObject *dtype; /* borrowed: the numpy dtype */
} Checked;

/* An exact int in [0, limit): its value in *out, else 0 (not an int, out of range, too large). */
static int small_int(PyObject *object, long long limit, long long *out) {
    if (!PyLong_CheckExact(object)) return 0;
    int overflow = 0;
    long long value = PyLong_AsLongLongAndOverflow(object, &overflow);
    if (overflow || (value == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    if (value < 0 || value >= limit) return 0;
    *out = value;
    return 1;
}

/* 1 when every entry keeps every rule (filled into ``checked``), 0 when one does not, -1 on error. */
static int check_table(PyObject *entries, long long count, long long size, long long alignment, PyObject *dtypes,
                       const double *values, const double *grads, Checked *checked) {
    Py_ssize_t n = PyList_GET_SIZE(entries);
    long long previous_key = -1, previous_end = 0;
    long long dims[MAX_DIMENSIONS], previous_dims[MAX_DIMENSIONS];
    Py_ssize_t ndim = 0, previous_ndim = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *entry = PyList_GET_ITEM(entries, i);
        if (!PyList_CheckExact(entry) || PyList_GET_SIZE(entry) != 6) return 0;
        PyObject **items = ((PyListObject *)entry)->ob_item;
        Checked *c = &checked[i];
        c->entry = entry;
        if (!small_int(items[0], count, &c->node)) return 0;
        if (!PyUnicode_CheckExact(items[1])) return 0;
        if (PyUnicode_CompareWithASCIIString(items[1], "value") == 0) {
            c->which = 0;
        } else if (PyUnicode_CompareWithASCIIString(items[1], "grad") == 0) {
            c->which = 1;
        } else {
            return 0;
        }
        if (!PyUnicode_CheckExact(items[2])) return 0;
        PyObject *known = PyDict_GetItemWithError(dtypes, items[2]); /* (dtype, itemsize) */
        if (known == NULL) return PyErr_Occurred() ? -1 : 0;
        if (!PyTuple_CheckExact(known) || PyTuple_GET_SIZE(known) != 2) {
            PyErr_SetString(PyExc_TypeError, "tensor_views: dtypes maps a name to (dtype, itemsize)");
            return -1;
        }
        c->dtype = PyTuple_GET_ITEM(known, 0);
        long long itemsize;
        if (!small_int(PyTuple_GET_ITEM(known, 1), 1 << 10, &itemsize)) {
            PyErr_SetString(PyExc_TypeError, "tensor_views: an itemsize must be a small int");
            return -1;
        }
        PyObject *shape = items[3];
        if (!PyList_CheckExact(shape)) return 0;
        ndim = PyList_GET_SIZE(shape);
        if (ndim > MAX_DIMENSIONS) return 0;
        /* as numpy counts: the other dimensions of an empty array may not be huge either, so the
         * product skips zeros; past 2**63 - 1 bytes it is too large (the entry check words it) */
        long long needed = itemsize;
        int empty = 0;
        for (Py_ssize_t k = 0; k < ndim; k++) {
            if (!small_int(PyList_GET_ITEM(shape, k), LLONG_MAX, &dims[k])) return 0;
            if (dims[k] == 0) {
                empty = 1;
            } else if (__builtin_mul_overflow(needed, dims[k], &needed)) {
                return 0;
            }
        }
        if (empty) needed = 0;
        long long nbytes, end;
        if (!small_int(items[4], LLONG_MAX, &c->offset) || !small_int(items[5], LLONG_MAX, &nbytes)) return 0;
        if (nbytes != needed || c->offset % alignment != 0 || c->offset < previous_end) return 0;
        if (__builtin_add_overflow(c->offset, nbytes, &end) || end > size) return 0;
        previous_end = end;
        long long key = 2 * c->node + c->which; /* by node, a value before its gradient, none twice */
        if (key <= previous_key) return 0;
        if (c->which == 0 ? !isnan(values[c->node]) : (grads != NULL && !isnan(grads[c->node]))) return 0;
        if (c->which == 1 && key == previous_key + 1) { /* a gradient has its value's shape */
            if (ndim != previous_ndim) return 0;
            for (Py_ssize_t k = 0; k < ndim; k++) {
                if (dims[k] != previous_dims[k]) return 0;
            }
        }
        previous_key = key;
        previous_ndim = ndim;
        for (Py_ssize_t k = 0; k < ndim; k++) previous_dims[k] = dims[k];
    }
    return 1;
}

static PyObject *tensor_views(PyObject *self, PyObject *args) {
    PyObject *entries, *dtypes, *values_object, *grads_object, *make_array, *buffer;
    long long count, size, alignment;
    if (!PyArg_ParseTuple(args, "O!LLLO!OOOO:tensor_views", &PyList_Type, &entries, &count, &size, &alignment,
                          &PyDict_Type, &dtypes, &values_object, &grads_object, &make_array, &buffer))
        return NULL;
    if (alignment <= 0) {
        PyErr_SetString(PyExc_ValueError, "tensor_views: the alignment must be positive");
        return NULL;
    }
    graphsvc_buffers held = {.count = 0};
    Py_buffer *values = graphsvc_take(&held, values_object, sizeof(double), 0, "values");
    Py_buffer *grads = NULL;
    PyObject *result = NULL, *arrays[2] = {NULL, NULL};
    Checked *checked = NULL;
    if (values == NULL) goto done;
    if (grads_object != Py_None && (grads = graphsvc_take(&held, grads_object, sizeof(double), 0, "grads")) == NULL)
        goto done;
    if (values->len / (Py_ssize_t)sizeof(double) < count ||
        (grads != NULL && grads->len / (Py_ssize_t)sizeof(double) < count)) {
        PyErr_SetString(PyExc_ValueError, "tensor_views: a column is shorter than count");
        goto done;
    }
    Py_ssize_t n = PyList_GET_SIZE(entries);
    checked = PyMem_Malloc(sizeof(Checked) * (size_t)(n ? n : 1));
    if (checked == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    int ok = check_table(entries, count, size, alignment, dtypes, values->buf, grads ? grads->buf : NULL, checked);
    if (ok < 0) goto done;
    if (ok == 0) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    /* Every rule holds: only now is anything allocated. The list ``entries`` is not changed by the
     * calls below (numpy does not see it), so the borrowed entries stay alive. */
    if ((arrays[0] = PyDict_New()) == NULL || (arrays[1] = PyDict_New()) == NULL) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject **items = ((PyListObject *)checked[i].entry)->ob_item;
        PyObject *array =
            PyObject_CallFunctionObjArgs(make_array, items[3], checked[i].dtype, buffer, items[4], NULL);
        if (array == NULL) goto done;
        int failed = PyDict_SetItem(arrays[checked[i].which], items[0], array);
        Py_DECREF(array);
        if (failed < 0) goto done;
    }
    result = PyTuple_Pack(2, arrays[0], arrays[1]);
done:
    Py_XDECREF(arrays[0]);
    Py_XDECREF(arrays[1]);
    PyMem_Free(checked);
    graphsvc_release(&held);
    return result;
}

static PyMethodDef methods[] = {
    {"tensor_views", tensor_views, METH_VARARGS,
     "tensor_views(entries, count, size, alignment, dtypes, values, grads, make_array, buffer)\n\n"
     "Version 2.0's tensor table ``entries`` (the decoded list of [node, which, dtype, shape, offset, nbytes])\n"
     "checked against every rule of FORMAT.md section 15-16 for a graph of ``count`` nodes and a data section of\n"
     "``size`` bytes; ``dtypes`` maps a dtype's name to (numpy dtype, itemsize); ``values`` and ``grads``\n"
     "(float64 columns, grads may be None) must be nan where a node holds an array. When every rule holds and\n"
     "the payloads are in table order: the arrays, ``({node: value}, {node: grad})``,\n"
     "each ``make_array(shape, dtype, buffer, offset)``. Otherwise None (the caller words the error).\n"
     "Twin of graphsvc.document._checked_table."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "graphsvc._ctable",
    .m_doc = "version 2.0's tensor table, checked and viewed",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__ctable(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddIntMacro(m, MAX_DIMENSIONS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
