/* Orderings and structure: twins of graphsvc/topo.py's references (and graph.py's structure check).
 * Columns: offsets int64 (N + 1), parents int32 (E). */
#include "native.h"

/* levels(offsets, parents, level): level[node] = 1 + the highest level of its parents (0 for a leaf). */
static PyObject *levels(PyObject *self, PyObject *args) {
    PyObject *a, *b, *c;
    Py_buffer offsets, parents, level;
    if (!PyArg_ParseTuple(args, "OOO:levels", &a, &b, &c)) return NULL;
    if (graphsvc_buffer(a, &offsets, 8, 0, "offsets") < 0) return NULL;
    if (graphsvc_buffer(b, &parents, 4, 0, "parents") < 0) goto fail_offsets;
    if (graphsvc_buffer(c, &level, 8, 1, "level") < 0) goto fail_parents;
    const int64_t *off = offsets.buf;
    const int32_t *par = parents.buf;
    int64_t *out = level.buf;
    Py_ssize_t n = level.len / 8;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t node = 0; node < n; node++) {
        int64_t highest = -1;
        for (int64_t slot = off[node]; slot < off[node + 1]; slot++) {
            int64_t l = out[par[slot]];
            if (l > highest) highest = l;
        }
        out[node] = highest + 1;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&level);
    PyBuffer_Release(&parents);
    PyBuffer_Release(&offsets);
    Py_RETURN_NONE;
fail_parents:
    PyBuffer_Release(&parents);
fail_offsets:
    PyBuffer_Release(&offsets);
    return NULL;
}

static PyMethodDef methods[] = {
    {"levels", levels, METH_VARARGS, "levels(offsets, parents, level): each node's level, into level (int64, N)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "graphsvc._ctopo", "orderings and the structure check", -1, methods};

PyMODINIT_FUNC PyInit__ctopo(void) { return PyModule_Create(&module); }
