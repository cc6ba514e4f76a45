/* auditlog.aggregate.Aggregator in C, part of the auditlog._record_fast module.
 *
 * The same class, method for method and record for record: its windows, exact counts, offloaded folding,
 * eviction, clamping of jitter and closing at a clock step (auditlog/aggregate.py says what each does; this
 * file follows it line by line, so read that first). What C saves is the Python around each packet-in: in a
 * flood of new keys every packet-in opens a window (a _Window object with eleven attributes), closes the one
 * that came due, and builds its "first" Emission, ~1.3 µs warm in Python. Here a window is a small C object
 * and the emission a tuple filled in place. tests/unit/auditlog/test_aggregate.py runs every test on both
 * classes and runs them side by side on random calls: the same emissions, the same counts.
 *
 * add_run, which the Python class does not have, is the pipeline's per-packet-in part for a run of a read's
 * packet-ins (AuditPipeline.take_run): decode, key, count and add, with no Python frame per packet-in.
 * tests/unit/auditlog/test_pipeline_runs.py shows it gives what add and the pipeline's __call__ give.
 *
 * Differences that do not show: times are kept as floats (the pipeline's are), counts as 64-bit integers (the
 * eBPF offload's counters are 64-bit), and a closed window lets go of its key and sample at once rather than
 * when the expiry queue drops it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>

#include "_aggregate_fast.h"

/* What one key holds between its "first" record and the close of its window (aggregate.py's _Window). */
typedef struct {
    PyObject_HEAD
    PyObject *key;     /* NULL once closed */
    PyObject *sample;  /* Py_None until a packet (or offloaded counts given one) names the key; NULL once closed */
    Py_hash_t hash;    /* the key's: hashed once when the window opens (a tuple does not keep its hash) */
    double deadline, first, last;
    long long packets, bytes, off_packets, off_bytes;
    char announced, live;
} Window;

static void Window_dealloc(Window *w) {
    Py_XDECREF(w->key);
    Py_XDECREF(w->sample);
    Py_TYPE(w)->tp_free((PyObject *)w);
}

static PyTypeObject WindowType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "auditlog._record_fast._Window",
    .tp_basicsize = sizeof(Window),
    .tp_dealloc = (destructor)Window_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An aggregation window (internal).",
};

typedef struct {
    PyObject_HEAD
    double window, latest;
    Py_ssize_t max_keys;
    PyObject *open;  /* key -> Window */
    /* The expiry queue: every window has the same length and times never decrease, so opening order is
     * deadline order (aggregate.py's deque). A ring of strong references, its capacity a power of two. */
    Window **ring;
    Py_ssize_t cap, head, len;
    long long held, off_held, packets_in, packets_out, records_out, off_in, off_out, evicted, clock_steps;
} Aggregator;

static PyTypeObject AggregatorType;
static PyTypeObject *EmissionType;  /* auditlog.aggregate.Emission, a NamedTuple of 9 fields */
static PyObject *S_first, *S_aggregate, *S_immediate;

#define HEAD(a) ((a)->ring[(a)->head])

static int ring_push(Aggregator *a, Window *w) {
    if (a->len == a->cap) {
        Py_ssize_t cap = a->cap ? a->cap * 2 : 64;
        Window **ring = PyMem_New(Window *, cap);
        if (ring == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t i = 0; i < a->len; i++) ring[i] = a->ring[(a->head + i) & (a->cap - 1)];
        PyMem_Free(a->ring);
        a->ring = ring;
        a->cap = cap;
        a->head = 0;
    }
    Py_INCREF(w);
    a->ring[(a->head + a->len) & (a->cap - 1)] = w;
    a->len++;
    return 0;
}

/* The head of a non-empty ring, taken off it: the ring's reference is the caller's now. */
static Window *ring_pop(Aggregator *a) {
    Window *w = HEAD(a);
    a->head = (a->head + 1) & (a->cap - 1);
    a->len--;
    return w;
}

