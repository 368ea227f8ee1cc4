/* Walks over Python objects: the graphs of micrograd's Values (graphsvc/micrograd.py) and of
 * graphsvc.Value (graphsvc/value.py), read into columns in one pass each, and gradients written back.
 *
 * Each function is the twin of a pure-Python reference kept beside its caller, which the tests
 * compare it with: the same node order, the same columns, the same errors from the same nodes. The
 * walks keep explicit stacks (no recursion: a chain of a million values is fine) and find a visited
 * object by its address in a hash table of their own (Python's id(), as the references use), while
 * holding a reference to every object they have met, so no address can be reused meanwhile.
 * Attributes are read with PyObject_GetAttr and interned names, so properties and subclasses behave
 * as in Python. Columns are written into bytearrays, which the callers view with np.frombuffer.
 */
#include "native.h"

#include <string.h>

/* -- growable arrays ------------------------------------------------------------------------------ */
typedef struct {
    char *data;
    size_t len, cap; /* in bytes */
} Vec;

static int vec_reserve(Vec *v, size_t extra) {
    if (v->len + extra <= v->cap) return 0;
    size_t cap = v->cap ? v->cap : 256;
    while (cap < v->len + extra) cap *= 2;
    char *data = PyMem_Realloc(v->data, cap);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    v->data = data;
    v->cap = cap;
    return 0;
}

#define VEC_PUSH(v, type, value)                                                                   \
    (vec_reserve((v), sizeof(type)) < 0 ? -1                                                      \
                                        : (*(type *)((v)->data + (v)->len) = (value), (v)->len += sizeof(type), 0))
#define VEC_AT(v, type, i) (((type *)(v)->data)[i])
#define VEC_COUNT(v, type) ((v)->len / sizeof(type))

static void vec_free(Vec *v) {
    PyMem_Free(v->data);
    v->data = NULL;
    v->len = v->cap = 0;
}

/* -- objects by address: a hash table from PyObject* to an int64 (open addressing) ---------------- */
typedef struct {
    PyObject *key;
    int64_t value;
} Entry; /* a key and its value side by side: one cache miss per lookup, not two */

typedef struct {
    Entry *entries;
    size_t mask, used;
} Table;

static inline size_t table_slot(const Table *t, const PyObject *key) {
    /* addresses come in runs with regular strides: mix every bit into the low ones (murmur3's
     * finalizer, in part) or linear probing meets long clusters */
    uint64_t h = (uint64_t)(uintptr_t)key;
    h ^= h >> 33;
    h *= UINT64_C(0xff51afd7ed558ccd);
    h ^= h >> 33;
    return (size_t)h & t->mask;
}

