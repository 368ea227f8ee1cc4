/* Replay sweeps: twins of graphsvc/replay/columns.py's references (and of benchmarks/numba_kernels.py, the
 * numba kernels they replaced). graphsvc/native/replay_kernels.py allocates the results and calls these.
 *
 * Columns: offsets int64 (N + 1), parents int32 (E), values float64 (N), op codes uint16 (N),
 * ``table`` int8 (a primitive per op code), ``kinds`` int8 (a primitive per node), ``nodes`` int64.
 * Array lengths are checked; the columns' contents (offsets that never decrease, parent ids below
 * their child's) are trusted: Graph.check holds them.
 *
 * The ops' math comes from opmath.h, generated from graphsvc/ops/opmath.py, from which the numpy
 * functions of graphsvc/ops/builtin.py and Value's arithmetic are derived too. The correctly rounded
 * operations (+ - * /, sqrt, the comparisons) give the same bits as numpy on every CPU; exp, log,
 * pow, sin, cos and tanh are libm's, as in Python's math, and graphsvc.ops.builtin runs those
 * through the elementwise loops below, so every path agrees on one machine. The build passes -ffp-contract=off:
 * ``a + b * c`` rounds twice, as numpy does; never write fma() here.
 */
#include "native.h"

#include <math.h>

/* How many nodes ahead of the one they compute the sweeps ask for its parents' numbers: with random
 * parents the loads of many nodes then overlap instead of waiting for each in turn. */
#define AHEAD 32

/* -- primitive ops --------------------------------------------------------------------------------
 * The codes of graphsvc.ops.opmath.PRIMITIVES (position + 1; 0: not a primitive), the builtin
 * elementwise ops of graphsvc/ops/opmath.py's table. Their math is in opmath.h, generated from that
 * table (``python -m graphsvc.ops.opmath``); none is written here. */
#include "opmath.h"

/* What the primitive computes: the op's forward of x and y (unary ones ignore y); p is the node's
 * parameter (pow's exponent). */
OPMATH_INLINE double primitive(int kind, double x, double y, double p) { return opmath_forward(kind, x, y, p); }

/* (d out/d x, d out/d y) of a primitive. */
OPMATH_INLINE void partials(int kind, double x, double y, double out, double p, double *dx, double *dy) {
    opmath_partials(kind, x, y, out, p, dx, dy);
}

/* The optional ``params`` argument of the sweeps: one float64 per node (pow's exponent; other
 * nodes' entries are not read), or None when no node takes a parameter. */
typedef struct {
    Py_buffer view;
    const double *data; /* NULL: None was given */
} params_arg;

/* Acquire ``object`` (None or N float64s) into ``params``: 0, or -1 with an exception set. */
static int take_params(PyObject *object, Py_ssize_t n, params_arg *params) {
    params->data = NULL;
    if (object == NULL || object == Py_None) return 0;
    if (graphsvc_buffer(object, &params->view, 8, 0, "params") < 0) return -1;
    if (params->view.len / 8 != n) {
        Py_ssize_t length = params->view.len / 8;
        PyErr_Format(PyExc_ValueError, "params: %zd %s, expected one per node (%zd)", length,
                     graphsvc_noun(length, "item", "items"), n);
        PyBuffer_Release(&params->view);
        return -1;
    }
    params->data = params->view.buf;
    return 0;
}

static void release_params(params_arg *params) {
    if (params->data != NULL) PyBuffer_Release(&params->view);
    params->data = NULL;
}

/* Node ``node``'s parameter: 0 for a primitive that takes none; -1 (a failure) for one that takes
 * one when no params were given. */
OPMATH_INLINE int param_of(const params_arg *params, int kind, Py_ssize_t node, double *p) {
    if (!opmath_takes_param(kind)) {
        *p = 0.0;
        return 0;
    }
    if (params->data == NULL) return -1;
    *p = params->data[node];
    return 0;
}

