/* Text: node listings made from the columns, twins of graphsvc/console/listing.py's references
 * (reference_text and reference_json_objects), one chunk of nodes at a time; and the nodes of a
 * graph's JSON form (graph_json_chunk), the twin of graphsvc/format/jsonio.py's reference_nodes_text.
 *
 * Columns: op_codes uint16 (N), offsets int64 (N + 1), parents int32 (E), values and grads float64
 * (N, optional). The text is built as UTF-8 in one growing buffer and decoded into one str at the
 * end. Floats are written by PyOS_double_to_string(x, 'r', 0, Py_DTSF_ADD_DOT_0), which is what
 * float.__repr__ calls, so every float reads exactly as repr() writes it ("nan", "inf", "-0.0",
 * "1e+16"). That function allocates through PyMem_Malloc and its dtoa keeps a free list that the
 * GIL protects, so unlike the sweeps these loops run holding the GIL.
 *
 * Names and op tags can be any Unicode, lone surrogates included (json.loads makes them from
 * "\ud800"): a cell that strict UTF-8 refuses is encoded with "surrogatepass" and the whole text is
 * decoded with it too, which gives back exactly the code points that went in.
 *
 * What is escaped is decided in one place, graphsvc/text.py: text cells come here already escaped,
 * and the JSON text that json_chunk writes gets its unprintable characters (U+202E, U+200B, C1
 * controls, lone surrogates...) written as JSON escapes there afterwards, as the reference's does.
 */
#include "native.h"

#include <math.h>
#include <string.h>

/* -- the output buffer ------------------------------------------------------------------------ */

typedef struct {
    char *data;
    Py_ssize_t len, cap;
} Buffer;

/* Grows the buffer to hold ``more`` bytes after the end: 0, or -1 with MemoryError set. */
static int grow(Buffer *out, Py_ssize_t more) {
    Py_ssize_t cap = out->cap ? out->cap : 4096;
    while (cap - out->len < more) {
        if (cap > PY_SSIZE_T_MAX / 2) {
            PyErr_NoMemory();
            return -1;
        }
        cap *= 2;
    }
    char *data = PyMem_Realloc(out->data, (size_t)cap);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    out->data = data;
    out->cap = cap;
    return 0;
}

/* Room for ``more`` bytes after the end: 0, or -1 with MemoryError set. */
static inline int reserve(Buffer *out, Py_ssize_t more) {
    return more <= out->cap - out->len ? 0 : grow(out, more);
}

static int put(Buffer *out, const char *text, Py_ssize_t n) {
    if (reserve(out, n) < 0) return -1;
    memcpy(out->data + out->len, text, (size_t)n);
    out->len += n;
    return 0;
}

#define PUT_LITERAL(out, literal) put((out), (literal), (Py_ssize_t)sizeof(literal) - 1)

/* Most bytes write_int writes: "-9223372036854775808". */
#define INT_MAX_CHARS 20

/* A decimal integer, as str(int) writes it, at ``to`` (room for INT_MAX_CHARS bytes); returns the end. */
static inline char *write_int(char *to, int64_t number) {
    char digits[24];
    char *end = digits + sizeof digits, *p = end;
    /* negate through uint64_t, so INT64_MIN does not overflow */
    uint64_t magnitude = number < 0 ? (uint64_t)0 - (uint64_t)number : (uint64_t)number;
    do {
        *--p = (char)('0' + magnitude % 10);
        magnitude /= 10;
    } while (magnitude);
    if (number < 0) *--p = '-';
    memcpy(to, p, (size_t)(end - p));
    return to + (end - p);
}

static int put_int(Buffer *out, int64_t number) {
    if (reserve(out, INT_MAX_CHARS) < 0) return -1;
    out->len = write_int(out->data + out->len, number) - out->data;
    return 0;
}

/* -- floats ------------------------------------------------------------------------------------ */

typedef unsigned __int128 u128;

/* pow10[k] = 10^k, filled in by the module's init. */
static u128 pow10[21];

/* repr()'s layout of a positive float whose shortest round-tripping digits are ``digits`` (no
 * trailing zeros) with the decimal point ``decpt`` places after the first one (value 0.DIGITS x
 * 10^decpt), as CPython's format_float_short does for 'r' with Py_DTSF_ADD_DOT_0: exponent notation
 * when decpt <= -4 or decpt > 16 (1e-05, 1.5e+16), else fixed with at least one digit either side
 * of the point (0.001, 12.5, 3.0). Writes at most 25 bytes to ``p``; returns the end. */
