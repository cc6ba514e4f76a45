/* auditlog.packet.decode_frame's common case in C, part of the auditlog._record_fast module.
 *
 * FrameDecoder(summary_type, fallback).decode(frame): for an untagged IPv4 frame without options, not a
 * fragment, carrying a whole UDP header, or a TCP header whose first 20 bytes are there -- decode_frame's own
 * fast path, what nearly every packet-in of a flood is -- it builds the PacketSummary itself; any other frame
 * (and anything but bytes) goes to `fallback` (decode_frame), so the summary is decode_frame's either way.
 * tests/unit/auditlog/test_frame_fast.py compares the two on every kind of frame. Addresses become text
 * through a cache per decoder (an IPv4 pair -> its two str), as decode_frame's _V4_PAIRS: a node's
 * packet-ins name few address pairs, and the same str objects make the encoder's cache lookups cheaper.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdio.h>

#include "_frame_fast.h"

#define ETH_TYPE_IPV4 0x0800
#define IPPROTO_TCP_ 6
#define IPPROTO_UDP_ 17
#define MAX_PAIRS 4096 /* as auditlog/packet.py's _V4_PAIRS: emptied when it holds this many */
#define SUMMARY_FIELDS 15

typedef struct {
    PyObject_HEAD
    PyTypeObject *summary;  /* auditlog.packet.PacketSummary (a tuple subclass, 15 fields) */
    PyObject *fallback;     /* auditlog.packet.decode_frame */
    PyObject *pairs;        /* int (8 address bytes, big-endian) -> (src text, dst text) */
    Py_ssize_t fast, slow;  /* frames decoded here, and handed to the fallback */
} FrameDecoder;

static PyObject *S_udp, *S_tcp, *I_ipv4, *I_four, *I_udp, *I_tcp;

static void FrameDecoder_dealloc(FrameDecoder *self) {
    Py_XDECREF(self->summary);
    Py_XDECREF(self->fallback);
    Py_XDECREF(self->pairs);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* FrameDecoder(summary_type, fallback) */
static int FrameDecoder_init(FrameDecoder *self, PyObject *args, PyObject *kwds) {
    PyObject *summary, *fallback;
    if (!PyArg_ParseTuple(args, "O!O", &PyType_Type, &summary, &fallback)) return -1;
    if (!PyType_IsSubtype((PyTypeObject *)summary, &PyTuple_Type) || !PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_TypeError, "FrameDecoder(summary_type, fallback): a tuple type and a callable");
        return -1;
    }
    /* the summary's width: its _fields, as decode_frame builds it */
    PyObject *fields = PyObject_GetAttrString(summary, "_fields");
    if (fields == NULL) return -1;
    Py_ssize_t width = PyTuple_Check(fields) ? PyTuple_GET_SIZE(fields) : -1;
    Py_DECREF(fields);
    if (width != SUMMARY_FIELDS) {
        PyErr_Format(PyExc_TypeError, "FrameDecoder: the summary type must have %d fields", SUMMARY_FIELDS);
        return -1;
    }
    Py_XSETREF(self->summary, (PyTypeObject *)Py_NewRef(summary));
    Py_XSETREF(self->fallback, Py_NewRef(fallback));
    Py_XSETREF(self->pairs, PyDict_New());
    return self->pairs == NULL ? -1 : 0;
}

static PyObject *v4_text(const unsigned char *a) {
    char text[16];
    int n = snprintf(text, sizeof text, "%u.%u.%u.%u", a[0], a[1], a[2], a[3]);
    return PyUnicode_FromStringAndSize(text, n);
}

/* (src text, dst text) of the 8 address bytes at `a`, from the cache or made and cached; NULL on error */
static PyObject *address_pair(FrameDecoder *self, const unsigned char *a) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = (v << 8) | a[i];
    PyObject *key = PyLong_FromUnsignedLongLong(v);
    if (key == NULL) return NULL;
    PyObject *pair = PyDict_GetItemWithError(self->pairs, key);
    if (pair != NULL) {
        Py_DECREF(key);
        return Py_NewRef(pair);
    }
    if (PyErr_Occurred()) {
        Py_DECREF(key);
        return NULL;
    }
    PyObject *src = v4_text(a), *dst = src ? v4_text(a + 4) : NULL;
    pair = dst ? PyTuple_Pack(2, src, dst) : NULL;
    Py_XDECREF(src);
    Py_XDECREF(dst);
    if (pair != NULL && PyDict_GET_SIZE(self->pairs) >= MAX_PAIRS) PyDict_Clear(self->pairs);
    if (pair != NULL && PyDict_SetItem(self->pairs, key, pair) < 0) Py_CLEAR(pair);
    Py_DECREF(key);
    return pair;
}

