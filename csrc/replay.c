/* Replay sweeps: twins of graphsvc/replay.py's references (and of benchmarks/numba_kernels.py, the
 * numba kernels they replaced). graphsvc/_replay_kernels.py allocates the results and calls these.
 *
 * Columns: offsets int64 (N + 1), parents int32 (E), values float64 (N), op codes uint16 (N),
 * ``table`` int8 (a primitive per op code), ``kinds`` int8 (a primitive per node), ``nodes`` int64.
 * Array lengths are checked; the columns' contents (offsets that never decrease, parent ids below
 * their child's) are trusted: Graph.check holds them.
 *
 * Every floating-point operation here is one correctly rounded IEEE operation, exactly the one the
 * numpy forward or derivative of graphsvc/builtin_ops.py performs, so the results are the same bits
 * on every CPU. The build passes -ffp-contract=off: ``a + b * c`` rounds twice, as numpy does; never
 * write fma() here. Comparisons with nan are false, so the branches below are written to pick the
 * operand numpy picks when one is nan (``x != x`` is true only for nan).
 */
#include "native.h"

#include <math.h>

/* How many nodes ahead of the one they compute the sweeps ask for its parents' numbers: with random
 * parents the loads of many nodes then overlap instead of waiting for each in turn. */
#define AHEAD 32

/* -- primitive ops --------------------------------------------------------------------------------
 * The codes of graphsvc.kernels.PRIMITIVES (position + 1; 0: not a primitive). Unary ones ignore y. */
enum { ADD = 1, SUB, MUL, DIV, NEG, RELU, ABS, MAX, MIN };

/* What the numpy forward of the primitive computes, bit for bit. */
static inline double primitive(int kind, double x, double y) {
    switch (kind) {
    case ADD: return x + y;
    case SUB: return x - y;
    case MUL: return x * y;
    case DIV: return x / y; /* x/0 is ±inf or nan, as numpy's (no trap: errors are masked) */
    case NEG: return -x;
    /* np.maximum(x, 0.0): nan stays (with its sign), -0.0 gives 0.0 (a tie gives the second operand) */
    case RELU: return (x > 0.0 || x != x) ? x : 0.0;
    case ABS: return fabs(x); /* clears the sign bit, of -0.0 and of nan too, as np.abs does */
    /* np.maximum / np.minimum: a nan in either operand is the result; a tie (0.0 and -0.0) gives y */
    case MAX: return (x > y || x != x) ? x : y;
    default: return (x < y || x != x) ? x : y; /* MIN */
    }
}

/* (d out/d x, d out/d y) of a primitive, as its numpy derivatives compute them. */
static inline void partials(int kind, double x, double y, double out, double *dx, double *dy) {
    double tie;
    switch (kind) {
    case ADD: *dx = 1.0; *dy = 1.0; return;
    case SUB: *dx = 1.0; *dy = -1.0; return;
    case MUL: *dx = y; *dy = x; return;
    case DIV: *dx = 1.0 / y; *dy = -out / y; return;
    case NEG: *dx = -1.0; *dy = 0.0; return;
    case RELU: *dx = out > 0.0 ? 1.0 : 0.0; *dy = 0.0; return; /* np.where(out > 0, 1.0, 0.0) */
    case ABS: /* np.sign(x): +0.0 for ±0.0, x itself for nan */
        *dx = x > 0.0 ? 1.0 : (x < 0.0 ? -1.0 : (x == 0.0 ? 0.0 : x));
        *dy = 0.0;
        return;
    case MAX: /* (x > y) + 0.5 * (x == y): each side of a tie gets half */
        tie = x == y ? 0.5 : 0.0;
        *dx = (x > y ? 1.0 : 0.0) + tie;
        *dy = (y > x ? 1.0 : 0.0) + tie;
        return;
    default: /* MIN */
        tie = x == y ? 0.5 : 0.0;
        *dx = (x < y ? 1.0 : 0.0) + tie;
        *dy = (y < x ? 1.0 : 0.0) + tie;
        return;
    }
}

/* -- arguments ------------------------------------------------------------------------------------
 * Each function takes its buffers into a graphsvc_buffers (native.h) and releases them all with
 * graphsvc_release, on success and on failure alike. */

/* Acquire ``object`` as a buffer of ``itemsize``-byte items: its data and item count, or -1 with
 * an exception set. */
static int take(graphsvc_buffers *held, PyObject *object, Py_ssize_t itemsize, int writable, const char *name,
                void **data, Py_ssize_t *length) {
    Py_buffer *view = graphsvc_take(held, object, itemsize, writable, name);
    if (view == NULL) return -1;
    *data = view->buf;
    *length = view->len / itemsize;
    return 0;
}

