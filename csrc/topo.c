/* Orderings and structure: twins of graphsvc/topo.py's references (and graph.py's structure check).
 * Columns: offsets int64 (N + 1), parents int32 (E).
 *
 * The columns a caller passes have normally passed Graph.check, but nothing here relies on it to
 * stay in bounds: every length is checked up front, and every index a loop is about to follow is
 * checked as it is read (a compare the branch predictor always gets right), so broken columns raise
 * ValueError instead of reading or writing outside the arrays. */
#include "native.h"

#include <string.h>

/* In pairs (see fill_pairs): the node has more than two parents; read them from the CSR columns. */
#define MANY (-2)
/* How many nodes ahead of the one it works on a sweep asks for the memory that node will touch. */
#define AHEAD 32

/* What a loop found wrong, reported once the GIL is held again. */
enum problem { OK = 0, BAD_OFFSETS, BAD_PARENT, BAD_START, BAD_CODE };

static PyObject *raise_problem(enum problem problem, int64_t where) {
    switch (problem) {
    case BAD_OFFSETS:
        return PyErr_Format(PyExc_ValueError, "offsets out of order or out of range at node %lld", (long long)where);
    case BAD_PARENT:
        return PyErr_Format(PyExc_ValueError, "node %lld has a parent id out of range (not below its own)",
                            (long long)where);
    case BAD_START:
        return PyErr_Format(PyExc_ValueError, "start node %lld out of range", (long long)where);
    case BAD_CODE:
        return PyErr_Format(PyExc_ValueError, "node %lld has an op code beyond the table", (long long)where);
    default:
        return PyErr_Format(PyExc_SystemError, "graphsvc.native._ctopo: unknown problem");
    }
}

/* A buffer argument (native.h's graphsvc_take) into *view: 0, or -1 with an exception set. */
static int take(graphsvc_buffers *held, PyObject *object, Py_ssize_t itemsize, int writable, const char *name,
                Py_buffer **view) {
    *view = graphsvc_take(held, object, itemsize, writable, name);
    return *view == NULL ? -1 : 0;
}

static PyObject *wrong_length(graphsvc_buffers *held, const char *name, Py_ssize_t got, Py_ssize_t expected) {
    graphsvc_release(held);
    return PyErr_Format(PyExc_ValueError, "%s: %zd %s, expected %zd", name, got, graphsvc_noun(got, "entry", "entries"),
                        expected);
}

/* pairs[2 * node] and pairs[2 * node + 1]: the node's parents side by side (-1 where it has fewer
 * than two; MANY in the first when it has more), so a search that jumps from node to node reads one
 * cache line per node, not one in offsets and one in parents. Checks every offset (0 <= start <=
 * stop <= e) and every parent copied into pairs (0 <= parent < n); a MANY node's parents are
 * checked where they are read. */
static enum problem fill_pairs(const int64_t *off, const int32_t *par, int64_t n, int64_t e, int32_t *pairs,
                               int64_t *where) {
    if (off[0] < 0 || off[0] > e) {
        *where = 0;
        return BAD_OFFSETS;
    }
    for (int64_t node = 0; node < n; node++) {
        int64_t start = off[node], stop = off[node + 1];
        if (stop < start || stop > e) {
            *where = node;
            return BAD_OFFSETS;
        }
        int64_t count = stop - start;
        int32_t first = -1, second = -1;
        if (count > 2) {
            first = MANY;
        } else if (count > 0) {
            first = par[start];
            if (count == 2) second = par[start + 1];
            /* a parent's id is below its child's (node ids are a topological order): the orderings
             * rely on it, and columns not yet checked must not make them read or write out of bounds */
            if (first < 0 || first >= node || (count == 2 && (second < 0 || second >= node))) {
                *where = node;
                return BAD_PARENT;
            }
        }
        pairs[2 * node] = first;
        pairs[2 * node + 1] = second;
    }
    return OK;
}

/* Checks that each start lies in 0..n-1. */
static enum problem check_starts(const int64_t *starts, Py_ssize_t count, int64_t n, int64_t *where) {
    for (Py_ssize_t k = 0; k < count; k++) {
        if (starts[k] < 0 || starts[k] >= n) {
            *where = starts[k];
            return BAD_START;
        }
    }
    return OK;
}

