/* Reused memory for the arrays a tensor replay makes: numpy's memory handler (NEP 49) with a cache
 * of freed blocks, installed by graphsvc/replay/memory.py's `reuse` (without this module numpy's own
 * handler serves: the same arrays, the same results, only where their memory comes from differs).
 *
 * A replay keeps every value and gradient, so each pass asks for its memory anew, and glibc serves
 * large blocks from fresh pages (mmap, or a heap top it trimmed when the last pass's arrays were
 * freed): every page is then a page fault and a page of zeros before numpy writes into it. Here a
 * freed block of MIN_CACHED bytes or more waits in a list of blocks of its size (rounded up to a
 * page) for the next array of that size, up to `limit` bytes in all: when a freed block would pass
 * the limit, the blocks that have waited longest are freed first. A pass that repeats the last
 * one's shapes gets the pages it already touched. Blocks smaller than MIN_CACHED come from malloc
 * and go back to free (numpy's default handler also keeps a cache of tiny blocks, which this one
 * does not); a new block of 4 MiB or more is offered transparent huge pages, as numpy's is.
 *
 * numpy is not needed to build this: the handler's layout is numpy's public, versioned struct
 * (PyDataMem_Handler, version 1), and PyDataMem_SetHandler is taken from numpy's C-API table, as
 * numpy's own import_array does (slot 304, numpy >= 1.22).
 */
#include "native.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

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
#define GET_HANDLER_SLOT 305     /* PyDataMem_GetHandler */
#define DEFAULT_HANDLER_SLOT 306 /* PyDataMem_DefaultHandler: numpy's own handler (a capsule) */
#define FEATURE_VERSION_SLOT 211 /* PyArray_GetNDArrayCFeatureVersion */
#define NUMPY_1_22 0x0000000f    /* NPY_1_22_API_VERSION: the first with memory handlers */

#define PAGE 4096
#define MIN_CACHED (64 * 1024)
#define HUGE_PAGES (4 * 1024 * 1024) /* numpy's threshold for madvise(MADV_HUGEPAGE) */
#define CLASSES 1024                 /* distinct block sizes (open addressing) */

struct Class;

/* Before each block's data. While a block waits in the cache it is in two lists: its size's, and
 * the list of every waiting block, oldest first (`older`/`newer`). */
typedef struct Block {
    size_t bytes;                  /* the data's size: the class size for a cached-size block */
    int cached;                    /* 1: a class-sized block, which goes back to the cache */
    struct Class *size;            /* while waiting: its size's list */
    struct Block *prev, *next;     /* in that list */
    struct Block *older, *newer;   /* in the list of all waiting blocks */
} Block;
#define HEADER 64 /* keeps the data as aligned as malloc's (16) */

typedef struct Class {
    size_t bytes; /* 0: an empty slot */
    Block *free;
} Class;

static Class classes[CLASSES];
static size_t used_classes = 0;
static Block *oldest = NULL, *newest = NULL;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static size_t cached_bytes = 0; /* waiting in the cache */
static size_t limit = 0;        /* at most this much waits: graphsvc/replay/memory.py sets it (LIMIT) */
static unsigned long long hits = 0, misses = 0;

static void *data_of(Block *block) { return (char *)block + HEADER; }
static Block *block_of(void *data) { return (Block *)((char *)data - HEADER); }

/* Take ``block`` out of the cache (with the lock held). */
static void unlink_block(Block *block) {
    Class *c = block->size;
    if (block->prev != NULL) block->prev->next = block->next;
    else c->free = block->next;
    if (block->next != NULL) block->next->prev = block->prev;
    if (block->older != NULL) block->older->newer = block->newer;
    else oldest = block->newer;
    if (block->newer != NULL) block->newer->older = block->older;
    else newest = block->older;
    cached_bytes -= block->bytes;
}

/* Empty the size table of sizes with no waiting block (with the lock held): each waiting block's
 * size is entered again. */
static Class *find_class(size_t bytes, int add);
static void compact(void) {
    Block *all = oldest;
    memset(classes, 0, sizeof classes);
    used_classes = 0;
    for (Block *block = all; block != NULL; block = block->newer) {
        Class *c = find_class(block->bytes, 1); /* fewer sizes than slots: always found */
        block->size = c;
        block->prev = NULL;
        block->next = c->free;
        if (c->free != NULL) c->free->prev = block;
        c->free = block;
    }
}

