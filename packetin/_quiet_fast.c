/* The event loop's wait after a quiet spell, with a lone packet-in's record written from inside it
 * (packetin/quiet.py QuietSelector).
 *
 * wait(epfd, maxevents, timeout_ms, sock, arm) -> (events, early)
 *
 * epoll_wait on the event loop's own epoll set, the GIL released, as select.epoll.poll waits. When it returns
 * with the OpenFlow socket `sock` readable and the socket holds exactly one whole OpenFlow message (looked at
 * with MSG_PEEK), that message goes to the C encoder's encode_raw (auditlog/_record_fast.c) with the arm's rules,
 * Pod table and aggregator. A record made is sealed and appended to the audit file here, where the arm names the
 * writer and its lock can be taken without waiting, and only then is the message taken off the socket. No Python
 * bytecode runs from the wake-up to the write: after a quiet spell each line of it costs a lone record's latency
 * tens of microseconds (bench/RESULTS.md). After the write the thread sleeps a moment (AFTER_WRITE_NS), so that a
 * reader the write woke runs before the read's bookkeeping.
 *
 * arm: (finish, encode_raw, rules, table, aggregator, userdata_version, log_bit, reject_bit, writer_arm), the
 * state that the layers above say, before the wait, a lone read would find (RecordOut.early_arm); the wait itself
 * runs nothing else on the loop's thread, so it stays true. `finish` is not called here.
 * writer_arm: None, or (io_lock, writer, seq, chain, fd, seal_run, chain_key, queue, handler, stream)
 * (AuditWriter.lone_arm): the lock is taken with acquire(False); under it the queue must be empty, the writer's
 * `_seq` still `seq`, its `_handler` still `handler` and that one's `stream` still `stream` (nothing was written,
 * queued or reopened by another thread since the arm), else it is let go and nothing is written here.
 *
 * events: [(fd, mask), ...] as select.epoll.poll gives them. early: None (nothing done: the loop reads the socket
 * as ever), else (message, wall, mono, record, locked, line, written, errno): the message taken off the socket, the
 * times it was read at (time.time(), time.monotonic()), its record; `locked`: the writer's lock is held and the
 * record was sealed as `line` (the caller's AuditWriter.lone_written finishes the write and lets the lock go);
 * `written`: the bytes of line + "\n" that reached the file, `errno` the write's error (0: none).
 * On EINTR, signals are checked (an exception raises, as epoll.poll would) and the events are []. An exception from
 * encode_raw or the sealer is said (sys.unraisablehook), not raised: early is then None and the loop reads the
 * message as ever.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define PEEK_MAX 16384  /* a lone packet-in is far smaller; a read this big is no lone read */
#define EVENTS_MAX 256
#define ARM_N 9
#define WRITER_ARM_N 10
#define AFTER_WRITE_NS 30000L  /* the pause after a write, below */

static PyObject *S_acquire, *S_release, *S_seq, *S_handler, *S_stream;