/* inline_parents(offsets, parents, pairs): fill pairs (int32, 2 N). */
static PyObject *inline_parents(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *a, *b, *c;
    graphsvc_buffers held = {.count = 0};
    Py_buffer *offsets, *parents, *pairs;
    if (!PyArg_ParseTuple(args, "OOO:inline_parents", &a, &b, &c)) return NULL;
    if (take(&held, a, 8, 0, "offsets", &offsets) < 0 || take(&held, b, 4, 0, "parents", &parents) < 0 ||
        take(&held, c, 4, 1, "pairs", &pairs) < 0) {
        graphsvc_release(&held);
        return NULL;
    }
    int64_t n = offsets->len / 8 - 1;
    if (n < 0) return wrong_length(&held, "offsets", 0, 1);
    if (pairs->len / 4 != 2 * n) return wrong_length(&held, "pairs", pairs->len / 4, 2 * n);
    enum problem problem;
    int64_t where = 0;
    Py_BEGIN_ALLOW_THREADS
    problem = fill_pairs(offsets->buf, parents->buf, n, parents->len / 4, pairs->buf, &where);
    Py_END_ALLOW_THREADS
    graphsvc_release(&held);
    if (problem != OK) return raise_problem(problem, where);
    Py_RETURN_NONE;
}

/* The run-ahead of dfs: RING nodes whose search is coming (second parents put aside), each looked
 * at DELAY steps after it was put in, when its pairs have had time to arrive. Only parents more
 * than NEAR ids below their child go in: the nearer ones are most likely in cache already (in a
 * graph built by tracing, as micrograd's MLP, a node's parents were mostly made just before it),
 * where the run-ahead would only cost time (1.5x slower on that MLP without this rule). */
enum { RING = 16, DELAY = 2, NEAR = 64 };

typedef struct {
    int32_t nodes[RING];
    uint64_t put, taken; /* counts; the ring holds nodes[taken % RING .. put % RING) */
} runahead;

/* Asks for the flag and pairs of parent, a parent of child; puts it aside if it lies far below. */
static inline void runahead_add(runahead *ahead, const uint8_t *visited, const int32_t *pairs, int64_t child,
                                int32_t parent) {
    PREFETCH_READ(&visited[parent]);
    PREFETCH_READ(&pairs[2 * parent]);
    if (child - parent <= NEAR) return;
    ahead->nodes[ahead->put++ % RING] = parent;
    if (ahead->put - ahead->taken > RING) ahead->taken = ahead->put - RING; /* full: forget the oldest */
}

/* Takes the oldest node put aside and, when the search has not been there yet, asks for its parents
 * and puts them aside in turn: a second walk, a few steps ahead of the search, down the branches the
 * search will come back to. It only asks for memory: it changes nothing the search reads. */
static inline void runahead_step(runahead *ahead, const uint8_t *visited, const int32_t *pairs) {
    if (ahead->put - ahead->taken <= DELAY) return;
    int32_t node = ahead->nodes[ahead->taken++ % RING];
    if (visited[node]) return;
    int32_t first = pairs[2 * node], second = pairs[2 * node + 1];
    if (first >= 0) runahead_add(ahead, visited, pairs, node, first);
    if (second >= 0) runahead_add(ahead, visited, pairs, node, second);
}

/* The depth-first post-order of topo._dfs_postorder, from each start in turn, parents in stored
 * order. stack[top] is the node being searched at depth top, cursor[top] how many of its parents
 * have been looked at. Every node is pushed at most once (marked visited as it is pushed), so
 * stack, cursor and order need n entries. Returns how many nodes order holds, -1 on a problem.
 *
 * Going down from a node to its first parent is a chain of dependent loads (that parent's pairs say
 * where to go next), one trip to memory per node once the graph outgrows the caches. Two things
 * keep more loads in flight: the parent's pairs are asked for together with its visited flag, and
 * each second parent is asked for when its node is first met, with a run-ahead walk (above) into
 * its parents, so that by the time the search comes back for it the branch is in cache (1.7x
 * faster at 10M nodes of benchmarks/graphs.py's DAG than the second parent's prefetch alone). */
