/* NXT_PACKET_IN2 decoding by learned layout in C: packetin/layouts.py's per-message work.
 *
 * LayoutDecoder(packet_in_type, fallback): packetin.layouts.PacketIn2Decoder learns a layout per message
 * length from its walk and tells this object (learn, clear). decode(msg, received_at) then reads a message
 * of a learned length here when its steering bytes (lengths, property and OXM headers) are those of the
 * learned message -- the test Layout makes with one struct unpack -- and builds the PacketIn itself; any
 * other message (unknown length, other steering bytes, anything but bytes) goes to `fallback` (the
 * PacketIn2Decoder), which walks it, raises DecodeError where the walk does, and learns anew. So the
 * PacketIn is the walk's either way; tests/unit/packetin/test_layouts.py runs its checks through both.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define FIELDS 10       /* PacketIn: reason, table_id, cookie, in_port, rule_id, reg7, userdata, packet, total_len,
                           received_at */
#define MAX_LAYOUTS 64  /* packetin/layouts.py's MAX_LAYOUTS: it clears (and so clears this) before it holds more */
#define MAX_HEADERS 64

enum { F_UINT, F_BYTES, F_CONST, F_PACKET, F_RECEIVED_AT };

typedef struct {
    int kind;
    Py_ssize_t off, size;  /* F_UINT: 1, 2, 4 or 8 bytes, big-endian; F_BYTES: that many bytes */
    PyObject *value;       /* F_CONST */
} Field;

typedef struct {
    Py_ssize_t length;  /* the message length it was learned for (0: a free slot) */
    int headers;
    Py_ssize_t header_off[MAX_HEADERS], header_size[MAX_HEADERS];
    uint64_t header_value[MAX_HEADERS];
    Py_ssize_t packet_start, packet_end;
    Field fields[FIELDS];
} Layout;

typedef struct {
    PyObject_HEAD
    PyTypeObject *packet_in;  /* packetin.model.PacketIn (a tuple subclass, 10 fields) */
    PyObject *fallback;       /* the PacketIn2Decoder */
    Layout *layouts;          /* MAX_LAYOUTS of them */
    Py_ssize_t fast, slow;    /* messages read here, and handed to the fallback */
} LayoutDecoder;

static void layout_clear(Layout *l) {
    for (int i = 0; i < FIELDS; i++) Py_CLEAR(l->fields[i].value);
    l->length = 0;
}

