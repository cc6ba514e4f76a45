/* The audit record encoder's per-packet work in C: auditlog.record.RecordEncoder.encode_positional, for the
 * records whose rule, Pods, network, OVS and flow texts the Python encoder has already worked out.
 *
 * FastEncoder(encoder, consts) reads the Python encoder's caches (dicts it fills; never replaced) and builds
 * the record's three texts (chain.RecordText) straight into ASCII strings, computing a new flow's Community ID
 * (SHA-1, base64: auditlog/_digest_fast.c) itself. Anything else -- a cache miss, a coarse record, a non-ASCII text, a count past
 * JSON's safe integers, an address it cannot pack -- goes to the Python encoder, which fills the caches,
 * so the text is always the Python encoder's; tests/unit/auditlog/test_record_fast.py compares the two.
 * Decisions are all taken before the event id is drawn, so a fallback never skips an id.
 *
 * seal_run: chain.RecordText.seal for a run of records whose texts are ASCII (SHA-256: auditlog/_digest_fast.c), for
 * auditlog/sealing.py, which seals any other record in Python; tests/unit/auditlog/test_seal_run.py compares.
 *
 * FrameDecoder (auditlog/_frame_fast.c, added to this module at its init): packet.decode_frame's common case.
 *
 * Aggregator (auditlog/_aggregate_fast.c, added at init too): auditlog.aggregate.Aggregator.
 *
 * sealed_parts (auditlog/_scan_fast.c, added at init too): auditlog.syslog.sealed_line.scan_sealed's byte work.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <arpa/inet.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <structmember.h>

#include "_aggregate_fast.h"
#include "_digest_fast.h"
#include "_frame_fast.h"
#include "_scan_fast.h"

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* base64 with padding, as binascii.b2a_base64(newline=False); `out` holds 4 * ceil(n / 3) bytes */
static size_t base64(const unsigned char *in, size_t n, char *out) {
    size_t o = 0, i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 | in[i + 2];
        out[o++] = B64[v >> 18]; out[o++] = B64[(v >> 12) & 63]; out[o++] = B64[(v >> 6) & 63]; out[o++] = B64[v & 63];
    }
    if (n - i == 1) {
        uint32_t v = (uint32_t)in[i] << 16;
        out[o++] = B64[v >> 18]; out[o++] = B64[(v >> 12) & 63]; out[o++] = '='; out[o++] = '=';
    } else if (n - i == 2) {
        uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8;
        out[o++] = B64[v >> 18]; out[o++] = B64[(v >> 12) & 63]; out[o++] = B64[(v >> 6) & 63]; out[o++] = '=';
    }
    return o;
}

/* ---- an ASCII text under construction ------------------------------------------------------------- */

typedef struct {
    char *p;
    size_t len, cap;
    char small[2048];
} Buf;

static void buf_init(Buf *b) { b->p = b->small; b->len = 0; b->cap = sizeof b->small; }
static void buf_free(Buf *b) { if (b->p != b->small) PyMem_Free(b->p); }

/* 0, or -1 with MemoryError set */
static int put(Buf *b, const char *s, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = (b->len + n) * 2;
        char *p = PyMem_Malloc(cap);
        if (p == NULL) { PyErr_NoMemory(); return -1; }
        memcpy(p, b->p, b->len);
        buf_free(b);
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    return 0;
}

#define PUT_LIT(b, lit) put((b), (lit), sizeof(lit) - 1)

/* An ASCII str's bytes, or NULL (no exception) when `s` is no str or not ASCII: the caller falls back. */
static inline const char *ascii_of(PyObject *s, Py_ssize_t *n) {
    if (!PyUnicode_CheckExact(s) || !PyUnicode_IS_ASCII(s)) return NULL;
    *n = PyUnicode_GET_LENGTH(s);
    return (const char *)PyUnicode_DATA(s);
}

/* a non-negative count in decimal (callers hold nothing negative: safe_count, small_int) */
static int put_ll(Buf *b, long long v) {
    char tmp[20];
    return put(b, tmp, np_decimal((unsigned long long)v, tmp));
}

static PyObject *buf_str(Buf *b) {
    PyObject *s = PyUnicode_New((Py_ssize_t)b->len, 127);
    if (s != NULL) memcpy(PyUnicode_DATA(s), b->p, b->len);
    return s;
}

/* ---- the encoder ---------------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *encoder, *fallback;                 /* RecordEncoder, its bound encode_positional */
    PyObject *rules, *pairs, *networks, *community, *ovs_texts;  /* its cache dicts */
    PyObject *rules_get, *ip_table;               /* ctx.rules.get, ctx.pods.ip_table */
    PyObject *id_prefix, *id_next;                /* EventIds' prefix and counter */
    PyObject *record_text;                        /* chain.RecordText */
    PyObject *timestamp_key, *seq_key, *fragment, *truncated;  /* texts of record.py / chain.py */
    long long disposition_bits, safe_integer;
    Py_ssize_t max_cached;
    long long ms, second;                         /* the last timestamp made, as record._timestamp keeps it */
    char ms_text[24];                             /* its text: the second's (kept while it lasts), .mmmZ */
    Py_ssize_t fast, slow;                        /* records built here, and handed to the Python encoder */
    /* Where RecordText keeps head, mid, tail, seq, verdict and received (its __slots__): a record is then made
     * as RecordText(head, mid, tail) makes it, without the Python __init__ (record_slots). 0: call the class. */
    Py_ssize_t slots[6];
    /* Between begin_batch and end_batch (one read's records): the Pod table asked once, and each rule id's
     * current rule asked once (rule id -> rule), instead of a Python call of each per record. Neither changes
     * while a read is handled: both are swapped on the event loop, between reads. NULL outside a batch. */
    PyObject *batch_table, *batch_rules;
    /* The lone path's compact state (encode_raw): per template key, the texts of the records encode built for
     * it, copied into C memory. NULL until the first. */
    struct Template **tmpl;
    Py_ssize_t tmpl_len;
    PyObject *tmpl_table;  /* the Pod table every template was worked out for (a new one empties them) */
} FastEncoder;

static PyObject *S_rule, *S_after_dst, *S_after_start, *S_said, *S_priority, *S_verdict, *S_network_direction,
    *S_pairs_of, *S_received, *S_received_at;

static void templates_clear(FastEncoder *self);