/* The size ``bytes`` (a multiple of PAGE) in the table; with ``add``, entered when missing (the
 * table compacted when full). NULL when it is not there (or, full of waiting sizes, cannot be). */
static Class *find_class(size_t bytes, int add) {
    size_t slot = (bytes / PAGE) % CLASSES;
    for (size_t probe = 0; probe < CLASSES; probe++) {
        Class *c = &classes[(slot + probe) % CLASSES];
        if (c->bytes == bytes) return c;
        if (c->bytes == 0) {
            if (!add) return NULL;
            c->bytes = bytes;
            used_classes++;
            return c;
        }
    }
    if (!add || used_classes == 0) return NULL;
    compact();
    return used_classes < CLASSES ? find_class(bytes, 1) : NULL;
}

/* Free waiting blocks, oldest first, until ``room`` more bytes fit under the limit (lock held);
 * they are returned in ``freed`` (a list through ``newer``) to be freed without the lock. */
static Block *make_room(size_t room) {
    Block *freed = NULL;
    while (oldest != NULL && cached_bytes + room > limit) {
        Block *block = oldest;
        unlink_block(block);
        block->newer = freed;
        freed = block;
    }
    return freed;
}

static void free_all(Block *freed) {
    while (freed != NULL) {
        Block *next = freed->newer;
        free(freed);
        freed = next;
    }
}

/* A new block of ``bytes`` bytes of data (zeroed if ``zero``), NULL when memory is out. */
static Block *new_block(size_t bytes, int cached, int zero) {
    Block *block = zero ? calloc(1, HEADER + bytes) : malloc(HEADER + bytes);
    if (block == NULL) return NULL;
    block->bytes = bytes;
    block->cached = cached;
#ifdef MADV_HUGEPAGE
    if (bytes >= HUGE_PAGES) { /* as numpy's default handler: the whole pages inside the data */
        uintptr_t start = ((uintptr_t)data_of(block) + PAGE - 1) / PAGE * PAGE;
        uintptr_t end = ((uintptr_t)data_of(block) + bytes) / PAGE * PAGE;
        if (end > start) madvise((void *)start, end - start, MADV_HUGEPAGE); /* advice only */
    }
#endif
    return block;
}

/* At least ``size`` bytes of data, zeroed if ``zero``; NULL when memory is out. */
static void *take(size_t size, int zero) {
    if (size < MIN_CACHED || size > SIZE_MAX - HEADER - PAGE) {
        if (size > SIZE_MAX - HEADER) return NULL;
        Block *block = new_block(size, 0, zero);
        return block == NULL ? NULL : data_of(block);
    }
    size_t bytes = (size + PAGE - 1) / PAGE * PAGE;
    pthread_mutex_lock(&lock);
    Class *c = find_class(bytes, 0);
    Block *block = c == NULL ? NULL : c->free;
    if (block != NULL) {
        unlink_block(block);
        hits++;
    } else {
        misses++;
    }
    pthread_mutex_unlock(&lock);
    if (block != NULL) {
        if (zero) memset(data_of(block), 0, size);
        return data_of(block);
    }
    block = new_block(bytes, 1, zero);
    return block == NULL ? NULL : data_of(block);
}