/* A ValueError saying a length is wrong; returns -1. */
static int wrong_length(const char *name, Py_ssize_t length, const char *expected, Py_ssize_t value) {
    PyErr_Format(PyExc_ValueError, "%s: %zd items, expected %s (%zd)", name, length, expected, value);
    return -1;
}

/* The graph's offsets and parents, checked against each other: N (offsets has N + 1 items, the
 * last at most the parent count), or -1 with an exception set. */
static Py_ssize_t take_columns(graphsvc_buffers *held, PyObject *offsets_object, PyObject *parents_object,
                               const int64_t **offsets, const int32_t **parents) {
    Py_ssize_t offsets_length, parents_length;
    if (take(held, offsets_object, 8, 0, "offsets", (void **)offsets, &offsets_length) < 0) return -1;
    if (take(held, parents_object, 4, 0, "parents", (void **)parents, &parents_length) < 0) return -1;
    if (offsets_length < 1) return wrong_length("offsets", offsets_length, "at least", 1);
    Py_ssize_t n = offsets_length - 1;
    if ((*offsets)[0] < 0 || (*offsets)[n] > parents_length) {
        PyErr_Format(PyExc_ValueError, "offsets: run from %lld to %lld, outside the %zd parents",
                     (long long)(*offsets)[0], (long long)(*offsets)[n], parents_length);
        return -1;
    }
    return n;
}

/* -- the sweeps ----------------------------------------------------------------------------------- */

/* backward_sweep(offsets, parents, local, nodes, output, grads): twin of replay.reference_sweep.
 * ``grads`` (N, zeros) gets 1 at ``output``, then ``nodes`` (the output's ancestors, increasing
 * ids) are swept from the last, each adding grad * local[slot] to its parent of that slot. */
static PyObject *backward_sweep(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *a, *b, *c, *d, *e;
    Py_ssize_t output;
    if (!PyArg_ParseTuple(args, "OOOOnO:backward_sweep", &a, &b, &c, &d, &output, &e)) return NULL;
    graphsvc_buffers held = {.count = 0};
    const int64_t *offsets, *nodes;
    const int32_t *parents;
    const double *local;
    double *grads;
    Py_ssize_t local_length, num_nodes, grads_length;
    Py_ssize_t n = take_columns(&held, a, b, &offsets, &parents);
    if (n < 0) goto fail;
    if (take(&held, c, 8, 0, "local", (void **)&local, &local_length) < 0) goto fail;
    if (take(&held, d, 8, 0, "nodes", (void **)&nodes, &num_nodes) < 0) goto fail;
    if (take(&held, e, 8, 1, "grads", (void **)&grads, &grads_length) < 0) goto fail;
    if (local_length < offsets[n]) {
        wrong_length("local", local_length, "one per parent slot", offsets[n]);
        goto fail;
    }
    if (grads_length != n) {
        wrong_length("grads", grads_length, "one per node", n);
        goto fail;
    }
    if (output < 0 || output >= n) {
        PyErr_Format(PyExc_ValueError, "output %zd is not a node of this graph of %zd", output, n);
        goto fail;
    }
    int failed = 0;
    int64_t bad = 0; /* a node id out of range, if one is met */
    Py_BEGIN_ALLOW_THREADS
    grads[output] = 1.0;
    for (Py_ssize_t k = num_nodes - 1; k >= 0; k--) {
        int64_t node = nodes[k];
        if (node < 0 || node >= n) {
            failed = 1;
            bad = node;
            break;
        }
        double grad = grads[node];
        for (int64_t slot = offsets[node]; slot < offsets[node + 1]; slot++) {
            grads[parents[slot]] += grad * local[slot];
        }
    }
    Py_END_ALLOW_THREADS
    if (failed) {
        PyErr_Format(PyExc_ValueError, "nodes: %lld is not a node of this graph of %zd", (long long)bad, n);
        goto fail;
    }
    graphsvc_release(&held);
    Py_RETURN_NONE;
fail:
    graphsvc_release(&held);
    return NULL;
}

/* forward_all_primitives(codes, table, offsets, parents, values): every node with parents, in id
 * order, gets the primitive ``table[its op code]`` of its inputs (``y`` is ``x`` for one parent). */