static int64_t dfs(const int64_t *starts, Py_ssize_t num_starts, const int64_t *off, const int32_t *par, int64_t n,
                   int64_t e, int32_t *pairs, uint8_t *visited, int64_t *order, int64_t *stack, int64_t *cursor,
                   enum problem *problem, int64_t *where) {
    if ((*problem = check_starts(starts, num_starts, n, where)) != OK) return -1;
    if ((*problem = fill_pairs(off, par, n, e, pairs, where)) != OK) return -1;
    memset(visited, 0, (size_t)n);
    runahead ahead = {.put = 0, .taken = 0};
    int64_t count = 0;
    for (Py_ssize_t s = 0; s < num_starts; s++) {
        int64_t start = starts[s];
        if (visited[start]) continue;
        visited[start] = 1;
        int64_t top = 0;
        stack[0] = start;
        cursor[0] = 0;
        while (top >= 0) {
            runahead_step(&ahead, visited, pairs);
            int64_t node = stack[top];
            int64_t k = cursor[top];
            int32_t first = pairs[2 * node];
            int64_t parent;
            if (first == MANY) {
                int64_t slot = off[node] + k;
                parent = -1;
                if (slot < off[node + 1]) {
                    parent = par[slot];
                    if (parent < 0 || parent >= node) {
                        *problem = BAD_PARENT;
                        *where = node;
                        return -1;
                    }
                }
            } else if (k == 0) {
                parent = first;
                int32_t second = pairs[2 * node + 1];
                if (second >= 0) runahead_add(&ahead, visited, pairs, node, second); /* needed after first's search */
            } else {
                parent = k == 1 ? pairs[2 * node + 1] : -1;
            }
            if (parent >= 0) {
                cursor[top] = k + 1;
                PREFETCH_READ(&pairs[2 * parent]); /* read next if not visited: ask now, with the flag */
                if (!visited[parent]) {
                    visited[parent] = 1;
                    top++;
                    stack[top] = parent;
                    cursor[top] = 0;
                }
            } else {
                top--;
                order[count++] = node;
            }
        }
    }
    return count;
}

/* dfs_postorder(starts, offsets, parents, pairs, visited, order, stack, cursor) -> count
 * starts int64; pairs int32 (2 N); visited bool (N); order, stack, cursor int64 (N). */
static PyObject *dfs_postorder(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o[8];
    graphsvc_buffers held = {.count = 0};
    Py_buffer *starts, *offsets, *parents, *pairs, *visited, *order, *stack, *cursor;
    if (!PyArg_ParseTuple(args, "OOOOOOOO:dfs_postorder", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7]))
        return NULL;
    if (take(&held, o[0], 8, 0, "starts", &starts) < 0 || take(&held, o[1], 8, 0, "offsets", &offsets) < 0 ||
        take(&held, o[2], 4, 0, "parents", &parents) < 0 || take(&held, o[3], 4, 1, "pairs", &pairs) < 0 ||
        take(&held, o[4], 1, 1, "visited", &visited) < 0 || take(&held, o[5], 8, 1, "order", &order) < 0 ||
        take(&held, o[6], 8, 1, "stack", &stack) < 0 || take(&held, o[7], 8, 1, "cursor", &cursor) < 0) {
        graphsvc_release(&held);
        return NULL;
    }
    int64_t n = visited->len;
    if (offsets->len / 8 != n + 1) return wrong_length(&held, "offsets", offsets->len / 8, n + 1);
    if (pairs->len / 4 != 2 * n) return wrong_length(&held, "pairs", pairs->len / 4, 2 * n);
    if (order->len / 8 != n) return wrong_length(&held, "order", order->len / 8, n);
    if (stack->len / 8 != n) return wrong_length(&held, "stack", stack->len / 8, n);
    if (cursor->len / 8 != n) return wrong_length(&held, "cursor", cursor->len / 8, n);
    enum problem problem = OK;
    int64_t where = 0, count;
    Py_BEGIN_ALLOW_THREADS
    count = dfs(starts->buf, starts->len / 8, offsets->buf, parents->buf, n, parents->len / 4, pairs->buf,
                visited->buf, order->buf, stack->buf, cursor->buf, &problem, &where);
    Py_END_ALLOW_THREADS
    graphsvc_release(&held);
    if (count < 0) return raise_problem(problem, where);
    return PyLong_FromLongLong(count);
}