static void LayoutDecoder_dealloc(LayoutDecoder *self) {
    if (self->layouts != NULL) {
        for (int i = 0; i < MAX_LAYOUTS; i++) layout_clear(&self->layouts[i]);
        PyMem_Free(self->layouts);
    }
    Py_XDECREF(self->packet_in);
    Py_XDECREF(self->fallback);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int LayoutDecoder_init(LayoutDecoder *self, PyObject *args, PyObject *kwds) {
    PyObject *packet_in, *fallback;
    if (!PyArg_ParseTuple(args, "O!O", &PyType_Type, &packet_in, &fallback)) return -1;
    if (!PyType_IsSubtype((PyTypeObject *)packet_in, &PyTuple_Type) || !PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_TypeError, "LayoutDecoder(packet_in_type, fallback): a tuple type and a callable");
        return -1;
    }
    Py_XSETREF(self->packet_in, (PyTypeObject *)Py_NewRef(packet_in));
    Py_XSETREF(self->fallback, Py_NewRef(fallback));
    if (self->layouts == NULL && !(self->layouts = PyMem_Calloc(MAX_LAYOUTS, sizeof(Layout)))) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static inline uint64_t read_be(const unsigned char *p, Py_ssize_t size) {
    uint64_t v = 0;
    for (Py_ssize_t i = 0; i < size; i++) v = (v << 8) | p[i];
    return v;
}

/* The learned layout `msg` matches (its length learned, its steering bytes the learned message's), or NULL. */
static Layout *layout_of(LayoutDecoder *self, PyObject *msg) {
    if (!PyBytes_CheckExact(msg)) return NULL;
    Py_ssize_t n = PyBytes_GET_SIZE(msg);
    Layout *l = NULL;
    for (int i = 0; i < MAX_LAYOUTS && n > 0; i++)  /* length 0: a free slot, never a message's */
        if (self->layouts[i].length == n) { l = &self->layouts[i]; break; }
    if (l == NULL) return NULL;
    const unsigned char *m = (const unsigned char *)PyBytes_AS_STRING(msg);
    for (int i = 0; i < l->headers; i++)
        if (read_be(m + l->header_off[i], l->header_size[i]) != l->header_value[i]) return NULL;
    return l;
}

/* The PacketIn of `msg` read by layout `l` (layout_of's), stamped `received_at`: a new reference, or NULL. */
static PyObject *read_layout(LayoutDecoder *self, Layout *l, PyObject *msg, PyObject *received_at) {
    const unsigned char *m = (const unsigned char *)PyBytes_AS_STRING(msg);
    PyObject *out = self->packet_in->tp_alloc(self->packet_in, FIELDS);
    if (out == NULL) return NULL;
    for (int i = 0; i < FIELDS; i++) {
        Field *f = &l->fields[i];
        PyObject *v;
        switch (f->kind) {
        case F_UINT: v = PyLong_FromUnsignedLongLong(read_be(m + f->off, f->size)); break;
        case F_BYTES: v = PyBytes_FromStringAndSize((const char *)m + f->off, f->size); break;
        case F_PACKET: v = PyBytes_FromStringAndSize((const char *)m + l->packet_start, l->packet_end - l->packet_start);
            break;
        case F_RECEIVED_AT: v = Py_NewRef(received_at); break;
        default: v = Py_NewRef(f->value); break;
        }
        if (v == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, i, v);
    }
    self->fast++;
    return out;
}

/* decode(msg, received_at) -> PacketIn */
static PyObject *LayoutDecoder_decode(LayoutDecoder *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "decode takes 2 positional arguments");
        return NULL;
    }
    Layout *l = layout_of(self, args[0]);
    if (l != NULL) return read_layout(self, l, args[0], args[1]);
    self->slow++;
    return PyObject_Vectorcall(self->fallback, args, 2, NULL);
}

/* decode_run(msgs, start, received_at, out, msg_type, experimenter) -> the first index from `start` whose message
 * is not read here: each message of the list `msgs` from `start` on that is an NXT_PACKET_IN2 (byte 1 `msg_type`,
 * bytes 8..16 `experimenter`) of a learned layout is read as decode reads it and appended to the list `out`; the
 * first that is anything else (another message, a layout to learn or walk) stops the run, untouched, for the
 * caller to hand on one by one (packetin/reader.py). A read's packet-ins in one call instead of two each. */
static PyObject *LayoutDecoder_decode_run(LayoutDecoder *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6 || !PyList_CheckExact(args[0]) || !PyList_CheckExact(args[3]) || !PyBytes_CheckExact(args[5])
            || PyBytes_GET_SIZE(args[5]) != 8) {
        PyErr_SetString(PyExc_TypeError, "decode_run(msgs: list, start, received_at, out: list, msg_type, "
                                         "experimenter: 8 bytes)");
        return NULL;
    }
    PyObject *msgs = args[0], *out = args[3];
    Py_ssize_t i = PyLong_AsSsize_t(args[1]);
    if (i == -1 && PyErr_Occurred()) return NULL;
    long msg_type = PyLong_AsLong(args[4]);
    if (msg_type == -1 && PyErr_Occurred()) return NULL;
    if (i < 0) {
        PyErr_SetString(PyExc_ValueError, "decode_run: start is negative");
        return NULL;
    }
    const char *exp = PyBytes_AS_STRING(args[5]);
    for (; i < PyList_GET_SIZE(msgs); i++) {  /* the size reread each time: see below */
        PyObject *msg = PyList_GET_ITEM(msgs, i);
        if (!PyBytes_CheckExact(msg) || PyBytes_GET_SIZE(msg) < 16) break;
        const unsigned char *m = (const unsigned char *)PyBytes_AS_STRING(msg);
        if (m[1] != msg_type || memcmp(m + 8, exp, 8) != 0) break;
        Layout *l = layout_of(self, msg);
        if (l == NULL) break;
        Py_INCREF(msg);  /* held: building the PacketIn allocates, and a collection may run Python code */
        PyObject *pin = read_layout(self, l, msg, args[2]);
        Py_DECREF(msg);
        if (pin == NULL) return NULL;
        int status = PyList_Append(out, pin);
        Py_DECREF(pin);
        if (status < 0) return NULL;
    }
    return PyLong_FromSsize_t(i);
}