static PyObject *forward_all_primitives(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *a, *b, *c, *d, *e;
    if (!PyArg_ParseTuple(args, "OOOOO:forward_all_primitives", &a, &b, &c, &d, &e)) return NULL;
    graphsvc_buffers held = {.count = 0};
    const uint16_t *codes;
    const int8_t *table;
    const int64_t *offsets;
    const int32_t *parents;
    double *values;
    Py_ssize_t n, table_length, values_length;
    if (take(&held, a, 2, 0, "codes", (void **)&codes, &n) < 0) goto fail;
    if (take(&held, b, 1, 0, "table", (void **)&table, &table_length) < 0) goto fail;
    Py_ssize_t offsets_n = take_columns(&held, c, d, &offsets, &parents);
    if (offsets_n < 0) goto fail;
    if (take(&held, e, 8, 1, "values", (void **)&values, &values_length) < 0) goto fail;
    if (offsets_n != n || values_length != n) {
        wrong_length(offsets_n != n ? "offsets" : "values", offsets_n != n ? offsets_n + 1 : values_length,
                     "one per node (one more for offsets)", n + (offsets_n != n));
        goto fail;
    }
    Py_ssize_t bad = -1; /* a node whose op code has no entry in the table, if one is met */
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t node = 0; node < n; node++) {
        Py_ssize_t ahead = node + AHEAD;
        if (ahead < n) {
            int64_t start = offsets[ahead];
            if (offsets[ahead + 1] > start) {
                PREFETCH_READ(&values[parents[start]]);
                if (offsets[ahead + 1] > start + 1) PREFETCH_READ(&values[parents[start + 1]]);
            }
        }
        int64_t slot = offsets[node], stop = offsets[node + 1];
        if (stop == slot) continue; /* a leaf */
        if (codes[node] >= table_length) {
            bad = node;
            break;
        }
        double x = values[parents[slot]];
        double y = stop - slot > 1 ? values[parents[slot + 1]] : x;
        values[node] = primitive(table[codes[node]], x, y);
    }
    Py_END_ALLOW_THREADS
    if (bad >= 0) {
        PyErr_Format(PyExc_ValueError, "codes: node %zd has op code %d, beyond the table of %zd", bad,
                     (int)codes[bad], table_length);
        goto fail;
    }
    graphsvc_release(&held);
    Py_RETURN_NONE;
fail:
    graphsvc_release(&held);
    return NULL;
}

/* The number of nodes ``kinds`` and ``values`` both cover (the graph's N), checked; -1 with an
 * exception set when they do not match the offsets. */
static int check_nodes(Py_ssize_t n, Py_ssize_t kinds_length, Py_ssize_t values_length) {
    if (kinds_length != n) return wrong_length("kinds", kinds_length, "one per node", n);
    if (values_length != n) return wrong_length("values", values_length, "one per node", n);
    return 0;
}

/* forward_primitives(nodes, kinds, offsets, parents, values, start): compute the values of
 * nodes[start:] in order; stop at the first whose kind is 0 (not a primitive) and return its
 * position (len(nodes) when all were done). */
static PyObject *forward_primitives(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *a, *b, *c, *d, *e;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "OOOOOn:forward_primitives", &a, &b, &c, &d, &e, &start)) return NULL;
    graphsvc_buffers held = {.count = 0};
    const int64_t *nodes, *offsets;
    const int8_t *kinds;
    const int32_t *parents;
    double *values;
    Py_ssize_t num_nodes, kinds_length, values_length;
    if (take(&held, a, 8, 0, "nodes", (void **)&nodes, &num_nodes) < 0) goto fail;
    if (take(&held, b, 1, 0, "kinds", (void **)&kinds, &kinds_length) < 0) goto fail;
    Py_ssize_t n = take_columns(&held, c, d, &offsets, &parents);
    if (n < 0) goto fail;
    if (take(&held, e, 8, 1, "values", (void **)&values, &values_length) < 0) goto fail;
    if (check_nodes(n, kinds_length, values_length) < 0) goto fail;
    if (start < 0) start = 0;
    if (start > num_nodes) start = num_nodes; /* nothing left: len(nodes), as Python's range() gives */
    Py_ssize_t k = start;
    int failed = 0;
    int64_t bad = 0; /* a node id out of range, if one is met */
    Py_BEGIN_ALLOW_THREADS
    for (; k < num_nodes; k++) {
        int64_t node = nodes[k];
        if (node < 0 || node >= n) {
            failed = 1;
            bad = node;
            break;
        }
        int kind = kinds[node];
        if (kind == 0) break;
        int64_t slot = offsets[node];
        double x = values[parents[slot]];
        double y = offsets[node + 1] - slot > 1 ? values[parents[slot + 1]] : x;
        values[node] = primitive(kind, x, y);
    }
    Py_END_ALLOW_THREADS
    if (failed) {
        PyErr_Format(PyExc_ValueError, "nodes: %lld is not a node of this graph of %zd", (long long)bad, n);
        goto fail;
    }
    graphsvc_release(&held);
    return PyLong_FromSsize_t(k);