/* Emission(key, sample, packets, bytes, first, last, offloaded_packets, offloaded_bytes, kind) appended to out */
static int emit(PyObject *out, PyObject *key, PyObject *sample, long long packets, long long bytes, double first,
                double last, long long off_packets, long long off_bytes, PyObject *kind) {
    PyObject *e = EmissionType->tp_alloc(EmissionType, 9);  /* as tuple.__new__(Emission, ...) */
    if (e == NULL) return -1;
    PyObject *items[9] = {Py_NewRef(key), Py_NewRef(sample), PyLong_FromLongLong(packets),
                          PyLong_FromLongLong(bytes), PyFloat_FromDouble(first), PyFloat_FromDouble(last),
                          PyLong_FromLongLong(off_packets), PyLong_FromLongLong(off_bytes), Py_NewRef(kind)};
    int failed = 0;
    for (int i = 0; i < 9; i++) {
        failed |= items[i] == NULL;
        PyTuple_SET_ITEM(e, i, items[i]);
    }
    int status = failed ? -1 : PyList_Append(out, e);
    Py_DECREF(e);
    return status;
}

/* _close: the window leaves `open`; its record when it holds anything. The caller holds a reference to w. */
static int close_window(Aggregator *a, Window *w, PyObject *out) {
    w->live = 0;
    if (_PyDict_DelItem_KnownHash(a->open, w->key, w->hash) < 0) return -1;
    int status = 0;
    if (w->packets || w->off_packets) {
        a->held -= w->packets;
        a->off_held -= w->off_packets;
        a->packets_out += w->packets;
        a->off_out += w->off_packets;
        a->records_out++;
        status = emit(out, w->key, w->sample, w->packets, w->bytes, w->first, w->last, w->off_packets,
                      w->off_bytes, S_aggregate);
    }
    Py_CLEAR(w->key);
    Py_CLEAR(w->sample);
    return status;
}

static int close_all(Aggregator *a, PyObject *out) {
    while (a->len) {
        Window *w = ring_pop(a);
        int status = w->live ? close_window(a, w, out) : 0;
        Py_DECREF(w);
        if (status < 0) return -1;
    }
    return 0;
}

static int expire(Aggregator *a, double now, PyObject *out) {
    while (a->len) {
        Window *w = HEAD(a);
        if (w->live && w->deadline > now) return 0;
        ring_pop(a);
        int status = w->live ? close_window(a, w, out) : 0;
        Py_DECREF(w);
        if (status < 0) return -1;
    }
    return 0;
}

/* `now` made the aggregator's time: kept when it does not go back, clamped for jitter up to a window, else
 * (the wall clock was reset) every window closes now (_stepped_back). */
static int advance(Aggregator *a, double *now, PyObject *out) {
    if (*now >= a->latest) {
        a->latest = *now;
        return 0;
    }
    if (isnan(*now)) {
        PyErr_SetString(PyExc_ValueError, "aggregation time is NaN");
        return -1;
    }
    if (a->latest - *now <= a->window) {
        *now = a->latest;
        return 0;
    }
    if (close_all(a, out) < 0) return -1;
    a->clock_steps++;
    a->latest = *now;
    return 0;
}

/* _open_window: close what is due (a window that saw only its "first" closes silently), evict the soonest if
 * at max_keys, then open the key's window. A new reference, or NULL. */
static Window *open_window(Aggregator *a, PyObject *key, Py_hash_t hash, PyObject *sample, double now,
                           int announced, PyObject *out) {
    while (a->len) {
        Window *due = HEAD(a);
        if (due->live && due->deadline > now) break;
        ring_pop(a);
        int status = due->live ? close_window(a, due, out) : 0;  /* one that saw only its "first": silently */
        Py_DECREF(due);
        if (status < 0) return NULL;
    }
    if (PyDict_GET_SIZE(a->open) >= a->max_keys) {
        while (a->len && !HEAD(a)->live) Py_DECREF(ring_pop(a));
        if (a->len) {  /* always: every open window is in the ring */
            a->evicted++;  /* its record goes out early, never lost */
            Window *due = ring_pop(a);
            int status = close_window(a, due, out);
            Py_DECREF(due);
            if (status < 0) return NULL;
        }
    }
    Window *w = PyObject_New(Window, &WindowType);
    if (w == NULL) return NULL;
    w->key = Py_NewRef(key);
    w->hash = hash;
    w->sample = Py_NewRef(announced ? sample : Py_None);
    w->deadline = now + a->window;
    w->first = w->last = 0.0;
    w->packets = w->bytes = w->off_packets = w->off_bytes = 0;
    w->announced = (char)announced;
    w->live = 1;
    if (ring_push(a, w) < 0) {
        Py_DECREF(w);
        return NULL;
    }
    if (_PyDict_SetItem_KnownHash(a->open, key, (PyObject *)w, hash) < 0) {
        w->live = 0;  /* in the ring, not open: dropped when it reaches the head */
        Py_DECREF(w);
        return NULL;
    }
    return w;
}