/* Adds one child to parent's count while counting (see child_count below). */
#define COUNT(parent)                                                                                                  \
    do {                                                                                                               \
        counts[parent]++;                                                                                              \
        reached[parent] = 1;                                                                                           \
    } while (0)

/* Emits parent once its last child is emitted: pushed when this is the last slot pointing at it. */
#define RELEASE(parent)                                                                                                \
    do {                                                                                                               \
        if (counts[parent] == 1) {                                                                                     \
            stack[top++] = parent;                                                                                     \
            PREFETCH_READ(&pairs[2 * (parent)]); /* popped soon */                                                     \
        } else {                                                                                                       \
            counts[parent]--;                                                                                          \
        }                                                                                                              \
    } while (0)

/* topo._child_count_order: a node is emitted once every child within reach that points at it has
 * been. The counts (parent slots pointing at each node, from the nodes reachable from the starts)
 * do not depend on the order they are made in, so they come from one sweep down the ids (a parent's
 * id is smaller than its child's: a node is reached before the sweep gets to it) that asks for the
 * counters of the node AHEAD ids further down before it gets there; the reference walks a stack
 * instead. Repeated starts count once, as the reference's do. Returns how many nodes order holds,
 * -1 on a problem. */
static int64_t child_count(const int64_t *starts, Py_ssize_t num_starts, const int64_t *off, const int32_t *par,
                           int64_t n, int64_t e, int32_t *pairs, int64_t *counts, uint8_t *reached, int64_t *order,
                           int64_t *stack, enum problem *problem, int64_t *where) {
    if ((*problem = check_starts(starts, num_starts, n, where)) != OK) return -1;
    if ((*problem = fill_pairs(off, par, n, e, pairs, where)) != OK) return -1;
    memset(counts, 0, (size_t)n * sizeof *counts);
    memset(reached, 0, (size_t)n);
    int64_t highest = -1;
    for (Py_ssize_t s = 0; s < num_starts; s++) {
        reached[starts[s]] = 1;
        if (starts[s] > highest) highest = starts[s];
    }
    for (int64_t node = highest; node >= 0; node--) {
        int64_t ahead = node - AHEAD;
        if (ahead >= 0 && pairs[2 * ahead] >= 0) {
            int32_t a = pairs[2 * ahead], b = pairs[2 * ahead + 1];
            PREFETCH_WRITE(&counts[a]);
            PREFETCH_WRITE(&reached[a]);
            if (b >= 0) {
                PREFETCH_WRITE(&counts[b]);
                PREFETCH_WRITE(&reached[b]);
            }
        }
        if (!reached[node]) continue;
        int32_t first = pairs[2 * node];
        if (first == MANY) {
            for (int64_t slot = off[node]; slot < off[node + 1]; slot++) {
                int32_t parent = par[slot];
                if (parent < 0 || parent >= node) {
                    *problem = BAD_PARENT;
                    *where = node;
                    return -1;
                }
                COUNT(parent);
            }
        } else if (first >= 0) {
            COUNT(first);
            int32_t second = pairs[2 * node + 1];
            if (second >= 0) COUNT(second);
        }
    }
    /* Every node is pushed once at most: a start when nothing points at it (reached cleared, so a
     * repeated start is not pushed again), any other node when its count reaches its last slot. */
    int64_t count = 0, top = 0;
    for (Py_ssize_t s = 0; s < num_starts; s++) {
        int64_t start = starts[s];
        if (counts[start] == 0 && reached[start]) {
            reached[start] = 0;
            stack[top++] = start;
        }
    }
    while (top > 0) {
        int64_t node = stack[--top];
        order[count++] = node;
        int32_t first = pairs[2 * node];
        if (first == MANY) {
            for (int64_t slot = off[node]; slot < off[node + 1]; slot++) RELEASE(par[slot]);
        } else if (first >= 0) {
            RELEASE(first);
            int32_t second = pairs[2 * node + 1];
            if (second >= 0) RELEASE(second);
        }
    }
    return count;
}

#undef COUNT
#undef RELEASE

/* child_count_order(starts, offsets, parents, pairs, counts, reached, order, stack) -> count
 * starts int64; pairs int32 (2 N); counts int64 (N); reached bool (N); order, stack int64 (N). */