static void FastEncoder_dealloc(FastEncoder *self) {
    Py_XDECREF(self->encoder); Py_XDECREF(self->fallback);
    Py_XDECREF(self->rules); Py_XDECREF(self->pairs); Py_XDECREF(self->networks);
    Py_XDECREF(self->community); Py_XDECREF(self->ovs_texts);
    Py_XDECREF(self->rules_get); Py_XDECREF(self->ip_table);
    Py_XDECREF(self->id_prefix); Py_XDECREF(self->id_next); Py_XDECREF(self->record_text);
    Py_XDECREF(self->timestamp_key); Py_XDECREF(self->seq_key); Py_XDECREF(self->fragment);
    Py_XDECREF(self->truncated);
    Py_XDECREF(self->batch_table); Py_XDECREF(self->batch_rules);
    templates_clear(self);
    PyMem_Free(self->tmpl);
    Py_XDECREF(self->tmpl_table);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *item(PyObject *consts, const char *name, int want_dict) {
    PyObject *v = PyDict_GetItemString(consts, name);
    if (v == NULL) {
        PyErr_Format(PyExc_KeyError, "FastEncoder: consts has no %s", name);
        return NULL;
    }
    if (want_dict && !PyDict_CheckExact(v)) {
        PyErr_Format(PyExc_TypeError, "FastEncoder: %s must be a dict", name);
        return NULL;
    }
    Py_INCREF(v);
    return v;
}

static const char *RECORD_SLOTS[6] = {"head", "mid", "tail", "seq", "verdict", "received"};
static PyObject *F_zero, *I_zero;  /* 0.0 and 0: RecordText's `received` and `seq` until set */

/* The offsets of RecordText's six slots in `slots` when the type is a plain __slots__ class of exactly those
 * (object's __new__, each a member descriptor of an object): what RecordText.__init__ sets, head, mid and tail
 * from its arguments, seq 0, verdict None, received 0.0. Else slots[0] = 0 and records are made by calling it. */
static void record_slots(PyObject *type, Py_ssize_t *slots) {
    slots[0] = 0;
    if (!PyType_Check(type) || ((PyTypeObject *)type)->tp_new != PyBaseObject_Type.tp_new) return;
    PyObject *names = PyObject_GetAttrString(type, "__slots__");
    Py_ssize_t n = names != NULL && PyTuple_Check(names) ? PyTuple_GET_SIZE(names) : -1;
    Py_XDECREF(names);
    PyErr_Clear();
    if (n != 6) return;
    Py_ssize_t found[6];
    for (int i = 0; i < 6; i++) {
        PyObject *d = PyObject_GetAttrString(type, RECORD_SLOTS[i]);
        if (d == NULL) {
            PyErr_Clear();
            return;
        }
        int ok = Py_IS_TYPE(d, &PyMemberDescr_Type) && ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX
                 && !(((PyMemberDescrObject *)d)->d_member->flags & READONLY);
        found[i] = ok ? ((PyMemberDescrObject *)d)->d_member->offset : 0;
        Py_DECREF(d);
        if (found[i] <= 0) return;
    }
    memcpy(slots, found, sizeof found);
}

/* RecordText(head, mid, tail) with its verdict: made in place where record_slots found the slots */
static PyObject *new_record(FastEncoder *self, PyObject *head, PyObject *mid, PyObject *tail, PyObject *verdict) {
    if (self->slots[0] == 0) {
        PyObject *record = PyObject_CallFunctionObjArgs(self->record_text, head, mid, tail, NULL);
        if (record != NULL && PyObject_SetAttr(record, S_verdict, verdict) < 0) Py_CLEAR(record);
        return record;
    }
    PyTypeObject *type = (PyTypeObject *)self->record_text;
    PyObject *record = type->tp_alloc(type, 0);
    if (record == NULL) return NULL;
    PyObject *values[6] = {head, mid, tail, I_zero, verdict, F_zero};
    for (int i = 0; i < 6; i++) *(PyObject **)((char *)record + self->slots[i]) = Py_NewRef(values[i]);
    return record;
}

/* FastEncoder(encoder, consts): consts names the encoder's caches, callables and the record's fixed texts. */
static int FastEncoder_init(FastEncoder *self, PyObject *args, PyObject *kwds) {
    PyObject *encoder, *consts, *v;
    if (!PyArg_ParseTuple(args, "OO!", &encoder, &PyDict_Type, &consts)) return -1;
    Py_INCREF(encoder);
    self->encoder = encoder;
    if (!(self->fallback = item(consts, "fallback", 0)) || !(self->rules = item(consts, "rules", 1)) ||
        !(self->pairs = item(consts, "pairs", 1)) || !(self->networks = item(consts, "networks", 1)) ||
        !(self->community = item(consts, "community", 1)) || !(self->ovs_texts = item(consts, "ovs_texts", 1)) ||
        !(self->rules_get = item(consts, "rules_get", 0)) || !(self->ip_table = item(consts, "ip_table", 0)) ||
        !(self->id_prefix = item(consts, "id_prefix", 0)) || !(self->id_next = item(consts, "id_next", 0)) ||
        !(self->record_text = item(consts, "record_text", 0)) ||
        !(self->timestamp_key = item(consts, "timestamp_key", 0)) || !(self->seq_key = item(consts, "seq_key", 0)) ||
        !(self->fragment = item(consts, "fragment", 0)) || !(self->truncated = item(consts, "truncated", 0)))
        return -1;
    Py_ssize_t n;
    if (!ascii_of(self->id_prefix, &n) || !ascii_of(self->timestamp_key, &n) || !ascii_of(self->seq_key, &n) ||
        !ascii_of(self->fragment, &n) || !ascii_of(self->truncated, &n)) {
        PyErr_SetString(PyExc_TypeError, "FastEncoder: the fixed texts and the id prefix must be ASCII str");
        return -1;
    }
    if (!(v = PyDict_GetItemString(consts, "disposition_bits")) || (self->disposition_bits = PyLong_AsLongLong(v)) < 0 ||
        !(v = PyDict_GetItemString(consts, "safe_integer")) || (self->safe_integer = PyLong_AsLongLong(v)) < 0 ||
        !(v = PyDict_GetItemString(consts, "max_cached")) || (self->max_cached = PyLong_AsSsize_t(v)) < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "FastEncoder: bad disposition_bits / safe_integer / max_cached");
        return -1;
    }
    self->ms = self->second = -1;
    record_slots(self->record_text, self->slots);
    return 0;
}

/* The UTC text of epoch seconds `t` to the nearest millisecond (record._timestamp); 0, or 1 to fall back. */
static int timestamp(FastEncoder *self, double t, char *out, size_t *len) {
    double x = t * 1000.0;
    if (!isfinite(x) || x < 0 || x > 253402300799000.0) return 1;
    long long ms = (long long)nearbyint(x);  /* round half to even, as Python's round() */
    if (ms != self->ms) {
        long long seconds = ms / 1000, millis = ms % 1000;
        if (seconds != self->second) {  /* gmtime_r and strftime's text, in this module's code (_digest_fast.c) */
            np_utc_second(seconds, self->ms_text);
            self->second = seconds;
        }
        /* f"{second}.{millis:03d}Z" */
        self->ms_text[19] = '.';
        self->ms_text[20] = (char)('0' + millis / 100);
        self->ms_text[21] = (char)('0' + millis / 10 % 10);
        self->ms_text[22] = (char)('0' + millis % 10);
        self->ms_text[23] = 'Z';
        self->ms = ms;
    }
    memcpy(out, self->ms_text, sizeof self->ms_text);
    *len = sizeof self->ms_text;
    return 0;
}

/* The Community ID member ("community_id":"1:...",) of a TCP/UDP/SCTP flow between the packed addresses `sa`
 * and `da` (`alen` bytes each) into `out`; its length. community_id._ported's bytes, hashed and encoded. */
static size_t community_member(const unsigned char *sa, const unsigned char *da, size_t alen, long proto, long sport,
                               long dport, char out[64]) {
    unsigned char data[40];
    int cmp = memcmp(sa, da, alen);
    int forward = cmp < 0 || (cmp == 0 && sport <= dport);
    size_t n = 0;
    data[n++] = 0; data[n++] = 0;  /* seed 0 */
    memcpy(data + n, forward ? sa : da, alen); n += alen;
    memcpy(data + n, forward ? da : sa, alen); n += alen;
    long p1 = forward ? sport : dport, p2 = forward ? dport : sport;
    data[n++] = (unsigned char)proto; data[n++] = 0;
    data[n++] = (unsigned char)(p1 >> 8); data[n++] = (unsigned char)p1;
    data[n++] = (unsigned char)(p2 >> 8); data[n++] = (unsigned char)p2;
    unsigned char digest[20];
    np_sha1(data, n, digest);
    static const char head[] = "\"community_id\":\"1:";
    size_t t = sizeof head - 1;
    memcpy(out, head, t);
    t += base64(digest, 20, out + t);
    memcpy(out + t, "\",", 2);
    return t + 2;
}

/* The Community ID member of a TCP/UDP/SCTP flow (community_id._ported), or NULL with no exception to fall
 * back (an address inet_pton refuses, two IP versions), or NULL with an exception. */
static PyObject *community_text(PyObject *src_ip, PyObject *dst_ip, long proto, long sport, long dport) {
    Py_ssize_t sn = 0, dn = 0;
    const char *s = ascii_of(src_ip, &sn), *d = ascii_of(dst_ip, &dn);
    char sz[64], dz[64];
    unsigned char sa[16], da[16];
    if (!s || !d || sn >= 64 || dn >= 64) return NULL;
    memcpy(sz, s, sn); sz[sn] = 0;
    memcpy(dz, d, dn); dz[dn] = 0;
    int sv6 = memchr(s, ':', sn) != NULL, dv6 = memchr(d, ':', dn) != NULL;
    if (sv6 != dv6) return NULL;
    /* a dotted quad read here (the common case, no libc call), anything else by inet_pton */
    if (!(!sv6 && np_ipv4(s, (size_t)sn, sa)) && inet_pton(sv6 ? AF_INET6 : AF_INET, sz, sa) != 1) return NULL;
    if (!(!dv6 && np_ipv4(d, (size_t)dn, da)) && inet_pton(dv6 ? AF_INET6 : AF_INET, dz, da) != 1) return NULL;
    char text[64];
    size_t t = community_member(sa, da, sv6 ? 16 : 4, proto, sport, dport, text);
    return PyUnicode_FromStringAndSize(text, (Py_ssize_t)t);
}

/* dict[key] = value, the dict emptied first when it holds max_cached (record._cache) */
static int cache_put(FastEncoder *self, PyObject *cache, PyObject *key, PyObject *value) {
    if (PyDict_GET_SIZE(cache) >= self->max_cached) PyDict_Clear(cache);
    return PyDict_SetItem(cache, key, value);
}

/* An int argument that fits JSON's safe integers and a long long; 1 (no exception) otherwise. */
static int safe_count(FastEncoder *self, PyObject *o, long long *v) {
    if (!PyLong_CheckExact(o)) return 1;
    int overflow;
    *v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || *v < 0 || *v > self->safe_integer) { PyErr_Clear(); return 1; }
    return 0;
}

/* A small non-negative int field of a frame or packet-in (a port, an ICMP type or code); -1 if None,
 * -2 (no exception) if anything else. */
static long small_int(PyObject *o) {
    if (o == Py_None) return -1;
    if (!PyLong_CheckExact(o)) return -2;
    long v = PyLong_AsLong(o);
    if (v < 0 || v > 0xFFFF) { PyErr_Clear(); return -2; }
    return v;
}

/* ---- a record's texts from its parts ----------------------------------------------------------------- */

/* An ASCII text: where its bytes are and how many (a Python str's, or a copy kept in C). */
typedef struct { const char *p; size_t n; } Text;