/* add(), the caller's `out` given */
static int add_one(Aggregator *a, PyObject *key, PyObject *sample, long long size, double now, int aggregate,
                   PyObject *out) {
    a->packets_in++;
    if (!aggregate || a->window == 0) {
        a->records_out++;
        a->packets_out++;
        return emit(out, key, sample, 1, size, now, now, 0, 0, S_immediate);
    }
    if (advance(a, &now, out) < 0) return -1;
    Py_hash_t hash = PyObject_Hash(key);
    if (hash == -1) return -1;
    Window *w = (Window *)_PyDict_GetItem_KnownHash(a->open, key, hash);
    if (w == NULL && PyErr_Occurred()) return -1;
    if (w != NULL && now < w->deadline) {
        if (w->announced) {
            /* the hot path under a flood: fold in place */
            if (w->packets) {
                w->packets++;
                w->bytes += size;
            } else {
                if (!w->off_packets) w->first = now;
                Py_INCREF(w);
                Py_SETREF(w->sample, Py_NewRef(sample));
                Py_DECREF(w);
                w->packets = 1;
                w->bytes = size;
            }
            w->last = now;
            a->held++;
            return 0;
        }
        /* opened by offloaded counts only: no record named this key yet, so this packet is a "first" too */
        w->announced = 1;
        Py_INCREF(w);
        Py_SETREF(w->sample, Py_NewRef(sample));
        Py_DECREF(w);
    } else {
        if (w != NULL) {
            Py_INCREF(w);
            int status = close_window(a, w, out);
            Py_DECREF(w);
            if (status < 0) return -1;
        }
        Window *opened = open_window(a, key, hash, sample, now, 1, out);
        if (opened == NULL) return -1;
        Py_DECREF(opened);
    }
    a->records_out++;
    a->packets_out++;
    return emit(out, key, sample, 1, size, now, now, 0, 0, S_first);
}

int aggregator_first_only(PyObject *agg, PyObject *key, double now, int aggregate) {
    if (!PyObject_TypeCheck(agg, &AggregatorType)) return 0;  /* a subclass adds no state (record_fast.py) */
    Aggregator *a = (Aggregator *)agg;
    if (!aggregate || a->window == 0) return 1;  /* "immediate" */
    if (!(now >= a->latest)) return 0;           /* clamped or stepped back: not `now`, or more emissions */
    int has = PyDict_Contains(a->open, key);
    if (has != 0) return has < 0 ? -1 : 0;      /* open: counted into its window, or closed first */
    Py_ssize_t closing = 0;                       /* live windows due now, each closing silently */
    for (Py_ssize_t i = 0; i < a->len; i++) {
        Window *w = a->ring[(a->head + i) & (a->cap - 1)];
        if (w->live && w->deadline > now) break;
        if (w->live) {
            if (w->packets || w->off_packets) return 0;  /* its "aggregate" record */
            closing++;
        }
    }
    return PyDict_GET_SIZE(a->open) - closing < a->max_keys;  /* else one is evicted (its record early) */
}

static int as_count(PyObject *o, long long *v) {
    *v = PyLong_AsLongLong(o);
    return *v == -1 && PyErr_Occurred() ? -1 : 0;
}

static int as_time(PyObject *o, double *v) {
    *v = PyFloat_AsDouble(o);
    return *v == -1.0 && PyErr_Occurred() ? -1 : 0;
}

/* by_rule[rule_id] = by_rule.get(rule_id, 0) + n */
static int count_rule(PyObject *by_rule, PyObject *rule_id, long long n) {
    PyObject *had = PyDict_GetItemWithError(by_rule, rule_id);
    if (had == NULL && PyErr_Occurred()) return -1;
    long long v = had != NULL ? PyLong_AsLongLong(had) : 0;
    if (v == -1 && PyErr_Occurred()) return -1;
    PyObject *now = PyLong_FromLongLong(v + n);
    if (now == NULL) return -1;
    int status = PyDict_SetItem(by_rule, rule_id, now);
    Py_DECREF(now);
    return status;
}

