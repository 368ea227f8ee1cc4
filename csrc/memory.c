/* Reused memory for the arrays a tensor replay makes: numpy's memory handler (NEP 49) with a cache
 * of freed blocks, graphsvc/memory.py's `reuse` (its pure-Python twin is numpy's own allocator: the
 * same arrays, the same results, only where their memory comes from differs).
 *
 * A replay keeps every value and gradient, so each pass asks for its memory anew, and glibc serves
 * large blocks from fresh pages (mmap, or a heap top it trimmed when the last pass's arrays were
 * freed): every page is then a page fault and a page of zeros before numpy writes into it. Here a
 * freed block of MIN_CACHED bytes or more waits in a list of blocks of its size (rounded up to a
 * page) for the next array of that size, up to `limit` bytes in all; a pass that repeats the last
 * one's shapes gets the pages it already touched. Smaller blocks go to malloc and free as numpy's
 * default handler sends them.
 *
 * numpy is not needed to build this: the handler's layout is numpy's public, versioned struct
 * (PyDataMem_Handler, version 1), and PyDataMem_SetHandler is taken from numpy's C-API table, as
 * numpy's own import_array does (slot 304, numpy >= 1.22).
 */
#include "native.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    void *ctx;
    void *(*malloc)(void *ctx, size_t size);
    void *(*calloc)(void *ctx, size_t nelem, size_t elsize);
    void *(*realloc)(void *ctx, void *ptr, size_t new_size);
    void (*free)(void *ctx, void *ptr, size_t size);
} Allocator; /* numpy's PyDataMemAllocator */

typedef struct {
    char name[127];
    uint8_t version;
    Allocator allocator;
} Handler; /* numpy's PyDataMem_Handler */

#define SET_HANDLER_SLOT 304     /* PyDataMem_SetHandler in numpy's C-API table */
#define FEATURE_VERSION_SLOT 211 /* PyArray_GetNDArrayCFeatureVersion */
#define NUMPY_1_22 0x0000000f    /* NPY_1_22_API_VERSION: the first with memory handlers */

#define PAGE 4096
#define MIN_CACHED (64 * 1024)
#define CLASSES 1024 /* distinct block sizes kept (open addressing); a full table caches no new size */

/* Before each block's data: where the allocation starts is the header itself. 64 bytes keep the
 * data as aligned as malloc's (16) and leave room. */
typedef struct Block {
    size_t bytes;       /* the data's size: the class size for a cached-size block */
    int cached;         /* 1: a class-sized block, which goes back to the cache */
    struct Block *next; /* in its class's free list */
} Block;
#define HEADER 64

typedef struct {
    size_t bytes; /* 0: an empty slot */
    Block *free;
} Class;

static Class classes[CLASSES];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static size_t cached_bytes = 0;                /* in free lists */
static size_t limit = 0; /* at most this much waits in free lists: graphsvc/memory.py sets it (LIMIT) */
static unsigned long long hits = 0, misses = 0;

static void *data_of(Block *block) { return (char *)block + HEADER; }
static Block *block_of(void *data) { return (Block *)((char *)data - HEADER); }

/* The class of ``bytes`` (a multiple of PAGE), or NULL when the table has no room for a new one. */
static Class *class_of(size_t bytes) {
    size_t slot = (bytes / PAGE) % CLASSES;
    for (size_t probe = 0; probe < CLASSES; probe++) {
        Class *c = &classes[(slot + probe) % CLASSES];
        if (c->bytes == bytes) return c;
        if (c->bytes == 0) {
            c->bytes = bytes;
            return c;
        }
    }
    return NULL;
}

/* A block of at least ``size`` bytes of data, zeroed if ``zero``; NULL when memory is out. */
static void *take(size_t size, int zero) {
    if (size >= MIN_CACHED && size <= SIZE_MAX - HEADER - PAGE) {
        size_t bytes = (size + PAGE - 1) / PAGE * PAGE;
        Block *block = NULL;
        pthread_mutex_lock(&lock);
        Class *c = class_of(bytes);
        if (c != NULL && c->free != NULL) {
            block = c->free;
            c->free = block->next;
            cached_bytes -= bytes;
            hits++;
        } else {
            misses++;
        }
        pthread_mutex_unlock(&lock);
        if (block != NULL) {
            if (zero) memset(data_of(block), 0, size);
            return data_of(block);
        }
        block = zero ? calloc(1, HEADER + bytes) : malloc(HEADER + bytes);
        if (block == NULL) return NULL;
        block->bytes = bytes;
        block->cached = 1;
        return data_of(block);
    }
    if (size > SIZE_MAX - HEADER) return NULL;
    Block *block = zero ? calloc(1, HEADER + size) : malloc(HEADER + size);
    if (block == NULL) return NULL;
    block->bytes = size;
    block->cached = 0;
    return data_of(block);
}

static void give_back(void *data) {
    if (data == NULL) return;
    Block *block = block_of(data);
    if (block->cached) {
        pthread_mutex_lock(&lock);
        Class *c = cached_bytes + block->bytes <= limit ? class_of(block->bytes) : NULL;
        if (c != NULL) {
            block->next = c->free;
            c->free = block;
            cached_bytes += block->bytes;
        }
        pthread_mutex_unlock(&lock);
        if (c != NULL) return;
    }
    free(block);
}