static PyObject *missing_params(Py_ssize_t node, int kind) {
    PyErr_Format(PyExc_ValueError, "params: node %zd is a primitive with a parameter (code %d), but no params were given",
                 node, kind);
    return NULL;
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
    PyErr_Format(PyExc_ValueError, "%s: %zd %s, expected %s (%zd)", name, length, graphsvc_noun(length, "item", "items"),
                 expected, value);
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
        PyErr_Format(PyExc_ValueError, "offsets: run from %lld to %lld, outside the %zd %s",
                     (long long)(*offsets)[0], (long long)(*offsets)[n], parents_length,
                     graphsvc_noun(parents_length, "parent", "parents"));
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
        PyErr_Format(PyExc_ValueError, "output %zd is not a node of this graph of %zd %s", output, n,
                     graphsvc_noun(n, "node", "nodes"));
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
        PyErr_Format(PyExc_ValueError, "nodes: %lld is not a node of this graph of %zd %s", (long long)bad, n,
                     graphsvc_noun(n, "node", "nodes"));
        goto fail;
    }
    graphsvc_release(&held);
    Py_RETURN_NONE;
fail:
    graphsvc_release(&held);
    return NULL;
}

/* forward_all_primitives(codes, table, offsets, parents, values[, params]): every node with
 * parents, in id order, gets the primitive ``table[its op code]`` of its inputs (``y`` is ``x`` for
 * one parent). */
static PyObject *forward_all_primitives(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *a, *b, *c, *d, *e, *f = NULL;
    if (!PyArg_ParseTuple(args, "OOOOO|O:forward_all_primitives", &a, &b, &c, &d, &e, &f)) return NULL;
    graphsvc_buffers held = {.count = 0};
    params_arg params = {.data = NULL};
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
    if (take_params(f, n, &params) < 0) goto fail;
    Py_ssize_t bad = -1;      /* a node whose op code has no entry in the table, if one is met */
    Py_ssize_t unset = -1;    /* a node that takes a parameter when none were given */
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
        int kind = table[codes[node]];
        double p;
        if (param_of(&params, kind, node, &p) < 0) {
            unset = node;
            break;
        }
        double x = values[parents[slot]];
        double y = stop - slot > 1 ? values[parents[slot + 1]] : x;
        values[node] = primitive(kind, x, y, p);
    }
    Py_END_ALLOW_THREADS
    if (bad >= 0) {
        PyErr_Format(PyExc_ValueError, "codes: node %zd has op code %d, beyond the table of %zd %s", bad,
                     (int)codes[bad], table_length, graphsvc_noun(table_length, "entry", "entries"));
        goto fail;
    }
    if (unset >= 0) {
        missing_params(unset, table[codes[unset]]);
        goto fail;
    }
    release_params(&params);
    graphsvc_release(&held);
    Py_RETURN_NONE;
fail:
    release_params(&params);
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

/* forward_primitives(nodes, kinds, offsets, parents, values, start[, params]): compute the values
 * of nodes[start:] in order; stop at the first whose kind is 0 (not a primitive) and return its
 * position (len(nodes) when all were done). */
static PyObject *forward_primitives(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *a, *b, *c, *d, *e, *f = NULL;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "OOOOOn|O:forward_primitives", &a, &b, &c, &d, &e, &start, &f)) return NULL;
    graphsvc_buffers held = {.count = 0};
    params_arg params = {.data = NULL};
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
    if (take_params(f, n, &params) < 0) goto fail;
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
        double p;
        if (param_of(&params, kind, node, &p) < 0) {
            failed = 2;
            bad = node;
            break;
        }
        int64_t slot = offsets[node];
        double x = values[parents[slot]];
        double y = offsets[node + 1] - slot > 1 ? values[parents[slot + 1]] : x;
        values[node] = primitive(kind, x, y, p);
    }
    Py_END_ALLOW_THREADS
    if (failed == 1) {
        PyErr_Format(PyExc_ValueError, "nodes: %lld is not a node of this graph of %zd %s", (long long)bad, n,
                     graphsvc_noun(n, "node", "nodes"));
        goto fail;
    }
    if (failed == 2) {
        missing_params((Py_ssize_t)bad, kinds[bad]);
        goto fail;
    }
    release_params(&params);
    graphsvc_release(&held);
    return PyLong_FromSsize_t(k);
fail:
    release_params(&params);
    graphsvc_release(&held);
    return NULL;
}

/* primitive_derivatives(nodes, kinds, offsets, parents, values, local[, params]): for each of
 * ``nodes`` that is a primitive, its partial derivatives into ``local`` (one entry per parent slot). */
