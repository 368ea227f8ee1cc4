/* The JSON form of a graph read straight into columns: the twin of graphsvc/format/jsonio.py's
 * reading through json.loads (loads_versioned's slow path), which the tests compare it with.
 *
 * read(data) parses the UTF-8 bytes of a document once, from the first byte to the last, and fills
 * the columns as it goes: op codes, parent offsets and ids, values and gradients, with a dict of
 * names and one of attributes (a Python object per name and per attribute, none per node), and a
 * tensor node's array object's data straight into its array's bytes. Like
 * csrc/table.c it only ever says "this is the graph" or "look closer" (None): it takes the
 * document only in the shape a writer gives it (ids 0, 1, 2... in order, parents given by id and
 * listed before their children, values as numbers or "nan", "inf", "-inf", every key known and
 * none repeated, every string Unicode text) and it never words an error. Anything else (a syntax
 * error, a number too large for a float64, a bare NaN, a repeated or unknown key, a lone
 * surrogate, a name or a parent given by name, an array object's keys in another order, ids in
 * another order...) gives
 * None, and jsonio.py reads the text through json.loads, which says what is wrong or builds the
 * same graph the long way. So a document gives the same graph or the same error either way.
 *
 * Numbers are converted as json.loads converts them: an integer literal as int(), then float()
 * where a float is wanted (so "-0" is 0.0), anything with a fraction or an exponent by
 * PyOS_string_to_double, which float() calls.
 *
 * Values nested inside attributes, metadata, ops, version and outputs are built as Python objects
 * (dict, list, str, int, float, True, False, None). That walk recurses, at most MAX_DEPTH levels
 * deep (JSON nesting, not graph depth); a deeper document is left to json.loads.
 */
#include "native.h"

#include <math.h>
#include <string.h>

/* How deep values may nest before the document is left to json.loads (a graph file's attributes
 * and metadata may nest 32 levels: graphsvc.format.layout.Limits.max_attr_depth). */
#define MAX_DEPTH 64
/* The most op tags a graph holds (graphsvc.graph.MAX_OPS: op codes are uint16). */
#define MAX_OPS 65536
/* How many op tags are remembered by their bytes in the document, for a lookup without a str. */
#define TAG_CACHE 32

enum { OK = 0, LOOK_CLOSER = 1, FAILED = -1 }; /* FAILED: a Python exception is set */

/* float("nan")'s bits, which json.loads's reader gives "nan" (the module's init sets it). */
static double NAN_VALUE;

/* A column that grows: its bytes live in a bytearray, returned as it is. */
typedef struct {
    PyObject *array; /* bytearray */
    Py_ssize_t len, cap;
} Column;

static int column_init(Column *c) {
    c->array = PyByteArray_FromStringAndSize(NULL, 0);
    c->len = c->cap = 0;
    return c->array ? OK : FAILED;
}

static inline int column_put(Column *c, const void *item, Py_ssize_t size) {
    if (c->len + size > c->cap) {
        Py_ssize_t cap = c->cap ? c->cap : 1 << 12;
        while (cap < c->len + size) {
            if (cap > PY_SSIZE_T_MAX / 2) {
                PyErr_NoMemory();
                return FAILED;
            }
            cap *= 2;
        }
        if (PyByteArray_Resize(c->array, cap) < 0) return FAILED;
        c->cap = cap;
    }
    memcpy(PyByteArray_AS_STRING(c->array) + c->len, item, (size_t)size);
    c->len += size;
    return OK;
}

static int column_finish(Column *c) { return PyByteArray_Resize(c->array, c->len) < 0 ? FAILED : OK; }

typedef struct {
    const char *p, *end;
    /* scratch for decoding strings with escapes and copying number literals */
    char *scratch;
    Py_ssize_t scratch_cap;
} Parser;

static inline void skip_space(Parser *P) {
    while (P->p < P->end && (*P->p == ' ' || *P->p == '\n' || *P->p == '\r' || *P->p == '\t')) P->p++;
}

/* The next byte after whitespace is ``c``: consumed, 1; else 0. */
static inline int take(Parser *P, char c) {
    skip_space(P);
    if (P->p < P->end && *P->p == c) {
        P->p++;
        return 1;
    }
    return 0;
}

static int scratch_room(Parser *P, Py_ssize_t size) {
    if (size <= P->scratch_cap) return OK;
    char *grown = PyMem_Realloc(P->scratch, (size_t)size);
    if (grown == NULL) {
        PyErr_NoMemory();
        return FAILED;
    }
    P->scratch = grown;
    P->scratch_cap = size;
    return OK;
}