static char *layout(char *p, const char *digits, int count, int decpt) {
    if (decpt <= -4 || decpt > 16) {
        *p++ = digits[0];
        if (count > 1) {
            *p++ = '.';
            memcpy(p, digits + 1, (size_t)count - 1);
            p += count - 1;
        }
        int exponent = decpt - 1;
        *p++ = 'e';
        *p++ = exponent < 0 ? '-' : '+';
        if (exponent < 0) exponent = -exponent;
        if (exponent >= 100) *p++ = (char)('0' + exponent / 100);
        *p++ = (char)('0' + exponent / 10 % 10);
        *p++ = (char)('0' + exponent % 10);
    } else if (decpt <= 0) {
        *p++ = '0';
        *p++ = '.';
        for (int i = 0; i < -decpt; i++) *p++ = '0';
        memcpy(p, digits, (size_t)count);
        p += count;
    } else if (decpt < count) {
        memcpy(p, digits, (size_t)decpt);
        p += decpt;
        *p++ = '.';
        memcpy(p, digits + decpt, (size_t)(count - decpt));
        p += count - decpt;
    } else {
        memcpy(p, digits, (size_t)count);
        p += count;
        for (int i = count; i < decpt; i++) *p++ = '0';
        *p++ = '.';
        *p++ = '0';
    }
    return p;
}

/* Does d = round(x 10^k), the nearest decimal with k digits after the point (x = m / 2^q; k in
 * [-15, 20]), read back as x? If so, *best = d and *best_k = k. See shortest_repr. */
static inline int reads_back(uint64_t m, int q, int k, uint64_t *best, int *best_k) {
    u128 scale = k > 0 ? pow10[k] : 1; /* 10^max(k,0) */
    u128 n = (u128)m * scale;
    /* d = n / (2^q 10^max(-k,0)): the shift first, then the (rare) division by a power of ten */
    u128 d = n >> q;
    u128 d_den = (u128)1 << q;
    if (k < 0) {
        d /= pow10[-k];
        d_den *= pow10[-k];
    }
    u128 rest = n - d * d_den;
    /* nearest, a tie to the even one (both of a tie can read back: x = 0.25 is 0.05 from 0.2 and
     * 0.3, within half an ulp of 0.125; Gay's dtoa then gives the even digit, as here) */
    if (rest * 2 > d_den || (rest * 2 == d_den && (d & 1))) d++;
    u128 dd = d * d_den;
    u128 error = dd > n ? dd - n : n - dd;
    if (error * 2 > scale || (error * 2 == scale && (m & 1))) return 0;
    *best = (uint64_t)d;
    *best_k = k;
    return 1;
}

/* The shortest repr of a positive normal x = m / 2^q in [1e-4, 2^53), exactly, with 128-bit integers;
 * 0 where it does not apply (the caller then asks CPython). Returns the length written to ``p``.
 *
 * For p digits, the nearest p-digit decimal to x is d / 10^k with k = p - 1 - floor(log10 x) and
 * d = round(x 10^k) = round(N / D), N = m 10^max(k,0), D = 2^q 10^max(-k,0). It reads back as x when
 * it lies within half an ulp (2^-q / 2) of x: |d D - N| * 2 <= 10^max(k,0), the bound itself only
 * when m is even (strtod rounds a tie to even). Where any p-digit decimal reads back as x, the
 * nearest one does, as long as x's rounding interval is symmetric, that is m is not a power of
 * two (excluded); and if p digits are enough, so are p + 1. So the shortest is the fewest digits
 * that still read back (17 always do): that is what repr gives (David Gay's shortest, the
 * nearest among the shortest, a tie to the even digit). Bounds: m < 2^53, k <= 20,
 * q <= 67, so N < 2^120 and D < 2^117. */
static int shortest_repr(double x, char *out) {
    if (!(x >= 1e-4 && x < 9007199254740992.0)) return 0;
    uint64_t bits;
    memcpy(&bits, &x, sizeof bits);
    uint64_t m = (bits & ((1ULL << 52) - 1)) | (1ULL << 52);
    int q = 1075 - (int)(bits >> 52); /* x = m / 2^q; x < 2^53 gives q >= 1 */
    if (m == (1ULL << 52)) return 0;   /* a power of two: its rounding interval is lopsided */
    /* e10 = floor(log10 x) in [-4, 15]: estimated, then checked exactly (10^e10 <= x < 10^(e10+1)).
     * x is in [2^e2, 2^(e2+1)) with e2 = 52 - q, so floor(log10 x) is floor(e2 log10(2)) or one
     * more; 78913 / 2^18 is log10(2) closely enough for that floor over this range (Ryu's log10Pow2) */
    int e2 = 52 - q;
    int e10 = e2 >= 0 ? (e2 * 78913) >> 18 : -((-e2 * 78913 + (1 << 18) - 1) >> 18);
    for (int round = 0; round < 2; round++) {
        if (e10 < -4) e10 = -4;
        if (e10 > 15) e10 = 15;
        /* x >= 10^e: m 10^max(-e,0) >= 2^q 10^max(e,0) */
        u128 low_l = (u128)m * (e10 < 0 ? pow10[-e10] : 1), low_r = ((u128)1 << q) * (e10 > 0 ? pow10[e10] : 1);
        int e1 = e10 + 1;
        u128 high_l = (u128)m * (e1 < 0 ? pow10[-e1] : 1), high_r = ((u128)1 << q) * (e1 > 0 ? pow10[e1] : 1);
        if (low_l < low_r) e10--;
        else if (high_l >= high_r) e10++;
        else break;
        if (round == 1) return 0; /* cannot happen; be safe */
    }
    uint64_t best = 0; /* the shortest d that reads back, and its k */
    int best_k = 0;
    /* Most floats need 16 or 17 digits: 16 is tried first; if it does not read back, neither does
     * any shorter one and 17 is the answer; if it does, shorter ones are tried until one does not. */
    if (!reads_back(m, q, 16 - 1 - e10, &best, &best_k)) {
        reads_back(m, q, 17 - 1 - e10, &best, &best_k);
    } else {
        for (int p = 15; p >= 1 && reads_back(m, q, p - 1 - e10, &best, &best_k); p--) {
        }
    }
    if (best == 0) return 0; /* 17 digits always read back; be safe */
    /* best's decimal digits, written backwards from the end of ``digits``: value 0.DIGITS x
     * 10^(length - k); then the trailing zeros dropped */
    char digits[24];
    char *end = digits + sizeof digits, *start = end;
    do {
        *--start = (char)('0' + best % 10);
        best /= 10;
    } while (best);
    int decpt = (int)(end - start) - best_k;
    while (end - start > 1 && end[-1] == '0') end--;
    return (int)(layout(out, start, (int)(end - start), decpt) - out);
}