static int as_size(PyObject *o, Py_ssize_t *v, Py_ssize_t hi) {
    *v = PyLong_AsSsize_t(o);
    if (*v == -1 && PyErr_Occurred()) return -1;
    if (*v < 0 || *v > hi) {
        PyErr_Format(PyExc_ValueError, "LayoutDecoder.learn: %zd is out of range", *v);
        return -1;
    }
    return 0;
}

/* learn(length, headers, fields, packet_start, packet_end): headers [(offset, size, value)], fields FIELDS
 * tuples, each (F_UINT, offset, size), (F_BYTES, offset, size), (F_CONST, value), (F_PACKET,) or
 * (F_RECEIVED_AT,). Every range lies within `length` bytes. Replaces what was learned for that length. */
static PyObject *LayoutDecoder_learn(LayoutDecoder *self, PyObject *args) {
    Py_ssize_t length, start, end;
    PyObject *headers, *fields;
    if (!PyArg_ParseTuple(args, "nO!O!nn", &length, &PyList_Type, &headers, &PyList_Type, &fields, &start, &end))
        return NULL;
    if (length <= 0 || start < 0 || end < start || end > length || PyList_GET_SIZE(fields) != FIELDS ||
        PyList_GET_SIZE(headers) > MAX_HEADERS) {
        PyErr_SetString(PyExc_ValueError, "LayoutDecoder.learn: a layout that does not fit its length");
        return NULL;
    }
    Layout l = {0};
    l.length = length;
    l.packet_start = start;
    l.packet_end = end;
    l.headers = (int)PyList_GET_SIZE(headers);
    for (int i = 0; i < l.headers; i++) {
        PyObject *h = PyList_GET_ITEM(headers, i);
        if (!PyTuple_Check(h) || PyTuple_GET_SIZE(h) != 3) goto bad;
        if (as_size(PyTuple_GET_ITEM(h, 0), &l.header_off[i], length) < 0 ||
            as_size(PyTuple_GET_ITEM(h, 1), &l.header_size[i], 8) < 0)
            goto error;
        if (l.header_off[i] + l.header_size[i] > length) goto bad;
        l.header_value[i] = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(h, 2));
        if (l.header_value[i] == (uint64_t)-1 && PyErr_Occurred()) goto error;
    }
    for (int i = 0; i < FIELDS; i++) {
        PyObject *f = PyList_GET_ITEM(fields, i);
        if (!PyTuple_Check(f) || PyTuple_GET_SIZE(f) < 1) goto bad;
        long kind = PyLong_AsLong(PyTuple_GET_ITEM(f, 0));
        if (kind == -1 && PyErr_Occurred()) goto error;
        Field *d = &l.fields[i];
        d->kind = (int)kind;
        if (kind == F_UINT || kind == F_BYTES) {
            if (PyTuple_GET_SIZE(f) != 3 || as_size(PyTuple_GET_ITEM(f, 1), &d->off, length) < 0 ||
                as_size(PyTuple_GET_ITEM(f, 2), &d->size, length) < 0)
                goto error_or_bad;
            if (d->off + d->size > length || (kind == F_UINT && d->size > 8)) goto bad;
        } else if (kind == F_CONST) {
            if (PyTuple_GET_SIZE(f) != 2) goto bad;
            d->value = Py_NewRef(PyTuple_GET_ITEM(f, 1));
        } else if (!(kind == F_PACKET || kind == F_RECEIVED_AT)) {
            goto bad;
        }
    }
    Layout *slot = NULL;
    for (int i = 0; i < MAX_LAYOUTS && slot == NULL; i++)
        if (self->layouts[i].length == length) slot = &self->layouts[i];
    for (int i = 0; i < MAX_LAYOUTS && slot == NULL; i++)
        if (self->layouts[i].length == 0) slot = &self->layouts[i];
    if (slot == NULL) {
        PyErr_SetString(PyExc_OverflowError, "LayoutDecoder.learn: every layout slot is taken (clear first)");
        goto error;
    }
    layout_clear(slot);
    *slot = l;
    Py_RETURN_NONE;