/* -- strings ------------------------------------------------------------------------------------- */

typedef struct {
    const char *text; /* the raw bytes between the quotes */
    Py_ssize_t len;
    int escaped; /* holds a backslash */
} Raw;

/* A string at P->p (after whitespace): its raw bytes. LOOK_CLOSER for anything but a string, or a
 * control character in it (json.loads refuses those). */
static int raw_string(Parser *P, Raw *raw) {
    if (!take(P, '"')) return LOOK_CLOSER;
    const char *start = P->p;
    int escaped = 0;
    while (P->p < P->end) {
        unsigned char c = (unsigned char)*P->p;
        if (c == '"') {
            raw->text = start;
            raw->len = P->p - start;
            raw->escaped = escaped;
            P->p++;
            return OK;
        }
        if (c < 0x20) return LOOK_CLOSER;
        if (c == '\\') {
            escaped = 1;
            P->p++;
            if (P->p >= P->end) return LOOK_CLOSER;
        }
        P->p++;
    }
    return LOOK_CLOSER;
}

static inline int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int four_hex(const char *p, const char *end, unsigned *out) {
    if (end - p < 4) return 0;
    unsigned value = 0;
    for (int i = 0; i < 4; i++) {
        int d = hex_digit(p[i]);
        if (d < 0) return 0;
        value = value * 16 + (unsigned)d;
    }
    *out = value;
    return 1;
}

/* The raw string's escapes decoded into P->scratch as UTF-8: its length, or -1 for LOOK_CLOSER (an
 * unknown escape, a lone surrogate), -2 with an exception set. */
static Py_ssize_t unescape(Parser *P, const Raw *raw) {
    if (scratch_room(P, raw->len + 1) < 0) return -2; /* an escape never decodes to more bytes than it has */
    char *out = P->scratch;
    const char *p = raw->text, *end = raw->text + raw->len;
    while (p < end) {
        if (*p != '\\') {
            *out++ = *p++;
            continue;
        }
        p++;
        char e = *p++;
        switch (e) {
        case '"': *out++ = '"'; break;
        case '\\': *out++ = '\\'; break;
        case '/': *out++ = '/'; break;
        case 'b': *out++ = '\b'; break;
        case 'f': *out++ = '\f'; break;
        case 'n': *out++ = '\n'; break;
        case 'r': *out++ = '\r'; break;
        case 't': *out++ = '\t'; break;
        case 'u': {
            unsigned cp;
            if (!four_hex(p, end, &cp)) return -1;
            p += 4;
            if (cp >= 0xDC00 && cp <= 0xDFFF) return -1; /* a low surrogate alone */
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                unsigned low;
                if (end - p < 6 || p[0] != '\\' || p[1] != 'u' || !four_hex(p + 2, end, &low) || low < 0xDC00 ||
                    low > 0xDFFF)
                    return -1; /* a high surrogate alone */
                p += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
            }
            if (cp < 0x80) {
                *out++ = (char)cp;
            } else if (cp < 0x800) {
                *out++ = (char)(0xC0 | (cp >> 6));
                *out++ = (char)(0x80 | (cp & 0x3F));
            } else if (cp < 0x10000) {
                *out++ = (char)(0xE0 | (cp >> 12));
                *out++ = (char)(0x80 | ((cp >> 6) & 0x3F));
                *out++ = (char)(0x80 | (cp & 0x3F));
            } else {
                *out++ = (char)(0xF0 | (cp >> 18));
                *out++ = (char)(0x80 | ((cp >> 12) & 0x3F));
                *out++ = (char)(0x80 | ((cp >> 6) & 0x3F));
                *out++ = (char)(0x80 | (cp & 0x3F));
            }
            break;
        }
        default: return -1;
        }
    }
    return out - P->scratch;
}

/* The str of a raw string, or NULL: *status LOOK_CLOSER (not Unicode text, an unknown escape) or
 * FAILED (an exception set). */
static PyObject *string_object(Parser *P, const Raw *raw, int *status) {
    const char *text = raw->text;
    Py_ssize_t len = raw->len;
    if (raw->escaped) {
        len = unescape(P, raw);
        if (len < 0) {
            *status = len == -1 ? LOOK_CLOSER : FAILED;
            return NULL;
        }
        text = P->scratch;
    }
    PyObject *str = PyUnicode_DecodeUTF8(text, len, "strict"); /* refuses encoded surrogates too */
    if (str == NULL) {
        if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
            PyErr_Clear();
            *status = LOOK_CLOSER;
        } else {
            *status = FAILED;
        }
    }
    return str;
}