static PyObject *child_count_order(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o[8];
    graphsvc_buffers held = {.count = 0};
    Py_buffer *starts, *offsets, *parents, *pairs, *counts, *reached, *order, *stack;
    if (!PyArg_ParseTuple(args, "OOOOOOOO:child_count_order", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6],
                          &o[7]))
        return NULL;
    if (take(&held, o[0], 8, 0, "starts", &starts) < 0 || take(&held, o[1], 8, 0, "offsets", &offsets) < 0 ||
        take(&held, o[2], 4, 0, "parents", &parents) < 0 || take(&held, o[3], 4, 1, "pairs", &pairs) < 0 ||
        take(&held, o[4], 8, 1, "counts", &counts) < 0 || take(&held, o[5], 1, 1, "reached", &reached) < 0 ||
        take(&held, o[6], 8, 1, "order", &order) < 0 || take(&held, o[7], 8, 1, "stack", &stack) < 0) {
        graphsvc_release(&held);
        return NULL;
    }
    int64_t n = reached->len;
    if (offsets->len / 8 != n + 1) return wrong_length(&held, "offsets", offsets->len / 8, n + 1);
    if (pairs->len / 4 != 2 * n) return wrong_length(&held, "pairs", pairs->len / 4, 2 * n);
    if (counts->len / 8 != n) return wrong_length(&held, "counts", counts->len / 8, n);
    if (order->len / 8 != n) return wrong_length(&held, "order", order->len / 8, n);
    if (stack->len / 8 != n) return wrong_length(&held, "stack", stack->len / 8, n);
    enum problem problem = OK;
    int64_t where = 0, count;
    Py_BEGIN_ALLOW_THREADS
    count = child_count(starts->buf, starts->len / 8, offsets->buf, parents->buf, n, parents->len / 4, pairs->buf,
                        counts->buf, reached->buf, order->buf, stack->buf, &problem, &where);
    Py_END_ALLOW_THREADS
    graphsvc_release(&held);
    if (count < 0) return raise_problem(problem, where);
    return PyLong_FromLongLong(count);
}

/* levels(offsets, parents, level): level[node] = 1 + the highest level of its parents (0 for a leaf). */
static PyObject *levels(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *a, *b, *c;
    graphsvc_buffers held = {.count = 0};
    Py_buffer *offsets, *parents, *level;
    if (!PyArg_ParseTuple(args, "OOO:levels", &a, &b, &c)) return NULL;
    if (take(&held, a, 8, 0, "offsets", &offsets) < 0 || take(&held, b, 4, 0, "parents", &parents) < 0 ||
        take(&held, c, 8, 1, "level", &level) < 0) {
        graphsvc_release(&held);
        return NULL;
    }
    int64_t n = level->len / 8, e = parents->len / 4;
    if (offsets->len / 8 != n + 1) return wrong_length(&held, "offsets", offsets->len / 8, n + 1);
    const int64_t *off = offsets->buf;
    const int32_t *par = parents->buf;
    int64_t *out = level->buf;
    enum problem problem = OK;
    int64_t where = 0;
    Py_BEGIN_ALLOW_THREADS
    for (int64_t node = 0; node < n && problem == OK; node++) {
        int64_t start = off[node], stop = off[node + 1], highest = -1;
        if (start < 0 || stop < start || stop > e) {
            problem = BAD_OFFSETS;
            where = node;
            break;
        }
        for (int64_t slot = start; slot < stop; slot++) {
            int32_t parent = par[slot];
            if (parent < 0 || parent >= node) { /* a level comes from parents already done */
                problem = BAD_PARENT;
                where = node;
                break;
            }
            if (out[parent] > highest) highest = out[parent];
        }
        out[node] = highest + 1;
    }
    Py_END_ALLOW_THREADS
    graphsvc_release(&held);
    if (problem != OK) return raise_problem(problem, where);
    Py_RETURN_NONE;
}

/* ancestors(offsets, parents, output, mask): mask[node] = 1 for output and every node it depends
 * on, 0 for the others (mask: bool, N). One sweep down the ids from output suffices: a node's
 * children all have larger ids, so it is marked before the sweep reaches it. */
