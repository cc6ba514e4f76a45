/* auditlog/_scan_fast.c's part of the auditlog._record_fast module (see that file). */
#ifndef NPAUDIT_SCAN_FAST_H
#define NPAUDIT_SCAN_FAST_H
#include <Python.h>

/* Adds sealed_parts and sealed_frames to `module`: 0, or -1 with an exception set. */
int sealed_parts_add(PyObject *module);

#endif