static int table_init(Table *t, size_t expected) {
    size_t size = 64;
    while (size < 2 * expected) size *= 2;
    t->entries = PyMem_Calloc(size, sizeof(Entry));
    t->mask = size - 1;
    t->used = 0;
    if (t->entries == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void table_free(Table *t) {
    PyMem_Free(t->entries);
    t->entries = NULL;
}

/* The value stored for key, or NULL. */
static inline int64_t *table_find(const Table *t, const PyObject *key) {
    for (size_t slot = table_slot(t, key);; slot = (slot + 1) & t->mask) {
        if (t->entries[slot].key == key) return &t->entries[slot].value;
        if (t->entries[slot].key == NULL) return NULL;
    }
}

/* Store key -> value (key must not be in the table yet); 0, or -1 with MemoryError. */
static int table_add(Table *t, PyObject *key, int64_t value) {
    if (2 * (t->used + 1) > t->mask + 1) { /* keep it at most half full */
        Table bigger;
        if (table_init(&bigger, t->mask + 1) < 0) {
            table_free(&bigger);
            return -1;
        }
        for (size_t slot = 0; slot <= t->mask; slot++) {
            if (t->entries[slot].key == NULL) continue;
            size_t s = table_slot(&bigger, t->entries[slot].key);
            while (bigger.entries[s].key != NULL) s = (s + 1) & bigger.mask;
            bigger.entries[s] = t->entries[slot];
        }
        bigger.used = t->used;
        table_free(t);
        *t = bigger;
    }
    size_t slot = table_slot(t, key);
    while (t->entries[slot].key != NULL) slot = (slot + 1) & t->mask;
    t->entries[slot].key = key;
    t->entries[slot].value = value;
    t->used++;
    return 0;
}

/* -- numbers ----------------------------------------------------------------------------------------
 * float(obj) (strict), or numpy's conversion of an item to float64 (none_is_nan: None becomes nan),
 * into *out; -1 with an exception set. */
static inline int as_double(PyObject *obj, int none_is_nan, double *out) {
    if (PyFloat_CheckExact(obj)) {
        *out = PyFloat_AS_DOUBLE(obj);
        return 0;
    }
    if (none_is_nan && obj == Py_None) {
        *out = Py_NAN;
        return 0;
    }
    PyObject *number = PyNumber_Float(obj);
    if (number == NULL) return -1;
    *out = PyFloat_AS_DOUBLE(number);
    Py_DECREF(number);
    return 0;
}

/* The attribute ``name`` of obj as a double (as as_double); -1 with an exception set. */
static inline int attr_double(PyObject *obj, PyObject *name, int none_is_nan, double *out) {
    PyObject *value = PyObject_GetAttr(obj, name);
    if (value == NULL) return -1;
    int status = as_double(value, none_is_nan, out);
    Py_DECREF(value);
    return status;
}

/* Python's hash() of numbers and tuples, computed without making the objects: the canonical keys of
 * graphsvc/micrograd.py are hash(tuple) of ints and floats, and must be the same numbers here. */
static inline Py_hash_t hash_double(double x) { /* never called with nan: keys replace it by NAN_KEY */
    return _Py_HashDouble(NULL, x); /* still exported by 3.13 and 3.14 (the C API workgroup kept it) */
}

/* graphsvc.micrograd._NAN_KEY: stands in for nan in keys (hash(nan) depends on the object). */
#define NAN_KEY (-1.2345678901234567e308)

/* hash(int(x)): x modulo 2**61 - 1 with x's sign, -1 made -2 (CPython's long_hash). */
static inline Py_hash_t hash_int(int64_t x) {
    uint64_t magnitude = x < 0 ? (uint64_t)0 - (uint64_t)x : (uint64_t)x;
    int64_t h = (int64_t)(magnitude % (uint64_t)_PyHASH_MODULUS);
    if (x < 0) h = -h;
    return h == -1 ? -2 : h;
}

/* hash() of a tuple whose items hash to lanes[0..len) (CPython's tuplehash, xxHash's mixing). */
static Py_hash_t hash_tuple(const Py_hash_t *lanes, Py_ssize_t len) {
    const uint64_t prime1 = UINT64_C(11400714785074694791), prime2 = UINT64_C(14029467366897019727),
                   prime5 = UINT64_C(2870177450012600261);
    uint64_t acc = prime5;
    for (Py_ssize_t i = 0; i < len; i++) {
        acc += (uint64_t)lanes[i] * prime2;
        acc = (acc << 31) | (acc >> 33);
        acc *= prime1;
    }
    acc += (uint64_t)len ^ (prime5 ^ UINT64_C(3527539));
    return acc == (uint64_t)-1 ? 1546275796 : (Py_hash_t)acc;
}

/* -- results --------------------------------------------------------------------------------------- */
/* A bytearray holding a copy of v's bytes, or NULL. */
static PyObject *vec_bytes(const Vec *v) { return PyByteArray_FromStringAndSize(v->data ? v->data : "", (Py_ssize_t)v->len); }

/* A bytearray of n items of size bytes each (contents undefined), or NULL; *data points into it. */
static PyObject *new_column(Py_ssize_t n, size_t size, void **data) {
    PyObject *column = PyByteArray_FromStringAndSize(NULL, n * (Py_ssize_t)size);
    if (column != NULL) *data = PyByteArray_AS_STRING(column);
    return column;
}

static PyObject *str_prev, *str_op, *str_data, *str_grad, *str_parents, *str_attrs, *str_name, *str_exponent;

/* ==================================================================================================
 * micrograd: twin of graphsvc.micrograd._from_micrograd_reference (read its comments first).
 *
 * micrograd(roots, translate, prev, error, named, name_keys) -> (op_table, op_codes, offsets,
 *     parents, values, grads, attrs, root_ids, named_ids)
 *
 * translate(node) is _translate (called once per distinct _op; its result is reused for every node
 * with an equal _op), prev(node) is _prev (called only to raise its error when _prev is missing),
 * error the exception class for a malformed graph, named the named nodes and name_keys their
 * names' keys. The columns are bytearrays in the graph's node order: op codes uint16, offsets
 * int64 (N + 1), parents int32, values and grads float64. attrs maps node ids to {"exponent": k};
 * root_ids are the roots' ids, named_ids the named nodes' ids (-1: not in the graph).
 * ================================================================================================== */

/* What translate() said about an _op. */
typedef struct {
    int arity;
    int64_t code;
    double exponent;
    int has_exponent;
} Kind;

/* The kind of node's _op (an index into kinds), translating an _op not met before; -1 with an
 * exception set. */
static Py_ssize_t kind_of(PyObject *node, PyObject *translate, PyObject *cache, PyObject *translations, Vec *kinds) {
    PyObject *tag = PyObject_GetAttr(node, str_op);
    if (tag == NULL) return -1;
    PyObject *known = PyDict_GetItemWithError(cache, tag); /* borrowed */
    if (known != NULL) {
        Py_DECREF(tag);
        return PyLong_AsSsize_t(known);
    }
    if (PyErr_Occurred()) goto fail; /* an unhashable _op: TypeError, as _TAGS.get() raises */
    PyObject *result = PyObject_CallOneArg(translate, node);
    if (result == NULL) goto fail;
    PyObject *exponent;
    Kind kind = {0, 0, 0.0, 0};
    if (!PyTuple_Check(result) || PyTuple_GET_SIZE(result) != 4) {
        PyErr_SetString(PyExc_TypeError, "translate() must return (tag, arity, code, exponent or None)");
        goto fail_result;
    }
    kind.arity = (int)PyLong_AsLong(PyTuple_GET_ITEM(result, 1)); /* 0, 1 or 2 */
    kind.code = PyLong_AsLongLong(PyTuple_GET_ITEM(result, 2));
    if (PyErr_Occurred()) goto fail_result;
    exponent = PyTuple_GET_ITEM(result, 3);
    if (exponent != Py_None) {
        kind.has_exponent = 1;
        if (as_double(exponent, 0, &kind.exponent) < 0) goto fail_result;
    }
    Py_ssize_t index = PyList_GET_SIZE(translations);
    PyObject *number = PyLong_FromSsize_t(index);
    if (number == NULL || PyDict_SetItem(cache, tag, number) < 0 || PyList_Append(translations, result) < 0 ||
        VEC_PUSH(kinds, Kind, kind) < 0) {
        Py_XDECREF(number);
        goto fail_result;
    }
    Py_DECREF(number);
    Py_DECREF(result);
    Py_DECREF(tag);
    return index;
fail_result:
    Py_DECREF(result);
fail:
    Py_DECREF(tag);
    return -1;
}

/* Iterating over a node's _prev in Python's order without making an iterator object for each one:
 * iterators are objects the garbage collector tracks, and allocating two per node would start a
 * collection every few hundred nodes (each full one scanning every object in the program). */
typedef struct {
    PyObject *items, *iterator;
    Py_ssize_t position;
} Items;

static int items_start(Items *it, PyObject *items) {
    it->items = items;
    it->iterator = NULL;
    it->position = 0;
    if (PyAnySet_CheckExact(items) || PyList_CheckExact(items) || PyTuple_CheckExact(items)) return 0;
    it->iterator = PyObject_GetIter(items);
    return it->iterator == NULL ? -1 : 0;
}

/* The next item (a new reference), or NULL at the end or with an exception set. */
static PyObject *items_next(Items *it) {
    PyObject *item = NULL;
    if (it->iterator != NULL) return PyIter_Next(it->iterator);
    if (PyTuple_CheckExact(it->items)) {
        if (it->position < PyTuple_GET_SIZE(it->items)) item = PyTuple_GET_ITEM(it->items, it->position++);
    } else if (PyList_CheckExact(it->items)) {
        if (it->position < PyList_GET_SIZE(it->items)) item = PyList_GET_ITEM(it->items, it->position++);
    } else {
        Py_hash_t hash; /* the order of a set's iterator: its table, slot by slot */
        if (!_PySet_NextEntry(it->items, &it->position, &item, &hash)) item = NULL;
    }
    Py_XINCREF(item);
    return item;
}

static void items_end(Items *it) { Py_CLEAR(it->iterator); }

/* node._prev, or NULL with the reference's error (prev(node) raises it) when it has none. */
static PyObject *prev_of(PyObject *node, PyObject *prev) {
    PyObject *parents = PyObject_GetAttr(node, str_prev);
    if (parents == NULL && PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();
        PyObject *result = PyObject_CallOneArg(prev, node); /* raises */
        if (result != NULL) { /* it found one after all (a property that failed once?): use it */
            return result;
        }
    }
    return parents;
}

static PyObject *micrograd(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *roots, *translate, *prev, *error, *named, *name_keys;
    if (!PyArg_ParseTuple(args, "O!OOOO!O!:micrograd", &PyTuple_Type, &roots, &translate, &prev, &error, &PyList_Type,
                          &named, &PyList_Type, &name_keys))
        return NULL;
    if (PyList_GET_SIZE(named) != PyList_GET_SIZE(name_keys)) {
        PyErr_SetString(PyExc_ValueError, "named and name_keys differ in length");
        return NULL;
    }
    PyObject *result = NULL, *cache = PyDict_New(), *translations = PyList_New(0);
    Vec stack = {0}, nodes = {0}, kinds = {0}, kind_of_node = {0}, keys = {0}, ties = {0}, ordered = {0};
    Vec data = {0}, grads = {0}, walk = {0}, order = {0};
    Table state = {0}, names = {0};
    int64_t *new_id = NULL;
    if (cache == NULL || translations == NULL || table_init(&state, 1024) < 0 ||
        table_init(&names, (size_t)PyList_GET_SIZE(named)) < 0)
        goto done;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(named); i++) { /* named node -> index in name_keys */
        PyObject *node = PyList_GET_ITEM(named, i);
        if (table_find(&names, node) == NULL && table_add(&names, node, i) < 0) goto done;
    }

    /* Pass 1: every node once, parents before children, in the order the sets give; the stack and
     * the nodes hold a reference each. When a node's parents are all done, they are put in
     * canonical order and its keys computed. */
    for (Py_ssize_t i = PyTuple_GET_SIZE(roots) - 1; i >= 0; i--) {
        PyObject *root = PyTuple_GET_ITEM(roots, i);
        if (VEC_PUSH(&stack, PyObject *, root) < 0) goto done;
        Py_INCREF(root);
    }
    while (stack.len) {
        stack.len -= sizeof(PyObject *);
        PyObject *node = VEC_AT(&stack, PyObject *, VEC_COUNT(&stack, PyObject *)); /* our reference */
        int64_t *seen = table_find(&state, node);
        if (seen == NULL) { /* first visit: come back to it after its parents */
            if (table_add(&state, node, -1) < 0 || VEC_PUSH(&stack, PyObject *, node) < 0) {
                Py_DECREF(node);
                goto done;
            }
            PyObject *parents = prev_of(node, prev);
            if (parents == NULL) goto done;
            Items it;
            if (items_start(&it, parents) < 0) {
                Py_DECREF(parents);
                goto done;
            }
            PyObject *parent;
            while ((parent = items_next(&it)) != NULL) {
                if (VEC_PUSH(&stack, PyObject *, parent) < 0) {
                    Py_DECREF(parent);
                    break;
                }
            }
            items_end(&it);
            Py_DECREF(parents);
            if (PyErr_Occurred()) goto done;
            continue;
        }
        if (*seen != -1) {
            Py_DECREF(node);
            continue;
        }
        /* Its parents are done (in a DAG nothing reaches a node again while its parents are visited). */
        int64_t index = (int64_t)VEC_COUNT(&nodes, PyObject *);
        *seen = index;
        if (VEC_PUSH(&nodes, PyObject *, node) < 0) {
            Py_DECREF(node);
            goto done;
        }
        Py_ssize_t k = kind_of(node, translate, cache, translations, &kinds);
        if (k < 0 || VEC_PUSH(&kind_of_node, int32_t, (int32_t)k) < 0) goto done;
        const Kind *kind = &VEC_AT(&kinds, Kind, k);
        /* the parents' indices, in set order (only the first two kept: more is an error) */
        int64_t parent_ids[2] = {-1, -1};
        Py_ssize_t count = 0;
        int cycle = 0;
        PyObject *parents = PyObject_GetAttr(node, str_prev);
        if (parents == NULL) goto done;
        Items it;
        if (items_start(&it, parents) < 0) {
            Py_DECREF(parents);
            goto done;
        }
        PyObject *parent;
        while ((parent = items_next(&it)) != NULL) {
            int64_t *id = table_find(&state, parent);
            Py_DECREF(parent); /* a parent met in pass 1 is held by the stack or the nodes */
            if (id == NULL) {
                PyErr_Format(error, "micrograd node %R changed its _prev while it was imported", node);
                break;
            }
            cycle |= *id == -1 || *id == index; /* an ancestor still being visited, or the node itself */
            if (count < 2) parent_ids[count] = *id;
            count++;
        }
        items_end(&it);
        Py_DECREF(parents);
        if (PyErr_Occurred()) goto done;
        if (cycle) {
            PyErr_Format(error, "micrograd node %R is its own ancestor: a graph with a cycle cannot be imported", node);
            goto done;
        }
        if (kind->arity == 2 && count == 1) { /* a + a, a * a: the set kept one */
            parent_ids[1] = parent_ids[0];
            count = 2;
        } else if (kind->arity == 2 && count == 2) {
            int64_t first = parent_ids[0], second = parent_ids[1];
            int64_t key1 = VEC_AT(&keys, int64_t, first), key2 = VEC_AT(&keys, int64_t, second);
            if (key2 < key1 || (key2 == key1 && VEC_AT(&ties, int64_t, second) < VEC_AT(&ties, int64_t, first))) {
                parent_ids[0] = second;
                parent_ids[1] = first;
            }
        }
        if (count != kind->arity) {
            PyObject *op = PyObject_GetAttr(node, str_op);
            if (op != NULL) {
                PyErr_Format(error, "micrograd node %R with op %R has %zd %s, expected %d", node, op, count,
                             count == 1 ? "parent" : "parents", kind->arity);
                Py_DECREF(op);
            }
            goto done;
        }
        if (VEC_PUSH(&ordered, int64_t, parent_ids[0]) < 0 || VEC_PUSH(&ordered, int64_t, parent_ids[1]) < 0)
            goto done;
        /* key = hash((code, exponent or 0.0, data or the nan key, *parents' keys)) */
        double value, grad;
        if (attr_double(node, str_data, 0, &value) < 0) goto done;
        Py_hash_t lanes[5];
        lanes[0] = hash_int(kind->code);
        lanes[1] = hash_double(kind->has_exponent ? kind->exponent : 0.0);
        lanes[2] = hash_double(value == value ? value : NAN_KEY);
        for (Py_ssize_t p = 0; p < count; p++) lanes[3 + p] = hash_int(VEC_AT(&keys, int64_t, parent_ids[p]));
        if (VEC_PUSH(&keys, int64_t, hash_tuple(lanes, 3 + count)) < 0) goto done;
        /* tie = hash((grad or the nan key, the name's key, *parents' ties)) */
        if (attr_double(node, str_grad, 0, &grad) < 0) goto done;
        int64_t name_key = 0;
        if (names.used) {
            int64_t *at = table_find(&names, node);
            if (at != NULL) {
                name_key = PyLong_AsLongLong(PyList_GET_ITEM(name_keys, *at));
                if (name_key == -1 && PyErr_Occurred()) goto done;
            }
        }
        lanes[0] = hash_double(grad == grad ? grad : NAN_KEY);
        lanes[1] = hash_int(name_key);
        for (Py_ssize_t p = 0; p < count; p++) lanes[2 + p] = hash_int(VEC_AT(&ties, int64_t, parent_ids[p]));
        if (VEC_PUSH(&ties, int64_t, hash_tuple(lanes, 2 + count)) < 0 || VEC_PUSH(&data, double, value) < 0 ||
            VEC_PUSH(&grads, double, grad) < 0)
            goto done;
    }

    /* Pass 2: ids from a depth-first post-order over the ordered parents, roots in the order given. */
    Py_ssize_t n = (Py_ssize_t)VEC_COUNT(&nodes, PyObject *);
    if (n > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "more than 2**31 - 1 micrograd nodes");
        goto done;
    }
    new_id = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(int64_t));
    if (new_id == NULL || vec_reserve(&walk, (size_t)(PyTuple_GET_SIZE(roots) + 2 * n + 1) * sizeof(int64_t)) < 0 ||
        vec_reserve(&order, (size_t)n * sizeof(int64_t)) < 0) {
        if (new_id == NULL) PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = PyTuple_GET_SIZE(roots) - 1; i >= 0; i--) {
        VEC_AT(&walk, int64_t, VEC_COUNT(&walk, int64_t)) = *table_find(&state, PyTuple_GET_ITEM(roots, i));
        walk.len += sizeof(int64_t);
    }
    Py_ssize_t edges = 0;
    {
        const int64_t *par = (const int64_t *)ordered.data;
        const Kind *kind = (const Kind *)kinds.data;
        const int32_t *kind_index = (const int32_t *)kind_of_node.data;
        int64_t *stack_top = (int64_t *)walk.data, *out = (int64_t *)order.data;
        Py_ssize_t depth = (Py_ssize_t)VEC_COUNT(&walk, int64_t), done_count = 0;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++) new_id[i] = -1; /* -1 not seen, -2 parents being visited */
        while (depth) {
            int64_t i = stack_top[--depth];
            if (new_id[i] == -1) {
                int arity = kind[kind_index[i]].arity;
                new_id[i] = -2;
                stack_top[depth++] = i;
                for (int p = arity - 1; p >= 0; p--) stack_top[depth++] = par[2 * i + p];
                edges += arity;
            } else if (new_id[i] == -2) {
                new_id[i] = done_count;
                out[done_count++] = i;
            }
        }
        Py_END_ALLOW_THREADS
    }
    if (edges > INT32_MAX) { /* parents are int32 ids; offsets int64 */
        PyErr_SetString(PyExc_OverflowError, "more than 2**31 - 1 micrograd edges");
        goto done;
    }

    /* The columns in the new order; op codes number the graphsvc tags in order of first use. */
    {
        PyObject *op_table = NULL, *op_codes = NULL, *offsets = NULL, *parent_ids = NULL, *values = NULL,
                 *gradients = NULL, *attrs = NULL, *root_ids = NULL, *named_ids = NULL;
        uint16_t *codes = NULL;
        int64_t *off = NULL;
        int32_t *pids = NULL;
        double *val = NULL, *grd = NULL;
        Py_ssize_t num_kinds = (Py_ssize_t)VEC_COUNT(&kinds, Kind);
        int64_t *code_of_kind = PyMem_Malloc((size_t)(num_kinds ? num_kinds : 1) * sizeof(int64_t));
        if (code_of_kind == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        for (Py_ssize_t k = 0; k < num_kinds; k++) code_of_kind[k] = -1;
        op_table = PyList_New(0);
        op_codes = new_column(n, sizeof(uint16_t), (void **)&codes);
        offsets = new_column(n + 1, sizeof(int64_t), (void **)&off);
        parent_ids = new_column(edges, sizeof(int32_t), (void **)&pids);
        values = new_column(n, sizeof(double), (void **)&val);
        gradients = new_column(n, sizeof(double), (void **)&grd);
        attrs = PyDict_New();
        root_ids = PyList_New(PyTuple_GET_SIZE(roots));
        named_ids = PyList_New(PyList_GET_SIZE(named));
        if (op_table == NULL || op_codes == NULL || offsets == NULL || parent_ids == NULL || values == NULL ||
            gradients == NULL || attrs == NULL || root_ids == NULL || named_ids == NULL)
            goto columns_done;
        const int64_t *old_of = (const int64_t *)order.data, *par = (const int64_t *)ordered.data;
        const int32_t *kind_index = (const int32_t *)kind_of_node.data;
        int64_t slot = 0;
        off[0] = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t old = old_of[i];
            int32_t k = kind_index[old];
            const Kind *kind = &VEC_AT(&kinds, Kind, k);
            if (code_of_kind[k] == -1) { /* the first node of this kind: find or add its tag */
                PyObject *tag = PyTuple_GET_ITEM(PyList_GET_ITEM(translations, k), 0);
                Py_ssize_t code = 0, size = PyList_GET_SIZE(op_table);
                for (; code < size; code++) {
                    int same = PyObject_RichCompareBool(PyList_GET_ITEM(op_table, code), tag, Py_EQ);
                    if (same < 0) goto columns_done;
                    if (same) break;
                }
                if (code == size && PyList_Append(op_table, tag) < 0) goto columns_done;
                code_of_kind[k] = code;
            }
            codes[i] = (uint16_t)code_of_kind[k];
            for (int p = 0; p < kind->arity; p++) pids[slot++] = (int32_t)new_id[par[2 * old + p]];
            off[i + 1] = slot;
            val[i] = VEC_AT(&data, double, old);
            grd[i] = VEC_AT(&grads, double, old);
            if (kind->has_exponent) {
                PyObject *exponent = PyTuple_GET_ITEM(PyList_GET_ITEM(translations, k), 3);
                PyObject *id = PyLong_FromSsize_t(i), *entry = PyDict_New();
                int failed = id == NULL || entry == NULL || PyDict_SetItem(entry, str_exponent, exponent) < 0 ||
                             PyDict_SetItem(attrs, id, entry) < 0;
                Py_XDECREF(id);
                Py_XDECREF(entry);
                if (failed) goto columns_done;
            }
        }
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(roots); i++) {
            PyObject *id = PyLong_FromLongLong(new_id[*table_find(&state, PyTuple_GET_ITEM(roots, i))]);
            if (id == NULL) goto columns_done;
            PyList_SET_ITEM(root_ids, i, id);
        }
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(named); i++) {
            int64_t *at = table_find(&state, PyList_GET_ITEM(named, i));
            PyObject *id = PyLong_FromLongLong(at == NULL ? -1 : new_id[*at]);
            if (id == NULL) goto columns_done;
            PyList_SET_ITEM(named_ids, i, id);
        }
        result = PyTuple_Pack(9, op_table, op_codes, offsets, parent_ids, values, gradients, attrs, root_ids,
                              named_ids);
    columns_done:
        PyMem_Free(code_of_kind);
        Py_XDECREF(op_table);
        Py_XDECREF(op_codes);
        Py_XDECREF(offsets);
        Py_XDECREF(parent_ids);
        Py_XDECREF(values);
        Py_XDECREF(gradients);
        Py_XDECREF(attrs);
        Py_XDECREF(root_ids);
        Py_XDECREF(named_ids);
    }