/* add(key, sample, size, now, aggregate) */
static PyObject *Aggregator_add(Aggregator *a, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "add(key, sample, size, now, aggregate)");
        return NULL;
    }
    long long size;
    double now;
    int aggregate;
    if (as_count(args[2], &size) < 0 || as_time(args[3], &now) < 0 || (aggregate = PyObject_IsTrue(args[4])) < 0)
        return NULL;
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    if (add_one(a, args[0], args[1], size, now, aggregate, out) < 0) Py_CLEAR(out);
    return out;
}

/* add_run's step for one packet-in: 1 taken (*sample: the (pin, summary) added, a new reference; *cut: its
 * summary says truncated), 0 not taken (nothing done, no exception), -1 the aggregator failed (raised). */
static int add_run_one(Aggregator *a, PyObject *pin, PyObject *decode, const Py_ssize_t *f, PyObject *out,
                       PyObject **sample_out, int *cut_out) {
    Py_ssize_t pin_n = f[0], sum_n = f[6];
    if (!PyTuple_Check(pin) || PyTuple_GET_SIZE(pin) != pin_n) return 0;
    PyObject *rule_id = PyTuple_GET_ITEM(pin, f[2]), *reg7 = PyTuple_GET_ITEM(pin, f[3]);
    if (!PyLong_CheckExact(rule_id) || !PyLong_CheckExact(reg7)) return 0;
    long long reg7_v = PyLong_AsLongLong(reg7), size;
    double now;
    if ((reg7_v == -1 && PyErr_Occurred()) || as_count(PyTuple_GET_ITEM(pin, f[4]), &size) < 0
            || as_time(PyTuple_GET_ITEM(pin, f[5]), &now) < 0) {
        PyErr_Clear();
        return 0;
    }
    PyObject *summary = PyObject_CallOneArg(decode, PyTuple_GET_ITEM(pin, f[1]));
    if (summary == NULL) {
        PyErr_Clear();
        return 0;
    }
    int cut = PyTuple_Check(summary) && PyTuple_GET_SIZE(summary) == sum_n
              ? PyObject_IsTrue(PyTuple_GET_ITEM(summary, f[7])) : -1;
    if (cut < 0) {
        PyErr_Clear();
        Py_DECREF(summary);
        return 0;
    }
    long long disposition_v = reg7_v & f[13];
    PyObject *dst_port = PyTuple_GET_ITEM(summary, f[11]);
    PyObject *lastf = dst_port != Py_None ? dst_port : PyTuple_GET_ITEM(summary, f[12]);
    PyObject *disposition = PyLong_FromLongLong(disposition_v), *key = NULL, *sample = NULL;
    if (disposition != NULL)
        key = PyTuple_Pack(6, rule_id, disposition, PyTuple_GET_ITEM(summary, f[8]), PyTuple_GET_ITEM(summary, f[9]),
                           PyTuple_GET_ITEM(summary, f[10]), lastf);
    Py_XDECREF(disposition);
    if (key != NULL) sample = PyTuple_Pack(2, pin, summary);
    Py_DECREF(summary);
    if (sample == NULL || add_one(a, key, sample, size, now, disposition_v != f[14], out) < 0) {
        Py_XDECREF(key);
        Py_XDECREF(sample);
        return -1;
    }
    Py_DECREF(key);
    *sample_out = sample;
    *cut_out = cut;
    return 1;
}