/* Is the raw string exactly ``word`` (no escapes)? */
static inline int raw_is(const Raw *raw, const char *word) {
    Py_ssize_t n = (Py_ssize_t)strlen(word);
    return !raw->escaped && raw->len == n && memcmp(raw->text, word, (size_t)n) == 0;
}

/* -- numbers ------------------------------------------------------------------------------------- */

typedef struct {
    const char *text;
    Py_ssize_t len;
    int integer; /* no fraction, no exponent */
} Number;

/* A number at P->p (after whitespace), as json.loads's NUMBER_RE takes it:
 * -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?. LOOK_CLOSER for anything else (a digit or a dot
 * left over is a syntax error there). */
static int number(Parser *P, Number *n) {
    skip_space(P);
    const char *p = P->p, *end = P->end, *start = p;
    if (p < end && *p == '-') p++;
    if (p >= end) return LOOK_CLOSER;
    if (*p == '0') {
        p++;
    } else if (*p >= '1' && *p <= '9') {
        while (p < end && *p >= '0' && *p <= '9') p++;
    } else {
        return LOOK_CLOSER;
    }
    n->integer = 1;
    if (p < end && *p == '.') {
        p++;
        if (p >= end || !(*p >= '0' && *p <= '9')) return LOOK_CLOSER;
        while (p < end && *p >= '0' && *p <= '9') p++;
        n->integer = 0;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        if (p >= end || !(*p >= '0' && *p <= '9')) return LOOK_CLOSER;
        while (p < end && *p >= '0' && *p <= '9') p++;
        n->integer = 0;
    }
    if (p < end && (*p == '.' || (*p >= '0' && *p <= '9'))) return LOOK_CLOSER;
    n->text = start;
    n->len = p - start;
    P->p = p;
    return OK;
}

/* An integer literal that fits an int64, as one: 1; else 0 (larger: Python's int). */
static int small_integer(const Number *n, int64_t *out) {
    const char *p = n->text, *end = n->text + n->len;
    int negative = *p == '-';
    if (negative) p++;
    if (end - p > 19) return 0;
    uint64_t value = 0; /* 19 digits stay below 2^64 */
    for (; p < end; p++) value = value * 10 + (uint64_t)(*p - '0');
    if (negative) {
        if (value > (uint64_t)1 << 63) return 0;
        *out = value == (uint64_t)1 << 63 ? INT64_MIN : -(int64_t)value;
    } else {
        if (value > (uint64_t)INT64_MAX) return 0;
        *out = (int64_t)value;
    }
    return 1;
}

/* The literal copied into the scratch, NUL-terminated: OK or FAILED. */
static int literal(Parser *P, const Number *n) {
    if (scratch_room(P, n->len + 1) < 0) return FAILED;
    memcpy(P->scratch, n->text, (size_t)n->len);
    P->scratch[n->len] = '\0';
    return OK;
}

/* The number as a finite float64, converted as json.loads and then float() would: OK, LOOK_CLOSER
 * (too large: json.loads's reader refuses it), FAILED. */
static int number_as_double(Parser *P, const Number *n, double *out) {
    int64_t small;
    if (n->integer && small_integer(n, &small)) {
        *out = (double)small; /* exact below 2^53, else rounded to nearest, ties to even, as float(int) does */
        return OK;
    }
    if (n->integer && n->len > 4000) return LOOK_CLOSER; /* int() of it is refused past 4300 digits */
    if (literal(P, n) < 0) return FAILED;
    /* an integer is correctly rounded by float(int) and by strtod alike */
    double value = PyOS_string_to_double(P->scratch, NULL, NULL);
    if (value == -1.0 && PyErr_Occurred()) return FAILED;
    if (!isfinite(value)) return LOOK_CLOSER;
    *out = value;
    return OK;
}

/* -- values as Python objects ------------------------------------------------------------------ */

static PyObject *value_object(Parser *P, int depth, int *status);

static PyObject *look_closer(int *status) {
    *status = LOOK_CLOSER;
    return NULL;
}

static PyObject *failed(int *status) {
    *status = FAILED;
    return NULL;
}