done:
    for (size_t i = 0; i < VEC_COUNT(&stack, PyObject *); i++) Py_DECREF(VEC_AT(&stack, PyObject *, i));
    for (size_t i = 0; i < VEC_COUNT(&nodes, PyObject *); i++) Py_DECREF(VEC_AT(&nodes, PyObject *, i));
    vec_free(&stack);
    vec_free(&nodes);
    vec_free(&kinds);
    vec_free(&kind_of_node);
    vec_free(&keys);
    vec_free(&ties);
    vec_free(&ordered);
    vec_free(&data);
    vec_free(&grads);
    vec_free(&walk);
    vec_free(&order);
    table_free(&state);
    table_free(&names);
    PyMem_Free(new_id);
    Py_XDECREF(cache);
    Py_XDECREF(translations);
    return result;
}

/* ==================================================================================================
 * graphsvc.Value: twin of value._postorder followed by value._graph's columns.
 *
 * values(outputs, extras) -> (nodes, op_table, op_codes, offsets, parents, values, grads, attrs,
 *     names, output_ids)
 *
 * nodes: the values in depth-first post-order from each output in turn, parents in stored order
 * (micrograd's build_topo; a value whose _parents is empty is finished as soon as it is met). The
 * columns are bytearrays in that order: op codes uint16 (op_table: the tags in order of first
 * use), offsets int64 (N + 1), parents int32, values float64, and with extras grads float64 (else
 * None). attrs maps node ids to a copy of each non-empty _attrs; names (with extras, else None) maps
 * ids to each name that is not None. output_ids: each output's id.
 * ================================================================================================== */