static PyObject *ancestors(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *a, *b, *d;
    Py_ssize_t output;
    graphsvc_buffers held = {.count = 0};
    Py_buffer *offsets, *parents, *mask_view;
    if (!PyArg_ParseTuple(args, "OOnO:ancestors", &a, &b, &output, &d)) return NULL;
    if (take(&held, a, 8, 0, "offsets", &offsets) < 0 || take(&held, b, 4, 0, "parents", &parents) < 0 ||
        take(&held, d, 1, 1, "mask", &mask_view) < 0) {
        graphsvc_release(&held);
        return NULL;
    }
    int64_t n = mask_view->len, e = parents->len / 4;
    if (offsets->len / 8 != n + 1) return wrong_length(&held, "offsets", offsets->len / 8, n + 1);
    if (output < 0 || output >= n) {
        graphsvc_release(&held);
        return raise_problem(BAD_START, output);
    }
    const int64_t *off = offsets->buf;
    const int32_t *par = parents->buf;
    uint8_t *mask = mask_view->buf;
    enum problem problem = OK;
    int64_t where = 0;
    Py_BEGIN_ALLOW_THREADS
    memset(mask, 0, (size_t)n);
    mask[output] = 1;
    for (int64_t node = output; node >= 0; node--) {
        if (!mask[node]) continue;
        int64_t start = off[node], stop = off[node + 1];
        if (start < 0 || stop < start || stop > e) {
            problem = BAD_OFFSETS;
            where = node;
            break;
        }
        for (int64_t slot = start; slot < stop; slot++) {
            int32_t parent = par[slot];
            if (parent < 0 || parent >= n) {
                problem = BAD_PARENT;
                where = node;
                break;
            }
            mask[parent] = 1;
        }
        if (problem != OK) break;
    }
    Py_END_ALLOW_THREADS
    graphsvc_release(&held);
    if (problem != OK) return raise_problem(problem, where);
    Py_RETURN_NONE;
}

/* structure_ok(offsets, parents, op_codes, num_ops, is_leaf_code) -> bool: the column rules
 * Graph._check_columns vectorizes (offsets start at 0, never decrease and end at the edge count; op
 * codes below num_ops; leaves without parents; every parent id at least 0 and smaller than its
 * child's). Reads nothing out of bounds whatever the columns hold. */
static PyObject *structure_ok(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *a, *b, *c, *d;
    Py_ssize_t num_ops;
    graphsvc_buffers held = {.count = 0};
    Py_buffer *offsets, *parents, *codes, *leaf;
    if (!PyArg_ParseTuple(args, "OOOnO:structure_ok", &a, &b, &c, &num_ops, &d)) return NULL;
    if (take(&held, a, 8, 0, "offsets", &offsets) < 0 || take(&held, b, 4, 0, "parents", &parents) < 0 ||
        take(&held, c, 2, 0, "op_codes", &codes) < 0 || take(&held, d, 1, 0, "is_leaf_code", &leaf) < 0) {
        graphsvc_release(&held);
        return NULL;
    }
    if (leaf->len < num_ops) return wrong_length(&held, "is_leaf_code", leaf->len, num_ops);
    int64_t n = codes->len / 2, e = parents->len / 4;
    const int64_t *off = offsets->buf;
    const int32_t *par = parents->buf;
    const uint16_t *code = codes->buf;
    const uint8_t *is_leaf = leaf->buf;
    int ok = offsets->len / 8 == n + 1 && off[0] == 0 && off[n] == e;
    Py_BEGIN_ALLOW_THREADS
    for (int64_t node = 0; ok && node < n; node++) {
        int64_t start = off[node], stop = off[node + 1]; /* start lies in 0..e: checked one node before */
        if (stop < start || stop > e || code[node] >= num_ops || (is_leaf[code[node]] && stop > start)) {
            ok = 0;
            break;
        }
        for (int64_t slot = start; slot < stop; slot++) {
            if (par[slot] < 0 || par[slot] >= node) {
                ok = 0;
                break;
            }
        }
    }
    Py_END_ALLOW_THREADS
    graphsvc_release(&held);
    return PyBool_FromLong(ok);
}

/* first_arity_mismatch(codes, offsets, arity) -> node: the first node whose parent count is not
 * arity[its op code] (entries below 0 are not checked), or -1. codes uint16 (N), arity int64. */