/* What a record takes from its rule, its Pods, its network and OVS members, the flow's Community ID and the
 * record.py / chain.py constants: texts the encoder's caches hold, none made per packet. */
typedef struct {
    Text said0, said1, proto, src_pre, src_ep, dst_pre, dst_ep;     /* the message's */
    Text ts_key, dst_head, after_dst, prefix, after_start;           /* head */
    Text comm, net_before, net_after;
    Text mid_head, frag, ovs, priority, seq_key;                     /* mid */
    Text tail_head, trunc, tail_rest, src_head;                      /* tail */
} RecordTexts;

/* What a record takes from its packet(s): counts, ports, flags, times and its event id. */
typedef struct {
    long long packets, bytes, offloaded;
    long src_port, dst_port, icmp_type, icmp_code;  /* -1: none */
    int fragment, truncated;
    char first[32], last[32];
    size_t first_n, last_n;
    char id[16];
} RecordValues;

#define BPUT(b, t) do { if (put((b), (t).p, (t).n) < 0) return -1; } while (0)
#define BLIT(b, lit) do { if (PUT_LIT((b), lit) < 0) return -1; } while (0)
#define BNUM(b, v) do { if (put_ll((b), (v)) < 0) return -1; } while (0)
#define BRAW(b, s, n) do { if (put((b), (s), (n)) < 0) return -1; } while (0)

/* The record's head, mid and tail texts (chain.RecordText's) into hb, mb and tb, and its message into msg;
 * 0, or -1 with MemoryError set. The one place a record's text is laid out in C. */
static int build_record(const RecordTexts *t, const RecordValues *v, Buf *hb, Buf *mb, Buf *tb, Buf *msg) {
    /* message: said, the transport, both ends, ICMP, the count, the rule */
    BPUT(msg, t->said0); BPUT(msg, t->proto); BLIT(msg, " ");
    if (v->src_port >= 0) { BPUT(msg, t->src_pre); BNUM(msg, v->src_port); } else BPUT(msg, t->src_ep);
    BLIT(msg, " -> ");
    if (v->dst_port >= 0) { BPUT(msg, t->dst_pre); BNUM(msg, v->dst_port); } else BPUT(msg, t->dst_ep);
    if (v->icmp_type >= 0) {
        BLIT(msg, " type "); BNUM(msg, v->icmp_type);
        if (v->icmp_code >= 0) { BLIT(msg, " code "); BNUM(msg, v->icmp_code); }
    }
    BLIT(msg, ", ");
    if (v->packets == 1) BLIT(msg, "1 packet"); else { BNUM(msg, v->packets); BLIT(msg, " packets"); }
    BPUT(msg, t->said1);

    /* head: @timestamp, destination, ecs, event, labels, message, network, npaudit up to its aggregate */
    BPUT(hb, t->ts_key); BRAW(hb, v->first, v->first_n); BLIT(hb, "\"");
    BPUT(hb, t->dst_head);
    if (v->dst_port >= 0) { BLIT(hb, ",\"port\":"); BNUM(hb, v->dst_port); }
    BLIT(hb, "}");
    BPUT(hb, t->after_dst); BRAW(hb, v->last, v->last_n);
    BLIT(hb, "\",\"id\":\""); BPUT(hb, t->prefix); BRAW(hb, v->id, sizeof v->id);
    BLIT(hb, "\",\"kind\":\"event\",\"outcome\":\"success\",\"start\":\"");
    BRAW(hb, v->first, v->first_n); BPUT(hb, t->after_start); BRAW(hb, msg->p, msg->len); BLIT(hb, "\"");
    BLIT(hb, ",\"network\":{\"bytes\":"); BNUM(hb, v->bytes); BLIT(hb, ",");
    BPUT(hb, t->comm); BPUT(hb, t->net_before); BLIT(hb, "\"packets\":"); BNUM(hb, v->packets);
    BPUT(hb, t->net_after);
    BLIT(hb, "},\"npaudit\":{\"aggregate\":{\"bytes\":"); BNUM(hb, v->bytes);
    BLIT(hb, ",\"first\":\""); BRAW(hb, v->first, v->first_n);
    BLIT(hb, "\",\"last\":\""); BRAW(hb, v->last, v->last_n);
    BLIT(hb, "\",\"offloaded_packets\":"); BNUM(hb, v->offloaded);
    BLIT(hb, ",\"packets\":"); BNUM(hb, v->packets); BLIT(hb, "},");

    /* mid: chain_format, the destination Pod, disposition, fragment, icmp, ovs, priority, "seq": */
    BPUT(mb, t->mid_head);
    if (v->fragment) BPUT(mb, t->frag);
    if (v->icmp_type >= 0) {
        BLIT(mb, "\"icmp\":{");
        if (v->icmp_code >= 0) { BLIT(mb, "\"code\":"); BNUM(mb, v->icmp_code); BLIT(mb, ","); }
        BLIT(mb, "\"type\":"); BNUM(mb, v->icmp_type); BLIT(mb, "},");
    }
    BPUT(mb, t->ovs); BPUT(mb, t->priority); BPUT(mb, t->seq_key);

    /* tail: the source Pod, tier, truncated, observer, orchestrator, related, rule, source */
    BPUT(tb, t->tail_head);
    if (v->truncated) BPUT(tb, t->trunc);
    BPUT(tb, t->tail_rest); BPUT(tb, t->src_head);
    if (v->src_port >= 0) { BLIT(tb, ",\"port\":"); BNUM(tb, v->src_port); }
    BLIT(tb, "}}");
    return 0;
}

/* ---- the lone path's compact state ------------------------------------------------------------------
 *
 * A record of one new key's first packet (a lone packet-in after a quiet spell) is built by encode_raw from the
 * NXT_PACKET_IN2's bytes and what is kept here: no Python object is made or read on the way but the few it
 * is given. After a quiet spell a record's cost is the memory its making touches; the caches encode reads
 * (dicts of tuples, the rule's and the Pods' text objects) are spread over the heap, a template is one block.
 *
 * A template is keyed by what a record's texts depend on beyond its packet: the rule id and disposition, both
 * IPv4 addresses, the protocol (TCP or UDP) and the packet-in's OVS place (cookie, table, in_port); it holds
 * the texts encode worked out for that key (the Community ID aside: per flow) with the rule and the Pod table
 * they were worked out for. encode stores one whenever it builds such a record itself; all are for one Pod table,
 * and a record worked out for another empties them (an old table is not kept alive by them). */
#define TMPL_CAP 1024          /* slots; emptied when half full, as record._cache empties a full cache */
#define IN_PORT_NONE 0xFFFFFFFFFFULL

typedef struct {
    uint64_t cookie, in_port;  /* in_port: IN_PORT_NONE when the packet-in named none */
    uint32_t rule_id, disposition, src, dst;
    uint8_t protocol, table_id;
} TKey;

typedef struct Template {
    TKey key;
    PyObject *rule, *verdict;           /* held: the rule the texts are for, the record's verdict */
    PyObject *src_ip, *dst_ip;          /* held: the addresses' texts, for the aggregator's key (encode_raw) */
    RecordTexts tx;                     /* pointing into `text`; tx.comm unused */
    char text[];
} Template;

static uint64_t tkey_hash(const TKey *k) {
    uint64_t h = k->cookie * 0x9E3779B97F4A7C15ULL;
    h ^= ((uint64_t)k->rule_id << 32 | k->disposition) + 0x632BE59BD9B4E019ULL + (h << 6) + (h >> 2);
    h ^= ((uint64_t)k->src << 32 | k->dst) + 0x85EBCA77C2B2AE63ULL + (h << 6) + (h >> 2);
    h ^= (k->in_port << 16 | (uint64_t)k->protocol << 8 | k->table_id) + (h << 6) + (h >> 2);
    return h ^ (h >> 29);
}

static int tkey_eq(const TKey *a, const TKey *b) {
    return a->cookie == b->cookie && a->in_port == b->in_port && a->rule_id == b->rule_id &&
           a->disposition == b->disposition && a->src == b->src && a->dst == b->dst && a->protocol == b->protocol &&
           a->table_id == b->table_id;
}

static void template_free(Template *t) {
    Py_XDECREF(t->rule); Py_XDECREF(t->verdict); Py_XDECREF(t->src_ip); Py_XDECREF(t->dst_ip);
    PyMem_Free(t);
}

static void templates_clear(FastEncoder *self) {
    if (self->tmpl == NULL) return;
    for (Py_ssize_t i = 0; i < TMPL_CAP; i++)
        if (self->tmpl[i] != NULL) { template_free(self->tmpl[i]); self->tmpl[i] = NULL; }
    self->tmpl_len = 0;
}

/* The slot of `k`: its template's, or the empty one where it would go. */
static Template **template_slot(FastEncoder *self, const TKey *k) {
    size_t i = (size_t)tkey_hash(k) & (TMPL_CAP - 1);
    while (self->tmpl[i] != NULL && !tkey_eq(&self->tmpl[i]->key, k)) i = (i + 1) & (TMPL_CAP - 1);
    return &self->tmpl[i];
}

