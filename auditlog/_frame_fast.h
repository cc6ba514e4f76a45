/* auditlog/_frame_fast.c's part of the auditlog._record_fast module (see that file). */
#ifndef NPAUDIT_FRAME_FAST_H
#define NPAUDIT_FRAME_FAST_H
#include <Python.h>

/* Adds FrameDecoder to `module`: 0, or -1 with an exception set. */
int frame_decoder_add(PyObject *module);

#endif