/* add_run(pins, start, end, decode, layout, by_rule, out) -> (stop, truncated, last)
 *
 * AuditPipeline.__call__'s full-detail part for pins[start:end], in one call (auditlog/pipeline.py take_run):
 * per packet-in, summary = decode(pin.packet); the key (rule_id, reg7 & disposition_bits, src_ip, dst_ip,
 * protocol, dst_port if not None else icmp_type); add(key, (pin, summary), pin.total_len, pin.received_at,
 * disposition != allow) with the emissions appended to `out`; by_rule[rule_id] += 1. `layout` names where
 * those fields are: (pin_size, packet, rule_id, reg7, total_len, received_at, summary_size, truncated, src_ip,
 * dst_ip, protocol, dst_port, icmp_type, disposition_bits, allow).
 *
 * It stops at the first packet-in it does not take and returns its index with nothing done for it: a pin of
 * another size or no tuple, decode raising or giving no tuple of the summary's size, a rule id or reg7 that is
 * no int, a size or time the aggregator would refuse. The pipeline takes that one on its own path, which says
 * what is wrong with it. `truncated`: packet-ins taken whose summary says truncated; `last`: the last
 * (pin, summary) taken, or None. Only a failure of the aggregator itself (no memory) raises. */
static PyObject *Aggregator_add_run(Aggregator *a, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7 || !PyList_CheckExact(args[0]) || !PyTuple_CheckExact(args[4]) || PyTuple_GET_SIZE(args[4]) != 15
            || !PyDict_CheckExact(args[5]) || !PyList_CheckExact(args[6])) {
        PyErr_SetString(PyExc_TypeError, "add_run(pins: list, start, end, decode, layout: 15-tuple, by_rule: dict, "
                                         "out: list)");
        return NULL;
    }
    PyObject *pins = args[0], *decode = args[3], *by_rule = args[5], *out = args[6];
    Py_ssize_t start = PyLong_AsSsize_t(args[1]), end = PyLong_AsSsize_t(args[2]);
    if ((start == -1 || end == -1) && PyErr_Occurred()) return NULL;
    Py_ssize_t f[15];
    for (int i = 0; i < 15; i++) {
        f[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(args[4], i));
        if (f[i] == -1 && PyErr_Occurred()) return NULL;
    }
    Py_ssize_t pin_n = f[0], sum_n = f[6];
    for (int i = 1; i < 6; i++)
        if (f[i] < 0 || f[i] >= pin_n) goto bad_layout;
    for (int i = 7; i < 13; i++)
        if (f[i] < 0 || f[i] >= sum_n) goto bad_layout;
    if (start < 0 || end > PyList_GET_SIZE(pins)) {
        PyErr_SetString(PyExc_IndexError, "add_run: start and end must lie within pins");
        return NULL;
    }
    Py_ssize_t i = start, truncated = 0;
    PyObject *last = NULL;               /* the last sample taken (held) */
    PyObject *run_rule = NULL;           /* by_rule counted here for runs of one rule id: flushed on a change */
    long long run_count = 0;
    int failed = 0;
    /* the list's size read each time, and the packet-in held: decode may run Python code */
    for (; i < end && i < PyList_GET_SIZE(pins); i++) {
        PyObject *pin = Py_NewRef(PyList_GET_ITEM(pins, i)), *sample = NULL;
        int cut = 0, status = add_run_one(a, pin, decode, f, out, &sample, &cut);
        Py_DECREF(pin);
        if (status <= 0) {
            failed = status < 0;
            break;
        }
        PyObject *rule_id = PyTuple_GET_ITEM(PyTuple_GET_ITEM(sample, 0), f[2]);  /* held by sample */
        Py_XSETREF(last, sample);
        truncated += cut;
        if (run_rule != NULL && run_rule != rule_id && PyObject_RichCompareBool(run_rule, rule_id, Py_EQ) != 1) {
            int counted = count_rule(by_rule, run_rule, run_count);  /* two ints: the compare cannot fail */
            Py_CLEAR(run_rule);
            if (counted < 0) {  /* no memory: this packet-in is in the aggregator, not in by_rule */
                failed = 1;
                break;
            }
        }
        if (run_rule == NULL) {
            run_rule = Py_NewRef(rule_id);
            run_count = 0;
        }
        run_count++;
    }
    if (run_rule != NULL) {  /* what was taken is counted, also when the aggregator failed */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        if (count_rule(by_rule, run_rule, run_count) < 0) {
            failed = 1;
            Py_XDECREF(type); Py_XDECREF(value); Py_XDECREF(tb);
        } else {
            PyErr_Restore(type, value, tb);
        }
        Py_DECREF(run_rule);
    }
    if (failed) {
        Py_XDECREF(last);
        return NULL;
    }
    return Py_BuildValue("(nnN)", i, truncated, last != NULL ? last : Py_NewRef(Py_None));