/* Keep the texts of a record encode built (tx, its comm aside) under `k`; 0, or -1 with MemoryError set. */
static int template_store(FastEncoder *self, const TKey *k, PyObject *rule, PyObject *table, PyObject *verdict,
                          PyObject *src_ip, PyObject *dst_ip, const RecordTexts *tx) {
    if (self->tmpl == NULL && !(self->tmpl = PyMem_Calloc(TMPL_CAP, sizeof(Template *)))) {
        PyErr_NoMemory();
        return -1;
    }
    if (table != self->tmpl_table) {  /* the Pods changed: none of the texts kept holds, nor an old table alive */
        templates_clear(self);
        Py_XSETREF(self->tmpl_table, Py_NewRef(table));
    }
    Template **slot = template_slot(self, k);
    if (*slot != NULL) {  /* worked out again: for another rule */
        if ((*slot)->rule == rule) return 0;
        template_free(*slot);
        *slot = NULL;
        self->tmpl_len--;
    } else if (self->tmpl_len >= TMPL_CAP / 2) {
        templates_clear(self);
        slot = template_slot(self, k);
    }
    const Text *src = (const Text *)tx;
    size_t count = sizeof(RecordTexts) / sizeof(Text), size = 0;
    for (size_t i = 0; i < count; i++) size += src[i].n;
    Template *t = PyMem_Malloc(sizeof(Template) + size + 1);
    if (t == NULL) { PyErr_NoMemory(); return -1; }
    t->key = *k;
    t->rule = Py_NewRef(rule); t->verdict = Py_NewRef(verdict);
    t->src_ip = Py_NewRef(src_ip); t->dst_ip = Py_NewRef(dst_ip);
    Text *dst = (Text *)&t->tx;
    char *w = t->text;
    for (size_t i = 0; i < count; i++) {
        if (src[i].n) memcpy(w, src[i].p, src[i].n);
        dst[i].p = w; dst[i].n = src[i].n;
        w += src[i].n;
    }
    *slot = t;
    self->tmpl_len++;
    return 0;
}

/* What encode_raw reads of an NXT_PACKET_IN2 (packetin/wire.py decode_packet_in2's walk, same checks). */
typedef struct {
    uint64_t cookie, in_port;
    uint32_t rule_id, reg7, total_len;
    uint8_t table_id;
    const unsigned char *packet, *userdata;
    size_t packet_len, userdata_len;
} RawPin;

/* 0, or 1 when it is not a well-formed NXT_PACKET_IN2 (decode_packet_in2 would raise: the caller declines). */
static int raw_pin(const unsigned char *m, size_t end, RawPin *out) {
    if (end < 16 || ((size_t)m[2] << 8 | m[3]) != end) return 1;
    memset(out, 0, sizeof *out);
    out->in_port = IN_PORT_NONE;
    long long total_len = -1;
    size_t off = 16;
    while (off < end) {
        if (end - off < 4) return 1;
        size_t plen = (size_t)m[off + 2] << 8 | m[off + 3], pend = off + plen;
        if (plen < 4 || pend > end) return 1;
        unsigned ptype = (unsigned)m[off] << 8 | m[off + 1];
        if (ptype == 0) {  /* packet */
            out->packet = m + off + 4;
            out->packet_len = plen - 4;
        } else if (ptype == 6) {  /* metadata: OXM entries */
            size_t o = off + 4;
            while (o < pend) {
                if (pend - o < 4) return 1;
                size_t length = m[o + 3], v = o + 4;
                if (v + length > pend) return 1;
                unsigned oclass = (unsigned)m[o] << 8 | m[o + 1], field = m[o + 2] >> 1;
                size_t vlen = m[o + 2] & 1 ? length >> 1 : length;
                if (oclass == 0x8000) {
                    if (field == 0 && vlen == 4)
                        out->in_port = (uint64_t)m[v] << 24 | (uint64_t)m[v + 1] << 16 | m[v + 2] << 8 | m[v + 3];
                } else if (oclass == 0x8001) {
                    if (field == 3 && vlen == 8) {  /* xreg3: reg6 (rule id), reg7 */
                        out->rule_id = (uint32_t)m[v] << 24 | (uint32_t)m[v + 1] << 16 | m[v + 2] << 8 | m[v + 3];
                        out->reg7 = (uint32_t)m[v + 4] << 24 | (uint32_t)m[v + 5] << 16 | m[v + 6] << 8 | m[v + 7];
                    }
                } else if (oclass == 0x0001 && vlen == 4) {
                    uint32_t x = (uint32_t)m[v] << 24 | (uint32_t)m[v + 1] << 16 | m[v + 2] << 8 | m[v + 3];
                    if (field == 6) out->rule_id = x;
                    else if (field == 7) out->reg7 = x;
                }
                o = v + length;
            }
        } else if (ptype == 7) {  /* userdata */
            out->userdata = m + off + 4;
            out->userdata_len = plen - 4;
        } else if (ptype == 4) {  /* cookie, after 4 bytes of padding */
            if (plen < 16) return 1;
            uint64_t c = 0;
            for (int i = 0; i < 8; i++) c = c << 8 | m[off + 8 + i];
            out->cookie = c;
        } else if (ptype == 3) {
            if (plen < 5) return 1;
            out->table_id = m[off + 4];
        } else if (ptype == 5) {
            if (plen < 5) return 1;
        } else if (ptype == 1) {
            if (plen < 8) return 1;
            total_len = (long long)((uint32_t)m[off + 4] << 24 | (uint32_t)m[off + 5] << 16 | m[off + 6] << 8 |
                                    m[off + 7]);
        }
        off += (plen + 7) & ~(size_t)7;
    }
    out->total_len = total_len < 0 ? (uint32_t)out->packet_len : (uint32_t)total_len;
    return 0;
}

#define FALL_BACK(...) do { status = 1; goto done; } while (0)
#define FAIL() do { status = -1; goto done; } while (0)
#define ASCII(var, obj) do { if (!((var##_p) = ascii_of((obj), &(var##_n)))) FALL_BACK(); } while (0)
#define STR(var) const char *var##_p = NULL; Py_ssize_t var##_n = 0

/* An int of at most `max`, or -1 (no exception) if `o` is none such. */
static long long bounded(PyObject *o, unsigned long long max) {
    if (!PyLong_CheckExact(o)) return -1;
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) { PyErr_Clear(); return -1; }
    return v > max ? -1 : (long long)v;
}

/* encode has built a record itself: keep its texts as a template when encode_raw can build its key's records
 * (an untagged IPv4 frame, TCP or UDP, a rule id); 0, or -1 with an exception. */
static int lone_template(FastEncoder *self, PyObject *pin, PyObject *s, long long reg7, PyObject *rule,
                         PyObject *table, PyObject *verdict, const RecordTexts *tx) {
    PyObject *proto = PyTuple_GET_ITEM(s, 5), *transport = PyTuple_GET_ITEM(s, 6);
    long long eth = bounded(PyTuple_GET_ITEM(s, 0), 0xFFFF), version = bounded(PyTuple_GET_ITEM(s, 2), 255);
    long long protocol = bounded(proto, 255), rule_id = bounded(PyTuple_GET_ITEM(pin, 4), 0xFFFFFFFFULL);
    long long table_id = bounded(PyTuple_GET_ITEM(pin, 1), 255);
    if (eth != 0x0800 || PyTuple_GET_ITEM(s, 1) != Py_None || version != 4 || rule_id <= 0 || table_id < 0 ||
        !(protocol == 6 || protocol == 17) || !PyUnicode_CheckExact(transport) ||
        PyUnicode_CompareWithASCIIString(transport, protocol == 6 ? "tcp" : "udp") != 0)
        return 0;
    PyObject *cookie = PyTuple_GET_ITEM(pin, 2), *in_port = PyTuple_GET_ITEM(pin, 3);
    if (!PyLong_CheckExact(cookie)) return 0;
    unsigned long long c = PyLong_AsUnsignedLongLong(cookie);
    if (c == (unsigned long long)-1 && PyErr_Occurred()) { PyErr_Clear(); return 0; }
    long long port = in_port == Py_None ? (long long)IN_PORT_NONE : bounded(in_port, 0xFFFFFFFFULL);
    Py_ssize_t sn, dn;
    const char *src = ascii_of(PyTuple_GET_ITEM(s, 3), &sn), *dst = ascii_of(PyTuple_GET_ITEM(s, 4), &dn);
    unsigned char sa[4], da[4];
    if (port < 0 || !src || !dst || !np_ipv4(src, (size_t)sn, sa) || !np_ipv4(dst, (size_t)dn, da)) return 0;
    TKey k = {.cookie = c, .in_port = (uint64_t)port, .rule_id = (uint32_t)rule_id,
              .disposition = (uint32_t)(reg7 & self->disposition_bits),
              .src = (uint32_t)sa[0] << 24 | (uint32_t)sa[1] << 16 | sa[2] << 8 | sa[3],
              .dst = (uint32_t)da[0] << 24 | (uint32_t)da[1] << 16 | da[2] << 8 | da[3],
              .protocol = (uint8_t)protocol, .table_id = (uint8_t)table_id};
    return template_store(self, &k, rule, table, verdict, PyTuple_GET_ITEM(s, 3), PyTuple_GET_ITEM(s, 4), tx);
}

