/* auditlog/_aggregate_fast.c's part of the auditlog._record_fast module (see that file). */
#ifndef NPAUDIT_AGGREGATE_FAST_H
#define NPAUDIT_AGGREGATE_FAST_H
#include <Python.h>

/* Adds Aggregator to `module`: 0, or -1 with an exception set. */
int aggregator_add(PyObject *module);

#endif