static PyObject *object_value(Parser *P, int depth, int *status) {
    PyObject *dict = PyDict_New();
    if (dict == NULL) return failed(status);
    if (take(P, '}')) return dict;
    for (;;) {
        Raw raw;
        if (raw_string(P, &raw) != OK || !take(P, ':')) goto closer;
        PyObject *key = string_object(P, &raw, status);
        if (key == NULL) goto fail;
        int repeated = PyDict_Contains(dict, key);
        if (repeated != 0) {
            Py_DECREF(key);
            if (repeated < 0) goto error;
            goto closer;
        }
        PyObject *item = value_object(P, depth + 1, status);
        if (item == NULL) {
            Py_DECREF(key);
            goto fail;
        }
        int set = PyDict_SetItem(dict, key, item);
        Py_DECREF(key);
        Py_DECREF(item);
        if (set < 0) goto error;
        if (take(P, ',')) continue;
        if (take(P, '}')) return dict;
        goto closer;
    }
closer:
    *status = LOOK_CLOSER;
    goto fail;
error:
    *status = FAILED;
fail:
    Py_DECREF(dict);
    return NULL;
}

static PyObject *array_value(Parser *P, int depth, int *status) {
    PyObject *list = PyList_New(0);
    if (list == NULL) return failed(status);
    if (take(P, ']')) return list;
    for (;;) {
        PyObject *item = value_object(P, depth + 1, status);
        if (item == NULL) goto fail;
        int appended = PyList_Append(list, item);
        Py_DECREF(item);
        if (appended < 0) {
            *status = FAILED;
            goto fail;
        }
        if (take(P, ',')) continue;
        if (take(P, ']')) return list;
        *status = LOOK_CLOSER;
        goto fail;
    }
fail:
    Py_DECREF(list);
    return NULL;
}

static int word(Parser *P, const char *w) {
    Py_ssize_t n = (Py_ssize_t)strlen(w);
    if (P->end - P->p >= n && memcmp(P->p, w, (size_t)n) == 0) {
        P->p += n;
        return 1;
    }
    return 0;
}

/* Any JSON value as json.loads builds it (objects with no repeated key), or NULL with *status. */
static PyObject *value_object(Parser *P, int depth, int *status) {
    if (depth > MAX_DEPTH) return look_closer(status);
    skip_space(P);
    if (P->p >= P->end) return look_closer(status);
    char c = *P->p;
    if (c == '{') {
        P->p++;
        return object_value(P, depth, status);
    }
    if (c == '[') {
        P->p++;
        return array_value(P, depth, status);
    }
    if (c == '"') {
        Raw raw;
        if (raw_string(P, &raw) != OK) return look_closer(status);
        return string_object(P, &raw, status);
    }
    if (word(P, "true")) Py_RETURN_TRUE;
    if (word(P, "false")) Py_RETURN_FALSE;
    if (word(P, "null")) Py_RETURN_NONE;
    Number n;
    if (number(P, &n) != OK) return look_closer(status);
    if (n.integer) {
        int64_t small;
        if (small_integer(&n, &small)) {
            PyObject *result = PyLong_FromLongLong(small);
            return result ? result : failed(status);
        }
        if (n.len > 4000) return look_closer(status);
        if (literal(P, &n) < 0) return failed(status);
        PyObject *result = PyLong_FromString(P->scratch, NULL, 10);
        if (result == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_ValueError)) return failed(status);
            PyErr_Clear();
            return look_closer(status);
        }
        return result;
    }
    double value;
    int got = number_as_double(P, &n, &value);
    if (got != OK) {
        *status = got;
        return NULL;
    }
    PyObject *result = PyFloat_FromDouble(value);
    return result ? result : failed(status);
}

/* -- the nodes ------------------------------------------------------------------------------------ */

typedef struct {
    Column codes, offsets, parents, values, grads;
    PyObject *names, *attrs, *tags, *tag_codes; /* dict, dict, list, dict str -> code */
    PyObject *arrays, *grad_arrays;             /* dict node -> (dtype name, shape, bytearray) */
    struct {
        const char *text;
        Py_ssize_t len;
        uint16_t code;
    } cache[TAG_CACHE];
    int cached;
    int has_grads;
} Nodes;

/* A node's value or gradient: a number, or "nan", "inf", "-inf" (escapes decoded). */
static int scalar(Parser *P, double *out) {
    skip_space(P);
    if (P->p < P->end && *P->p == '"') {
        Raw raw;
        if (raw_string(P, &raw) != OK) return LOOK_CLOSER;
        const char *text = raw.text;
        Py_ssize_t len = raw.len;
        if (raw.escaped) {
            len = unescape(P, &raw);
            if (len == -2) return FAILED;
            if (len < 0) return LOOK_CLOSER;
            text = P->scratch;
        }
        if (len == 3 && memcmp(text, "nan", 3) == 0) {
            *out = NAN_VALUE;
        } else if (len == 3 && memcmp(text, "inf", 3) == 0) {
            *out = Py_HUGE_VAL;
        } else if (len == 4 && memcmp(text, "-inf", 4) == 0) {
            *out = -Py_HUGE_VAL;
        } else {
            return LOOK_CLOSER;
        }
        return OK;
    }
    Number n;
    if (number(P, &n) != OK) return LOOK_CLOSER;
    return number_as_double(P, &n, out);
}

