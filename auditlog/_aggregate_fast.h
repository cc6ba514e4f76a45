/* auditlog/_aggregate_fast.c's part of the auditlog._record_fast module (see that file). */
#ifndef NPAUDIT_AGGREGATE_FAST_H
#define NPAUDIT_AGGREGATE_FAST_H
#include <Python.h>

/* Adds Aggregator to `module`: 0, or -1 with an exception set. */
int aggregator_add(PyObject *module);

/* Whether add(key, sample, size, now, aggregate) on the C Aggregator `agg` would emit exactly one emission, the
 * key's "first" (or "immediate") with `now` as its times, and no other (no window with packets closing, none
 * evicted, the clock not stepped back): 1, 0 if not (or if `agg` is no C Aggregator), -1 with an exception. */
int aggregator_first_only(PyObject *agg, PyObject *key, double now, int aggregate);

#endif