bad_layout:
    PyErr_SetString(PyExc_ValueError, "add_run: a layout index outside its tuple");
    return NULL;
}

/* add_many(key, sample, count, size, now, second=None) */
static PyObject *Aggregator_add_many(Aggregator *a, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 5 || nargs > 6) {
        PyErr_SetString(PyExc_TypeError, "add_many(key, sample, count, size, now, second=None)");
        return NULL;
    }
    PyObject *key = args[0], *sample = args[1], *second = nargs == 6 ? args[5] : Py_None;
    long long count, size;
    double now;
    if (as_count(args[2], &count) < 0 || as_count(args[3], &size) < 0 || as_time(args[4], &now) < 0) return NULL;
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    if (add_one(a, key, sample, size, now, 1, out) < 0) goto fail;
    long long rest = count - 1;
    if (rest <= 0) return out;
    if (a->window == 0) {
        for (long long i = 0; i < rest; i++)
            if (add_one(a, key, sample, size, now, 1, out) < 0) goto fail;
        return out;
    }
    /* add() left the key's window open and announced, at the time it used (now, clamped) */
    double at = a->latest;
    Window *w = (Window *)PyDict_GetItemWithError(a->open, key);
    if (w == NULL) {
        if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, key);
        goto fail;
    }
    Py_INCREF(w);
    if (w->packets) {
        w->packets += rest;
        w->bytes += size * rest;
    } else {
        if (!w->off_packets) w->first = at;
        Py_ssize_t n = PyList_GET_SIZE(out);
        PyObject *last = n ? PyList_GET_ITEM(out, n - 1) : NULL;
        PyObject *chosen;
        if (second != Py_None && last != NULL && PyTuple_GET_ITEM(last, 0) == key
                && PyTuple_GET_ITEM(last, 8) == S_first) {
            chosen = PyObject_CallNoArgs(second);  /* the window's sample is the second packet-in's */
            if (chosen == NULL) {
                Py_DECREF(w);
                goto fail;
            }
        } else {
            chosen = Py_NewRef(sample);
        }
        Py_SETREF(w->sample, chosen);
        w->packets = rest;
        w->bytes = size * rest;
    }
    w->last = at;
    Py_DECREF(w);
    a->packets_in += rest;
    a->held += rest;
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

