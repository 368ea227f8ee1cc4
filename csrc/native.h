/* Shared by graphsvc's C extensions (csrc/NAME.c is the module graphsvc._cNAME; hatch_build.py
 * builds them, graphsvc/kernels.py chooses between them and the pure-Python references).
 *
 * Every function takes the graph's columns as buffers (numpy arrays, through the buffer protocol)
 * and writes its results into buffers the caller allocated; nothing here allocates a Python object
 * per node. Each is the twin of a pure-Python reference kept beside its caller, and the tests
 * compare the two bit for bit. Nothing recurses: searches keep explicit stacks in arrays.
 */
#ifndef GRAPHSVC_NATIVE_H
#define GRAPHSVC_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* A C-contiguous buffer argument with items of ``itemsize`` bytes (writable if asked): 0 on
 * success, -1 with an exception set. Release it with PyBuffer_Release. */
static inline int graphsvc_buffer(PyObject *object, Py_buffer *view, Py_ssize_t itemsize, int writable,
                                  const char *name) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(object, view, flags) < 0) {
        return -1;
    }
    if (view->itemsize != itemsize) {
        PyErr_Format(PyExc_TypeError, "%s: items of %zd bytes, not %zd", name, view->itemsize, itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* Hints that a load (or store) of *address is coming: never changes a result, never faults. */
#define PREFETCH_READ(address) __builtin_prefetch((address), 0, 3)
#define PREFETCH_WRITE(address) __builtin_prefetch((address), 1, 3)

#endif