/* encode_raw(message, received_at, event_id, rules, table) -> RecordText | None: what encode(pin, summary, 1,
 * pin.total_len, received_at, received_at, 0) makes of this NXT_PACKET_IN2 (pin and summary decoded from it,
 * the event id `event_id`, or the next one drawn as encode draws it when None, `received` set to received_at as
 * encode_run sets it), from the message's bytes and
 * a template alone; None, nothing done, unless the frame is decode_frame's fast path (an untagged IPv4 frame
 * without options, not a fragment, UDP or TCP), a template holds the key's texts, and `rules` (the rule
 * registry's mapping) and `table` (the Pod table now) are what it was worked out for. */
static PyObject *FastEncoder_encode_raw(FastEncoder *self, PyObject *const *args, Py_ssize_t nargs) {
    if ((nargs != 5 && nargs != 9) || !PyBytes_CheckExact(args[0]) || !PyDict_CheckExact(args[3])) {
        PyErr_SetString(PyExc_TypeError, "encode_raw(message: bytes, received_at, event_id, rules: dict, table"
                                         "[, aggregator, userdata_version, log_bit, reject_bit])");
        return NULL;
    }
    double wall = PyFloat_AsDouble(args[1]);
    if (wall == -1.0 && PyErr_Occurred()) return NULL;
    unsigned long long id_v = 0;
    if (args[2] != Py_None && (id_v = PyLong_AsUnsignedLongLong(args[2])) == (unsigned long long)-1 &&
        PyErr_Occurred())
        return NULL;
    RawPin r;
    if (self->tmpl == NULL ||
        raw_pin((const unsigned char *)PyBytes_AS_STRING(args[0]), (size_t)PyBytes_GET_SIZE(args[0]), &r))
        Py_RETURN_NONE;
    const unsigned char *f = r.packet;
    size_t n = r.packet_len;
    if (n < 42 || ((f[12] << 8) | f[13]) != 0x0800 || f[14] != 0x45 || (((f[20] << 8) | f[21]) & 0x3FFF))
        Py_RETURN_NONE;
    int proto = f[23];
    if (!(proto == 17 || (proto == 6 && n >= 54)) || r.rule_id == 0 || (long long)r.total_len > self->safe_integer)
        Py_RETURN_NONE;
    TKey k = {.cookie = r.cookie, .in_port = r.in_port, .rule_id = r.rule_id,
              .disposition = (uint32_t)(r.reg7 & self->disposition_bits),
              .src = (uint32_t)f[26] << 24 | (uint32_t)f[27] << 16 | f[28] << 8 | f[29],
              .dst = (uint32_t)f[30] << 24 | (uint32_t)f[31] << 16 | f[32] << 8 | f[33],
              .protocol = (uint8_t)proto, .table_id = r.table_id};
    Template *t = *template_slot(self, &k);
    if (t == NULL || self->tmpl_table != args[4]) Py_RETURN_NONE;
    if (nargs == 9) {  /* ours, for the policy subscriber, plain logged: LOG set, REJECT clear */
        long version = PyLong_AsLong(args[6]), log_bit = PyLong_AsLong(args[7]), reject_bit = PyLong_AsLong(args[8]);
        if ((version == -1 || log_bit == -1 || reject_bit == -1) && PyErr_Occurred()) return NULL;
        const unsigned char *u = r.userdata;
        if (u == NULL || r.userdata_len < 7 || u[0] != version || u[1] != 0 || !(u[2] & log_bit) ||
            (u[2] & reject_bit))
            Py_RETURN_NONE;
    }
    PyObject *rule_id = PyLong_FromUnsignedLong(r.rule_id);
    if (rule_id == NULL) return NULL;
    PyObject *current = PyDict_GetItemWithError(args[3], rule_id);
    if (current != t->rule) {
        Py_DECREF(rule_id);
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_NONE;
    }
    if (nargs == 9) {  /* the aggregator makes this packet-in's "first" and nothing else */
        /* the Python key, (rule_id, disposition, src, dst, protocol, port), with the addresses' texts the template
         * holds: no formatting (after a quiet spell a call into libc's printf costs µs), their hashes known */
        PyObject *key = PyTuple_New(6);
        if (key == NULL) {
            Py_DECREF(rule_id);
            return NULL;
        }
        PyTuple_SET_ITEM(key, 0, rule_id);
        rule_id = NULL;  /* the key's now */
        PyTuple_SET_ITEM(key, 2, Py_NewRef(t->src_ip));
        PyTuple_SET_ITEM(key, 3, Py_NewRef(t->dst_ip));
        PyObject *d = PyLong_FromUnsignedLong(k.disposition), *p = PyLong_FromLong(proto),
                 *port = PyLong_FromLong((f[36] << 8) | f[37]);
        if (d) PyTuple_SET_ITEM(key, 1, d);
        if (p) PyTuple_SET_ITEM(key, 4, p);
        if (port) PyTuple_SET_ITEM(key, 5, port);
        if (!d || !p || !port) {
            Py_DECREF(key);
            return NULL;
        }
        int only = aggregator_first_only(args[5], key, wall, k.disposition != 0);
        Py_DECREF(key);
        if (only <= 0) {
            if (only < 0) return NULL;
            Py_RETURN_NONE;
        }
    }
    Py_XDECREF(rule_id);
    RecordValues v;
    v.packets = 1; v.bytes = r.total_len; v.offloaded = 0;
    v.src_port = (f[34] << 8) | f[35]; v.dst_port = (f[36] << 8) | f[37];
    v.icmp_type = v.icmp_code = -1;
    v.fragment = 0;
    v.truncated = proto == 6 && n - 34 < (size_t)((f[46] >> 4) * 4);
    if (timestamp(self, wall, v.first, &v.first_n)) Py_RETURN_NONE;
    memcpy(v.last, v.first, v.first_n); v.last_n = v.first_n;
    if (args[2] == Py_None) {  /* everything is known: the event id drawn now, as encode draws it */
        PyObject *id = PyObject_CallNoArgs(self->id_next);
        if (id == NULL) return NULL;
        id_v = PyLong_AsUnsignedLongLong(id);
        Py_DECREF(id);
        if (id_v == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    }
    for (int i = 15; i >= 0; i--, id_v >>= 4) v.id[i] = "0123456789abcdef"[id_v & 15];
    /* the flow's Community ID, from the frame's addresses (as community_text from their texts) */
    char comm[64];
    size_t cn = community_member(f + 26, f + 30, 4, proto, v.src_port, v.dst_port, comm);
    RecordTexts tx = t->tx;
    tx.comm.p = comm; tx.comm.n = cn;
    Buf hb, mb, tb, msg;
    buf_init(&hb); buf_init(&mb); buf_init(&tb); buf_init(&msg);
    PyObject *head = NULL, *mid = NULL, *tail = NULL, *record = NULL, *received = NULL;
    int ok = build_record(&tx, &v, &hb, &mb, &tb, &msg) == 0 && (head = buf_str(&hb)) && (mid = buf_str(&mb)) &&
             (tail = buf_str(&tb)) && (record = new_record(self, head, mid, tail, t->verdict)) &&
             (received = PyFloat_FromDouble(wall)) && PyObject_SetAttr(record, S_received, received) == 0;
    if (!ok) Py_CLEAR(record);
    buf_free(&hb); buf_free(&mb); buf_free(&tb); buf_free(&msg);
    Py_XDECREF(head); Py_XDECREF(mid); Py_XDECREF(tail); Py_XDECREF(received);
    if (record != NULL) self->fast++;
    return record;
}

/* encode(pin, summary, packets, bytes_, first, last, offloaded_packets, coarsened="", keys=0): as
 * RecordEncoder.encode_positional, whose result it is whenever it cannot build the record itself. */
static PyObject *FastEncoder_encode(FastEncoder *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7 && nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "encode takes 7 or 9 positional arguments");
        return NULL;
    }
    PyObject *pin = args[0], *s = args[1];
    PyObject *result = NULL, *rule_key = NULL, *current = NULL, *table = NULL, *pairs_of = NULL,
             *pair_key = NULL, *net_key = NULL, *flow = NULL, *ovs_key = NULL, *community = NULL,
             *id = NULL, *head = NULL, *mid = NULL, *tail = NULL, *rp_attrs[7] = {0};
    /* what the caches gave, held: Python code runs in between (the registry's get, the Pods' ip_table) */
    PyObject *rp = NULL, *pair = NULL, *net = NULL, *ovs = NULL;
    int status = 0;  /* 0 built, 1 fall back, -1 error */
    Buf hb, mb, tb, msg;
    buf_init(&hb); buf_init(&mb); buf_init(&tb); buf_init(&msg);
    if (nargs == 9) {
        PyObject *coarsened = args[7];
        if (!PyUnicode_CheckExact(coarsened) || PyUnicode_GET_LENGTH(coarsened) != 0) FALL_BACK();
    }
    if (!PyTuple_Check(pin) || PyTuple_GET_SIZE(pin) < 6 || !PyTuple_Check(s) || PyTuple_GET_SIZE(s) < 14) FALL_BACK();
    long long packets, bytes_, offloaded;
    if (safe_count(self, args[2], &packets) || safe_count(self, args[3], &bytes_) ||
        safe_count(self, args[6], &offloaded))
        FALL_BACK();
    if ((packets | bytes_ | offloaded) > self->safe_integer) FALL_BACK();
    double first = PyFloat_AsDouble(args[4]), last = PyFloat_AsDouble(args[5]);
    if ((first == -1.0 || last == -1.0) && PyErr_Occurred()) { PyErr_Clear(); FALL_BACK(); }

    /* the rule's texts: RecordEncoder._rules[(rule_id, reg7 & DISPOSITION_BITS)], while the registry still
     * hands out the same rule object */
    PyObject *rule_id = PyTuple_GET_ITEM(pin, 4), *reg7 = PyTuple_GET_ITEM(pin, 5);
    if (!PyLong_CheckExact(rule_id) || !PyLong_CheckExact(reg7)) FALL_BACK();
    long long reg7_v = PyLong_AsLongLong(reg7);
    if (reg7_v == -1 && PyErr_Occurred()) { PyErr_Clear(); FALL_BACK(); }
    PyObject *disposition = PyLong_FromLongLong(reg7_v & self->disposition_bits);
    if (disposition == NULL) FAIL();
    rule_key = PyTuple_Pack(2, rule_id, disposition);
    Py_DECREF(disposition);
    if (rule_key == NULL) FAIL();
    rp = Py_XNewRef(PyDict_GetItemWithError(self->rules, rule_key));
    if (rp == NULL) { if (PyErr_Occurred()) FAIL(); FALL_BACK(); }
    static PyObject **names[7] = {&S_rule, &S_after_dst, &S_after_start, &S_said, &S_priority, &S_verdict,
                                  &S_network_direction};
    for (int i = 0; i < 7; i++)
        if (!(rp_attrs[i] = PyObject_GetAttr(rp, *names[i]))) FAIL();
    PyObject *rule = rp_attrs[0], *after_dst = rp_attrs[1], *after_start = rp_attrs[2], *said = rp_attrs[3],
             *priority = rp_attrs[4], *verdict = rp_attrs[5], *network_direction = rp_attrs[6];
    int has_rule = PyObject_IsTrue(rule_id);
    if (has_rule < 0) FAIL();
    if (has_rule && self->batch_rules != NULL) {
        current = Py_XNewRef(PyDict_GetItemWithError(self->batch_rules, rule_id));
        if (current == NULL) {
            if (PyErr_Occurred()) FAIL();
            if (!(current = PyObject_CallOneArg(self->rules_get, rule_id))) FAIL();
            if (PyDict_SetItem(self->batch_rules, rule_id, current) < 0) FAIL();
        }
    } else if (has_rule) {
        if (!(current = PyObject_CallOneArg(self->rules_get, rule_id))) FAIL();
    } else {
        current = Py_NewRef(Py_None);
    }
    if (current != rule) FALL_BACK();

    /* the Pods at both ends: RecordEncoder._pairs, while the Pod table is the one they were worked out for */
    PyObject *src_ip = PyTuple_GET_ITEM(s, 3), *dst_ip = PyTuple_GET_ITEM(s, 4);
    if (!PyUnicode_CheckExact(src_ip) || !PyUnicode_CheckExact(dst_ip)) FALL_BACK();
    if (self->batch_table != NULL)
        table = Py_NewRef(self->batch_table);
    else if (!(table = PyObject_CallNoArgs(self->ip_table)))
        FAIL();
    if (!(pairs_of = PyObject_GetAttr(self->encoder, S_pairs_of))) FAIL();
    if (table != pairs_of) FALL_BACK();
    if (!(pair_key = PyTuple_Pack(3, src_ip, dst_ip, rp))) FAIL();
    pair = Py_XNewRef(PyDict_GetItemWithError(self->pairs, pair_key));
    if (pair == NULL) { if (PyErr_Occurred()) FAIL(); FALL_BACK(); }
    if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 13) FALL_BACK();

    PyObject *protocol = PyTuple_GET_ITEM(s, 5), *transport = PyTuple_GET_ITEM(s, 6);
    PyObject *src_port_o = PyTuple_GET_ITEM(s, 7), *dst_port_o = PyTuple_GET_ITEM(s, 8);
    PyObject *icmp_type_o = PyTuple_GET_ITEM(s, 9), *icmp_code_o = PyTuple_GET_ITEM(s, 10);
    long src_port = small_int(src_port_o), dst_port = small_int(dst_port_o);
    long icmp_type = small_int(icmp_type_o), icmp_code = small_int(icmp_code_o);
    if (src_port == -2 || dst_port == -2 || icmp_type == -2 || icmp_code == -2) FALL_BACK();
    STR(proto);
    ASCII(proto, transport);
    if (proto_n == 0) FALL_BACK();

    /* network members: RecordEncoder._networks */
    if (!(net_key = PyTuple_Pack(4, network_direction, protocol, PyTuple_GET_ITEM(s, 2), PyTuple_GET_ITEM(s, 1))))
        FAIL();
    net = Py_XNewRef(PyDict_GetItemWithError(self->networks, net_key));
    if (net == NULL) { if (PyErr_Occurred()) FAIL(); FALL_BACK(); }
    if (!PyTuple_CheckExact(net) || PyTuple_GET_SIZE(net) != 2) FALL_BACK();

    /* the flow's Community ID: RecordEncoder._community, or worked out here for TCP/UDP/SCTP */
    if (!(flow = PyTuple_Pack(7, src_ip, dst_ip, protocol, src_port_o, dst_port_o, icmp_type_o, icmp_code_o)))
        FAIL();
    community = PyDict_GetItemWithError(self->community, flow);
    if (community != NULL) {
        Py_INCREF(community);
    } else {
        if (PyErr_Occurred()) FAIL();
        long proto_v = PyLong_CheckExact(protocol) ? PyLong_AsLong(protocol) : -1;
        if (proto_v == -1 && PyErr_Occurred()) { PyErr_Clear(); FALL_BACK(); }
        if (!((proto_v == 6 || proto_v == 17 || proto_v == 132) && src_port >= 0 && dst_port >= 0)) FALL_BACK();
        community = community_text(src_ip, dst_ip, proto_v, src_port, dst_port);
        if (community == NULL) { if (PyErr_Occurred()) FAIL(); FALL_BACK(); }
        if (cache_put(self, self->community, flow, community) < 0) FAIL();
    }

    /* npaudit.ovs: RecordEncoder._ovs_texts */
    if (!(ovs_key = PyTuple_Pack(3, PyTuple_GET_ITEM(pin, 2), PyTuple_GET_ITEM(pin, 1), PyTuple_GET_ITEM(pin, 3))))
        FAIL();
    ovs = Py_XNewRef(PyDict_GetItemWithError(self->ovs_texts, ovs_key));
    if (ovs == NULL) { if (PyErr_Occurred()) FAIL(); FALL_BACK(); }

    char first_s[32], last_s[32];
    size_t first_n, last_n;
    if (timestamp(self, first, first_s, &first_n) || timestamp(self, last, last_s, &last_n)) FALL_BACK();

    RecordTexts tx;
    RecordValues vx;