static void *handler_malloc(void *ctx, size_t size) {
    (void)ctx;
    return take(size, 0);
}

static void *handler_calloc(void *ctx, size_t nelem, size_t elsize) {
    (void)ctx;
    if (elsize != 0 && nelem > SIZE_MAX / elsize) return NULL;
    return take(nelem * elsize, 1);
}

static void *handler_realloc(void *ctx, void *ptr, size_t new_size) {
    (void)ctx;
    if (ptr == NULL) return take(new_size, 0);
    void *moved = take(new_size, 0);
    if (moved == NULL) return NULL; /* realloc's contract: the old block stays valid */
    size_t old = block_of(ptr)->bytes;
    memcpy(moved, ptr, old < new_size ? old : new_size);
    give_back(ptr);
    return moved;
}

static void handler_free(void *ctx, void *ptr, size_t size) {
    (void)ctx;
    (void)size;
    give_back(ptr);
}

static Handler handler = {
    .name = "graphsvc_reuse",
    .version = 1,
    .allocator = {NULL, handler_malloc, handler_calloc, handler_realloc, handler_free},
};

static PyObject *(*set_handler)(PyObject *) = NULL;
static PyObject *capsule = NULL;

/* Free every cached block (with the lock held). */
static void release_all(void) {
    for (size_t i = 0; i < CLASSES; i++) {
        Block *block = classes[i].free;
        while (block != NULL) {
            Block *next = block->next;
            free(block);
            block = next;
        }
        classes[i].free = NULL;
        classes[i].bytes = 0;
    }
    cached_bytes = 0;
}

static PyObject *install(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return set_handler(capsule); /* the previous handler, for restore() */
}

static PyObject *restore(PyObject *self, PyObject *previous) {
    (void)self;
    PyObject *ours = set_handler(previous);
    if (ours == NULL) return NULL;
    Py_DECREF(ours);
    Py_RETURN_NONE;
}

static PyObject *release(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    pthread_mutex_lock(&lock);
    release_all();
    pthread_mutex_unlock(&lock);
    Py_RETURN_NONE;
}

static PyObject *set_limit(PyObject *self, PyObject *arg) {
    (void)self;
    unsigned long long bytes = PyLong_AsUnsignedLongLong(arg);
    if (bytes == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    pthread_mutex_lock(&lock);
    limit = (size_t)bytes;
    if (cached_bytes > limit) release_all();
    pthread_mutex_unlock(&lock);
    Py_RETURN_NONE;
}

static PyObject *stats(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    pthread_mutex_lock(&lock);
    size_t cached = cached_bytes, most = limit;
    unsigned long long h = hits, m = misses;
    pthread_mutex_unlock(&lock);
    return Py_BuildValue("{s:n,s:n,s:K,s:K}", "cached_bytes", (Py_ssize_t)cached, "limit", (Py_ssize_t)most, "hits",
                         h, "misses", m);
}

static PyMethodDef methods[] = {
    {"install", install, METH_NOARGS,
     "install() -> previous\n\nMake this module's handler numpy's for the current context; returns the one it replaces."},
    {"restore", restore, METH_O, "restore(previous)\n\nGive numpy back the handler install() returned."},
    {"release", release, METH_NOARGS, "release()\n\nFree every cached block."},
    {"set_limit", set_limit, METH_O,
     "set_limit(bytes)\n\nAt most ``bytes`` of freed blocks wait for reuse (the cache is emptied if it holds more)."},
    {"stats", stats, METH_NOARGS, "stats() -> {cached_bytes, limit, hits, misses}"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "graphsvc._cmemory",
    .m_doc = "numpy's memory handler with a cache of freed blocks (graphsvc.memory)",
    .m_size = -1,
    .m_methods = methods,
};

/* numpy's C-API table, as import_array finds it; NULL with an exception set. */
static void **numpy_api(void) {
    PyObject *numpy = PyImport_ImportModule("numpy._core._multiarray_umath");
    if (numpy == NULL && PyErr_ExceptionMatches(PyExc_ModuleNotFoundError)) {
        PyErr_Clear();
        numpy = PyImport_ImportModule("numpy.core._multiarray_umath");
    }
    if (numpy == NULL) return NULL;
    PyObject *table = PyObject_GetAttrString(numpy, "_ARRAY_API");
    Py_DECREF(numpy);
    if (table == NULL) return NULL;
    void **api = PyCapsule_CheckExact(table) ? (void **)PyCapsule_GetPointer(table, NULL) : NULL;
    Py_DECREF(table);
    if (api == NULL && !PyErr_Occurred()) PyErr_SetString(PyExc_ImportError, "numpy's _ARRAY_API is not a capsule");
    return api;
}

PyMODINIT_FUNC PyInit__cmemory(void) {
    void **api = numpy_api();
    if (api == NULL) return NULL;
    unsigned int feature = ((unsigned int (*)(void))api[FEATURE_VERSION_SLOT])();
    if (feature < NUMPY_1_22) {
        PyErr_Format(PyExc_ImportError, "numpy's C API is version %#x; memory handlers need %#x (numpy 1.22)", feature,
                     NUMPY_1_22);
        return NULL;
    }
    set_handler = (PyObject * (*)(PyObject *)) api[SET_HANDLER_SLOT];
    capsule = PyCapsule_New(&handler, "mem_handler", NULL);
    if (capsule == NULL) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "handler", capsule) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