/* Most bytes write_float writes: 25 for the layout and a sign, or CPython's repr (at most 24) and quotes. */
#define FLOAT_MAX_CHARS 32

/* A float as repr() writes it, at ``to`` (room for FLOAT_MAX_CHARS bytes); in JSON (``quote_special``)
 * nan and the infinities as strings. Returns the end, or NULL with an exception set. */
static char *write_float(char *to, double x, int quote_special) {
    char *p = to;
    if (x == 0.0) { /* 0.0 and -0.0 */
        if (signbit(x)) *p++ = '-';
        memcpy(p, "0.0", 3);
        return p + 3;
    }
    if (x < 0 && isfinite(x)) *p++ = '-';
    int written = isfinite(x) ? shortest_repr(fabs(x), p) : 0;
    if (written > 0) return p + written;
    /* everything else (tiny, huge, powers of two, nan, inf) as float.__repr__ does it, sign included */
    char *text = PyOS_double_to_string(x, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (text == NULL) return NULL;
    size_t len = strlen(text);
    if (len > FLOAT_MAX_CHARS - 2) { /* cannot happen: repr of a double is at most 24 characters */
        PyMem_Free(text);
        PyErr_SetString(PyExc_SystemError, "repr of a float longer than expected");
        return NULL;
    }
    int quoted = quote_special && !isfinite(x);
    p = to;
    if (quoted) *p++ = '"';
    memcpy(p, text, len);
    p += len;
    if (quoted) *p++ = '"';
    PyMem_Free(text);
    return p;
}

static int put_float(Buffer *out, double x, int quote_special) {
    if (reserve(out, FLOAT_MAX_CHARS) < 0) return -1;
    char *end = write_float(out->data + out->len, x, quote_special);
    if (end == NULL) return -1;
    out->len = end - out->data;
    return 0;
}

/* ``text`` as a JSON string, as json.dumps(..., ensure_ascii=False) writes it: the quote, the
 * backslash and the C0 controls escaped, everything else as it is. In UTF-8 those are single
 * bytes that never occur inside a multi-byte character, so the bytes can be scanned directly. */
static int put_json_string(Buffer *out, const char *text, Py_ssize_t n) {
    static const char hex[] = "0123456789abcdef";
    /* at most 6 bytes for each input byte, and the quotes */
    if (n > (PY_SSIZE_T_MAX - 2) / 6 || reserve(out, 6 * n + 2) < 0) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        return -1;
    }
    char *p = out->data + out->len;
    *p++ = '"';
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)text[i];
        if (c >= 0x20 && c != '"' && c != '\\') {
            *p++ = (char)c;
            continue;
        }
        *p++ = '\\';
        switch (c) {
        case '"': *p++ = '"'; break;
        case '\\': *p++ = '\\'; break;
        case '\b': *p++ = 'b'; break;
        case '\f': *p++ = 'f'; break;
        case '\n': *p++ = 'n'; break;
        case '\r': *p++ = 'r'; break;
        case '\t': *p++ = 't'; break;
        default:
            *p++ = 'u';
            *p++ = '0';
            *p++ = '0';
            *p++ = hex[c >> 4];
            *p++ = hex[c & 0xf];
        }
    }
    *p++ = '"';
    out->len = p - out->data;
    return 0;
}

/* -- text cells from Python ------------------------------------------------------------------- */

typedef struct {
    const char *text; /* UTF-8, owned by a str (its cached UTF-8) or by a bytes object in ``keep`` */
    Py_ssize_t len;
    int is_none;
} Cell;

/* The UTF-8 of ``object`` (a str, or None where ``none_ok``) into *cell. A str with lone
 * surrogates is encoded with "surrogatepass" into a bytes object that ``keep`` holds on to. */