static PyObject *primitive_derivatives(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *a, *b, *c, *d, *e, *f, *g = NULL;
    if (!PyArg_ParseTuple(args, "OOOOOO|O:primitive_derivatives", &a, &b, &c, &d, &e, &f, &g)) return NULL;
    graphsvc_buffers held = {.count = 0};
    params_arg params = {.data = NULL};
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
    if (take_params(g, n, &params) < 0) goto fail;
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
        double p;
        if (param_of(&params, kind, node, &p) < 0) {
            failed = 2;
            bad = node;
            break;
        }
        int64_t slot = offsets[node];
        int binary = offsets[node + 1] - slot > 1;
        double x = values[parents[slot]];
        double y = binary ? values[parents[slot + 1]] : x;
        double dx, dy;
        partials(kind, x, y, values[node], p, &dx, &dy);
        local[slot] = dx;
        if (binary) local[slot + 1] = dy;
    }
    Py_END_ALLOW_THREADS
    if (failed == 1) {
        PyErr_Format(PyExc_ValueError, "nodes: %lld is not a node of this graph of %zd %s", (long long)bad, n,
                     graphsvc_noun(n, "node", "nodes"));
        goto fail;
    }
    if (failed == 2) {
        missing_params((Py_ssize_t)bad, kinds[bad]);
        goto fail;
    }
    release_params(&params);
    graphsvc_release(&held);
    Py_RETURN_NONE;
fail:
    release_params(&params);
    graphsvc_release(&held);
    return NULL;
}

/* backward_primitives(offsets, parents, codes, table, values, output, both, reached, grads[, params]):
 * backward_sweep fused with ancestors and primitive_derivatives, for graphs whose every op is a
 * primitive (``table`` as in forward_all_primitives). One pass down from ``output``: a node is swept
 * once a child that depends on it has been (ids decrease, so all its children come first); same
 * numbers, same order as the reference. Each node's value and gradient sit side by side,
 * both[2 node] and both[2 node + 1] (2 (output + 1) items), so a parent costs one cache line, not
 * two; ``reached`` has output + 1 booleans. The caller allocates the scratch with numpy, which asks
 * the kernel for huge pages: the random accesses are then spared most of their TLB misses. */
static PyObject *backward_primitives(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *a, *b, *c, *d, *e, *f, *g, *h, *k = NULL;
    Py_ssize_t output;
    if (!PyArg_ParseTuple(args, "OOOOOnOOO|O:backward_primitives", &a, &b, &c, &d, &e, &output, &f, &g, &h, &k)) {
        return NULL;
    }
    graphsvc_buffers held = {.count = 0};
    params_arg params = {.data = NULL}; /* a ninth buffer: held has room for eight */
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
        PyErr_Format(PyExc_ValueError, "output %zd is not a node of this graph of %zd %s", output, n,
                     graphsvc_noun(n, "node", "nodes"));
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
    if (take_params(k, n, &params) < 0) goto fail;
    Py_ssize_t bad = -1;   /* a node whose op code has no entry in the table, if one is met */
    Py_ssize_t unset = -1; /* a node that takes a parameter when none were given */
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
        int kind = table[codes[node]];
        double p;
        if (param_of(&params, kind, node, &p) < 0) {
            unset = node;
            break;
        }
        int binary = stop - slot > 1;
        int64_t first = parents[slot];
        int64_t second = binary ? parents[slot + 1] : first;
        double dx, dy;
        partials(kind, both[2 * first], both[2 * second], both[2 * node], p, &dx, &dy);
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
        PyErr_Format(PyExc_ValueError, "codes: node %zd has op code %d, beyond the table of %zd %s", bad,
                     (int)codes[bad], table_length, graphsvc_noun(table_length, "entry", "entries"));
        goto fail;
    }
    if (unset >= 0) {
        missing_params(unset, table[codes[unset]]);
        goto fail;
    }
    release_params(&params);
    graphsvc_release(&held);
    Py_RETURN_NONE;
fail:
    release_params(&params);
    graphsvc_release(&held);
    return NULL;
}

/* -- elementwise loops ----------------------------------------------------------------------------
 * What graphsvc/ops/builtin.py calls for the float64 forward and derivatives of the ops whose math
 * is not correctly rounded (exp, log, pow, sin, cos, tanh, sigmoid): the same opmath.h the sweeps
 * use, so a node computes the same bits in a numpy group, on its own, and in a compiled sweep. */

/* The ``count`` float64 buffers of ``objects`` (each n items, the first fixing n; the last
 * ``writable`` ones writable): n, or -1 with an exception set. */
