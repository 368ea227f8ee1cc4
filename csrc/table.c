/* Version 2.0's tensor table (schemas/FORMAT.md section 15-16), checked and turned into arrays in one
 * pass over the decoded entries: the twin of graphsvc/format/document.py's _checked_table, which the tests
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
#include <string.h>

/* The most dimensions a shape may have: graphsvc.graph.MAX_DIMENSIONS. The module exports it as
 * MAX_DIMENSIONS, and tests/format/test_format_v2.py holds the two equal. */
#define MAX_DIMENSIONS 32

typedef struct {
    long long node, offset, nbytes, itemsize;
    Py_ssize_t ndim;
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
        c->nbytes = nbytes;
        c->itemsize = itemsize;
        c->ndim = ndim;
        if (nbytes != needed || c->offset % alignment != 0 || c->offset < previous_end) return 0;
        if (__builtin_add_overflow(c->offset, nbytes, &end) || end > size) return 0;
        previous_end = end;
        long long key = 2 * c->node + c->which; /* by node, a value before its gradient, none twice */
        if (key <= previous_key) return 0;
        if (c->which == 0 ? !isnan(values[c->node]) : (grads != NULL && !isnan(grads[c->node]))) return 0;
        if (c->which == 1 && key == previous_key + 1) { /* a gradient has its value's dtype and shape */
            if (c->dtype != checked[i - 1].dtype || ndim != previous_ndim) return 0;
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

/* The data section's bytes as items of each dtype met so far (a table holds few dtypes). */
#define MAX_TYPED 8
typedef struct {
    PyObject *dtypes[MAX_TYPED]; /* borrowed */
    PyObject *views[MAX_TYPED];  /* owned */
    int count;
} Typed;

static void typed_clear(Typed *typed) {
    for (int k = 0; k < typed->count; k++) Py_DECREF(typed->views[k]);
    typed->count = 0;
}

static PyObject *str_view, *str_reshape; /* method names, interned at import */

/* One array of a non-empty entry: a slice of the buffer viewed as its dtype, reshaped (a view of the
 * same bytes as make_array(shape, dtype, buffer, offset) gives, made in two numpy calls instead of
 * the constructor's argument parsing). The offset is a multiple of the alignment, so of the
 * itemsize. */
static PyObject *sliced_view(Typed *typed, const Checked *c, long long size, PyObject *buffer) {
    PyObject *view = NULL;
    for (int k = 0; k < typed->count; k++) {
        if (typed->dtypes[k] == c->dtype) view = typed->views[k];
    }
    if (view == NULL) {
        if (typed->count == MAX_TYPED) {
            PyErr_SetString(PyExc_ValueError, "tensor_views: more dtypes than MAX_TYPED");
            return NULL;
        }
        PyObject *whole = PySequence_GetSlice(buffer, 0, (Py_ssize_t)(size - size % c->itemsize));
        if (whole == NULL) return NULL;
        view = PyObject_CallMethodOneArg(whole, str_view, c->dtype);
        Py_DECREF(whole);
        if (view == NULL) return NULL;
        typed->dtypes[typed->count] = c->dtype;
        typed->views[typed->count++] = view;
    }
    long long start = c->offset / c->itemsize;
    PyObject *part = PySequence_GetSlice(view, (Py_ssize_t)start, (Py_ssize_t)(start + c->nbytes / c->itemsize));
    if (part == NULL || c->ndim == 1) return part; /* a slice of a 1-d shape's length is that shape */
    PyObject *shape = PyList_AsTuple(PyList_GET_ITEM(c->entry, 3));
    PyObject *array = shape == NULL ? NULL : PyObject_CallMethodOneArg(part, str_reshape, shape);
    Py_XDECREF(shape);
    Py_DECREF(part);
    return array;
}

/* The array of an empty entry (no elements: nbytes 0): one read-only array for every empty entry
 * of the same dtype and shape, made once by make_array(shape, dtype, buffer, offset) and kept in
 * ``empties`` by (dtype, shape); a table of a million empty arrays then costs a dict entry each,
 * not a numpy array each (graphsvc/format/document.py's _read_tensors does the same). */
static PyObject *shared_empty(PyObject *empties, const Checked *c, PyObject *make_array, PyObject *buffer) {
    PyObject **items = ((PyListObject *)c->entry)->ob_item;
    PyObject *shape = PyList_AsTuple(items[3]);
    if (shape == NULL) return NULL;
    PyObject *key = PyTuple_Pack(2, c->dtype, shape);
    Py_DECREF(shape);
    if (key == NULL) return NULL;
    PyObject *array = PyDict_GetItemWithError(empties, key); /* borrowed */
    if (array != NULL) {
        Py_DECREF(key);
        return Py_NewRef(array);
    }
    if (PyErr_Occurred()) {
        Py_DECREF(key);
        return NULL;
    }
    array = PyObject_CallFunctionObjArgs(make_array, items[3], c->dtype, buffer, items[4], NULL);
    if (array != NULL && PyDict_SetItem(empties, key, array) < 0) Py_CLEAR(array);
    Py_DECREF(key);
    return array;
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
    PyObject *result = NULL, *arrays[2] = {NULL, NULL}, *empties = NULL;
    Checked *checked = NULL;
    Typed typed = {.count = 0};
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
    if ((empties = PyDict_New()) == NULL) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject **items = ((PyListObject *)checked[i].entry)->ob_item;
        PyObject *array = checked[i].nbytes ? sliced_view(&typed, &checked[i], size, buffer)
                                            : shared_empty(empties, &checked[i], make_array, buffer);
        if (array == NULL) goto done;
        int failed = PyDict_SetItem(arrays[checked[i].which], items[0], array);
        Py_DECREF(array);
        if (failed < 0) goto done;
    }
    result = PyTuple_Pack(2, arrays[0], arrays[1]);
done:
    Py_XDECREF(arrays[0]);
    Py_XDECREF(arrays[1]);
    Py_XDECREF(empties);
    typed_clear(&typed);
    PyMem_Free(checked);
    graphsvc_release(&held);
    return result;
}

/* -- the header walk: graphsvc/format/fastload.py's scan, over the bytes in memory ------------------------
 *
 * The twin of fastload.scan for the bytes of a file that are in memory (its first 64 KiB, or all of
 * it): finds the entries before ``nodes``, ``nodes``' count and columns, and version 2.0's tensor
 * table, pad and data section, and returns where each is; or None ("look closer": fastload.scan
 * walks it in Python, reading past the window, and decides). It accepts a subset of what the
 * Python walk accepts: every header it reads lies within the window, keys are ASCII, a value it
 * steps over nests at most SKIP_DEPTH levels and takes at most SKIP_BYTES bytes; the tests hold it
 * to the Python walk on the shipped files and on hostile ones. The msgpack type bytes are spelt
 * here as graphsvc/format/layout.py's Family tables name them (this file cannot import that module). */

/* How deep a value stepped over may nest, and how many bytes it may take (msgpack's own skip, which
 * the Python walk uses, allows 128 levels and 64 MiB: this walk refuses sooner, never later). */
#define SKIP_DEPTH 16
#define SKIP_BYTES (16LL << 20)

typedef struct {
    const unsigned char *buf;
    long long len;  /* the bytes in memory: the file's first ``len`` */
    long long size; /* the file's size */
    long long pos;
    long long budget; /* msgpack items left to step over (fastload's _SKIP_BUDGET) */
    Py_ssize_t max_string;
} Walk;

enum { UINT_FAMILY, STR_FAMILY, BIN_FAMILY, ARRAY_FAMILY, MAP_FAMILY };

/* The big-endian number of ``width`` bytes at the position (within the window), moving past it. */
static int walk_be(Walk *w, int width, unsigned long long *out) {
    if (w->pos < 0 || w->pos + width > w->len) return 0;
    unsigned long long value = 0;
    for (int k = 0; k < width; k++) value = (value << 8) | w->buf[w->pos + k];
    w->pos += width;
    *out = value;
    return 1;
}

/* A header of ``family`` (fix or sized form): its number (a count, a size, a uint's value). */
static int walk_number(Walk *w, int family, unsigned long long *out) {
    if (w->pos < 0 || w->pos >= w->len) return 0;
    unsigned char first = w->buf[w->pos++];
    int width = 0;
    switch (family) {
    case UINT_FAMILY:
        if (first <= 0x7f) return (*out = first), 1;
        width = first == 0xcc ? 1 : first == 0xcd ? 2 : first == 0xce ? 4 : first == 0xcf ? 8 : 0;
        break;
    case STR_FAMILY:
        if (first >= 0xa0 && first <= 0xbf) return (*out = first & 0x1f), 1;
        width = first == 0xd9 ? 1 : first == 0xda ? 2 : first == 0xdb ? 4 : 0;
        break;
    case BIN_FAMILY:
        width = first == 0xc4 ? 1 : first == 0xc5 ? 2 : first == 0xc6 ? 4 : 0;
        break;
    case ARRAY_FAMILY:
        if (first >= 0x90 && first <= 0x9f) return (*out = first & 0x0f), 1;
        width = first == 0xdc ? 2 : first == 0xdd ? 4 : 0;
        break;
    case MAP_FAMILY:
        if (first >= 0x80 && first <= 0x8f) return (*out = first & 0x0f), 1;
        width = first == 0xde ? 2 : first == 0xdf ? 4 : 0;
        break;
    }
    return width && walk_be(w, width, out);
}

/* Step over ``count`` bytes, which must lie within the file (not necessarily within the window). */
static int walk_skip(Walk *w, unsigned long long count) {
    if (count > (unsigned long long)(w->size - w->pos)) return 0;
    w->pos += (long long)count;
    return 1;
}

/* Is the byte at the position the first of a str? (0 at the end of the window.) */
static int walk_at_string(const Walk *w) {
    if (w->pos >= w->len) return 0;
    unsigned char first = w->buf[w->pos];
    return (first >= 0xa0 && first <= 0xbf) || first == 0xd9 || first == 0xda || first == 0xdb;
}

/* A str of ASCII bytes, at most max_string long, within the window: its bytes and length. */
static int walk_string(Walk *w, const unsigned char **text, Py_ssize_t *length) {
    unsigned long long n;
    if (!walk_number(w, STR_FAMILY, &n) || n > (unsigned long long)w->max_string) return 0;
    if (n > (unsigned long long)(w->len - w->pos)) return 0;
    for (unsigned long long k = 0; k < n; k++) {
        if (w->buf[w->pos + (long long)k] >= 0x80) return 0;
    }
    *text = w->buf + w->pos;
    *length = (Py_ssize_t)n;
    w->pos += (long long)n;
    return 1;
}

static int same(const unsigned char *text, Py_ssize_t length, PyObject *name) {
    return PyBytes_GET_SIZE(name) == length && memcmp(PyBytes_AS_STRING(name), text, (size_t)length) == 0;
}

/* Step over one msgpack value, iteratively (a stack of the items left at each level), within the
 * window; ext types and the reserved byte are refused, as graphsvc never writes them. */
static int walk_value(Walk *w) {
    unsigned long long left[SKIP_DEPTH + 1];
    int depth = 0;
    long long start = w->pos;
    left[0] = 1;
    while (depth >= 0) {
        if (left[depth] == 0) {
            depth--;
            continue;
        }
        left[depth]--;
        if (--w->budget < 0 || w->pos >= w->len || w->pos - start > SKIP_BYTES) return 0;
        unsigned char first = w->buf[w->pos];
        unsigned long long n;
        if (first <= 0x7f || first >= 0xe0 || first == 0xc0 || first == 0xc2 || first == 0xc3) {
            w->pos++;
        } else if (first == 0xca || first == 0xcb || (first >= 0xcc && first <= 0xd3)) {
            static const int widths[] = {4, 8, 1, 2, 4, 8, 1, 2, 4, 8}; /* float 32, 64; uint, int 8 .. 64 */
            w->pos += 1 + widths[first - 0xca];
            if (w->pos > w->len) return 0;
        } else if (walk_at_string(w)) {
            if (!walk_number(w, STR_FAMILY, &n) || !walk_skip(w, n)) return 0;
        } else if (first >= 0xc4 && first <= 0xc6) {
            if (!walk_number(w, BIN_FAMILY, &n) || !walk_skip(w, n)) return 0;
        } else if ((first >= 0x80 && first <= 0x9f) || (first >= 0xdc && first <= 0xdf)) {
            int is_map = first <= 0x8f || first >= 0xde;
            if (!walk_number(w, is_map ? MAP_FAMILY : ARRAY_FAMILY, &n)) return 0;
            if (n > (unsigned long long)(w->len - w->pos)) return 0; /* each item takes a byte at least */
            if (depth == SKIP_DEPTH) return 0;
            left[++depth] = is_map ? 2 * n : n;
        } else {
            return 0;
        }
    }
    return w->pos <= w->len && w->pos - start <= SKIP_BYTES;
}

/* A column map (any order of its three fields, any header widths): (key, dtype, length, offset, size). */
static PyObject *walk_column(Walk *w, PyObject *key, PyObject *fields) {
    unsigned long long entries, length = 0, size = 0;
    long long offset = 0;
    const unsigned char *dtype = NULL;
    Py_ssize_t dtype_length = 0;
    int seen = 0;
    if (!walk_number(w, MAP_FAMILY, &entries) || entries != 3) return Py_NewRef(Py_None);
    for (int k = 0; k < 3; k++) {
        const unsigned char *field;
        Py_ssize_t field_length;
        if (!walk_string(w, &field, &field_length)) return Py_NewRef(Py_None);
        int which = -1;
        for (int f = 0; f < 3; f++) {
            if (same(field, field_length, PyTuple_GET_ITEM(fields, f))) which = f;
        }
        if (which < 0 || (seen & (1 << which))) return Py_NewRef(Py_None);
        seen |= 1 << which;
        if (which == 0) { /* dtype: a str */
            if (!walk_string(w, &dtype, &dtype_length)) return Py_NewRef(Py_None);
        } else if (which == 1) { /* length: a uint */
            if (!walk_number(w, UINT_FAMILY, &length)) return Py_NewRef(Py_None);
        } else { /* data: a bin, stepped over */
            if (!walk_number(w, BIN_FAMILY, &size)) return Py_NewRef(Py_None);
            offset = w->pos;
            if (!walk_skip(w, size)) return Py_NewRef(Py_None);
        }
    }
    return Py_BuildValue("(Os#KLK)", key, (const char *)dtype, dtype_length, length, offset, size);
}

/* ``nodes``: (count, [column, ...]), or None. */
static PyObject *walk_nodes(Walk *w, PyObject *count_key, PyObject *known, Py_ssize_t required, PyObject *fields) {
    unsigned long long entries, count = 0;
    Py_ssize_t known_count = PyTuple_GET_SIZE(known); /* the required columns, then the optional one */
    unsigned long long seen = 0; /* bit 0: count; bit 1 + k: known[k] */
    PyObject *columns = PyList_New(0);
    if (columns == NULL) return NULL;
    if (!walk_number(w, MAP_FAMILY, &entries)) goto look_closer;
    for (unsigned long long e = 0; e < entries; e++) {
        const unsigned char *text;
        Py_ssize_t length;
        if (!walk_string(w, &text, &length)) goto look_closer;
        int which = -2;
        if (same(text, length, count_key)) which = -1;
        for (Py_ssize_t k = 0; k < known_count && which == -2; k++) {
            PyObject *name = PyTuple_GET_ITEM(known, k);
            Py_ssize_t name_length;
            const char *name_text = PyUnicode_AsUTF8AndSize(name, &name_length);
            if (name_text == NULL) goto failed;
            if (name_length == length && memcmp(name_text, text, (size_t)length) == 0) which = (int)k;
        }
        if (which == -2 || (seen & (1ULL << (which + 1)))) goto look_closer;
        seen |= 1ULL << (which + 1);
        if (which == -1) {
            if (!walk_number(w, UINT_FAMILY, &count)) goto look_closer;
        } else if (which == known_count - 1 && w->pos < w->len && w->buf[w->pos] == 0xc0) { /* the optional column: nil */
            w->pos++;
        } else {
            PyObject *column = walk_column(w, PyTuple_GET_ITEM(known, which), fields);
            if (column == NULL) goto failed;
            if (column == Py_None) {
                Py_DECREF(column);
                goto look_closer;
            }
            int appended = PyList_Append(columns, column);
            Py_DECREF(column);
            if (appended < 0) goto failed;
        }
    }
    unsigned long long wanted = 1; /* count, and every required column */
    for (Py_ssize_t k = 0; k < required; k++) wanted |= 1ULL << (k + 1);
    if ((seen & wanted) != wanted) goto look_closer;
    PyObject *result = Py_BuildValue("(KN)", count, columns);
    return result;
look_closer:
    Py_DECREF(columns);
    return Py_NewRef(Py_None);
failed:
    Py_DECREF(columns);
    return NULL;
}

static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer view;
    long long size, budget;
    Py_ssize_t max_string, required;
    PyObject *keys, *known, *fields;
    if (!PyArg_ParseTuple(args, "y*LO!O!nO!nL:scan", &view, &size, &PyTuple_Type, &keys, &PyTuple_Type, &known,
                          &required, &PyTuple_Type, &fields, &max_string, &budget))
        return NULL;
    PyObject *result = NULL, *nodes = NULL, *rest = NULL, *data = NULL;
    if (PyTuple_GET_SIZE(keys) != 5 || PyTuple_GET_SIZE(fields) != 3 || required < 0 ||
        required >= PyTuple_GET_SIZE(known) || PyTuple_GET_SIZE(known) > 60) {
        PyErr_SetString(PyExc_ValueError, "scan: keys (nodes, count, tensors, pad, data), known columns, fields");
        goto done;
    }
    for (int k = 0; k < 5; k++) {
        if (!PyBytes_Check(PyTuple_GET_ITEM(keys, k)) || (k < 3 && !PyBytes_Check(PyTuple_GET_ITEM(fields, k)))) {
            PyErr_SetString(PyExc_TypeError, "scan: keys and fields are bytes");
            goto done;
        }
    }
    PyObject *nodes_key = PyTuple_GET_ITEM(keys, 0), *count_key = PyTuple_GET_ITEM(keys, 1);
    Walk w = {.buf = view.buf, .len = view.len < size ? view.len : size, .size = size, .pos = 0, .budget = budget,
              .max_string = max_string};
    unsigned long long entries;
    if (!walk_number(&w, MAP_FAMILY, &entries)) goto look_closer;
    long long before = w.pos, nodes_at = -1;
    unsigned long long remaining = 0;
    for (unsigned long long index = 0; index < entries; index++) {
        long long start = w.pos;
        const unsigned char *text;
        Py_ssize_t length;
        if (!walk_string(&w, &text, &length)) goto look_closer;
        if (same(text, length, nodes_key)) {
            nodes_at = start;
            remaining = entries - index - 1;
            break;
        }
        if (!walk_value(&w)) goto look_closer;
    }
    if (nodes_at < 0) goto look_closer;
    nodes = walk_nodes(&w, count_key, known, required, fields);
    if (nodes == NULL) goto done;
    if (nodes == Py_None) goto look_closer;
    if ((rest = PyList_New(0)) == NULL) goto done;
    PyObject *span = Py_BuildValue("(LL)", before, nodes_at);
    if (span == NULL || PyList_Append(rest, span) < 0) {
        Py_XDECREF(span);
        goto done;
    }
    Py_DECREF(span);
    unsigned long long rest_entries = entries - 1;
    /* version 2.0: tensors, pad and data, in this order, as many of them as follow nodes */
    for (int k = 2; k < 5 && (unsigned long long)(k - 2) < remaining; k++) {
        long long start = w.pos;
        const unsigned char *text;
        Py_ssize_t length;
        if (!walk_at_string(&w)) {
            if (w.pos >= w.len) goto look_closer; /* the end of the window (or of the file) */
            break;
        }
        if (!walk_string(&w, &text, &length)) goto look_closer;
        if (!same(text, length, PyTuple_GET_ITEM(keys, k))) {
            w.pos = start;
            break;
        }
        if (k == 2) { /* tensors: decoded with the rest */
            if (!walk_value(&w)) goto look_closer;
            if ((span = Py_BuildValue("(LL)", start, w.pos)) == NULL || PyList_Append(rest, span) < 0) {
                Py_XDECREF(span);
                goto done;
            }
            Py_DECREF(span);
            continue;
        }
        unsigned long long bytes;
        if (!walk_number(&w, BIN_FAMILY, &bytes)) goto look_closer;
        if (k == 4 && (data = Py_BuildValue("(LK)", w.pos, bytes)) == NULL) goto done;
        if (!walk_skip(&w, bytes)) goto look_closer;
        rest_entries--;
    }
    if ((span = Py_BuildValue("(LL)", w.pos, size)) == NULL || PyList_Append(rest, span) < 0) {
        Py_XDECREF(span);
        goto done;
    }
    Py_DECREF(span);
    result = Py_BuildValue("(NKOOO)", PyList_AsTuple(rest), rest_entries, PyTuple_GET_ITEM(nodes, 0),
                           PyTuple_GET_ITEM(nodes, 1), data ? data : Py_None);
    goto done;
look_closer:
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(nodes);
    Py_XDECREF(rest);
    Py_XDECREF(data);
    PyBuffer_Release(&view);
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
     "each the view ``make_array(shape, dtype, buffer, offset)`` gives (made by slicing ``buffer`` viewed as\n"
     "the dtype, then reshaping, except for an empty array). Otherwise None (the caller words the error).\n"
     "Twin of graphsvc.format.document._checked_table."},
    {"scan", scan, METH_VARARGS,
     "scan(window, size, keys, known, required, fields, max_string_length, budget)\n\n"
     "Where the parts of a graph file lie, from its first bytes in memory (``window``; ``size``: the file's\n"
     "size): ``keys`` are the bytes of the keys nodes, count, tensors, pad and data; ``known`` the column\n"
     "names (str), the first ``required`` of them required, the last optional (it may be nil); ``fields``\n"
     "the bytes of a column's keys dtype, length and data. Returns (rest, rest_entries, node_count,\n"
     "columns, data) as graphsvc.format.fastload.scan's Layout, each column (key, dtype, length, offset, size),\n"
     "or None where the walk needs bytes past the window or meets anything unusual. Twin of\n"
     "graphsvc.format.fastload.scan."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "graphsvc.native._ctable",
    .m_doc = "version 2.0's tensor table, checked and viewed",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__ctable(void) {
    if ((str_view = PyUnicode_InternFromString("view")) == NULL) return NULL;
    if ((str_reshape = PyUnicode_InternFromString("reshape")) == NULL) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddIntMacro(m, MAX_DIMENSIONS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
