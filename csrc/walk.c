/* walks over Python objects (micrograd's Values, graphsvc.Value). */
#include "native.h"

static PyMethodDef methods[] = {
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "graphsvc._cwalk", "walks over Python objects (micrograd's Values, graphsvc.Value)", -1, methods};

PyMODINIT_FUNC PyInit__cwalk(void) { return PyModule_Create(&module); }