/* An integer literal in [0, limit): OK with *out, else LOOK_CLOSER. */
static int node_id(Parser *P, int64_t limit, int64_t *out) {
    Number n;
    int64_t value;
    if (number(P, &n) != OK || !n.integer || !small_integer(&n, &value) || value < 0 || value >= limit)
        return LOOK_CLOSER;
    *out = value;
    return OK;
}

static int op_code(Parser *P, Nodes *N, uint16_t *code) {
    Raw raw;
    if (raw_string(P, &raw) != OK || raw.len == 0) return LOOK_CLOSER;
    if (!raw.escaped) {
        for (int i = 0; i < N->cached; i++) {
            if (N->cache[i].len == raw.len && memcmp(N->cache[i].text, raw.text, (size_t)raw.len) == 0) {
                *code = N->cache[i].code;
                return OK;
            }
        }
    }
    int status = OK;
    PyObject *tag = string_object(P, &raw, &status);
    if (tag == NULL) return status;
    PyObject *known = PyDict_GetItemWithError(N->tag_codes, tag);
    Py_ssize_t value;
    if (known != NULL) {
        value = PyLong_AsSsize_t(known);
    } else if (PyErr_Occurred()) {
        Py_DECREF(tag);
        return FAILED;
    } else {
        value = PyList_GET_SIZE(N->tags);
        if (value >= MAX_OPS) {
            Py_DECREF(tag);
            return LOOK_CLOSER;
        }
        PyObject *number = PyLong_FromSsize_t(value);
        int bad = number == NULL || PyDict_SetItem(N->tag_codes, tag, number) < 0 || PyList_Append(N->tags, tag) < 0;
        Py_XDECREF(number);
        if (bad) {
            Py_DECREF(tag);
            return FAILED;
        }
    }
    Py_DECREF(tag);
    *code = (uint16_t)value;
    if (!raw.escaped && N->cached < TAG_CACHE) {
        N->cache[N->cached].text = raw.text;
        N->cache[N->cached].len = raw.len;
        N->cache[N->cached].code = *code;
        N->cached++;
    }
    return OK;
}

/* -- array objects (JSON version 2.0) ----------------------------------------------------------- */

/* The most dimensions a shape may have (graphsvc.graph.MAX_DIMENSIONS). */
#define MAX_DIMENSIONS 32
/* The most items an array read here may declare; a larger one (with an empty axis, it may be
 * valid) is left to json.loads. */
#define MAX_ITEMS ((int64_t)1 << 40)

enum { FLOAT64, FLOAT32, INT64 };

/* One item of an array's data into ``data``: OK, LOOK_CLOSER, FAILED. */
static int array_item(Parser *P, int dtype, Column *data) {
    if (dtype == INT64) {
        Number n;
        int64_t value;
        if (number(P, &n) != OK || !n.integer || !small_integer(&n, &value)) return LOOK_CLOSER;
        return column_put(data, &value, 8);
    }
    double value;
    int status = scalar(P, &value);
    if (status != OK) return status;
    if (dtype == FLOAT64) return column_put(data, &value, 8);
    float narrow = (float)value; /* to nearest, ties to even, as numpy's astype(float32) */
    if (isinf(narrow) && isfinite(value)) return LOOK_CLOSER; /* too large for a float32: an error there */
    return column_put(data, &narrow, 4);
}

/* The data of an array of ``shape``: lists nested exactly as the shape says (a 0-d array's is one
 * item). A stack of item counts, one per axis, not recursion. */
static int array_data(Parser *P, int dtype, const int64_t *shape, int ndim, Column *data) {
    if (ndim == 0) return array_item(P, dtype, data);
    int64_t seen[MAX_DIMENSIONS];
    int axis = 0;
    if (!take(P, '[')) return LOOK_CLOSER;
    seen[0] = 0;
    for (;;) {
        /* inside the list of ``axis``, ``seen[axis]`` items read */
        if (seen[axis] == shape[axis]) {
            if (!take(P, ']')) return LOOK_CLOSER;
            if (axis == 0) return OK;
            axis--;
            seen[axis]++;
            continue;
        }
        if (seen[axis] > 0 && !take(P, ',')) return LOOK_CLOSER;
        if (axis == ndim - 1) {
            int status = array_item(P, dtype, data);
            if (status != OK) return status;
            seen[axis]++;
        } else {
            if (!take(P, '[')) return LOOK_CLOSER;
            axis++;
            seen[axis] = 0;
        }
    }
}