error_or_bad:
    if (PyErr_Occurred()) goto error;
bad:
    PyErr_SetString(PyExc_ValueError, "LayoutDecoder.learn: a malformed layout");
error:
    layout_clear(&l);
    return NULL;
}

static PyObject *LayoutDecoder_clear(LayoutDecoder *self, PyObject *Py_UNUSED(ignored)) {
    for (int i = 0; i < MAX_LAYOUTS; i++) layout_clear(&self->layouts[i]);
    Py_RETURN_NONE;
}

static PyObject *LayoutDecoder_counts(LayoutDecoder *self, PyObject *Py_UNUSED(ignored)) {
    int learned = 0;
    for (int i = 0; i < MAX_LAYOUTS; i++) learned += self->layouts[i].length != 0;
    return Py_BuildValue("{s:n,s:n,s:i}", "fast", self->fast, "python", self->slow, "layouts", learned);
}

/* logged_run_end(items, start, end, packet_in_type, userdata_index, version, min_length, log_bit, reject_bit)
 * -> the first index in [start, end) whose item is not a plain logged packet-in, else end: an item of exactly
 * `packet_in_type` whose userdata (bytes) is not ours (shorter than min_length or another version: a packet-in
 * the reason code routed, logged) or is ours with `log_bit` set and `reject_bit` clear in its flags (byte 2).
 * policy_agent/policy_packetins.py hands such runs to the audit pipeline in one call (packetin/layouts.py). */
static PyObject *logged_run_end(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9 || !PyList_CheckExact(args[0]) || !PyType_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "logged_run_end(items: list, start, end, packet_in_type, userdata_index, "
                                         "version, min_length, log_bit, reject_bit)");
        return NULL;
    }
    PyObject *items = args[0];
    PyTypeObject *type = (PyTypeObject *)args[3];
    Py_ssize_t v[7];
    for (int k = 0; k < 7; k++) {
        v[k] = PyLong_AsSsize_t(args[k == 0 ? 1 : k == 1 ? 2 : k + 2]);
        if (v[k] == -1 && PyErr_Occurred()) return NULL;
    }
    Py_ssize_t start = v[0], end = v[1], ud_index = v[2], min_length = v[4];
    long version = (long)v[3], log_bit = (long)v[5], reject_bit = (long)v[6];
    if (start < 0 || end > PyList_GET_SIZE(items) || ud_index < 0 || min_length < 3) {
        PyErr_SetString(PyExc_ValueError, "logged_run_end: start, end, userdata_index or min_length out of range");
        return NULL;
    }
    Py_ssize_t i = start;
    for (; i < end; i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        if (Py_TYPE(item) != type || PyTuple_GET_SIZE(item) <= ud_index) break;
        PyObject *ud = PyTuple_GET_ITEM(item, ud_index);
        if (!PyBytes_CheckExact(ud)) break;
        const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(ud);
        if (PyBytes_GET_SIZE(ud) < min_length || b[0] != version) continue;  /* not ours: logged */
        if (!(b[2] & log_bit) || (b[2] & reject_bit)) break;
    }
    return PyLong_FromSsize_t(i);
}