static void give_back(void *data) {
    if (data == NULL) return;
    Block *block = block_of(data);
    Block *freed = NULL;
    int kept = 0;
    if (block->cached) {
        pthread_mutex_lock(&lock);
        if (block->bytes <= limit) {
            freed = make_room(block->bytes);
            Class *c = find_class(block->bytes, 1);
            if (c != NULL) {
                block->size = c;
                block->prev = NULL;
                block->next = c->free;
                if (c->free != NULL) c->free->prev = block;
                c->free = block;
                block->older = newest;
                block->newer = NULL;
                if (newest != NULL) newest->newer = block;
                else oldest = block;
                newest = block;
                cached_bytes += block->bytes;
                kept = 1;
            }
        }
        pthread_mutex_unlock(&lock);
    }
    free_all(freed);
    if (!kept) free(block);
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
static PyObject *(*get_handler)(void) = NULL;
static PyObject *default_handler = NULL; /* numpy's, borrowed: it lives as long as numpy */
static PyObject *capsule = NULL;

/* Free every waiting block and empty the size table. */
static void release_all(void) {
    pthread_mutex_lock(&lock);
    size_t keep = limit;
    limit = 0;
    Block *freed = make_room(0);
    limit = keep;
    memset(classes, 0, sizeof classes);
    used_classes = 0;
    pthread_mutex_unlock(&lock);
    free_all(freed);
}

static PyObject *install(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    PyObject *current = get_handler();
    if (current == NULL) return NULL;
    int others = current != default_handler && current != capsule;
    Py_DECREF(current);
    if (others) Py_RETURN_NONE; /* someone else's handler (a memory profiler's): left in place */
    return set_handler(capsule); /* the previous handler, for restore() */
}

static PyObject *restore(PyObject *self, PyObject *previous) {
    (void)self;
    if (previous == Py_None) Py_RETURN_NONE; /* install() left the handler alone */
    PyObject *ours = set_handler(previous);
    if (ours == NULL) return NULL;
    Py_DECREF(ours);
    Py_RETURN_NONE;
}

static PyObject *release(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    release_all();
    Py_RETURN_NONE;
}

static PyObject *set_limit(PyObject *self, PyObject *arg) {
    (void)self;
    unsigned long long bytes = PyLong_AsUnsignedLongLong(arg);
    if (bytes == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    pthread_mutex_lock(&lock);
    limit = (size_t)bytes;
    Block *freed = make_room(0);
    pthread_mutex_unlock(&lock);
    free_all(freed);
    Py_RETURN_NONE;
}

static PyObject *stats(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    pthread_mutex_lock(&lock);
    size_t cached = cached_bytes, most = limit, sizes = used_classes;
    unsigned long long h = hits, m = misses;
    pthread_mutex_unlock(&lock);
    return Py_BuildValue("{s:n,s:n,s:n,s:K,s:K}", "cached_bytes", (Py_ssize_t)cached, "limit", (Py_ssize_t)most,
                         "sizes", (Py_ssize_t)sizes, "hits", h, "misses", m);
}

static PyMethodDef methods[] = {
    {"install", install, METH_NOARGS,
     "install() -> previous\n\nMake this module's handler numpy's for the current context, unless another than\n"
     "numpy's own is in place (then nothing changes and None is returned); returns the one it replaces."},
    {"restore", restore, METH_O, "restore(previous)\n\nGive numpy back the handler install() returned (None: nothing to do)."},
    {"release", release, METH_NOARGS, "release()\n\nFree every waiting block."},
    {"set_limit", set_limit, METH_O,
     "set_limit(bytes)\n\nAt most ``bytes`` of freed blocks wait for reuse (the longest-waiting are freed first)."},
    {"stats", stats, METH_NOARGS, "stats() -> {cached_bytes, limit, sizes, hits, misses}"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "graphsvc.native._cmemory",
    .m_doc = "numpy's memory handler with a cache of freed blocks (graphsvc.replay.memory)",
    .m_size = -1,
    .m_methods = methods,
};

/* numpy's C-API table, as import_array finds it; NULL with an ImportError set. */
static void **numpy_api(void) {
    PyObject *numpy = PyImport_ImportModule("numpy._core._multiarray_umath");
    if (numpy == NULL && PyErr_ExceptionMatches(PyExc_ModuleNotFoundError)) {
        PyErr_Clear();
        numpy = PyImport_ImportModule("numpy.core._multiarray_umath");
    }
    PyObject *table = numpy == NULL ? NULL : PyObject_GetAttrString(numpy, "_ARRAY_API");
    Py_XDECREF(numpy);
    void **api = NULL;
    if (table != NULL && PyCapsule_CheckExact(table)) api = (void **)PyCapsule_GetPointer(table, NULL);
    Py_XDECREF(table);
    if (api == NULL) { /* whatever went wrong, graphsvc.replay.memory falls back to numpy's handler */
        PyErr_Clear();
        PyErr_SetString(PyExc_ImportError, "numpy's C-API table (_ARRAY_API) was not found");
    }
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
    get_handler = (PyObject * (*)(void)) api[GET_HANDLER_SLOT];
    default_handler = *(PyObject **)api[DEFAULT_HANDLER_SLOT];
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