static double clock_of(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void release(PyObject *lock) {
    PyObject *r = PyObject_CallMethodNoArgs(lock, S_release);
    if (r == NULL) PyErr_WriteUnraisable(lock);
    Py_XDECREF(r);
}

/* Seal `record` and append it under the writer's lock, as AuditWriter._write_inline would: 1 with the lock held,
 * *line set, *written and *err saying how the write went; 0 with nothing done (the lock busy, or the writer moved on
 * since the arm); -1 with an exception (the lock let go). */
static int lone_write(PyObject *warm, PyObject *record, PyObject **line, Py_ssize_t *written, int *err) {
    PyObject *lock = PyTuple_GET_ITEM(warm, 0), *writer = PyTuple_GET_ITEM(warm, 1);
    PyObject *got = PyObject_CallMethodOneArg(lock, S_acquire, Py_False);
    if (got == NULL) return -1;
    int locked = got == Py_True;
    Py_DECREF(got);
    if (!locked) return 0;
    /* nothing queued, the chain's head and the live file's stream still the armed ones (a stream reopened after a
     * failed write could hold another descriptor, or this one another file) */
    Py_ssize_t queued = PyObject_Length(PyTuple_GET_ITEM(warm, 7));
    PyObject *seq = queued == 0 ? PyObject_GetAttr(writer, S_seq) : NULL;
    PyObject *handler = seq ? PyObject_GetAttr(writer, S_handler) : NULL;
    PyObject *stream = handler ? PyObject_GetAttr(handler, S_stream) : NULL;
    int same = stream ? PyObject_RichCompareBool(seq, PyTuple_GET_ITEM(warm, 2), Py_EQ) : 0;
    if (same > 0) same = handler == PyTuple_GET_ITEM(warm, 8) && stream == PyTuple_GET_ITEM(warm, 9);
    Py_XDECREF(seq);
    Py_XDECREF(handler);
    Py_XDECREF(stream);
    if (queued < 0 || same < 0 || (queued == 0 && stream == NULL)) goto fail;
    if (!same) {
        release(lock);
        return 0;
    }
    PyObject *records = PyList_New(1), *lines = PyList_New(0);
    if (records == NULL || lines == NULL) {
        Py_XDECREF(records);
        Py_XDECREF(lines);
        goto fail;
    }
    Py_INCREF(record);
    PyList_SET_ITEM(records, 0, record);
    PyObject *zero = PyLong_FromLong(0);
    PyObject *args[6] = {records, zero, PyTuple_GET_ITEM(warm, 2), PyTuple_GET_ITEM(warm, 3),
                         PyTuple_GET_ITEM(warm, 6), lines};
    PyObject *sealed = zero ? PyObject_Vectorcall(PyTuple_GET_ITEM(warm, 5), args, 6, NULL) : NULL;
    Py_XDECREF(zero);
    Py_DECREF(records);
    if (sealed == NULL || PyList_GET_SIZE(lines) != 1 || !PyUnicode_IS_ASCII(PyList_GET_ITEM(lines, 0))) {
        Py_XDECREF(sealed);
        Py_DECREF(lines);
        if (PyErr_Occurred()) goto fail;
        release(lock);  /* not sealed here (not ASCII): write_now seals it in Python, as it would */
        return 0;
    }
    Py_DECREF(sealed);
    *line = PyList_GET_ITEM(lines, 0);
    Py_INCREF(*line);
    Py_DECREF(lines);
    long fd = PyLong_AsLong(PyTuple_GET_ITEM(warm, 4));
    if (fd == -1 && PyErr_Occurred()) {
        Py_CLEAR(*line);
        goto fail;
    }
    const char *text = (const char *)PyUnicode_DATA(*line);
    size_t n = (size_t)PyUnicode_GET_LENGTH(*line), done = 0;
    *err = 0;
    while (done < n + 1) {  /* line and newline in one write, as the handler's do_write; a short one goes on */
        struct iovec iov[2];
        int k = 0;
        if (done < n) iov[k++] = (struct iovec){(void *)(text + done), n - done};
        iov[k++] = (struct iovec){"\n", 1};
        ssize_t w = writev((int)fd, iov, k);
        if (w < 0) {
            if (errno == EINTR) continue;
            *err = errno;
            break;
        }
        done += (size_t)w;
    }
    *written = (Py_ssize_t)done;
    /* The record is in the file: a reader it woke (inotify, a tailer, the syslog forwarder) is often queued on this
     * CPU, where the kernel puts a task its waker woke. A floor reader sleeps after its write and so lets it run at
     * once; we have the read's bookkeeping still to do, in Python, on cold caches (~0.3 ms). So the thread sleeps
     * AFTER_WRITE_NS, the GIL let go (the kernel's timer slack adds up to 50 µs): a reader queued here runs first.
     * A sched_yield here left 10-13 % of lone records 0.2-0.4 ms late, the reader not always run before the
     * bookkeeping; the sleep, 0.5-1.5 % (bench/RESULTS.md, 2026-12-06). Only after a quiet spell (a flood never
     * arms the wait), so it costs a packet-in that follows within the sleep that much, and the agent a wake-up. */
    if (done == n + 1) {
        struct timespec pause = {0, AFTER_WRITE_NS};
        Py_BEGIN_ALLOW_THREADS
        nanosleep(&pause, NULL);  /* a signal may end it early: no matter, it is handled as the wait returns */
        Py_END_ALLOW_THREADS
    }
    return 1;
fail:
    release(lock);
    return -1;
}

static PyObject *early_from(int sock, PyObject *arm) {
    unsigned char buf[PEEK_MAX];
    ssize_t n = recv(sock, buf, sizeof buf, MSG_PEEK | MSG_DONTWAIT);
    if (n < 8 || n >= PEEK_MAX || ((buf[2] << 8) | buf[3]) != n) Py_RETURN_NONE;
    double wall = clock_of(CLOCK_REALTIME), mono = clock_of(CLOCK_MONOTONIC);
    PyObject *raw = PyBytes_FromStringAndSize((const char *)buf, n), *wall_o = PyFloat_FromDouble(wall);
    if (raw == NULL || wall_o == NULL) {
        Py_XDECREF(raw);
        Py_XDECREF(wall_o);
        return NULL;
    }
    PyObject *args[9] = {raw, wall_o, Py_None, PyTuple_GET_ITEM(arm, 2), PyTuple_GET_ITEM(arm, 3),
                         PyTuple_GET_ITEM(arm, 4), PyTuple_GET_ITEM(arm, 5), PyTuple_GET_ITEM(arm, 6),
                         PyTuple_GET_ITEM(arm, 7)};
    PyObject *record = PyObject_Vectorcall(PyTuple_GET_ITEM(arm, 1), args, 9, NULL);
    Py_DECREF(wall_o);
    if (record == NULL || record == Py_None) {  /* encode_raw declined: nothing was done, nothing is taken */
        Py_DECREF(raw);
        Py_XDECREF(record);
        if (record == NULL) return NULL;
        Py_RETURN_NONE;
    }
    PyObject *warm = PyTuple_GET_ITEM(arm, 8), *line = NULL;
    Py_ssize_t written = 0;
    int err = 0, locked = 0;
    if (warm != Py_None) {
        locked = lone_write(warm, record, &line, &written, &err);
        if (locked < 0) {
            /* the record's event id is drawn: it goes on unwritten, as when the lock is busy */
            PyErr_WriteUnraisable(warm);
            locked = 0;
        }
    }
    ssize_t took;
    do {
        took = recv(sock, buf, (size_t)n, MSG_DONTWAIT);  /* the message peeked: at the head of the stream */
    } while (took < 0 && errno == EINTR);
    PyObject *early = Py_BuildValue("(NddNNNni)", raw, wall, mono, record, PyBool_FromLong(locked),
                                    line ? line : Py_NewRef(Py_None), written, err);
    if (early == NULL && locked) release(PyTuple_GET_ITEM(warm, 0));
    if (early != NULL && took != n) {
        /* never seen: the socket gave less than it showed. The caller reads the rest as the loop would */
        PyObject *got = PyBytes_FromStringAndSize((const char *)buf, took > 0 ? took : 0);
        if (got == NULL) {
            Py_DECREF(early);
            return NULL;
        }
        PyObject *old = PyTuple_GET_ITEM(early, 0);
        PyTuple_SET_ITEM(early, 0, got);
        Py_DECREF(old);
    }
    return early;
}

static PyObject *quiet_wait(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || (args[4] != Py_None && (!PyTuple_CheckExact(args[4]) || PyTuple_GET_SIZE(args[4]) != ARM_N))) {
        PyErr_SetString(PyExc_TypeError, "wait(epfd, maxevents, timeout_ms, sock, arm: tuple of 9 | None)");
        return NULL;
    }
    int epfd = PyLong_AsLong(args[0]), maxevents = PyLong_AsLong(args[1]), timeout = PyLong_AsLong(args[2]);
    int sock = PyLong_AsLong(args[3]);
    if (PyErr_Occurred()) return NULL;
    PyObject *arm = args[4];
    if (arm != Py_None) {
        PyObject *warm = PyTuple_GET_ITEM(arm, 8);
        if (!PyDict_CheckExact(PyTuple_GET_ITEM(arm, 2)) ||
            (warm != Py_None && (!PyTuple_CheckExact(warm) || PyTuple_GET_SIZE(warm) != WRITER_ARM_N))) {
            PyErr_SetString(PyExc_TypeError, "wait: arm[2] must be a dict, arm[8] None or a tuple of 10");
            return NULL;
        }
    }
    if (maxevents < 1) maxevents = 1;
    if (maxevents > EVENTS_MAX) maxevents = EVENTS_MAX;
    struct epoll_event evs[EVENTS_MAX];
    int n;
    Py_BEGIN_ALLOW_THREADS
    n = epoll_wait(epfd, evs, maxevents, timeout);
    Py_END_ALLOW_THREADS
    if (n < 0) {
        if (errno != EINTR) return PyErr_SetFromErrno(PyExc_OSError);
        if (PyErr_CheckSignals() < 0) return NULL;
        n = 0;
    }
    PyObject *early = NULL;
    for (int i = 0; i < n && arm != Py_None; i++)
        if ((int)evs[i].data.fd == sock && (evs[i].events & EPOLLIN)) {
            early = early_from(sock, arm);
            if (early == NULL) {  /* said, not raised: the loop reads the message as ever (and meets it there) */
                PyErr_WriteUnraisable(arm);
                early = Py_NewRef(Py_None);
            }
            break;
        }
    PyObject *events = PyList_New(n);
    if (events == NULL) {
        Py_XDECREF(early);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        PyObject *pair = Py_BuildValue("(iI)", evs[i].data.fd, (unsigned int)evs[i].events);
        if (pair == NULL) {
            Py_DECREF(events);
            Py_XDECREF(early);
            return NULL;
        }
        PyList_SET_ITEM(events, i, pair);
    }
    return Py_BuildValue("(NN)", events, early ? early : Py_NewRef(Py_None));  /* early: None, or its tuple */
}

static PyMethodDef methods[] = {
    {"wait", (PyCFunction)(void (*)(void))quiet_wait, METH_FASTCALL,
     "wait(epfd, maxevents, timeout_ms, sock, arm) -> (events, early): epoll_wait, and a lone packet-in's record "
     "written from inside it (packetin/quiet.py)"},
    {NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "packetin._quiet_fast", NULL, -1, methods};

PyMODINIT_FUNC PyInit__quiet_fast(void) {
    S_acquire = PyUnicode_InternFromString("acquire");
    S_release = PyUnicode_InternFromString("release");
    S_seq = PyUnicode_InternFromString("_seq");
    S_handler = PyUnicode_InternFromString("_handler");
    S_stream = PyUnicode_InternFromString("stream");
    if (!S_acquire || !S_release || !S_seq || !S_handler || !S_stream) return NULL;
    return PyModule_Create(&module);
}