/* common_category(items, packet_in_type, userdata_index, version, min_length) -> the category every item of the
 * list has, else None: each of exactly `packet_in_type` (PacketIn) with userdata (bytes) of ours (at least
 * min_length, byte 0 `version`), the same byte 1 in all. None too for an empty list, or any item the reason code
 * would route (no userdata, or not ours): packetin/demux.py then sorts the read by PacketIn.category one by one. */
static PyObject *common_category(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyList_CheckExact(args[0]) || !PyType_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "common_category(items: list, packet_in_type, userdata_index, version, "
                                         "min_length)");
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)args[1];
    Py_ssize_t v[3];
    for (int k = 0; k < 3; k++) {
        v[k] = PyLong_AsSsize_t(args[k + 2]);
        if (v[k] == -1 && PyErr_Occurred()) return NULL;
    }
    Py_ssize_t ud_index = v[0], min_length = v[2];
    long version = (long)v[1];
    if (ud_index < 0 || min_length < 2) {
        PyErr_SetString(PyExc_ValueError, "common_category: userdata_index or min_length out of range");
        return NULL;
    }
    PyObject *items = args[0];
    Py_ssize_t n = PyList_GET_SIZE(items);
    int category = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        if (Py_TYPE(item) != type || PyTuple_GET_SIZE(item) <= ud_index) Py_RETURN_NONE;
        PyObject *ud = PyTuple_GET_ITEM(item, ud_index);
        if (!PyBytes_CheckExact(ud) || PyBytes_GET_SIZE(ud) < min_length) Py_RETURN_NONE;
        const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(ud);
        if (b[0] != version || (category >= 0 && b[1] != category)) Py_RETURN_NONE;
        category = b[1];
    }
    if (category < 0) Py_RETURN_NONE;
    return PyLong_FromLong(category);
}

/* packetin/frames.py destination_address, for a frame of `n` bytes at `f`: the offset of the destination address
 * and its size (4 or 16), or size 0 (b""). The VLAN TPIDs are frames.VLAN_TPIDS. */
static Py_ssize_t dst_address(const unsigned char *f, Py_ssize_t n, Py_ssize_t *size) {
    *size = 0;
    if (n < 14) return 0;
    Py_ssize_t off = 12;
    unsigned kind = (f[12] << 8) | f[13];
    while (kind == 0x8100 || kind == 0x88A8 || kind == 0x9100) {
        off += 4;
        if (n < off + 2) return 0;
        kind = (f[off] << 8) | f[off + 1];
    }
    Py_ssize_t ip = off + 2;
    if (kind == 0x0800 && n >= ip + 20 && f[ip] >= 0x45 && f[ip] <= 0x4F) { *size = 4; return ip + 16; }
    if (kind == 0x86DD && n >= ip + 40 && f[ip] >= 0x60 && f[ip] <= 0x6F) { *size = 16; return ip + 24; }
    return 0;
}

/* applied_to_keys(items, directions, egress, ingress, key, packet_in_type, rule_index, in_port_index, packet_index)
 * -> [key of each item]: packetin/fair_key.py AppliedToKey's keys in one call. An item of exactly `packet_in_type`
 * (PacketIn, whose fields are at those indexes) whose rule id
 * `directions` maps to `egress` (the very object) gets (rule id, in_port), to `ingress` (rule id, the frame's
 * destination address); any other item (a direction not known yet, neither, another type, a packet not bytes) is
 * given `key(item)`, the Python key, which learns directions. An item whose key equals the one before it (same
 * rule, port or address) is given that very key object: a read's keys come in runs, and FairShare.admit_read looks
 * a run's key up once. */