/* A value on the walk's stack, with its parents (a tuple or list) and the next one to look at. */
typedef struct {
    PyObject *node, *parents;
    Py_ssize_t next;
} Frame;

/* A parent that had no id yet when its child was finished (see finish_value). */
typedef struct {
    size_t position; /* in parent_ids */
    PyObject *parent;
} Fixup;

/* A value whose parents are all done: give it the next id and record its columns; 0 or -1. ``slot``
 * is its entry in index (a value that was on the stack), or NULL (a leaf met for the first time). */
static int finish_value(PyObject *node, PyObject *parents, int64_t *slot, Table *index, PyObject *nodes,
                        PyObject *tags, Vec *codes, Vec *offsets, Vec *parent_ids, Vec *fixups, Vec *values,
                        Vec *grads, PyObject *attrs, PyObject *names) {
    Py_ssize_t id = PyList_GET_SIZE(nodes);
    if (id >= INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "more than 2**31 - 1 values in one graph");
        return -1;
    }
    if (slot != NULL) {
        *slot = id;
    } else if (table_add(index, node, id) < 0) {
        return -1;
    }
    if (PyList_Append(nodes, node) < 0) return -1;
    /* parents: each one's id. One still on the stack (a _parents changed into a cycle) gets its id
     * when the walk is over, as the reference reads them (a later id, which Graph.check refuses). */
    Py_ssize_t count = parents ? PySequence_Fast_GET_SIZE(parents) : 0;
    PyObject **items = parents ? PySequence_Fast_ITEMS(parents) : NULL;
    if (vec_reserve(parent_ids, (size_t)count * sizeof(int32_t)) < 0) return -1;
    for (Py_ssize_t p = 0; p < count; p++) {
        const int64_t *at = table_find(index, items[p]);
        if (at == NULL) { /* cannot happen with the walk's own tuples; refuse rather than read nothing */
            PyErr_SetString(PyExc_RuntimeError, "a Value's parents changed while its graph was traced");
            return -1;
        }
        size_t position = VEC_COUNT(parent_ids, int32_t);
        if (*at == -1 && VEC_PUSH(fixups, Fixup, ((Fixup){position, items[p]})) < 0) return -1;
        VEC_AT(parent_ids, int32_t, position) = (int32_t)*at;
        parent_ids->len += sizeof(int32_t);
    }
    if (VEC_PUSH(offsets, int64_t, (int64_t)VEC_COUNT(parent_ids, int32_t)) < 0) return -1;
    /* op code: the tag's position in order of first use */
    PyObject *tag = PyObject_GetAttr(node, str_op);
    if (tag == NULL) return -1;
    PyObject *code = PyDict_GetItemWithError(tags, tag); /* borrowed */
    Py_ssize_t number;
    if (code != NULL) {
        number = PyLong_AsSsize_t(code);
    } else if (PyErr_Occurred()) {
        number = -1;
    } else {
        number = PyDict_GET_SIZE(tags);
        if (number > UINT16_MAX) {
            PyErr_Format(PyExc_OverflowError, "more than %d op tags in one graph", UINT16_MAX + 1);
            number = -1;
        } else {
            code = PyLong_FromSsize_t(number);
            if (code == NULL || PyDict_SetItem(tags, tag, code) < 0) number = -1;
            Py_XDECREF(code);
        }
    }
    Py_DECREF(tag);
    if (number < 0 || VEC_PUSH(codes, uint16_t, (uint16_t)number) < 0) return -1;
    double value;
    if (attr_double(node, str_data, 1, &value) < 0 || VEC_PUSH(values, double, value) < 0) return -1;
    /* a copy of the op's attributes, when it has any */
    PyObject *op_attrs = PyObject_GetAttr(node, str_attrs);
    if (op_attrs == NULL) return -1;
    int truth = op_attrs == Py_None ? 0 : PyObject_IsTrue(op_attrs);
    if (truth > 0) {
        PyObject *copy = PyDict_CheckExact(op_attrs) ? PyDict_Copy(op_attrs)
                                                     : PyObject_CallOneArg((PyObject *)&PyDict_Type, op_attrs);
        PyObject *key = PyLong_FromSsize_t(id);
        truth = copy == NULL || key == NULL || PyDict_SetItem(attrs, key, copy) < 0 ? -1 : 0;
        Py_XDECREF(copy);
        Py_XDECREF(key);
    }
    Py_DECREF(op_attrs);
    if (truth < 0) return -1;
    if (names == NULL) return 0;
    double grad;
    if (attr_double(node, str_grad, 1, &grad) < 0 || VEC_PUSH(grads, double, grad) < 0) return -1;
    PyObject *name = PyObject_GetAttr(node, str_name);
    if (name == NULL) return -1;
    int status = 0;
    if (name != Py_None) {
        PyObject *key = PyLong_FromSsize_t(id);
        status = key == NULL || PyDict_SetItem(names, key, name) < 0 ? -1 : 0;
        Py_XDECREF(key);
    }
    Py_DECREF(name);
    return status;
}