fail:
    graphsvc_release(&held);
    return NULL;
}

/* primitive_derivatives(nodes, kinds, offsets, parents, values, local): for each of ``nodes``
 * that is a primitive, its partial derivatives into ``local`` (one entry per parent slot). */
static PyObject *primitive_derivatives(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *a, *b, *c, *d, *e, *f;
    if (!PyArg_ParseTuple(args, "OOOOOO:primitive_derivatives", &a, &b, &c, &d, &e, &f)) return NULL;
    graphsvc_buffers held = {.count = 0};
    const int64_t *nodes, *offsets;
    const int8_t *kinds;
    const int32_t *parents;
    const double *values;
    double *local;
    Py_ssize_t num_nodes, kinds_length, values_length, local_length;
    if (take(&held, a, 8, 0, "nodes", (void **)&nodes, &num_nodes) < 0) goto fail;
    if (take(&held, b, 1, 0, "kinds", (void **)&kinds, &kinds_length) < 0) goto fail;
    Py_ssize_t n = take_columns(&held, c, d, &offsets, &parents);
    if (n < 0) goto fail;
    if (take(&held, e, 8, 0, "values", (void **)&values, &values_length) < 0) goto fail;
    if (take(&held, f, 8, 1, "local", (void **)&local, &local_length) < 0) goto fail;
    if (check_nodes(n, kinds_length, values_length) < 0) goto fail;
    if (local_length < offsets[n]) {
        wrong_length("local", local_length, "one per parent slot", offsets[n]);
        goto fail;
    }
    int failed = 0;
    int64_t bad = 0; /* a node id out of range, if one is met */
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < num_nodes; k++) {
        int64_t node = nodes[k];
        if (node < 0 || node >= n) {
            failed = 1;
            bad = node;
            break;
        }
        int kind = kinds[node];
        if (kind == 0) continue;
        int64_t slot = offsets[node];
        int binary = offsets[node + 1] - slot > 1;
        double x = values[parents[slot]];
        double y = binary ? values[parents[slot + 1]] : x;
        double dx, dy;
        partials(kind, x, y, values[node], &dx, &dy);
        local[slot] = dx;
        if (binary) local[slot + 1] = dy;
    }
    Py_END_ALLOW_THREADS
    if (failed) {
        PyErr_Format(PyExc_ValueError, "nodes: %lld is not a node of this graph of %zd", (long long)bad, n);
        goto fail;
    }
    graphsvc_release(&held);
    Py_RETURN_NONE;
fail:
    graphsvc_release(&held);
    return NULL;
}

/* backward_primitives(offsets, parents, codes, table, values, output, both, reached, grads):
 * backward_sweep fused with ancestors and primitive_derivatives, for graphs whose every op is a
 * primitive (``table`` as in forward_all_primitives). One pass down from ``output``: a node is swept
 * once a child that depends on it has been (ids decrease, so all its children come first); same
 * numbers, same order as the reference. Each node's value and gradient sit side by side,
 * both[2 node] and both[2 node + 1] (2 (output + 1) items), so a parent costs one cache line, not
 * two; ``reached`` has output + 1 booleans. The caller allocates the scratch with numpy, which asks
 * the kernel for huge pages: the random accesses are then spared most of their TLB misses. */