static int cell_of(PyObject *object, Cell *cell, PyObject *keep, int none_ok, const char *what) {
    cell->is_none = 0;
    if (object == Py_None && none_ok) {
        cell->is_none = 1;
        cell->text = NULL;
        cell->len = 0;
        return 0;
    }
    if (!PyUnicode_Check(object)) {
        PyErr_Format(PyExc_TypeError, "%s: a str%s, not %.100s", what, none_ok ? " or None" : "",
                     Py_TYPE(object)->tp_name);
        return -1;
    }
    cell->text = PyUnicode_AsUTF8AndSize(object, &cell->len);
    if (cell->text != NULL) return 0;
    if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) return -1;
    PyErr_Clear();
    PyObject *encoded = PyUnicode_AsEncodedString(object, "utf-8", "surrogatepass");
    if (encoded == NULL) return -1;
    int appended = PyList_Append(keep, encoded);
    Py_DECREF(encoded);
    if (appended < 0) return -1;
    cell->text = PyBytes_AS_STRING(encoded); /* alive as long as ``keep`` */
    cell->len = PyBytes_GET_SIZE(encoded);
    return 0;
}

/* ``sequence`` (a list or tuple of str, None too where ``none_ok``) as an array of cells, or NULL
 * with an exception set; ``expected`` >= 0 is the length it must have. Free it with PyMem_Free. */
static Cell *cells_of(PyObject *sequence, Py_ssize_t expected, PyObject *keep, int none_ok, const char *what,
                      Py_ssize_t *count) {
    /* A tuple of the items, kept (in ``keep``) until the listing is written: the cells point into
     * its strings, which nothing the caller does meanwhile (a generator, a list cleared) can free. */
    PyObject *items_tuple = PySequence_Tuple(sequence);
    if (items_tuple == NULL) return NULL;
    int kept = PyList_Append(keep, items_tuple);
    Py_DECREF(items_tuple); /* ``keep`` holds it now */
    if (kept < 0) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(items_tuple);
    if (expected >= 0 && n != expected) {
        PyErr_Format(PyExc_ValueError, "%s: %zd %s for %zd %s", what, n, graphsvc_noun(n, "item", "items"), expected,
                     graphsvc_noun(expected, "node", "nodes"));
        return NULL;
    }
    Cell *cells = PyMem_Malloc(sizeof(Cell) * (size_t)(n ? n : 1));
    if (cells == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (cell_of(PyTuple_GET_ITEM(items_tuple, i), &cells[i], keep, none_ok, what) < 0) {
            PyMem_Free(cells);
            return NULL;
        }
    }
    *count = n;
    return cells;
}

/* -- the arguments both listings take --------------------------------------------------------- */

typedef struct {
    Py_buffer ids, op_codes, offsets, parents, values, grads;
    int has_values, has_grads;
    Py_ssize_t n, nodes, slots; /* chunk length, graph's nodes, parent slots */
    Cell *names, *tags;         /* names NULL: no names at all */
    Py_ssize_t tag_count;
    PyObject *keep;
} Chunk;