#define TXT(field, obj) do { Py_ssize_t n_; if (!(tx.field.p = ascii_of((obj), &n_))) FALL_BACK(); \
                             tx.field.n = (size_t)n_; } while (0)
    TXT(dst_head, PyTuple_GET_ITEM(pair, 4)); TXT(src_head, PyTuple_GET_ITEM(pair, 5));
    TXT(src_ep, PyTuple_GET_ITEM(pair, 6)); TXT(src_pre, PyTuple_GET_ITEM(pair, 7));
    TXT(dst_ep, PyTuple_GET_ITEM(pair, 8)); TXT(dst_pre, PyTuple_GET_ITEM(pair, 9));
    TXT(mid_head, PyTuple_GET_ITEM(pair, 10)); TXT(tail_head, PyTuple_GET_ITEM(pair, 11));
    TXT(tail_rest, PyTuple_GET_ITEM(pair, 12));
    TXT(after_dst, after_dst); TXT(after_start, after_start); TXT(priority, priority);
    if (!PyTuple_CheckExact(said) || PyTuple_GET_SIZE(said) != 2) FALL_BACK();
    TXT(said0, PyTuple_GET_ITEM(said, 0)); TXT(said1, PyTuple_GET_ITEM(said, 1));
    TXT(comm, community); TXT(net_before, PyTuple_GET_ITEM(net, 0)); TXT(net_after, PyTuple_GET_ITEM(net, 1));
    TXT(ovs, ovs); TXT(ts_key, self->timestamp_key); TXT(seq_key, self->seq_key);
    TXT(frag, self->fragment); TXT(trunc, self->truncated); TXT(prefix, self->id_prefix);
    tx.proto.p = proto_p; tx.proto.n = (size_t)proto_n;