static PyObject *backward_primitives(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *a, *b, *c, *d, *e, *f, *g, *h;
    Py_ssize_t output;
    if (!PyArg_ParseTuple(args, "OOOOOnOOO:backward_primitives", &a, &b, &c, &d, &e, &output, &f, &g, &h)) {
        return NULL;
    }
    graphsvc_buffers held = {.count = 0};
    const int64_t *offsets;
    const int32_t *parents;
    const uint16_t *codes;
    const int8_t *table;
    const double *values;
    double *both, *grads;
    char *reached; /* numpy's booleans: one byte, 0 or 1 */
    Py_ssize_t codes_length, table_length, values_length, both_length, reached_length, grads_length;
    Py_ssize_t n = take_columns(&held, a, b, &offsets, &parents);
    if (n < 0) goto fail;
    if (take(&held, c, 2, 0, "codes", (void **)&codes, &codes_length) < 0) goto fail;
    if (take(&held, d, 1, 0, "table", (void **)&table, &table_length) < 0) goto fail;
    if (take(&held, e, 8, 0, "values", (void **)&values, &values_length) < 0) goto fail;
    if (take(&held, f, 8, 1, "both", (void **)&both, &both_length) < 0) goto fail;
    if (take(&held, g, 1, 1, "reached", (void **)&reached, &reached_length) < 0) goto fail;
    if (take(&held, h, 8, 1, "grads", (void **)&grads, &grads_length) < 0) goto fail;
    if (output < 0 || output >= n) {
        PyErr_Format(PyExc_ValueError, "output %zd is not a node of this graph of %zd", output, n);
        goto fail;
    }
    if (codes_length != n || values_length != n || grads_length != n) {
        const char *name = codes_length != n ? "codes" : (values_length != n ? "values" : "grads");
        wrong_length(name, codes_length != n ? codes_length : (values_length != n ? values_length : grads_length),
                     "one per node", n);
        goto fail;
    }
    if (both_length != 2 * (output + 1) || reached_length != output + 1) {
        int is_both = both_length != 2 * (output + 1);
        wrong_length(is_both ? "both" : "reached", is_both ? both_length : reached_length,
                     is_both ? "2 (output + 1)" : "output + 1", is_both ? 2 * (output + 1) : output + 1);
        goto fail;
    }
    Py_ssize_t bad = -1; /* a node whose op code has no entry in the table, if one is met */
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t node = 0; node <= output; node++) {
        both[2 * node] = values[node];
        both[2 * node + 1] = 0.0;
        reached[node] = 0;
    }
    both[2 * output + 1] = 1.0;
    reached[output] = 1;
    for (Py_ssize_t node = output; node >= 0; node--) {
        Py_ssize_t ahead = node - AHEAD;
        if (ahead >= 0) {
            int64_t start = offsets[ahead];
            if (offsets[ahead + 1] > start) {
                PREFETCH_WRITE(&both[2 * (int64_t)parents[start]]);
                PREFETCH_WRITE(&reached[parents[start]]);
                if (offsets[ahead + 1] > start + 1) {
                    PREFETCH_WRITE(&both[2 * (int64_t)parents[start + 1]]);
                    PREFETCH_WRITE(&reached[parents[start + 1]]);
                }
            }
        }
        int64_t slot = offsets[node], stop = offsets[node + 1];
        if (!reached[node] || stop == slot) continue;
        if (codes[node] >= table_length) {
            bad = node;
            break;
        }
        int binary = stop - slot > 1;
        int64_t first = parents[slot];
        int64_t second = binary ? parents[slot + 1] : first;
        double dx, dy;
        partials(table[codes[node]], both[2 * first], both[2 * second], both[2 * node], &dx, &dy);
        double grad = both[2 * node + 1];
        reached[first] = 1;
        both[2 * first + 1] += grad * dx;
        if (binary) {
            reached[second] = 1;
            both[2 * second + 1] += grad * dy;
        }
    }
    for (Py_ssize_t node = 0; node <= output; node++) grads[node] = both[2 * node + 1];
    for (Py_ssize_t node = output + 1; node < n; node++) grads[node] = 0.0;
    Py_END_ALLOW_THREADS
    if (bad >= 0) {
        PyErr_Format(PyExc_ValueError, "codes: node %zd has op code %d, beyond the table of %zd", bad,
                     (int)codes[bad], table_length);
        goto fail;
    }
    graphsvc_release(&held);
    Py_RETURN_NONE;
fail:
    graphsvc_release(&held);
    return NULL;
}

static PyMethodDef methods[] = {
    {"backward_sweep", backward_sweep, METH_VARARGS,
     "backward_sweep(offsets, parents, local, nodes, output, grads): the backward sweep into grads (zeros)."},
    {"forward_all_primitives", forward_all_primitives, METH_VARARGS,
     "forward_all_primitives(codes, table, offsets, parents, values): every node's primitive, in id order."},
    {"forward_primitives", forward_primitives, METH_VARARGS,
     "forward_primitives(nodes, kinds, offsets, parents, values, start): nodes[start:] up to the first that "
     "is not a primitive; returns its position."},
    {"primitive_derivatives", primitive_derivatives, METH_VARARGS,
     "primitive_derivatives(nodes, kinds, offsets, parents, values, local): the primitives' partials into local."},
    {"backward_primitives", backward_primitives, METH_VARARGS,
     "backward_primitives(offsets, parents, codes, table, values, output, both, reached, grads): the fused "
     "backward of an all-primitive graph into grads."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "graphsvc._creplay", .m_doc = "replay sweeps", .m_size = -1, .m_methods = methods,
};

PyMODINIT_FUNC PyInit__creplay(void) { return PyModule_Create(&module); }