/* decode(frame) -> PacketSummary: decode_frame(frame), its common case built here */
static PyObject *FrameDecoder_decode(FrameDecoder *self, PyObject *frame) {
    if (!PyBytes_CheckExact(frame)) goto fall_back;
    Py_ssize_t n = PyBytes_GET_SIZE(frame);
    const unsigned char *f = (const unsigned char *)PyBytes_AS_STRING(frame);
    /* decode_frame's fast path: ethertype, version/IHL, flags/fragment offset, protocol (_V4_FAST) */
    if (n < 42 || ((f[12] << 8) | f[13]) != ETH_TYPE_IPV4 || f[14] != 0x45 || (((f[20] << 8) | f[21]) & 0x3FFF))
        goto fall_back;
    int proto = f[23];
    if (!(proto == IPPROTO_UDP_ || (proto == IPPROTO_TCP_ && n >= 54))) goto fall_back;
    long sport = (f[34] << 8) | f[35], dport = (f[36] << 8) | f[37];
    PyObject *pair = address_pair(self, f + 26);
    if (pair == NULL) return NULL;
    PyObject *out = self->summary->tp_alloc(self->summary, SUMMARY_FIELDS);
    PyObject *sp = PyLong_FromLong(sport), *dp = PyLong_FromLong(dport), *len = PyLong_FromSsize_t(n);
    PyObject *flags = Py_NewRef(Py_None), *truncated = Py_NewRef(Py_False);
    if (proto == IPPROTO_TCP_) {
        unsigned doff = f[46];
        Py_SETREF(flags, PyLong_FromLong((long)(((doff & 1) << 8) | f[47])));
        Py_SETREF(truncated, Py_NewRef(n - 34 < (Py_ssize_t)((doff >> 4) * 4) ? Py_True : Py_False));
    }
    if (out == NULL || sp == NULL || dp == NULL || len == NULL || flags == NULL) {
        Py_XDECREF(out); Py_XDECREF(sp); Py_XDECREF(dp); Py_XDECREF(len); Py_XDECREF(flags);
        Py_DECREF(truncated); Py_DECREF(pair);
        return NULL;
    }
    /* (eth_type, vlan, ip_version, src_ip, dst_ip, protocol, transport, src_port, dst_port, icmp_type,
     *  icmp_code, tcp_flags, fragment, truncated, length): the steals below hand over every new reference */
    PyObject *items[SUMMARY_FIELDS] = {
        Py_NewRef(I_ipv4), Py_NewRef(Py_None), Py_NewRef(I_four), Py_NewRef(PyTuple_GET_ITEM(pair, 0)),
        Py_NewRef(PyTuple_GET_ITEM(pair, 1)), Py_NewRef(proto == IPPROTO_UDP_ ? I_udp : I_tcp),
        Py_NewRef(proto == IPPROTO_UDP_ ? S_udp : S_tcp), sp, dp, Py_NewRef(Py_None), Py_NewRef(Py_None), flags,
        Py_NewRef(Py_False), truncated, len};
    for (int i = 0; i < SUMMARY_FIELDS; i++) PyTuple_SET_ITEM(out, i, items[i]);
    Py_DECREF(pair);
    self->fast++;
    return out;
fall_back:
    self->slow++;
    return PyObject_CallOneArg(self->fallback, frame);
}

static PyObject *FrameDecoder_counts(FrameDecoder *self, PyObject *Py_UNUSED(ignored)) {
    return Py_BuildValue("{s:n,s:n}", "fast", self->fast, "python", self->slow);
}

static PyMethodDef FrameDecoder_methods[] = {
    {"decode", (PyCFunction)FrameDecoder_decode, METH_O, "decode(frame) -> PacketSummary, as decode_frame(frame)"},
    {"counts", (PyCFunction)FrameDecoder_counts, METH_NOARGS,
     "{'fast': frames decoded in C, 'python': frames handed to the fallback}"},
    {NULL}};

static PyTypeObject FrameDecoderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "auditlog._record_fast.FrameDecoder",
    .tp_basicsize = sizeof(FrameDecoder),
    .tp_dealloc = (destructor)FrameDecoder_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "FrameDecoder(summary_type, fallback): decode_frame's common case in C",
    .tp_methods = FrameDecoder_methods,
    .tp_init = (initproc)FrameDecoder_init,
    .tp_new = PyType_GenericNew,
};

int frame_decoder_add(PyObject *module) {
    if (PyType_Ready(&FrameDecoderType) < 0) return -1;
    if (!(S_udp = PyUnicode_InternFromString("udp")) || !(S_tcp = PyUnicode_InternFromString("tcp")) ||
        !(I_ipv4 = PyLong_FromLong(ETH_TYPE_IPV4)) || !(I_four = PyLong_FromLong(4)) ||
        !(I_udp = PyLong_FromLong(IPPROTO_UDP_)) || !(I_tcp = PyLong_FromLong(IPPROTO_TCP_)))
        return -1;
    Py_INCREF(&FrameDecoderType);
    if (PyModule_AddObject(module, "FrameDecoder", (PyObject *)&FrameDecoderType) < 0) {
        Py_DECREF(&FrameDecoderType);
        return -1;
    }
    return 0;
}