/* A float64 / integer buffer: the item size and the kind of item (numpy's typecodes). */
static int column(PyObject *object, Py_buffer *view, Py_ssize_t itemsize, const char *kinds, const char *name) {
    if (graphsvc_buffer(object, view, itemsize, 0, name) < 0) return -1;
    const char *format = view->format ? view->format : "B";
    if (*format == '<' || *format == '=' || *format == '@') format++;
    if (strlen(format) != 1 || strchr(kinds, *format) == NULL) {
        PyErr_Format(PyExc_TypeError, "%s: items of format '%s', not one of '%s'", name, view->format, kinds);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static void release(Chunk *c) {
    PyMem_Free(c->names);
    PyMem_Free(c->tags);
    Py_XDECREF(c->keep);
    if (c->grads.obj) PyBuffer_Release(&c->grads);
    if (c->values.obj) PyBuffer_Release(&c->values);
    if (c->parents.obj) PyBuffer_Release(&c->parents);
    if (c->offsets.obj) PyBuffer_Release(&c->offsets);
    if (c->op_codes.obj) PyBuffer_Release(&c->op_codes);
    if (c->ids.obj) PyBuffer_Release(&c->ids);
}

/* Takes the arguments and checks that every id, op code and parent slot the chunk uses is inside
 * its column: 0, or -1 with an exception set. Either way ``release`` frees what was taken (``c``
 * must be zeroed first). */
static int take(Chunk *c, PyObject *ids, PyObject *op_codes, PyObject *offsets, PyObject *parents, PyObject *names,
                PyObject *tags, PyObject *values, PyObject *grads, int names_may_be_none) {
    if ((c->keep = PyList_New(0)) == NULL) return -1;
    if (column(ids, &c->ids, 8, "qlL", "ids") < 0 || column(op_codes, &c->op_codes, 2, "H", "op_codes") < 0 ||
        column(offsets, &c->offsets, 8, "qlL", "offsets") < 0 || column(parents, &c->parents, 4, "ilI", "parents") < 0)
        return -1;
    c->has_values = values != Py_None;
    c->has_grads = grads != Py_None;
    if (c->has_values && column(values, &c->values, 8, "d", "values") < 0) return -1;
    if (c->has_grads && column(grads, &c->grads, 8, "d", "grads") < 0) return -1;
    c->n = c->ids.len / 8;
    c->nodes = c->op_codes.len / 2;
    c->slots = c->parents.len / 4;
    if (c->offsets.len / 8 != c->nodes + 1) {
        Py_ssize_t length = c->offsets.len / 8;
        PyErr_Format(PyExc_ValueError, "offsets: %zd %s for %zd %s (not N + 1)", length,
                     graphsvc_noun(length, "item", "items"), c->nodes, graphsvc_noun(c->nodes, "node", "nodes"));
        return -1;
    }
    if (names != Py_None) {
        Py_ssize_t count;
        if ((c->names = cells_of(names, c->n, c->keep, names_may_be_none, "names", &count)) == NULL) return -1;
    }
    if ((c->tags = cells_of(tags, -1, c->keep, 0, "tags", &c->tag_count)) == NULL) return -1;

    const int64_t *id = c->ids.buf, *off = c->offsets.buf;
    const uint16_t *code = c->op_codes.buf;
    Py_ssize_t value_count = c->has_values ? c->values.len / 8 : PY_SSIZE_T_MAX;
    Py_ssize_t grad_count = c->has_grads ? c->grads.len / 8 : PY_SSIZE_T_MAX;
    for (Py_ssize_t i = 0; i < c->n; i++) {
        int64_t node = id[i];
        if (node < 0 || node >= c->nodes || node >= value_count || node >= grad_count) {
            PyErr_Format(PyExc_IndexError, "node %lld is not in the graph's columns", (long long)node);
            return -1;
        }
        if (code[node] >= c->tag_count) {
            PyErr_Format(PyExc_IndexError, "node %lld: op code %d has no tag", (long long)node, (int)code[node]);
            return -1;
        }
        if (off[node] < 0 || off[node] > off[node + 1] || off[node + 1] > c->slots) {
            PyErr_Format(PyExc_IndexError, "node %lld: parent slots out of range", (long long)node);
            return -1;
        }
    }
    return 0;
}

/* The text built so far as one str. */
static PyObject *finish(Buffer *out) {
    return PyUnicode_DecodeUTF8(out->data ? out->data : "", out->len, "surrogatepass");
}

/* -- the listings ----------------------------------------------------------------------------- */

/* text_chunk(ids, op_codes, offsets, parents, names, tags, values, grads) -> str */
static PyObject *text_chunk(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *ids, *op_codes, *offsets, *parents, *names, *tags, *values, *grads;
    if (!PyArg_ParseTuple(args, "OOOOOOOO:text_chunk", &ids, &op_codes, &offsets, &parents, &names, &tags, &values,
                          &grads))
        return NULL;
    Chunk c;
    memset(&c, 0, sizeof c);
    Buffer out = {NULL, 0, 0};
    PyObject *result = NULL;
    if (take(&c, ids, op_codes, offsets, parents, names, tags, values, grads, 0) < 0) goto done;
    const int64_t *id = c.ids.buf, *off = c.offsets.buf;
    const int32_t *parent = c.parents.buf;
    const uint16_t *code = c.op_codes.buf;
    const double *value = c.values.buf, *grad = c.grads.buf;
    /* a guess at the size (id, parents, two floats and tabs), so the buffer rarely grows */
    if (reserve(&out, c.n * (c.has_values || c.has_grads ? 64 : 32)) < 0) goto done;
    for (Py_ssize_t i = 0; i < c.n; i++) {
        int64_t node = id[i];
        const Cell *tag = &c.tags[code[node]];
        Py_ssize_t name_len = c.names ? c.names[i].len : 1;
        int64_t parent_count = off[node + 1] - off[node];
        /* room for the whole line at once: id, name, tag, parents (an int32 and a comma each), floats,
         * the tabs and the newline; the cells' and parents' sizes were checked by take() */
        Py_ssize_t line = INT_MAX_CHARS + name_len + tag->len + (parent_count ? parent_count * 12 : 1) +
                          2 * (1 + FLOAT_MAX_CHARS) + 4;
        if (reserve(&out, line) < 0) goto done;
        char *p = write_int(out.data + out.len, node);
        *p++ = '\t';
        if (c.names) {
            memcpy(p, c.names[i].text, (size_t)name_len);
            p += name_len;
        } else {
            *p++ = '-';
        }
        *p++ = '\t';
        memcpy(p, tag->text, (size_t)tag->len);
        p += tag->len;
        *p++ = '\t';
        if (parent_count == 0) *p++ = '-';
        for (int64_t slot = off[node]; slot < off[node + 1]; slot++) {
            if (slot > off[node]) *p++ = ',';
            p = write_int(p, parent[slot]);
        }
        if (c.has_values) {
            *p++ = '\t';
            if ((p = write_float(p, value[node], 0)) == NULL) goto done;
        }
        if (c.has_grads) {
            *p++ = '\t';
            if ((p = write_float(p, grad[node], 0)) == NULL) goto done;
        }
        *p++ = '\n';
        out.len = p - out.data;
    }
    result = finish(&out);
done:
    PyMem_Free(out.data);
    release(&c);
    return result;
}

/* json_chunk(ids, op_codes, offsets, parents, names, tags, values, grads, leading_comma) -> str */
static PyObject *json_chunk(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *ids, *op_codes, *offsets, *parents, *names, *tags, *values, *grads;
    int leading_comma;
    if (!PyArg_ParseTuple(args, "OOOOOOOOp:json_chunk", &ids, &op_codes, &offsets, &parents, &names, &tags, &values,
                          &grads, &leading_comma))
        return NULL;
    Chunk c;
    memset(&c, 0, sizeof c);
    Buffer out = {NULL, 0, 0};
    PyObject *result = NULL;
    if (take(&c, ids, op_codes, offsets, parents, names, tags, values, grads, 1) < 0) goto done;
    const int64_t *id = c.ids.buf, *off = c.offsets.buf;
    const int32_t *parent = c.parents.buf;
    const uint16_t *code = c.op_codes.buf;
    const double *value = c.values.buf, *grad = c.grads.buf;
    if (reserve(&out, c.n * (c.has_values ? 112 : 64)) < 0) goto done;
    for (Py_ssize_t i = 0; i < c.n; i++) {
        int64_t node = id[i];
        if (((i > 0 || leading_comma) && PUT_LITERAL(&out, ",") < 0) || PUT_LITERAL(&out, "{\"id\":") < 0 ||
            put_int(&out, node) < 0 || PUT_LITERAL(&out, ",\"name\":") < 0)
            goto done;
        if (c.names == NULL || c.names[i].is_none) {
            if (PUT_LITERAL(&out, "null") < 0) goto done;
        } else if (put_json_string(&out, c.names[i].text, c.names[i].len) < 0) {
            goto done;
        }
        const Cell *tag = &c.tags[code[node]];
        if (PUT_LITERAL(&out, ",\"op\":") < 0 || put_json_string(&out, tag->text, tag->len) < 0 ||
            PUT_LITERAL(&out, ",\"parents\":[") < 0)
            goto done;
        for (int64_t slot = off[node]; slot < off[node + 1]; slot++) {
            if ((slot > off[node] && PUT_LITERAL(&out, ",") < 0) || put_int(&out, parent[slot]) < 0) goto done;
        }
        if (PUT_LITERAL(&out, "]") < 0) goto done;
        /* without values, no value and no grad (grads alone are not listed, as in the reference) */
        if (c.has_values) {
            if (PUT_LITERAL(&out, ",\"value\":") < 0 || put_float(&out, value[node], 1) < 0 ||
                PUT_LITERAL(&out, ",\"grad\":") < 0)
                goto done;
            if (c.has_grads ? put_float(&out, grad[node], 1) < 0 : PUT_LITERAL(&out, "null") < 0) goto done;
        }
        if (PUT_LITERAL(&out, "}") < 0) goto done;
    }
    result = finish(&out);
done:
    PyMem_Free(out.data);
    release(&c);
    return result;
}

/* -- the JSON form of a graph (graphsvc/format/jsonio.py) ---------------------------------------- */

/* A str of Python's as JSON text (json.dumps(text, ensure_ascii=False)), or "null" for None. */
static int put_json_object_string(Buffer *out, PyObject *text, PyObject *keep, const char *what) {
    Cell cell;
    if (cell_of(text, &cell, keep, 1, what) < 0) return -1;
    if (cell.is_none) return PUT_LITERAL(out, "null");
    return put_json_string(out, cell.text, cell.len);
}

/* A part _parts rendered (a str) or None: appended, 1; None, 0; -1 with an exception set. */
static int put_part(Buffer *out, PyObject *parts, Py_ssize_t index, const char *key, Py_ssize_t key_len,
                    PyObject *keep) {
    PyObject *part = PyTuple_GET_ITEM(parts, index);
    if (part == Py_None) return 0;
    Cell cell;
    if (cell_of(part, &cell, keep, 0, "a part") < 0) return -1;
    if (put(out, key, key_len) < 0 || put(out, cell.text, cell.len) < 0) return -1;
    return 1;
}

/* graph_json_chunk(first, last, op_codes, offsets, parents, values, grads, names, tags, specials, parts,
 * leading_comma) -> str: the twin of graphsvc.format.jsonio.reference_nodes_text. */
static PyObject *graph_json_chunk(PyObject *self, PyObject *args) {
    (void)self;
    Py_ssize_t first, last;
    PyObject *op_codes, *offsets, *parents, *values, *grads, *names, *tags, *specials, *parts_of;
    int leading_comma;
    if (!PyArg_ParseTuple(args, "nnOOOOOOOOOp:graph_json_chunk", &first, &last, &op_codes, &offsets, &parents, &values,
                          &grads, &names, &tags, &specials, &parts_of, &leading_comma))
        return NULL;
    if (names != Py_None && !PyDict_Check(names)) {
        PyErr_SetString(PyExc_TypeError, "names: a dict or None");
        return NULL;
    }
    Chunk c; /* its buffers, tags and keep; ids stands for ``specials`` */
    memset(&c, 0, sizeof c);
    Buffer out = {NULL, 0, 0};
    PyObject *result = NULL;
    if ((c.keep = PyList_New(0)) == NULL) goto done;
    if (column(specials, &c.ids, 8, "qlL", "specials") < 0 || column(op_codes, &c.op_codes, 2, "H", "op_codes") < 0 ||
        column(offsets, &c.offsets, 8, "qlL", "offsets") < 0 || column(parents, &c.parents, 4, "ilI", "parents") < 0 ||
        column(values, &c.values, 8, "d", "values") < 0)
        goto done;
    c.has_grads = grads != Py_None;
    if (c.has_grads && column(grads, &c.grads, 8, "d", "grads") < 0) goto done;
    if ((c.tags = cells_of(tags, -1, c.keep, 0, "tags", &c.tag_count)) == NULL) goto done;
    c.nodes = c.op_codes.len / 2;
    c.slots = c.parents.len / 4;
    Py_ssize_t special_count = c.ids.len / 8;
    if (first < 0 || last < first || last > c.nodes || c.offsets.len / 8 != c.nodes + 1 || c.values.len / 8 < c.nodes ||
        (c.has_grads && c.grads.len / 8 < c.nodes)) {
        PyErr_SetString(PyExc_ValueError, "graph_json_chunk: the nodes are not all in the columns");
        goto done;
    }
    const int64_t *off = c.offsets.buf, *special = c.ids.buf;
    const int32_t *parent = c.parents.buf;
    const uint16_t *code = c.op_codes.buf;
    const double *value = c.values.buf, *grad = c.grads.buf;
    Py_ssize_t next = 0; /* the next of ``specials`` */
    if (reserve(&out, (last - first) * (c.has_grads ? 128 : 96)) < 0) goto done;
    for (Py_ssize_t node = first; node < last; node++) {
        if (code[node] >= c.tag_count) {
            PyErr_Format(PyExc_IndexError, "node %zd: op code %d has no tag", node, (int)code[node]);
            goto done;
        }
        if (off[node] < 0 || off[node] > off[node + 1] || off[node + 1] > c.slots) {
            PyErr_Format(PyExc_IndexError, "node %zd: parent slots out of range", node);
            goto done;
        }
        if ((node > first || leading_comma) && PUT_LITERAL(&out, ",\n") < 0) goto done;
        if (PUT_LITERAL(&out, "  {\n   \"id\": ") < 0 || put_int(&out, node) < 0 ||
            PUT_LITERAL(&out, ",\n   \"name\": ") < 0)
            goto done;
        PyObject *name = NULL;
        if (names != Py_None && PyDict_GET_SIZE(names)) {
            PyObject *key = PyLong_FromSsize_t(node);
            if (key == NULL) goto done;
            name = PyDict_GetItemWithError(names, key);
            Py_DECREF(key);
            if (name == NULL && PyErr_Occurred()) goto done;
        }
        if (put_json_object_string(&out, name ? name : Py_None, c.keep, "a name") < 0) goto done;
        const Cell *tag = &c.tags[code[node]];
        if (PUT_LITERAL(&out, ",\n   \"op\": ") < 0 || put_json_string(&out, tag->text, tag->len) < 0 ||
            PUT_LITERAL(&out, ",\n   \"parents\": [") < 0)
            goto done;
        int64_t count = off[node + 1] - off[node];
        if (reserve(&out, count * 13 + 1) < 0) goto done;
        char *p = out.data + out.len;
        for (int64_t slot = off[node]; slot < off[node + 1]; slot++) {
            if (slot > off[node]) {
                *p++ = ',';
                *p++ = ' ';
            }
            p = write_int(p, parent[slot]);
        }
        *p++ = ']';
        out.len = p - out.data;
        while (next < special_count && special[next] < node) next++;
        PyObject *parts = NULL;
        if (next < special_count && special[next] == node) {
            parts = PyObject_CallFunction(parts_of, "n", node);
            if (parts == NULL) goto done;
            if (!PyTuple_Check(parts) || PyTuple_GET_SIZE(parts) != 3) {
                Py_DECREF(parts);
                PyErr_SetString(PyExc_TypeError, "parts: a tuple of 3");
                goto done;
            }
            if (PyList_Append(c.keep, parts) < 0) {
                Py_DECREF(parts);
                goto done;
            }
            Py_DECREF(parts); /* ``keep`` holds it until the text is made */
        }
        int got;
        static const char value_key[] = ",\n   \"value\": ", grad_key[] = ",\n   \"grad\": ",
                          attrs_key[] = ",\n   \"attrs\": ";
        got = parts ? put_part(&out, parts, 0, value_key, sizeof value_key - 1, c.keep) : 0;
        if (got < 0 || (!got && (put(&out, value_key, sizeof value_key - 1) < 0 || put_float(&out, value[node], 1) < 0)))
            goto done;
        got = parts ? put_part(&out, parts, 1, grad_key, sizeof grad_key - 1, c.keep) : 0;
        if (got < 0 || (!got && c.has_grads &&
                        (put(&out, grad_key, sizeof grad_key - 1) < 0 || put_float(&out, grad[node], 1) < 0)))
            goto done;
        if ((parts && put_part(&out, parts, 2, attrs_key, sizeof attrs_key - 1, c.keep) < 0) ||
            PUT_LITERAL(&out, "\n  }") < 0)
            goto done;
    }
    result = finish(&out);
done:
    PyMem_Free(out.data);
    release(&c);
    return result;
}

/* json_float_rows(values, width) -> list of str: the float64 ``values`` in rows of ``width``, each
 * as json.dumps writes a list of them once graphsvc.format.jsonio.json_float made them JSON
 * ("[1.5, \"nan\", -0.0]"): the innermost rows of an array's data in the JSON form. */
static PyObject *json_float_rows(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *values;
    Py_ssize_t width;
    if (!PyArg_ParseTuple(args, "On:json_float_rows", &values, &width)) return NULL;
    Py_buffer view;
    if (column(values, &view, 8, "d", "values") < 0) return NULL;
    Py_ssize_t n = view.len / 8;
    PyObject *rows = NULL;
    Buffer out = {NULL, 0, 0};
    if (width <= 0 || n % width) {
        PyErr_SetString(PyExc_ValueError, "json_float_rows: the values are not rows of that width");
        goto done;
    }
    if ((rows = PyList_New(n / width)) == NULL) goto done;
    const double *x = view.buf;
    for (Py_ssize_t r = 0; r < n / width; r++) {
        out.len = 0;
        if (reserve(&out, width * (FLOAT_MAX_CHARS + 2) + 2) < 0) goto fail;
        out.data[out.len++] = '[';
        for (Py_ssize_t i = 0; i < width; i++) {
            if (i) {
                out.data[out.len++] = ',';
                out.data[out.len++] = ' ';
            }
            char *end = write_float(out.data + out.len, x[r * width + i], 1);
            if (end == NULL) goto fail;
            out.len = end - out.data;
        }
        out.data[out.len++] = ']';
        PyObject *row = PyUnicode_DecodeASCII(out.data, out.len, "strict");
        if (row == NULL) goto fail;
        PyList_SET_ITEM(rows, r, row);
    }
    goto done;
fail:
    Py_CLEAR(rows);
done:
    PyMem_Free(out.data);
    PyBuffer_Release(&view);
    return rows;
}

static PyMethodDef methods[] = {
    {"text_chunk", text_chunk, METH_VARARGS,
     "text_chunk(ids, op_codes, offsets, parents, names, tags, values, grads) -> str\n\n"
     "The tab-separated lines of the nodes ``ids`` (int64), each ending with a newline: id, name, op tag,\n"
     "parents joined by commas (- for none), then repr(value) and repr(grad) where those columns are\n"
     "given (float64 arrays over all nodes, or None). ``names`` holds each node's name cell, already\n"
     "escaped (None: every name is -); ``tags`` each op code's tag cell, already escaped."},
    {"json_chunk", json_chunk, METH_VARARGS,
     "json_chunk(ids, op_codes, offsets, parents, names, tags, values, grads, leading_comma) -> str\n\n"
     "The nodes ``ids`` as JSON objects joined by commas (with one more comma first if "
     "``leading_comma``),\n"
     "as json.dumps(..., separators=(',', ':'), ensure_ascii=False) writes them, nan and the infinities\n"
     "as strings. ``names`` holds each node's name (str or None; None for all: every name is null),\n"
     "``tags`` each op code's tag, neither escaped: this function writes them as JSON strings, as\n"
     "json.dumps does (graphsvc.console.listing then writes each unprintable character left in them as\n"
     "its JSON escape, graphsvc.text.json_escaped, as it does the reference's)."},
    {"graph_json_chunk", graph_json_chunk, METH_VARARGS,
     "graph_json_chunk(first, last, op_codes, offsets, parents, values, grads, names, tags, specials, parts,\n"
     "                 leading_comma) -> str\n\n"
     "The nodes first to last - 1 of a graph in its JSON form, as graphsvc.format.jsonio writes them\n"
     "(json.dumps(..., indent=1, ensure_ascii=False), arrays of numbers on one line), joined by ',\\n'\n"
     "(one more first if ``leading_comma``). ``names``: a dict node -> str, or None; ``tags``: each op\n"
     "code's tag; ``specials`` (int64, sorted): the nodes for which ``parts(node)`` gives the JSON text\n"
     "of their value, gradient and attributes (each a str, or None: the column's float, no attributes).\n"
     "Unprintable characters are left for graphsvc.text.json_escaped, as json_chunk leaves them."},
    {"json_float_rows", json_float_rows, METH_VARARGS,
     "json_float_rows(values, width) -> list of str\n\n"
     "The float64 ``values`` (C-contiguous) in rows of ``width``, each as json.dumps writes a list of\n"
     "them made JSON (nan and the infinities as strings): '[1.5, \"nan\", -0.0]'."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "graphsvc.native._ctext",
    .m_doc = "node listings as text",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__ctext(void) {
    pow10[0] = 1;
    for (int k = 1; k < 21; k++) pow10[k] = pow10[k - 1] * 10;
    return PyModule_Create(&module);
}