/* An array object {"dtype", "shape", "data"} (in that order, as a writer gives it), its ``{``
 * taken: ``(dtype name, shape, bytearray)`` into *out, or the status. */
static int array_object(Parser *P, PyObject **out) {
    static const char *const names[] = {"float64", "float32", "int64"};
    Raw key, name;
    if (raw_string(P, &key) != OK || !raw_is(&key, "dtype") || !take(P, ':') || raw_string(P, &name) != OK)
        return LOOK_CLOSER;
    int dtype = raw_is(&name, "float64")   ? FLOAT64
                : raw_is(&name, "float32") ? FLOAT32
                : raw_is(&name, "int64")   ? INT64
                                           : -1;
    if (dtype < 0 || !take(P, ',') || raw_string(P, &key) != OK || !raw_is(&key, "shape") || !take(P, ':') ||
        !take(P, '['))
        return LOOK_CLOSER;
    int64_t shape[MAX_DIMENSIONS], items = 1;
    int ndim = 0;
    if (!take(P, ']')) {
        for (;;) {
            if (ndim == MAX_DIMENSIONS || node_id(P, MAX_ITEMS, &shape[ndim]) != OK) return LOOK_CLOSER;
            /* items <= MAX_ITEMS and a size < MAX_ITEMS: checked by division before the product,
             * which could pass 2**63 (an empty axis then hides a shape too large for numpy) */
            if (shape[ndim] > 1 && items > MAX_ITEMS / shape[ndim]) return LOOK_CLOSER;
            items *= shape[ndim] ? shape[ndim] : 1;
            ndim++;
            if (take(P, ',')) continue;
            if (take(P, ']')) break;
            return LOOK_CLOSER;
        }
    }
    if (!take(P, ',') || raw_string(P, &key) != OK || !raw_is(&key, "data") || !take(P, ':')) return LOOK_CLOSER;
    Column data;
    if (column_init(&data) < 0) return FAILED;
    int status = array_data(P, dtype, shape, ndim, &data);
    if (status == OK && !take(P, '}')) status = LOOK_CLOSER;
    if (status == OK && column_finish(&data) < 0) status = FAILED;
    if (status != OK) {
        Py_DECREF(data.array);
        return status;
    }
    PyObject *shape_tuple = PyTuple_New(ndim);
    if (shape_tuple == NULL) {
        Py_DECREF(data.array);
        return FAILED;
    }
    for (int i = 0; i < ndim; i++) {
        PyObject *size = PyLong_FromLongLong(shape[i]);
        if (size == NULL) {
            Py_DECREF(shape_tuple);
            Py_DECREF(data.array);
            return FAILED;
        }
        PyTuple_SET_ITEM(shape_tuple, i, size);
    }
    *out = Py_BuildValue("(sNN)", names[dtype], shape_tuple, data.array);
    return *out ? OK : FAILED;
}

/* A node's value or gradient: a number or "nan", "inf", "-inf" into *scalar_out, or an array
 * object into ``table`` under ``index`` (*is_array set). */
static int value_or_array(Parser *P, double *scalar_out, PyObject *table, int64_t index, int *is_array) {
    *is_array = 0;
    if (!take(P, '{')) return scalar(P, scalar_out);
    PyObject *array = NULL;
    int status = array_object(P, &array);
    if (status != OK) return status;
    PyObject *key = PyLong_FromLongLong(index);
    int bad = key == NULL || PyDict_SetItem(table, key, array) < 0;
    Py_XDECREF(key);
    Py_DECREF(array);
    if (bad) return FAILED;
    *is_array = 1;
    return OK;
}

enum { K_ID = 1, K_NAME = 2, K_OP = 4, K_PARENTS = 8, K_VALUE = 16, K_GRAD = 32, K_ATTRS = 64 };