/* add_offloaded(key, packets, bytes_, now, sample=None) */
static PyObject *Aggregator_add_offloaded(Aggregator *a, PyObject *args, PyObject *kwds) {
    static char *names[] = {"key", "packets", "bytes_", "now", "sample", NULL};
    PyObject *key, *packets_o, *bytes_o, *now_o, *sample = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOO|O", names, &key, &packets_o, &bytes_o, &now_o, &sample))
        return NULL;
    long long packets, bytes;
    double now;
    if (as_count(packets_o, &packets) < 0 || as_count(bytes_o, &bytes) < 0 || as_time(now_o, &now) < 0)
        return NULL;
    if (packets < 0 || bytes < 0) {
        PyErr_Format(PyExc_ValueError, "offloaded counts must be >= 0, got packets=%lld bytes=%lld for %R",
                     packets, bytes, key);
        return NULL;
    }
    PyObject *out = PyList_New(0);
    if (out == NULL || !packets) return out;  /* a map counter that did not move */
    a->off_in += packets;
    if (a->window == 0) {
        a->records_out++;
        a->off_out += packets;
        if (emit(out, key, sample, 0, 0, now, now, packets, bytes, S_aggregate) < 0) goto fail;
        return out;
    }
    if (advance(a, &now, out) < 0) goto fail;
    Py_hash_t hash = PyObject_Hash(key);
    if (hash == -1) goto fail;
    Window *w = (Window *)_PyDict_GetItem_KnownHash(a->open, key, hash);
    if (w == NULL && PyErr_Occurred()) goto fail;
    if (w == NULL || now >= w->deadline) {
        if (w != NULL) {
            Py_INCREF(w);
            int status = close_window(a, w, out);
            Py_DECREF(w);
            if (status < 0) goto fail;
        }
        if ((w = open_window(a, key, hash, sample, now, 0, out)) == NULL) goto fail;
    } else {
        Py_INCREF(w);
    }
    if (!(w->packets || w->off_packets)) w->first = now;
    if (w->sample == Py_None) Py_SETREF(w->sample, Py_NewRef(sample));
    w->off_packets += packets;
    w->off_bytes += bytes;
    w->last = now;
    Py_DECREF(w);
    a->off_held += packets;
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

/* tick(now): close every window whose end is <= now */
static PyObject *tick(Aggregator *a, PyObject *now_o, int all) {
    double now;
    if (as_time(now_o, &now) < 0) return NULL;
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    if (advance(a, &now, out) < 0 || expire(a, now, out) < 0 || (all && close_all(a, out) < 0)) Py_CLEAR(out);
    return out;
}

static PyObject *Aggregator_tick(Aggregator *a, PyObject *now) { return tick(a, now, 0); }

/* flush(now): close every window now (shutdown) */
static PyObject *Aggregator_flush(Aggregator *a, PyObject *now) { return tick(a, now, 1); }

static PyObject *Aggregator_next_deadline(Aggregator *a, PyObject *unused) {
    while (a->len && !HEAD(a)->live) Py_DECREF(ring_pop(a));
    return a->len ? PyFloat_FromDouble(HEAD(a)->deadline) : Py_NewRef(Py_None);
}

static PyObject *Aggregator_packets_held(Aggregator *a, PyObject *unused) { return PyLong_FromLongLong(a->held); }

static PyObject *Aggregator_offloaded_held(Aggregator *a, PyObject *unused) {
    return PyLong_FromLongLong(a->off_held);
}

static PyObject *Aggregator_get_window(Aggregator *a, void *closure) { return PyFloat_FromDouble(a->window); }

static PyObject *Aggregator_get_stats(Aggregator *a, void *closure) {
    return Py_BuildValue("{s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:n}", "packets_in", a->packets_in,
                         "records_out", a->records_out, "packets_out", a->packets_out,
                         "offloaded_packets_in", a->off_in, "offloaded_packets_out", a->off_out,
                         "evicted_early", a->evicted, "clock_steps", a->clock_steps,
                         "open_windows", PyDict_GET_SIZE(a->open));
}

static void reset(Aggregator *a) {
    while (a->len) Py_DECREF(ring_pop(a));
    if (a->open != NULL) PyDict_Clear(a->open);
    a->latest = -INFINITY;
    a->held = a->off_held = a->packets_in = a->packets_out = a->records_out = 0;
    a->off_in = a->off_out = a->evicted = a->clock_steps = 0;
}

static PyObject *Aggregator_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    Aggregator *a = (Aggregator *)type->tp_alloc(type, 0);
    if (a == NULL) return NULL;
    a->window = 1.0;
    a->max_keys = 100000;
    a->latest = -INFINITY;
    if ((a->open = PyDict_New()) == NULL) Py_CLEAR(a);
    return (PyObject *)a;
}

/* Aggregator(window=1.0, max_keys=100_000) */
static int Aggregator_init(Aggregator *a, PyObject *args, PyObject *kwds) {
    static char *names[] = {"window", "max_keys", NULL};
    PyObject *window_o = NULL;
    Py_ssize_t max_keys = 100000;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|On", names, &window_o, &max_keys)) return -1;
    double window = 1.0;
    if (window_o != NULL && as_time(window_o, &window) < 0) return -1;
    if (!(window >= 0 && isfinite(window))) {
        PyErr_Format(PyExc_ValueError, "aggregation window must be a finite number of seconds >= 0, got %R",
                     window_o);
        return -1;
    }
    if (max_keys < 1) {
        PyErr_Format(PyExc_ValueError, "aggregation max_keys must be >= 1, got %zd", max_keys);
        return -1;
    }
    if (EmissionType == NULL) {
        PyObject *module = PyImport_ImportModule("auditlog.aggregate");
        PyObject *type = module != NULL ? PyObject_GetAttrString(module, "Emission") : NULL;
        Py_XDECREF(module);
        if (type == NULL) return -1;
        if (!PyType_Check(type) || !PyType_IsSubtype((PyTypeObject *)type, &PyTuple_Type)) {
            Py_DECREF(type);
            PyErr_SetString(PyExc_TypeError, "auditlog.aggregate.Emission is not a tuple type");
            return -1;
        }
        EmissionType = (PyTypeObject *)type;
    }
    reset(a);
    a->window = window;
    a->max_keys = max_keys;
    return 0;
}