static PyObject *applied_to_keys(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9 || !PyList_CheckExact(args[0]) || !PyDict_CheckExact(args[1]) || !PyType_Check(args[5])
            || !PyType_IsSubtype((PyTypeObject *)args[5], &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "applied_to_keys(items: list, directions: dict, egress, ingress, key, "
                                         "packet_in_type: a tuple type, rule_index, in_port_index, packet_index)");
        return NULL;
    }
    PyObject *items = args[0], *directions = args[1], *egress = args[2], *ingress = args[3], *key = args[4];
    PyTypeObject *type = (PyTypeObject *)args[5];
    Py_ssize_t ix[3];
    for (int k = 0; k < 3; k++) {
        ix[k] = PyLong_AsSsize_t(args[k + 6]);
        if (ix[k] == -1 && PyErr_Occurred()) return NULL;
        if (ix[k] < 0) {
            PyErr_SetString(PyExc_ValueError, "applied_to_keys: a negative index");
            return NULL;
        }
    }
    Py_ssize_t rule_ix = ix[0], port_ix = ix[1], packet_ix = ix[2];
    Py_ssize_t need = rule_ix > port_ix ? rule_ix : port_ix;
    if (packet_ix > need) need = packet_ix;
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    PyObject *prev = NULL;  /* the key made here for the item before, if it was made here (a new reference) */
    PyObject *prev_way = NULL;  /* its direction: egress or ingress (borrowed: compared by identity only) */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items); i++) {  /* reread: `key` runs Python code */
        PyObject *item = PyList_GET_ITEM(items, i);
        Py_INCREF(item);
        PyObject *k = NULL, *way = NULL;
        if (Py_TYPE(item) == type && PyTuple_GET_SIZE(item) > need
                && PyBytes_CheckExact(PyTuple_GET_ITEM(item, packet_ix))) {
            PyObject *rule = PyTuple_GET_ITEM(item, rule_ix);
            PyObject *d = PyDict_GetItemWithError(directions, rule);  /* borrowed */
            if (d == NULL && PyErr_Occurred()) goto fail;
            if (d != NULL && (d == egress || d == ingress)) {
                way = d;
                PyObject *part;  /* the key's second member: the in_port, or the destination address */
                PyObject *packet = PyTuple_GET_ITEM(item, packet_ix);
                Py_ssize_t size = 0, at = 0;
                if (way == egress) {
                    part = Py_NewRef(PyTuple_GET_ITEM(item, port_ix));
                } else {
                    at = dst_address((const unsigned char *)PyBytes_AS_STRING(packet), PyBytes_GET_SIZE(packet),
                                     &size);
                    part = NULL;
                }
                int same = 0;
                if (prev != NULL && prev_way == way) {
                    int eq = PyObject_RichCompareBool(PyTuple_GET_ITEM(prev, 0), rule, Py_EQ);
                    if (eq < 0) { Py_XDECREF(part); goto fail; }
                    if (eq) {
                        PyObject *was = PyTuple_GET_ITEM(prev, 1);
                        if (way == egress) {
                            eq = PyObject_RichCompareBool(was, part, Py_EQ);
                            if (eq < 0) { Py_DECREF(part); goto fail; }
                            same = eq;
                        } else {
                            same = PyBytes_GET_SIZE(was) == size
                                   && memcmp(PyBytes_AS_STRING(was), PyBytes_AS_STRING(packet) + at, size) == 0;
                        }
                    }
                }
                if (same) {
                    Py_XDECREF(part);
                    k = Py_NewRef(prev);
                } else {
                    if (part == NULL) {
                        part = PyBytes_FromStringAndSize(PyBytes_AS_STRING(packet) + at, size);
                        if (part == NULL) goto fail;
                    }
                    k = PyTuple_Pack(2, rule, part);
                    Py_DECREF(part);
                    if (k == NULL) goto fail;
                }
            }
        }
        if (k == NULL) {  /* the Python key: it may learn a direction, or make a key of another shape */
            k = PyObject_CallOneArg(key, item);
            if (k == NULL) goto fail;
            Py_CLEAR(prev);
            prev_way = NULL;
        } else {
            Py_XSETREF(prev, Py_NewRef(k));
            prev_way = way;
        }
        Py_DECREF(item);
        int status = PyList_Append(out, k);
        Py_DECREF(k);
        if (status < 0) {
            Py_XDECREF(prev);
            Py_DECREF(out);
            return NULL;
        }
        continue;
fail:
        Py_DECREF(item);
        Py_XDECREF(prev);
        Py_DECREF(out);
        return NULL;
    }
    Py_XDECREF(prev);
    return out;
}

