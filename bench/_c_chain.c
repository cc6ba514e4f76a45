/* bench/agent_path.py --stages: the lone path's C calls from one C function, no Python bytecode between them.
 *
 * chain(decode, message, wall, add_run, decode_frame, layout, rule_packet_ins, encode_run, seal_run, seq, chain,
 *       chain_key, fd) -> ((ns of decode, add_run, encode_run, seal_run, write, all), seal_run's result)
 *
 * decode(message, wall()) -> pin; add_run([pin], 0, 1, decode_frame, layout, rule_packet_ins, out);
 * encode_run(out, 0, records); seal_run(records, 0, seq, chain, chain_key, lines); the first line and a newline
 * appended to fd with one writev(2). What a lone packet-in's path would still cost in these pieces, as they are,
 * with nothing else run between them: the bench's own build (gcc at run time), never part of the agent. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <sys/uio.h>
#include <time.h>

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static PyObject *chain(PyObject *module, PyObject *const *a, Py_ssize_t n) {
    (void)module;
    if (n != 13) {
        PyErr_SetString(PyExc_TypeError, "chain takes 13 arguments");
        return NULL;
    }
    long fd = PyLong_AsLong(a[12]);
    if (fd == -1 && PyErr_Occurred()) return NULL;
    PyObject *zero = PyLong_FromLong(0), *one = PyLong_FromLong(1), *pins = NULL, *out = PyList_New(0),
             *records = PyList_New(0), *lines = PyList_New(0), *wall = NULL, *pin = NULL, *r = NULL,
             *sealed = NULL, *result = NULL;
    long long t[6];
    if (!zero || !one || !out || !records || !lines) goto done;
    t[0] = now_ns();
    if (!(wall = PyObject_CallNoArgs(a[2]))) goto done;
    PyObject *decode_args[2] = {a[1], wall};
    if (!(pin = PyObject_Vectorcall(a[0], decode_args, 2, NULL))) goto done;
    t[1] = now_ns();
    if (!(pins = PyList_New(1))) goto done;
    PyList_SET_ITEM(pins, 0, Py_NewRef(pin));
    PyObject *add_args[7] = {pins, zero, one, a[4], a[5], a[6], out};
    if (!(r = PyObject_Vectorcall(a[3], add_args, 7, NULL))) goto done;
    Py_CLEAR(r);
    t[2] = now_ns();
    PyObject *encode_args[3] = {out, zero, records};
    if (!(r = PyObject_Vectorcall(a[7], encode_args, 3, NULL))) goto done;
    Py_CLEAR(r);
    t[3] = now_ns();
    PyObject *seal_args[6] = {records, zero, a[9], a[10], a[11], lines};
    if (!(sealed = PyObject_Vectorcall(a[8], seal_args, 6, NULL))) goto done;
    t[4] = now_ns();
    if (PyList_GET_SIZE(lines) != 1) {
        PyErr_SetString(PyExc_ValueError, "chain: the packet-in made no record (a repeated key?)");
        goto done;
    }
    Py_ssize_t len;
    const char *text = PyUnicode_AsUTF8AndSize(PyList_GET_ITEM(lines, 0), &len);
    if (!text) goto done;
    struct iovec iov[2] = {{(void *)text, (size_t)len}, {"\n", 1}};
    if (writev((int)fd, iov, 2) != len + 1) {
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    t[5] = now_ns();
    result = Py_BuildValue("(LLLLLL)O", t[1] - t[0], t[2] - t[1], t[3] - t[2], t[4] - t[3], t[5] - t[4],
                           t[5] - t[0], sealed);
done:
    Py_XDECREF(zero); Py_XDECREF(one); Py_XDECREF(pins); Py_XDECREF(out); Py_XDECREF(records);
    Py_XDECREF(lines); Py_XDECREF(wall); Py_XDECREF(pin); Py_XDECREF(r); Py_XDECREF(sealed);
    return result;
}

static PyMethodDef methods[] = {{"chain", (PyCFunction)(void (*)(void))chain, METH_FASTCALL, NULL},
                                {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_c_chain", NULL, -1, methods};
PyMODINIT_FUNC PyInit__c_chain(void) { return PyModule_Create(&module); }