static int Aggregator_traverse(Aggregator *a, visitproc visit, void *arg) {
    Py_VISIT(a->open);
    for (Py_ssize_t i = 0; i < a->len; i++) {  /* what each window holds: windows are not tracked themselves */
        Window *w = a->ring[(a->head + i) & (a->cap - 1)];
        Py_VISIT(w->key);
        Py_VISIT(w->sample);
    }
    return 0;
}

static int Aggregator_clear(Aggregator *a) {
    while (a->len) Py_DECREF(ring_pop(a));
    Py_CLEAR(a->open);
    return 0;
}

static void Aggregator_dealloc(Aggregator *a) {
    PyObject_GC_UnTrack(a);
    Aggregator_clear(a);
    PyMem_Free(a->ring);
    Py_TYPE(a)->tp_free((PyObject *)a);
}

static PyMethodDef Aggregator_methods[] = {
    {"add", (PyCFunction)(void (*)(void))Aggregator_add, METH_FASTCALL,
     "add(key, sample, size, now, aggregate) -> list[Emission]: one admitted packet-in"},
    {"add_run", (PyCFunction)(void (*)(void))Aggregator_add_run, METH_FASTCALL,
     "add_run(pins, start, end, decode, layout, by_rule, out) -> (stop, truncated, last): the pipeline's full-detail "
     "add for a run of packet-ins"},
    {"add_many", (PyCFunction)(void (*)(void))Aggregator_add_many, METH_FASTCALL,
     "add_many(key, sample, count, size, now, second=None) -> list[Emission]: `count` packet-ins at once"},
    {"add_offloaded", (PyCFunction)(void (*)(void))Aggregator_add_offloaded, METH_VARARGS | METH_KEYWORDS,
     "add_offloaded(key, packets, bytes_, now, sample=None) -> list[Emission]: drops the eBPF offload counted"},
    {"tick", (PyCFunction)Aggregator_tick, METH_O, "tick(now) -> list[Emission]: close the windows due by now"},
    {"flush", (PyCFunction)Aggregator_flush, METH_O, "flush(now) -> list[Emission]: close every window"},
    {"next_deadline", (PyCFunction)Aggregator_next_deadline, METH_NOARGS,
     "next_deadline() -> float | None: when the soonest open window closes"},
    {"packets_held", (PyCFunction)Aggregator_packets_held, METH_NOARGS, "OVS packets held in open windows"},
    {"offloaded_held", (PyCFunction)Aggregator_offloaded_held, METH_NOARGS,
     "eBPF-offloaded packets held in open windows"},
    {NULL}};

static PyGetSetDef Aggregator_getset[] = {
    {"window", (getter)Aggregator_get_window, NULL, "the window's length, seconds", NULL},
    {"stats", (getter)Aggregator_get_stats, NULL, "the counters, as aggregate.Aggregator.stats", NULL},
    {NULL}};

static PyTypeObject AggregatorType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "auditlog._record_fast.Aggregator",
    .tp_basicsize = sizeof(Aggregator),
    .tp_dealloc = (destructor)Aggregator_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "auditlog.aggregate.Aggregator in C (auditlog/_aggregate_fast.c).",
    .tp_traverse = (traverseproc)Aggregator_traverse,
    .tp_clear = (inquiry)Aggregator_clear,
    .tp_methods = Aggregator_methods,
    .tp_getset = Aggregator_getset,
    .tp_init = (initproc)Aggregator_init,
    .tp_new = Aggregator_new,
};

int aggregator_add(PyObject *module) {
    if (PyType_Ready(&WindowType) < 0 || PyType_Ready(&AggregatorType) < 0) return -1;
    if (!(S_first = PyUnicode_InternFromString("first")) || !(S_aggregate = PyUnicode_InternFromString("aggregate"))
            || !(S_immediate = PyUnicode_InternFromString("immediate")))
        return -1;
    Py_INCREF(&AggregatorType);
    if (PyModule_AddObject(module, "Aggregator", (PyObject *)&AggregatorType) < 0) {
        Py_DECREF(&AggregatorType);
        return -1;
    }
    return 0;
}