static PyMethodDef module_methods[] = {
    {"logged_run_end", (PyCFunction)(void (*)(void))logged_run_end, METH_FASTCALL,
     "logged_run_end(items, start, end, packet_in_type, userdata_index, version, min_length, log_bit, reject_bit) "
     "-> the end of the run of plain logged packet-ins from start"},
    {"common_category", (PyCFunction)(void (*)(void))common_category, METH_FASTCALL,
     "common_category(items, packet_in_type, userdata_index, version, min_length) -> the category all items' "
     "userdata give, "
     "else None"},
    {"applied_to_keys", (PyCFunction)(void (*)(void))applied_to_keys, METH_FASTCALL,
     "applied_to_keys(items, directions, egress, ingress, key, packet_in_type, rule_index, in_port_index, "
     "packet_index) -> "
     "the fair-share key of each item"},
    {NULL}};

static PyMethodDef LayoutDecoder_methods[] = {
    {"decode", (PyCFunction)(void (*)(void))LayoutDecoder_decode, METH_FASTCALL,
     "decode(msg, received_at) -> PacketIn, as packetin.wire.decode_packet_in2"},
    {"decode_run", (PyCFunction)(void (*)(void))LayoutDecoder_decode_run, METH_FASTCALL,
     "decode_run(msgs, start, received_at, out, msg_type, experimenter) -> the index of the first message from "
     "start not read here; the packet-ins of learned layouts before it appended to out"},
    {"learn", (PyCFunction)LayoutDecoder_learn, METH_VARARGS,
     "learn(length, headers, fields, packet_start, packet_end): read messages of `length` this way"},
    {"clear", (PyCFunction)LayoutDecoder_clear, METH_NOARGS, "forget every layout"},
    {"counts", (PyCFunction)LayoutDecoder_counts, METH_NOARGS,
     "{'fast': messages read here, 'python': handed to the fallback, 'layouts': layouts held}"},
    {NULL}};

static PyTypeObject LayoutDecoderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "packetin._layout_fast.LayoutDecoder",
    .tp_basicsize = sizeof(LayoutDecoder),
    .tp_dealloc = (destructor)LayoutDecoder_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "LayoutDecoder(packet_in_type, fallback): NXT_PACKET_IN2 by learned layout, in C",
    .tp_methods = LayoutDecoder_methods,
    .tp_init = (initproc)LayoutDecoder_init,
    .tp_new = PyType_GenericNew,
};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "packetin._layout_fast",
                                       "NXT_PACKET_IN2 decoding by learned layout in C (see packetin/layouts.py).",
                                       -1, module_methods};

PyMODINIT_FUNC PyInit__layout_fast(void) {
    if (PyType_Ready(&LayoutDecoderType) < 0) return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (m == NULL) return NULL;
    Py_INCREF(&LayoutDecoderType);
    if (PyModule_AddObject(m, "LayoutDecoder", (PyObject *)&LayoutDecoderType) < 0) {
        Py_DECREF(&LayoutDecoderType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
