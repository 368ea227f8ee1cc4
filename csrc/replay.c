/* Replay sweeps: twins of graphsvc/replay.py's references. */
#include "native.h"

static PyMethodDef methods[] = {
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "graphsvc._creplay", "replay sweeps", -1, methods};

PyMODINIT_FUNC PyInit__creplay(void) { return PyModule_Create(&module); }