/* A node's parents as a tuple the walk holds: the node's own tuple, or a copy of another sequence,
 * so code the walk runs (a property, __getattr__) cannot change or free them under it. */
static PyObject *parents_of(PyObject *node) {
    PyObject *parents = PyObject_GetAttr(node, str_parents);
    if (parents == NULL) return NULL;
    PyObject *sequence = PySequence_Tuple(parents);
    Py_DECREF(parents);
    return sequence;
}

static PyObject *values(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *outputs;
    int extras;
    if (!PyArg_ParseTuple(args, "O!p:values", &PyTuple_Type, &outputs, &extras)) return NULL;
    PyObject *result = NULL, *nodes = PyList_New(0), *tags = PyDict_New(), *attrs = PyDict_New();
    PyObject *names = extras ? PyDict_New() : NULL;
    Vec stack = {0}, codes = {0}, offsets = {0}, parent_ids = {0}, fixups = {0}, numbers = {0}, grads = {0};
    Table index = {0};
    if (nodes == NULL || tags == NULL || attrs == NULL || (extras && names == NULL) || table_init(&index, 1024) < 0 ||
        VEC_PUSH(&offsets, int64_t, 0) < 0)
        goto done;
    for (Py_ssize_t o = 0; o < PyTuple_GET_SIZE(outputs); o++) {
        PyObject *output = PyTuple_GET_ITEM(outputs, o);
        if (table_find(&index, output) != NULL) continue;
        PyObject *parents = parents_of(output);
        if (parents == NULL || table_add(&index, output, -1) < 0 || VEC_PUSH(&stack, Frame, ((Frame){output, parents, 0})) < 0) {
            Py_XDECREF(parents);
            goto done;
        }
        Py_INCREF(output);
        while (stack.len) {
            Frame *top = &VEC_AT(&stack, Frame, VEC_COUNT(&stack, Frame) - 1);
            PyObject *pushed = NULL;
            while (top->next < PySequence_Fast_GET_SIZE(top->parents)) {
                PyObject *parent = PySequence_Fast_GET_ITEM(top->parents, top->next);
                top->next++;
                if (table_find(&index, parent) != NULL) continue;
                PyObject *grandparents = parents_of(parent);
                if (grandparents == NULL) goto done;
                if (PySequence_Fast_GET_SIZE(grandparents) == 0) { /* a leaf: done at once, no stack entry */
                    int status = finish_value(parent, NULL, NULL, &index, nodes, tags, &codes, &offsets, &parent_ids, &fixups,
                                              &numbers, &grads, attrs, names);
                    Py_DECREF(grandparents);
                    if (status < 0) goto done;
                    continue;
                }
                if (table_add(&index, parent, -1) < 0) {
                    Py_DECREF(grandparents);
                    goto done;
                }
                pushed = parent;
                Py_INCREF(parent);
                if (VEC_PUSH(&stack, Frame, ((Frame){parent, grandparents, 0})) < 0) {
                    Py_DECREF(parent);
                    Py_DECREF(grandparents);
                    goto done;
                }
                break;
            }
            if (pushed != NULL) continue;
            /* every parent done (a DAG cannot reach a value on the stack again) */
            Frame frame = VEC_AT(&stack, Frame, VEC_COUNT(&stack, Frame) - 1);
            stack.len -= sizeof(Frame);
            int status = finish_value(frame.node, frame.parents, table_find(&index, frame.node), &index, nodes, tags, &codes, &offsets, &parent_ids, &fixups,
                                      &numbers, &grads, attrs, names);
            Py_DECREF(frame.node);
            Py_DECREF(frame.parents);
            if (status < 0) goto done;
        }
    }
    for (size_t i = 0; i < VEC_COUNT(&fixups, Fixup); i++) {
        const Fixup *fixup = &VEC_AT(&fixups, Fixup, i);
        VEC_AT(&parent_ids, int32_t, fixup->position) = (int32_t)*table_find(&index, fixup->parent);
    }
    {
        PyObject *op_table = PyDict_Keys(tags), *output_ids = PyList_New(PyTuple_GET_SIZE(outputs));
        PyObject *op_codes = vec_bytes(&codes), *offset_column = vec_bytes(&offsets), *parent_column = vec_bytes(&parent_ids);
        PyObject *value_column = vec_bytes(&numbers), *grad_column = extras ? vec_bytes(&grads) : Py_NewRef(Py_None);
        if (op_table && output_ids && op_codes && offset_column && parent_column && value_column && grad_column) {
            int ok = 1;
            for (Py_ssize_t o = 0; o < PyTuple_GET_SIZE(outputs) && ok; o++) {
                PyObject *id = PyLong_FromLongLong(*table_find(&index, PyTuple_GET_ITEM(outputs, o)));
                ok = id != NULL;
                if (ok) PyList_SET_ITEM(output_ids, o, id);
            }
            if (ok)
                result = PyTuple_Pack(10, nodes, op_table, op_codes, offset_column, parent_column, value_column,
                                      grad_column, attrs, names ? names : Py_None, output_ids);
        }
        Py_XDECREF(op_table);
        Py_XDECREF(output_ids);
        Py_XDECREF(op_codes);
        Py_XDECREF(offset_column);
        Py_XDECREF(parent_column);
        Py_XDECREF(value_column);
        Py_XDECREF(grad_column);
    }
done:
    for (size_t i = 0; i < VEC_COUNT(&stack, Frame); i++) {
        Py_DECREF(VEC_AT(&stack, Frame, i).node);
        Py_DECREF(VEC_AT(&stack, Frame, i).parents);
    }
    vec_free(&stack);
    vec_free(&codes);
    vec_free(&offsets);
    vec_free(&parent_ids);
    vec_free(&fixups);
    vec_free(&numbers);
    vec_free(&grads);
    table_free(&index);
    Py_XDECREF(nodes);
    Py_XDECREF(tags);
    Py_XDECREF(attrs);
    Py_XDECREF(names);
    return result;
}

