/* Shared by graphsvc's C extensions (csrc/NAME.c is the module graphsvc.native._cNAME; hatch_build.py
 * builds them, graphsvc/native/__init__.py chooses between them and the pure-Python references).
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

/* ``one`` for a count of 1, else ``many``: the noun after a count in a message, as
 * graphsvc.text.counted words it ("1 item", "7 items", "1 entry"). */
static inline const char *graphsvc_noun(Py_ssize_t count, const char *one, const char *many) {
    return count == 1 ? one : many;
}

/* A C-contiguous buffer argument with items of ``itemsize`` bytes (writable if asked): 0 on
 * success, -1 with an exception set. Release it with PyBuffer_Release. */
static inline int graphsvc_buffer(PyObject *object, Py_buffer *view, Py_ssize_t itemsize, int writable,
                                  const char *name) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(object, view, flags) < 0) {
        return -1;
    }
    if (view->itemsize != itemsize) {
        PyErr_Format(PyExc_TypeError, "%s: items of %zd %s, not %zd", name, view->itemsize,
                     graphsvc_noun(view->itemsize, "byte", "bytes"), itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* Up to GRAPHSVC_MAX_BUFFERS buffer arguments, taken one by one (graphsvc_take) and released
 * together (graphsvc_release), on success and on failure alike. Start from {.count = 0}. */
#define GRAPHSVC_MAX_BUFFERS 10

typedef struct {
    Py_buffer views[GRAPHSVC_MAX_BUFFERS];
    int count;
} graphsvc_buffers;

/* graphsvc_buffer into the next view of ``held``: that view, or NULL with an exception set. */
static inline Py_buffer *graphsvc_take(graphsvc_buffers *held, PyObject *object, Py_ssize_t itemsize,
                                       int writable, const char *name) {
    if (held->count >= GRAPHSVC_MAX_BUFFERS) {
        PyErr_SetString(PyExc_SystemError, "graphsvc: more buffer arguments than GRAPHSVC_MAX_BUFFERS");
        return NULL;
    }
    Py_buffer *view = &held->views[held->count];
    if (graphsvc_buffer(object, view, itemsize, writable, name) < 0) return NULL;
    held->count++;
    return view;
}

static inline void graphsvc_release(graphsvc_buffers *held) {
    while (held->count > 0) PyBuffer_Release(&held->views[--held->count]);
}

/* Hints that a load (or store) of *address is coming: never changes a result, never faults. */
#define PREFETCH_READ(address) __builtin_prefetch((address), 0, 3)
#define PREFETCH_WRITE(address) __builtin_prefetch((address), 1, 3)

#endif