/* Node ``index``, its object's ``{`` taken. */
static int one_node(Parser *P, Nodes *N, int64_t index) {
    int seen = 0;
    uint16_t code = 0;
    double value = NAN_VALUE, grad = NAN_VALUE;
    int64_t slots = N->parents.len / 4;
    if (column_put(&N->offsets, &slots, 8) < 0) return FAILED;
    if (take(P, '}')) return LOOK_CLOSER; /* no op */
    for (;;) {
        Raw key;
        if (raw_string(P, &key) != OK || key.escaped || !take(P, ':')) return LOOK_CLOSER;
        int which = raw_is(&key, "id")        ? K_ID
                    : raw_is(&key, "name")    ? K_NAME
                    : raw_is(&key, "op")      ? K_OP
                    : raw_is(&key, "parents") ? K_PARENTS
                    : raw_is(&key, "value")   ? K_VALUE
                    : raw_is(&key, "grad")    ? K_GRAD
                    : raw_is(&key, "attrs")   ? K_ATTRS
                                              : 0;
        if (which == 0 || (seen & which)) return LOOK_CLOSER; /* unknown keys are warned about there */
        seen |= which;
        int status = OK;
        switch (which) {
        case K_ID: {
            int64_t id;
            status = node_id(P, INT64_MAX, &id);
            if (status == OK && id != index) status = LOOK_CLOSER;
            break;
        }
        case K_NAME: {
            skip_space(P);
            if (word(P, "null")) break;
            Raw raw;
            if (raw_string(P, &raw) != OK || raw.len == 0) return LOOK_CLOSER;
            PyObject *name = string_object(P, &raw, &status);
            if (name == NULL) return status;
            PyObject *key_object = PyLong_FromLongLong(index);
            int bad = key_object == NULL || PyDict_SetItem(N->names, key_object, name) < 0;
            Py_XDECREF(key_object);
            Py_DECREF(name);
            if (bad) return FAILED;
            break;
        }
        case K_OP: status = op_code(P, N, &code); break;
        case K_PARENTS: {
            if (!take(P, '[')) return LOOK_CLOSER;
            if (take(P, ']')) break;
            for (;;) {
                int64_t parent;
                if (node_id(P, index, &parent) != OK) return LOOK_CLOSER; /* before the node: kept in order */
                int32_t narrow = (int32_t)parent;
                if (column_put(&N->parents, &narrow, 4) < 0) return FAILED;
                if (take(P, ',')) continue;
                if (take(P, ']')) break;
                return LOOK_CLOSER;
            }
            break;
        }
        case K_VALUE: {
            int is_array;
            status = value_or_array(P, &value, N->arrays, index, &is_array);
            break;
        }
        case K_GRAD: {
            int is_array;
            status = value_or_array(P, &grad, N->grad_arrays, index, &is_array);
            if (!is_array) N->has_grads = 1; /* the grads column: some node has a scalar gradient */
            break;
        }
        case K_ATTRS: {
            if (!take(P, '{')) return LOOK_CLOSER;
            PyObject *attrs = object_value(P, 1, &status);
            if (attrs == NULL) return status;
            int bad = 0;
            if (PyDict_GET_SIZE(attrs)) { /* an empty object is no attributes (FORMAT.md §5) */
                PyObject *key_object = PyLong_FromLongLong(index);
                bad = key_object == NULL || PyDict_SetItem(N->attrs, key_object, attrs) < 0;
                Py_XDECREF(key_object);
            }
            Py_DECREF(attrs);
            if (bad) return FAILED;
            break;
        }
        }
        if (status != OK) return status;
        if (take(P, ',')) continue;
        if (take(P, '}')) break;
        return LOOK_CLOSER;
    }
    if (!(seen & K_OP)) return LOOK_CLOSER;
    if (column_put(&N->codes, &code, 2) < 0 || column_put(&N->values, &value, 8) < 0 ||
        column_put(&N->grads, &grad, 8) < 0)
        return FAILED;
    return OK;
}

static int all_nodes(Parser *P, Nodes *N) {
    if (!take(P, '[')) return LOOK_CLOSER;
    int64_t index = 0;
    if (!take(P, ']')) {
        for (;;) {
            if (index >= INT32_MAX || !take(P, '{')) return LOOK_CLOSER;
            int status = one_node(P, N, index);
            if (status != OK) return status;
            index++;
            if (take(P, ',')) continue;
            if (take(P, ']')) break;
            return LOOK_CLOSER;
        }
    }
    int64_t slots = N->parents.len / 4;
    return column_put(&N->offsets, &slots, 8);
}