static PyObject *first_arity_mismatch(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *a, *b, *c;
    graphsvc_buffers held = {.count = 0};
    Py_buffer *codes, *offsets, *arity_view;
    if (!PyArg_ParseTuple(args, "OOO:first_arity_mismatch", &a, &b, &c)) return NULL;
    if (take(&held, a, 2, 0, "codes", &codes) < 0 || take(&held, b, 8, 0, "offsets", &offsets) < 0 ||
        take(&held, c, 8, 0, "arity", &arity_view) < 0) {
        graphsvc_release(&held);
        return NULL;
    }
    int64_t n = codes->len / 2, num_codes = arity_view->len / 8;
    if (offsets->len / 8 != n + 1) return wrong_length(&held, "offsets", offsets->len / 8, n + 1);
    const uint16_t *code = codes->buf;
    const int64_t *off = offsets->buf;
    const int64_t *arity = arity_view->buf;
    int64_t found = -1, bad_code = -1;
    Py_BEGIN_ALLOW_THREADS
    for (int64_t node = 0; node < n; node++) {
        if (code[node] >= num_codes) {
            bad_code = node;
            break;
        }
        int64_t expected = arity[code[node]];
        /* unsigned: the count of hostile offsets may not fit in int64; it then wraps and counts as a mismatch */
        if (expected >= 0 && (uint64_t)off[node + 1] - (uint64_t)off[node] != (uint64_t)expected) {
            found = node;
            break;
        }
    }
    Py_END_ALLOW_THREADS
    graphsvc_release(&held);
    if (bad_code >= 0) return raise_problem(BAD_CODE, bad_code);
    return PyLong_FromLongLong(found);
}

/* align_walk(offsets_a, parents_a, tags_a, offsets_b, parents_b, tags_b, matched, used, differs, stack,
 * count): twin of graphsvc.diff._walk. Pairs parents of A and B position by position from every
 * pair on the stack (stack[2 k], stack[2 k + 1]; ``count`` pairs there to begin with), last pushed
 * first, where their tags (int32, one number per op tag, shared by both graphs) agree and neither
 * is paired yet; ``differs[pa]`` keeps the first node of B seen in pa's place with another tag,
 * cleared when pa is paired. matched (int64, N_A), used (bool, N_B), differs (int64, N_A) are read
 * and written; a pair whose tags differ is walked on too (its inputs pair by position). stack holds
 * 4 N_A int64 (a node of A is pushed once when paired and once when first seen differing). */
