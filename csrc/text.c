/* Text: node listings made from the columns. */
#include "native.h"

static PyMethodDef methods[] = {
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "graphsvc._ctext", "node listings as text", -1, methods};

PyMODINIT_FUNC PyInit__ctext(void) { return PyModule_Create(&module); }