#undef TXT
    int fragment = PyObject_IsTrue(PyTuple_GET_ITEM(s, 12)), truncated = PyObject_IsTrue(PyTuple_GET_ITEM(s, 13));
    if (fragment < 0 || truncated < 0) FAIL();
    vx.packets = packets; vx.bytes = bytes_; vx.offloaded = offloaded;
    vx.src_port = src_port; vx.dst_port = dst_port; vx.icmp_type = icmp_type; vx.icmp_code = icmp_code;
    vx.fragment = fragment; vx.truncated = truncated;
    memcpy(vx.first, first_s, first_n); vx.first_n = first_n;
    memcpy(vx.last, last_s, last_n); vx.last_n = last_n;

    /* Everything is known: from here on the record is built here (the event id is drawn). */
    if (!(id = PyObject_CallNoArgs(self->id_next))) FAIL();
    unsigned long long id_v = PyLong_AsUnsignedLongLong(id);
    if (id_v == (unsigned long long)-1 && PyErr_Occurred()) FAIL();
    for (int i = 15; i >= 0; i--, id_v >>= 4) vx.id[i] = "0123456789abcdef"[id_v & 15];  /* f"{n:016x}" */
    if (build_record(&tx, &vx, &hb, &mb, &tb, &msg) < 0) FAIL();

    if (!(head = buf_str(&hb)) || !(mid = buf_str(&mb)) || !(tail = buf_str(&tb))) FAIL();
    if (!(result = new_record(self, head, mid, tail, verdict))) FAIL();
    if (lone_template(self, pin, s, reg7_v, rule, table, verdict, &tx) < 0) FAIL();

done:
    buf_free(&hb); buf_free(&mb); buf_free(&tb); buf_free(&msg);
    Py_XDECREF(rule_key); Py_XDECREF(current); Py_XDECREF(table); Py_XDECREF(pairs_of); Py_XDECREF(pair_key);
    Py_XDECREF(net_key); Py_XDECREF(flow); Py_XDECREF(ovs_key); Py_XDECREF(community); Py_XDECREF(id);
    Py_XDECREF(head); Py_XDECREF(mid); Py_XDECREF(tail);
    for (int i = 0; i < 7; i++) Py_XDECREF(rp_attrs[i]);
    Py_XDECREF(rp); Py_XDECREF(pair); Py_XDECREF(net); Py_XDECREF(ovs);
    if (status == 0) {
        self->fast++;
        return result;
    }
    Py_CLEAR(result);
    if (status < 0) return NULL;
    self->slow++;
    return PyObject_Vectorcall(self->fallback, args, (size_t)nargs, NULL);
}

/* encode_run(emissions, start, out) -> stop: the pipeline's _emit for a run of full-detail emissions (each an
 * aggregate.Emission: key, sample, packets, bytes_, first, last, offloaded_packets, offloaded_bytes, kind): per
 * emission, record = encode(pin, summary, packets + offloaded_packets, bytes_ + offloaded_bytes, first, last,
 * offloaded_packets) (the C record or the Python encoder's), its `received` set to pin.received_at unless kind
 * is "aggregate", appended to `out`. It stops at the first emission it does not take and returns its index:
 * no 9-tuple, a coarse key (a tuple whose first member is a str: _emit's own part), a sample that is no
 * (pin, summary) pair, counts that are not ints or whose sums leave 63 bits. An error of the encoder raises,
 * the records of the emissions before it in `out`. */
static PyObject *FastEncoder_encode_run(FastEncoder *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyList_CheckExact(args[0]) || !PyList_CheckExact(args[2])) {
        PyErr_SetString(PyExc_TypeError, "encode_run(emissions: list, start, out: list)");
        return NULL;
    }
    PyObject *emissions = args[0], *out = args[2];
    Py_ssize_t i = PyLong_AsSsize_t(args[1]);
    if (i == -1 && PyErr_Occurred()) return NULL;
    if (i < 0) {
        PyErr_SetString(PyExc_ValueError, "encode_run: start must not be negative");
        return NULL;
    }
    for (; i < PyList_GET_SIZE(emissions); i++) {
        PyObject *e = PyList_GET_ITEM(emissions, i);
        if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 9) break;
        PyObject *key = PyTuple_GET_ITEM(e, 0), *sample = PyTuple_GET_ITEM(e, 1), *kind = PyTuple_GET_ITEM(e, 8);
        if (!PyTuple_Check(key) || PyTuple_GET_SIZE(key) < 1 || PyUnicode_Check(PyTuple_GET_ITEM(key, 0))) break;
        if (!PyTuple_Check(sample) || PyTuple_GET_SIZE(sample) != 2 || !PyUnicode_CheckExact(kind)) break;
        long long v[4];
        int ok = 1;
        for (int k = 0; k < 4 && ok; k++) {
            PyObject *o = PyTuple_GET_ITEM(e, k < 2 ? 2 + k : 4 + k);  /* packets, bytes_, offloaded packets, bytes */
            int overflow = 0;
            ok = PyLong_CheckExact(o) && ((v[k] = PyLong_AsLongLongAndOverflow(o, &overflow)), !overflow)
                 && v[k] >= 0 && v[k] <= (1LL << 62);
            if (!ok) PyErr_Clear();
        }
        if (!ok) break;
        /* the emission held (and with it its pin): the encoder may run Python code */
        Py_INCREF(e);
        PyObject *pin = PyTuple_GET_ITEM(sample, 0);
        PyObject *packets = PyLong_FromLongLong(v[0] + v[2]), *bytes_ = PyLong_FromLongLong(v[1] + v[3]);
        PyObject *record = NULL, *received = NULL;
        if (packets != NULL && bytes_ != NULL) {
            PyObject *call[7] = {pin, PyTuple_GET_ITEM(sample, 1), packets, bytes_, PyTuple_GET_ITEM(e, 4),
                                 PyTuple_GET_ITEM(e, 5), PyTuple_GET_ITEM(e, 6)};
            record = FastEncoder_encode(self, call, 7);
        }
        Py_XDECREF(packets);
        Py_XDECREF(bytes_);
        int done = record != NULL;
        if (done && PyUnicode_CompareWithASCIIString(kind, "aggregate") != 0)
            done = (received = PyObject_GetAttr(pin, S_received_at)) != NULL
                 && PyObject_SetAttr(record, S_received, received) == 0;
        done = done && PyList_Append(out, record) == 0;
        Py_XDECREF(received);
        Py_XDECREF(record);
        Py_DECREF(e);
        if (!done) return NULL;
    }
    return PyLong_FromSsize_t(i);
}

static PyObject *FastEncoder_begin_batch(FastEncoder *self, PyObject *Py_UNUSED(ignored)) {
    PyObject *table = PyObject_CallNoArgs(self->ip_table), *rules = table != NULL ? PyDict_New() : NULL;
    if (rules == NULL) {
        Py_XDECREF(table);
        return NULL;
    }
    Py_XSETREF(self->batch_table, table);
    Py_XSETREF(self->batch_rules, rules);
    Py_RETURN_NONE;
}

static PyObject *FastEncoder_end_batch(FastEncoder *self, PyObject *Py_UNUSED(ignored)) {
    Py_CLEAR(self->batch_table);
    Py_CLEAR(self->batch_rules);
    Py_RETURN_NONE;
}

static PyObject *FastEncoder_counts(FastEncoder *self, PyObject *Py_UNUSED(ignored)) {
    return Py_BuildValue("{s:n,s:n}", "fast", self->fast, "python", self->slow);
}

static PyObject *community_id_ported(PyObject *mod, PyObject *args) {
    PyObject *src, *dst;
    long proto, sport, dport;
    if (!PyArg_ParseTuple(args, "UUlll", &src, &dst, &proto, &sport, &dport)) return NULL;
    if (proto < 0 || proto > 255 || sport < 0 || sport > 0xFFFF || dport < 0 || dport > 0xFFFF) {
        PyErr_SetString(PyExc_ValueError, "community id: protocol or port out of range");
        return NULL;
    }
    PyObject *text = community_text(src, dst, proto, sport, dport);
    if (text == NULL && !PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "community id: cannot pack the addresses");
    return text;
}

static PyObject *sha1_digest(PyObject *mod, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    unsigned char digest[20];
    np_sha1(view.buf, (size_t)view.len, digest);
    PyBuffer_Release(&view);
    return PyBytes_FromStringAndSize((const char *)digest, 20);
}

/* ---- sealing: auditlog.chain.RecordText.seal for a run of records ------------------------------------ */

static PyObject *S_head, *S_mid, *S_tail, *S_seq;

/* seal_run(records, start, seq, chain, chain_key, lines) -> (end, seq, chain)
 *
 * Seals records[start:] onto the chain while each is a plain one: head, mid and tail ASCII str, a seq that
 * fits 63 bits. For each: the digest is SHA-256 of f"{chain}\n{head}{mid}{seq}{tail}" (chain.RecordText.body
 * after the previous chain and a newline), its hex is the next chain, the line
 * f'{head}{chain_key}{hex}",{mid}{seq}{tail}' is appended to `lines` and record.seq is set, as
 * RecordText.seal does. It stops at the first record it does not take (anything else: not ASCII, no such
 * attribute) and returns its index, the seq and chain after the last record sealed: auditlog/sealing.py
 * seals that one in Python and calls again for the rest. Nothing is changed for a record it stops at. */