/* The document's top level: "nodes" into the columns, the other known keys as objects in ``top``. */
static int document(Parser *P, Nodes *N, PyObject *top) {
    static const char *const known[] = {"format", "version", "ops", "outputs", "metadata"};
    if (P->end - P->p >= 3 && memcmp(P->p, "\xef\xbb\xbf", 3) == 0) P->p += 3; /* a UTF-8 BOM */
    if (!take(P, '{')) return LOOK_CLOSER;
    int seen_nodes = 0;
    if (!take(P, '}')) {
        for (;;) {
            Raw key;
            if (raw_string(P, &key) != OK || key.escaped || !take(P, ':')) return LOOK_CLOSER;
            if (raw_is(&key, "nodes")) {
                if (seen_nodes) return LOOK_CLOSER;
                seen_nodes = 1;
                int status = all_nodes(P, N);
                if (status != OK) return status;
            } else {
                const char *name = NULL;
                for (size_t i = 0; i < sizeof known / sizeof *known; i++) {
                    if (raw_is(&key, known[i])) name = known[i];
                }
                if (name == NULL) return LOOK_CLOSER; /* unknown: warned about there */
                int status = OK;
                PyObject *item = value_object(P, 1, &status);
                if (item == NULL) return status;
                int repeated = PyDict_GetItemString(top, name) != NULL;
                int bad = !repeated && PyDict_SetItemString(top, name, item) < 0;
                Py_DECREF(item);
                if (bad) return FAILED;
                if (repeated) return LOOK_CLOSER;
            }
            if (take(P, ',')) continue;
            if (take(P, '}')) break;
            return LOOK_CLOSER;
        }
    }
    skip_space(P);
    return seen_nodes && P->p == P->end ? OK : LOOK_CLOSER;
}

/* read(data) -> (top, tags, op_codes, offsets, parents, values, grads, names, attrs, arrays, grad_arrays) or None */
static PyObject *read_document(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    Parser P = {.p = view.buf, .end = (const char *)view.buf + view.len, .scratch = NULL, .scratch_cap = 0};
    Nodes N;
    memset(&N, 0, sizeof N);
    PyObject *top = PyDict_New(), *result = NULL;
    N.names = PyDict_New();
    N.attrs = PyDict_New();
    N.tags = PyList_New(0);
    N.tag_codes = PyDict_New();
    N.arrays = PyDict_New();
    N.grad_arrays = PyDict_New();
    if (top == NULL || N.names == NULL || N.attrs == NULL || N.tags == NULL || N.tag_codes == NULL ||
        N.arrays == NULL || N.grad_arrays == NULL ||
        column_init(&N.codes) < 0 || column_init(&N.offsets) < 0 || column_init(&N.parents) < 0 ||
        column_init(&N.values) < 0 || column_init(&N.grads) < 0)
        goto done;
    int status = document(&P, &N, top);
    if (status == FAILED) goto done;
    if (status == LOOK_CLOSER) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    if (column_finish(&N.codes) < 0 || column_finish(&N.offsets) < 0 || column_finish(&N.parents) < 0 ||
        column_finish(&N.values) < 0 || column_finish(&N.grads) < 0)
        goto done;
    result = Py_BuildValue("(OOOOOOOOOOO)", top, N.tags, N.codes.array, N.offsets.array, N.parents.array,
                           N.values.array, N.has_grads ? N.grads.array : Py_None, N.names, N.attrs, N.arrays,
                           N.grad_arrays);
done:
    PyBuffer_Release(&view);
    PyMem_Free(P.scratch);
    Py_XDECREF(top);
    Py_XDECREF(N.names);
    Py_XDECREF(N.attrs);
    Py_XDECREF(N.tags);
    Py_XDECREF(N.tag_codes);
    Py_XDECREF(N.arrays);
    Py_XDECREF(N.grad_arrays);
    Py_XDECREF(N.codes.array);
    Py_XDECREF(N.offsets.array);
    Py_XDECREF(N.parents.array);
    Py_XDECREF(N.values.array);
    Py_XDECREF(N.grads.array);
    return result;
}

static PyMethodDef methods[] = {
    {"read", read_document, METH_O,
     "read(data) -> (top, tags, op_codes, offsets, parents, values, grads, names, attrs, arrays, grad_arrays)\n"
     "or None\n\n"
     "A graph's JSON form (UTF-8 bytes, a BOM allowed) read into columns: ``top`` the document's keys\n"
     "other than nodes (format, version, ops, outputs, metadata) as json.loads builds them; ``tags`` the\n"
     "op tags in order of first use; op codes (uint16), parent offsets (int64), parent ids (int32),\n"
     "values and gradients (float64; grads None where no node has one) as bytearrays; names and\n"
     "attributes as dicts node -> str / dict; arrays and grad_arrays as dicts node -> (dtype name, shape,\n"
     "bytearray of the items in C order). None when the document is not in the shape a writer gives\n"
     "it (graphsvc/format/jsonio.py then reads it through json.loads, which words any error)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "graphsvc.native._cjson",
    .m_doc = "the JSON form of a graph read into columns",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__cjson(void) {
    const uint64_t bits = 0x7ff8000000000000ULL;
    memcpy(&NAN_VALUE, &bits, sizeof NAN_VALUE);
    return PyModule_Create(&module);
}