static PyObject *align_walk(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o[11];
    Py_ssize_t count;
    graphsvc_buffers held = {.count = 0};
    Py_buffer *v[11];
    static const Py_ssize_t size[11] = {8, 4, 4, 8, 4, 4, 8, 1, 8, 8};
    static const int writable[11] = {0, 0, 0, 0, 0, 0, 1, 1, 1, 1};
    static const char *names[11] = {"offsets_a", "parents_a", "tags_a",  "offsets_b", "parents_b",
                                    "tags_b",    "matched",   "used",    "differs",   "stack"};
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOn:align_walk", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7],
                          &o[8], &o[9], &count))
        return NULL;
    for (int k = 0; k < 10; k++) {
        if (take(&held, o[k], size[k], writable[k], names[k], &v[k]) < 0) {
            graphsvc_release(&held);
            return NULL;
        }
    }
    int64_t na = v[2]->len / 4, nb = v[5]->len / 4, ea = v[1]->len / 4, eb = v[4]->len / 4;
    if (v[0]->len / 8 != na + 1) return wrong_length(&held, "offsets_a", v[0]->len / 8, na + 1);
    if (v[3]->len / 8 != nb + 1) return wrong_length(&held, "offsets_b", v[3]->len / 8, nb + 1);
    if (v[6]->len / 8 != na) return wrong_length(&held, "matched", v[6]->len / 8, na);
    if (v[7]->len != nb) return wrong_length(&held, "used", v[7]->len, nb);
    if (v[8]->len / 8 != na) return wrong_length(&held, "differs", v[8]->len / 8, na);
    if (v[9]->len / 8 != 4 * na) return wrong_length(&held, "stack", v[9]->len / 8, 4 * na);
    const int64_t *off_a = v[0]->buf, *off_b = v[3]->buf;
    const int32_t *par_a = v[1]->buf, *par_b = v[4]->buf, *tag_a = v[2]->buf, *tag_b = v[5]->buf;
    int64_t *matched = v[6]->buf, *differs = v[8]->buf, *stack = v[9]->buf;
    uint8_t *used = v[7]->buf;
    if (count < 0 || count > na) {
        graphsvc_release(&held);
        return PyErr_Format(PyExc_ValueError, "align_walk: %zd pairs on a stack of %lld", count, (long long)na);
    }
    for (Py_ssize_t k = 0; k < 2 * count; k++) {
        if (stack[k] < 0 || stack[k] >= (k % 2 ? nb : na)) {
            graphsvc_release(&held);
            return raise_problem(BAD_START, stack[k]);
        }
    }
    enum problem problem = OK;
    int64_t where = 0, top = count;
    Py_BEGIN_ALLOW_THREADS
    while (top > 0) {
        top--;
        int64_t node = stack[2 * top], other = stack[2 * top + 1];
        int64_t sa = off_a[node], ta = off_a[node + 1], sb = off_b[other], tb = off_b[other + 1];
        if (sa < 0 || ta < sa || ta > ea) {
            problem = BAD_OFFSETS;
            where = node;
            break;
        }
        if (sb < 0 || tb < sb || tb > eb) {
            problem = BAD_OFFSETS;
            where = other;
            break;
        }
        for (int64_t ka = sa, kb = sb; ka < ta && kb < tb; ka++, kb++) {
            int64_t pa = par_a[ka], pb = par_b[kb];
            if (pa < 0 || pa >= na) {
                problem = BAD_PARENT;
                where = node;
                break;
            }
            if (pb < 0 || pb >= nb) {
                problem = BAD_PARENT;
                where = other;
                break;
            }
            if (matched[pa] >= 0 || used[pb]) continue;
            if (tag_a[pa] == tag_b[pb]) {
                if (top >= 2 * na) { /* cannot happen: a node of A is pushed once paired, once differing */
                    problem = BAD_START;
                    where = pa;
                    break;
                }
                matched[pa] = pb;
                used[pb] = 1;
                differs[pa] = -1;
                stack[2 * top] = pa;
                stack[2 * top + 1] = pb;
                top++;
            } else if (differs[pa] < 0) {
                differs[pa] = pb; /* walked on: their inputs pair by position */
                if (top >= 2 * na) {
                    problem = BAD_START;
                    where = pa;
                    break;
                }
                stack[2 * top] = pa;
                stack[2 * top + 1] = pb;
                top++;
            }
        }
        if (problem != OK) break;
    }
    Py_END_ALLOW_THREADS
    graphsvc_release(&held);
    if (problem != OK) return raise_problem(problem, where);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"inline_parents", inline_parents, METH_VARARGS,
     "inline_parents(offsets, parents, pairs): each node's first two parents, side by side, into pairs."},
    {"dfs_postorder", dfs_postorder, METH_VARARGS,
     "dfs_postorder(starts, offsets, parents, pairs, visited, order, stack, cursor) -> count: the post-order "
     "of a depth-first search into order[:count]; the rest is scratch."},
    {"child_count_order", child_count_order, METH_VARARGS,
     "child_count_order(starts, offsets, parents, pairs, counts, reached, order, stack) -> count: the "
     "child-count (Kahn) order into order[:count]; the rest is scratch."},
    {"levels", levels, METH_VARARGS, "levels(offsets, parents, level): each node's level, into level (int64, N)."},
    {"align_walk", align_walk, METH_VARARGS,
     "align_walk(offsets_a, parents_a, tags_a, offsets_b, parents_b, tags_b, matched, used, differs, stack, "
     "count): pairs parents of the pairs on the stack whose tags agree."},
    {"ancestors", ancestors, METH_VARARGS,
     "ancestors(offsets, parents, output, mask): marks output and its ancestors in mask (bool, N, zeros)."},
    {"structure_ok", structure_ok, METH_VARARGS,
     "structure_ok(offsets, parents, op_codes, num_ops, is_leaf_code) -> bool: the columns keep every rule."},
    {"first_arity_mismatch", first_arity_mismatch, METH_VARARGS,
     "first_arity_mismatch(codes, offsets, arity) -> node: the first node whose parent count is not its "
     "op's arity, or -1."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "graphsvc.native._ctopo",
    .m_doc = "orderings and the structure check",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__ctopo(void) { return PyModule_Create(&module); }