static PyObject *seal_run(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6 || !PyList_CheckExact(args[0]) || !PyList_CheckExact(args[5])) {
        PyErr_SetString(PyExc_TypeError, "seal_run(records: list, start, seq, chain, chain_key, lines: list)");
        return NULL;
    }
    PyObject *records = args[0], *lines = args[5], *chain_in = args[3];
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    long long seq = PyLong_AsLongLong(args[2]);
    if ((start == -1 || seq == -1) && PyErr_Occurred()) return NULL;
    Py_ssize_t chain_n = 0, key_n = 0;  /* set by ascii_of when it gives text; 0 keeps gcc from guessing */
    const char *chain0 = ascii_of(chain_in, &chain_n), *key = ascii_of(args[4], &key_n);
    if (key == NULL) {
        PyErr_SetString(PyExc_TypeError, "seal_run: chain_key must be an ASCII str");
        return NULL;
    }
    if (start < 0) {
        PyErr_SetString(PyExc_ValueError, "seal_run: start must not be negative");
        return NULL;
    }
    Py_ssize_t i = start;
    char chain[64];
    int sealed = 0;  /* `chain` holds the last digest (else the caller's chain is still the chain) */
    Buf data;
    buf_init(&data);
    /* a chain not ASCII (never from the writer): none taken, Python says what it makes of it */
    /* the list's size read each time, and the record held: a foreign object's __getattr__ may change the list */
    for (; chain0 != NULL && i < PyList_GET_SIZE(records) && seq < 0x7FFFFFFFFFFFFFFELL; i++) {
        PyObject *r = Py_NewRef(PyList_GET_ITEM(records, i)), *h = NULL, *m = NULL, *t = NULL;
        const char *hp, *mp, *tp;
        Py_ssize_t hn, mn, tn;
        if (!(h = PyObject_GetAttr(r, S_head)) || !(m = PyObject_GetAttr(r, S_mid))
                || !(t = PyObject_GetAttr(r, S_tail)) || !(hp = ascii_of(h, &hn)) || !(mp = ascii_of(m, &mn))
                || !(tp = ascii_of(t, &tn))) {
            Py_XDECREF(h); Py_XDECREF(m); Py_XDECREF(t); Py_DECREF(r);
            if (PyErr_Occurred()) {
                if (!PyErr_ExceptionMatches(PyExc_AttributeError)) goto error;
                PyErr_Clear();
            }
            break;
        }
        char seq_s[24];
        int seq_n = (int)np_decimal((unsigned long long)(seq + 1), seq_s);
        PyObject *seq_o = PyLong_FromLongLong(seq + 1), *line = NULL;
        int ok = seq_o != NULL;
        /* the hashed text: previous chain, newline, the body */
        data.len = 0;
        ok = ok && !(sealed ? put(&data, chain, 64) : put(&data, chain0, (size_t)chain_n)) && !PUT_LIT(&data, "\n")
             && !put(&data, hp, (size_t)hn) && !put(&data, mp, (size_t)mn) && !put(&data, seq_s, (size_t)seq_n)
             && !put(&data, tp, (size_t)tn);
        if (ok) {
            unsigned char digest[32];
            np_sha256((const unsigned char *)data.p, data.len, digest);
            for (int k = 0; k < 32; k++) {
                chain[2 * k] = "0123456789abcdef"[digest[k] >> 4];
                chain[2 * k + 1] = "0123456789abcdef"[digest[k] & 15];
            }
            sealed = 1;
            Py_ssize_t len = hn + key_n + 64 + 2 + mn + seq_n + tn;
            line = PyUnicode_New(len, 127);
            ok = line != NULL;
            if (ok) {
                char *o = (char *)PyUnicode_DATA(line);
                memcpy(o, hp, (size_t)hn); o += hn;
                memcpy(o, key, (size_t)key_n); o += key_n;
                memcpy(o, chain, 64); o += 64;
                *o++ = '"'; *o++ = ',';
                memcpy(o, mp, (size_t)mn); o += mn;
                memcpy(o, seq_s, (size_t)seq_n); o += seq_n;
                memcpy(o, tp, (size_t)tn);
                ok = PyList_Append(lines, line) == 0 && PyObject_SetAttr(r, S_seq, seq_o) == 0;
            }
        }
        Py_DECREF(h); Py_DECREF(m); Py_DECREF(t); Py_XDECREF(seq_o); Py_XDECREF(line); Py_DECREF(r);
        if (!ok) goto error;
        seq++;
    }
    buf_free(&data);
    PyObject *chain_out = sealed ? PyUnicode_FromStringAndSize(chain, 64) : Py_NewRef(chain_in);
    if (chain_out == NULL) return NULL;
    return Py_BuildValue("(nLN)", i, seq, chain_out);
error:
    /* MemoryError or a failing setattr: raised, as the Python loop raises it; the writer's seq and chain
     * are then those before this batch, whatever records' seq this call set */
    buf_free(&data);
    return NULL;
}

static PyMethodDef FastEncoder_methods[] = {
    {"encode", (PyCFunction)(void (*)(void))FastEncoder_encode, METH_FASTCALL,
     "encode(pin, summary, packets, bytes_, first, last, offloaded_packets, coarsened='', keys=0) -> RecordText"},
    {"encode_run", (PyCFunction)(void (*)(void))FastEncoder_encode_run, METH_FASTCALL,
     "encode_run(emissions, start, out) -> stop: the records of a run of full-detail emissions, into out"},
    {"encode_raw", (PyCFunction)(void (*)(void))FastEncoder_encode_raw, METH_FASTCALL,
     "encode_raw(message, received_at, event_id, rules, table) -> RecordText | None: a lone packet-in's record from "
     "its NXT_PACKET_IN2 bytes and a template of the texts encode worked out for its key"},
    {"begin_batch", (PyCFunction)FastEncoder_begin_batch, METH_NOARGS,
     "begin_batch(): until end_batch (one read's records), the Pod table and each rule asked once, not per record"},
    {"end_batch", (PyCFunction)FastEncoder_end_batch, METH_NOARGS, "end_batch(): ask them per record again"},
    {"counts", (PyCFunction)FastEncoder_counts, METH_NOARGS,
     "{'fast': records built in C, 'python': records handed to the Python encoder}"},
    {NULL}};

static PyTypeObject FastEncoderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "auditlog._record_fast.FastEncoder",
    .tp_basicsize = sizeof(FastEncoder),
    .tp_dealloc = (destructor)FastEncoder_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "FastEncoder(encoder, consts): RecordEncoder.encode_positional's common case in C",
    .tp_methods = FastEncoder_methods,
    .tp_init = (initproc)FastEncoder_init,
    .tp_new = PyType_GenericNew,
};

static PyMethodDef module_methods[] = {
    {"community_id_ported", community_id_ported, METH_VARARGS,
     "community_id_ported(saddr, daddr, proto, sport, dport) -> the '\"community_id\":\"1:...\",' member"},
    {"sha1", sha1_digest, METH_O, "sha1(data) -> 20-byte digest (the Community ID's SHA-1 as this module takes it, for its tests)"},
    {"seal_run", (PyCFunction)(void (*)(void))seal_run, METH_FASTCALL,
     "seal_run(records, start, seq, chain, chain_key, lines) -> (end, seq, chain): RecordText.seal for a run"},
    {NULL}};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "auditlog._record_fast",
                                       "The audit record encoder's common case in C (see auditlog/record.py).", -1,
                                       module_methods};

PyMODINIT_FUNC PyInit__record_fast(void) {
    if (PyType_Ready(&FastEncoderType) < 0 || !(F_zero = PyFloat_FromDouble(0.0)) ||
            !(I_zero = PyLong_FromLong(0)))
        return NULL;
    struct { PyObject **slot; const char *name; } names[] = {
        {&S_rule, "rule"}, {&S_after_dst, "after_dst"}, {&S_after_start, "after_start"}, {&S_said, "said"},
        {&S_priority, "priority"}, {&S_verdict, "verdict"}, {&S_network_direction, "network_direction"},
        {&S_pairs_of, "_pairs_of"}, {&S_head, "head"}, {&S_mid, "mid"}, {&S_tail, "tail"}, {&S_seq, "seq"},
        {&S_received, "received"}, {&S_received_at, "received_at"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!(*names[i].slot = PyUnicode_InternFromString(names[i].name))) return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (m == NULL) return NULL;
    Py_INCREF(&FastEncoderType);
    if (PyModule_AddObject(m, "FastEncoder", (PyObject *)&FastEncoderType) < 0) {
        Py_DECREF(&FastEncoderType);
        Py_DECREF(m);
        return NULL;
    }
    if (frame_decoder_add(m) < 0 || aggregator_add(m) < 0 || sealed_parts_add(m) < 0 || digest_add(m) < 0) {  /* the other C files */
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