static Py_ssize_t take_columns_of(graphsvc_buffers *held, PyObject **objects, const char **names, int count,
                                  int writable, double **data) {
    Py_ssize_t n = -1;
    for (int i = 0; i < count; i++) {
        Py_ssize_t length;
        if (take(held, objects[i], 8, i >= count - writable, names[i], (void **)&data[i], &length) < 0) return -1;
        if (n >= 0 && length != n) return wrong_length(names[i], length, "as many as x", n);
        n = length;
    }
    return n;
}

/* The op code argument, checked: 1..OPMATH_COUNT, or -1 with an exception set. */
static int check_code(int code) {
    if (code < 1 || code > OPMATH_COUNT) {
        PyErr_Format(PyExc_ValueError, "code %d is not a primitive (1 to %d)", code, OPMATH_COUNT);
        return -1;
    }
    return code;
}

/* elementwise(code, x, y, p, out): out[i] = the op's forward of x[i], y[i] (p: its parameter). */
static PyObject *elementwise(PyObject *self, PyObject *args) {
    (void)self;
    int code;
    double p;
    PyObject *objects[3];
    const char *names[3] = {"x", "y", "out"};
    if (!PyArg_ParseTuple(args, "iOOdO:elementwise", &code, &objects[0], &objects[1], &p, &objects[2])) return NULL;
    if (check_code(code) < 0) return NULL;
    graphsvc_buffers held = {.count = 0};
    double *data[3];
    Py_ssize_t n = take_columns_of(&held, objects, names, 3, 1, data);
    if (n < 0) {
        graphsvc_release(&held);
        return NULL;
    }
    const double *x = data[0], *y = data[1];
    double *out = data[2];
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) out[i] = primitive(code, x[i], y[i], p);
    Py_END_ALLOW_THREADS
    graphsvc_release(&held);
    Py_RETURN_NONE;
}

/* elementwise_partials(code, x, y, out, p, dx, dy): the op's partial derivatives into dx and dy. */
static PyObject *elementwise_partials(PyObject *self, PyObject *args) {
    (void)self;
    int code;
    double p;
    PyObject *objects[5];
    const char *names[5] = {"x", "y", "out", "dx", "dy"};
    if (!PyArg_ParseTuple(args, "iOOOdOO:elementwise_partials", &code, &objects[0], &objects[1], &objects[2], &p,
                          &objects[3], &objects[4])) {
        return NULL;
    }
    if (check_code(code) < 0) return NULL;
    graphsvc_buffers held = {.count = 0};
    double *data[5];
    Py_ssize_t n = take_columns_of(&held, objects, names, 5, 2, data);
    if (n < 0) {
        graphsvc_release(&held);
        return NULL;
    }
    const double *x = data[0], *y = data[1], *out = data[2];
    double *dx = data[3], *dy = data[4];
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) partials(code, x[i], y[i], out[i], p, &dx[i], &dy[i]);
    Py_END_ALLOW_THREADS
    graphsvc_release(&held);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"backward_sweep", backward_sweep, METH_VARARGS,
     "backward_sweep(offsets, parents, local, nodes, output, grads): the backward sweep into grads (zeros)."},
    {"forward_all_primitives", forward_all_primitives, METH_VARARGS,
     "forward_all_primitives(codes, table, offsets, parents, values[, params]): every node's primitive, in id "
     "order."},
    {"forward_primitives", forward_primitives, METH_VARARGS,
     "forward_primitives(nodes, kinds, offsets, parents, values, start[, params]): nodes[start:] up to the "
     "first that is not a primitive; returns its position."},
    {"primitive_derivatives", primitive_derivatives, METH_VARARGS,
     "primitive_derivatives(nodes, kinds, offsets, parents, values, local[, params]): the primitives' partials "
     "into local."},
    {"backward_primitives", backward_primitives, METH_VARARGS,
     "backward_primitives(offsets, parents, codes, table, values, output, both, reached, grads[, params]): the "
     "fused backward of an all-primitive graph into grads."},
    {"elementwise", elementwise, METH_VARARGS, "elementwise(code, x, y, p, out): a primitive's forward, element by element."},
    {"elementwise_partials", elementwise_partials, METH_VARARGS,
     "elementwise_partials(code, x, y, out, p, dx, dy): a primitive's partial derivatives, element by element."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "graphsvc.native._creplay", .m_doc = "replay sweeps", .m_size = -1, .m_methods = methods,
};

PyMODINIT_FUNC PyInit__creplay(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    /* the checksum of the op table this was built from (graphsvc.ops.opmath.digest()) */
    if (PyModule_AddStringConstant(m, "opmath_digest", OPMATH_DIGEST) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