/* add_grads(nodes, grads): node.grad += grad for each node of the list and each float64 of grads,
 * in order (Python's ``+=``: a float grad gets the sum of two doubles, anything else its __iadd__). */
static PyObject *add_grads(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *nodes, *buffer;
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "O!O:add_grads", &PyList_Type, &nodes, &buffer)) return NULL;
    if (graphsvc_buffer(buffer, &view, 8, 0, "grads") < 0) return NULL;
    const double *grad = view.buf;
    Py_ssize_t n = view.len / 8;
    if (n != PyList_GET_SIZE(nodes)) {
        Py_ssize_t count = PyList_GET_SIZE(nodes);
        PyErr_Format(PyExc_ValueError, "%zd %s but %zd %s", count, graphsvc_noun(count, "node", "nodes"), n,
                     graphsvc_noun(n, "gradient", "gradients"));
        PyBuffer_Release(&view);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n && i < PyList_GET_SIZE(nodes); i++) {
        PyObject *node = PyList_GET_ITEM(nodes, i);
        Py_INCREF(node); /* the list may change under a __iadd__ or a property */
        PyObject *old = PyObject_GetAttr(node, str_grad), *sum = NULL;
        if (old != NULL && PyFloat_CheckExact(old)) {
            sum = PyFloat_FromDouble(PyFloat_AS_DOUBLE(old) + grad[i]);
        } else if (old != NULL) {
            PyObject *addend = PyFloat_FromDouble(grad[i]);
            if (addend != NULL) sum = PyNumber_InPlaceAdd(old, addend);
            Py_XDECREF(addend);
        }
        int status = sum == NULL ? -1 : PyObject_SetAttr(node, str_grad, sum);
        Py_XDECREF(sum);
        Py_XDECREF(old);
        Py_DECREF(node);
        if (status < 0) {
            PyBuffer_Release(&view);
            return NULL;
        }
    }
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"micrograd", micrograd, METH_VARARGS,
     "micrograd(roots, translate, prev, error, named, name_keys): a micrograd graph's columns "
     "(twin of graphsvc.micrograd._from_micrograd_reference)."},
    {"values", values, METH_VARARGS,
     "values(outputs, extras): a graphsvc.Value graph's nodes and columns (twin of value._postorder and value._graph)."},
    {"add_grads", add_grads, METH_VARARGS, "add_grads(nodes, grads): node.grad += grad, in order."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "graphsvc.native._cwalk",
                                    "walks over Python objects (micrograd's Values, graphsvc.Value)", -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__cwalk(void) {
    struct {
        PyObject **name;
        const char *text;
    } names[] = {{&str_prev, "_prev"},       {&str_op, "_op"},         {&str_data, "data"},
                 {&str_grad, "grad"},        {&str_parents, "_parents"}, {&str_attrs, "_attrs"},
                 {&str_name, "name"},        {&str_exponent, "exponent"}};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (*names[i].name == NULL && (*names[i].name = PyUnicode_InternFromString(names[i].text)) == NULL) return NULL;
    }
    return PyModule_Create(&module);
}
