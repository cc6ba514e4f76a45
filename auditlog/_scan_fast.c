/* The byte work of the syslog forwarder's read of sealed lines (auditlog/syslog/sealed_line.py), in C:
 *
 * sealed_parts(line, prev_chain, timestamp_key, chain_key, format_member, seq_key) ->
 *     (chain, segment, seq, stamp) or None
 *
 * None unless `line` (bytes) starts with timestamp_key, is ASCII, has its first chain_key followed by 64
 * characters, '",' and format_member, hashes without that member (SHA-256 of prev_chain, a newline, the line
 * before the member and the line after it) to those 64 characters as lowercase hex, has seq_key after the member
 * and there a seq of 1 to 16 digits not starting with 0 followed by ',' or '}'. Else: the chain (str), the bytes
 * from after the member up to and including the quote that opens seq_key (the npaudit text whose disposition
 * the caller works out, cached), the seq (int) and the bytes from after timestamp_key to the next quote (the
 * caller validates them, cached). prev_chain must be an ASCII str: the caller takes any other the Python way.
 * (tests/unit/auditlog/syslog/test_sealed_parts.py compares it with the Python, sealed_line._parts_of.)
 *
 * sealed_frames(lines, out, prev_chain, want, max_records, max_bytes, heads, stamps, lf, timestamp_key,
 *               chain_key, format_member, seq_key) -> (taken, line_bytes, chain, miss_kind, miss_key)
 *
 * The forwarder's frames of a run of such lines (auditlog/syslog/framer.py; tests/unit/auditlog/syslog/
 * test_framer.py compares them with the tailer's records framed by rfc5424.FrameEncoder). `lines` is the
 * tailer's read-ahead, the next line last; from its end, each line that has the parts above after the previous
 * one's chain, whose seq is `want` (then want + 1, ...), whose segment is a key of `heads` (value: (PRI part,
 * the part after TIMESTAMP) as bytes, or None) and whose stamp text a key of `stamps` (value: the TIMESTAMP as
 * bytes, or None) is taken off `lines` and its frame appended to `out`: "LEN SP MSG" (lf false) or "MSG LF",
 * MSG = PRI TIMESTAMP AFTER seq '" chain="' chain '"] ' line. It stops before `max_records` lines or once
 * `max_bytes` bytes of lines were taken, at the end of `lines`, or before a line it does not take: miss_kind 1
 * (the caller takes that line the Python way: not those parts, another seq, a None value), 2 (its segment is
 * no key of `heads`: miss_key is it) or 3 (its stamp text is no key of `stamps`: miss_key is it); else 0.
 * chain: the last taken line's chain (str), None if none was taken; line_bytes: their bytes, newlines not counted.
 *
 * lines_reversed(data) -> (lines, tail): the tailer's split of a block it read into lines (below).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/sha.h>

#include "_scan_fast.h"

#define MAX_SEQ_DIGITS 16  /* sealed_line._SEQ_VALUE: [1-9][0-9]{0,15} */
#define CHAIN_HEX 64       /* chain.CHAIN_MEMBER_LEN less the key, '"' and ',' */

typedef struct {
    const char *tk, *ck, *fm, *sk;
    Py_ssize_t tk_n, ck_n, fm_n, sk_n;
} keys_t;

typedef struct {
    char hex[CHAIN_HEX];
    Py_ssize_t seg_at, seg_n;      /* the segment: after the chain member up to and including seq_key's quote */
    Py_ssize_t stamp_at, stamp_n;  /* the stamp text */
    long long seq;
} parts_t;

static int keys_of(PyObject *const *args, keys_t *k) {
    for (int i = 0; i < 4; i++)
        if (!PyBytes_CheckExact(args[i])) {
            PyErr_SetString(PyExc_TypeError, "the keys must be bytes");
            return -1;
        }
    k->tk = PyBytes_AS_STRING(args[0]), k->tk_n = PyBytes_GET_SIZE(args[0]);
    k->ck = PyBytes_AS_STRING(args[1]), k->ck_n = PyBytes_GET_SIZE(args[1]);
    k->fm = PyBytes_AS_STRING(args[2]), k->fm_n = PyBytes_GET_SIZE(args[2]);
    k->sk = PyBytes_AS_STRING(args[3]), k->sk_n = PyBytes_GET_SIZE(args[3]);
    if (k->ck_n == 0 || k->sk_n == 0) {
        PyErr_SetString(PyExc_ValueError, "chain_key and seq_key must not be empty");
        return -1;
    }
    return 0;
}

static int ascii_chain(PyObject *prev) {
    if (!PyUnicode_Check(prev) || PyUnicode_READY(prev) < 0 || !PyUnicode_IS_ASCII(prev)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "prev_chain must be an ASCII str");
        return -1;
    }
    return 0;
}

static int is_ascii(const char *p, Py_ssize_t n) {
    uint64_t acc = 0, w;
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        memcpy(&w, p + i, 8);
        acc |= w;
    }
    for (; i < n; i++) acc |= (unsigned char)p[i];
    return (acc & 0x8080808080808080ULL) == 0;
}

/* 1 and `out` filled if `p` has the sealed layout after prev (see the top of the file), else 0. */
static int scan_line(const char *p, Py_ssize_t n, const char *prev, Py_ssize_t prev_n, const keys_t *k,
                     parts_t *out) {
    if (n < k->tk_n || memcmp(p, k->tk, (size_t)k->tk_n) != 0 || !is_ascii(p, n)) return 0;
    const char *found = memmem(p, (size_t)n, k->ck, (size_t)k->ck_n);
    if (found == NULL) return 0;
    Py_ssize_t at = found - p, end = at + k->ck_n + CHAIN_HEX + 2;
    if (end > n || p[end - 2] != '"' || p[end - 1] != ',' || n - end < k->fm_n
            || memcmp(p + end, k->fm, (size_t)k->fm_n) != 0)
        return 0;

    /* chain.sealed_chain: the digest of the line without its chain member, after prev */
    unsigned char digest[SHA256_DIGEST_LENGTH];
    SHA256_CTX ctx;
    SHA256_Init(&ctx);
    SHA256_Update(&ctx, prev, (size_t)prev_n);
    SHA256_Update(&ctx, "\n", 1);
    SHA256_Update(&ctx, p, (size_t)at);
    SHA256_Update(&ctx, p + end, (size_t)(n - end));
    SHA256_Final(digest, &ctx);
    for (int i = 0; i < 32; i++) {
        out->hex[2 * i] = "0123456789abcdef"[digest[i] >> 4];
        out->hex[2 * i + 1] = "0123456789abcdef"[digest[i] & 15];
    }
    if (memcmp(out->hex, p + at + k->ck_n, CHAIN_HEX) != 0) return 0;

    found = memmem(p + end, (size_t)(n - end), k->sk, (size_t)k->sk_n);
    if (found == NULL) return 0;
    Py_ssize_t seq_at = found - p, d = seq_at + k->sk_n, e = d;
    if (d >= n || p[d] < '1' || p[d] > '9') return 0;
    long long seq = 0;
    while (e < n && e - d < MAX_SEQ_DIGITS && p[e] >= '0' && p[e] <= '9') seq = seq * 10 + (p[e++] - '0');
    if (e >= n || (p[e] != ',' && p[e] != '}')) return 0;  /* also a 17th digit: no match */

    /* line[len(timestamp_key):line.find(b'"', len(timestamp_key))], -1 included, as Python slices it */
    const char *quote = memchr(p + k->tk_n, '"', (size_t)(n - k->tk_n));
    Py_ssize_t stop = quote != NULL ? quote - p : n - 1;
    if (stop < k->tk_n) stop = k->tk_n;
    out->seg_at = end, out->seg_n = seq_at + 1 - end;
    out->stamp_at = k->tk_n, out->stamp_n = stop - k->tk_n;
    out->seq = seq;
    return 1;
}

static PyObject *chain_str(const char *hex) {
    PyObject *chain = PyUnicode_New(CHAIN_HEX, 127);
    if (chain != NULL) memcpy(PyUnicode_DATA(chain), hex, CHAIN_HEX);
    return chain;
}

static PyObject *sealed_parts(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    keys_t k;
    if (nargs != 6 || !PyBytes_CheckExact(args[0]) || !PyUnicode_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "sealed_parts(line: bytes, prev_chain: str, timestamp_key: bytes, "
                                         "chain_key: bytes, format_member: bytes, seq_key: bytes)");
        return NULL;
    }
    if (keys_of(args + 2, &k) < 0 || ascii_chain(args[1]) < 0) return NULL;
    const char *p = PyBytes_AS_STRING(args[0]);
    parts_t parts;
    if (!scan_line(p, PyBytes_GET_SIZE(args[0]), PyUnicode_DATA(args[1]), PyUnicode_GET_LENGTH(args[1]), &k, &parts))
        Py_RETURN_NONE;
    PyObject *chain = chain_str(parts.hex);
    if (chain == NULL) return NULL;
    return Py_BuildValue("(Ny#Ly#)", chain, p + parts.seg_at, parts.seg_n, parts.seq, p + parts.stamp_at,
                         parts.stamp_n);
}

/* The value of `dict` for the `n` bytes at `p` (borrowed), reusing the last look-up while the bytes repeat; NULL
 * with *missing set to a new reference to the key if it is absent; NULL with an exception on error. */
typedef struct {
    PyObject *key;    /* owned: the last key looked up */
    PyObject *value;  /* borrowed from the dict, which nothing changes during the call */
} memo_t;

static PyObject *look_up(PyObject *dict, const char *p, Py_ssize_t n, memo_t *memo, PyObject **missing) {
    if (memo->key != NULL && PyBytes_GET_SIZE(memo->key) == n && memcmp(PyBytes_AS_STRING(memo->key), p, (size_t)n) == 0)
        return memo->value;
    PyObject *key = PyBytes_FromStringAndSize(p, n);
    if (key == NULL) return NULL;
    PyObject *value = PyDict_GetItemWithError(dict, key);
    if (value == NULL) {
        if (!PyErr_Occurred()) *missing = key;
        else Py_DECREF(key);
        return NULL;
    }
    Py_XSETREF(memo->key, key);
    memo->value = value;
    return value;
}

static int digits(long long v) {
    int d = 1;
    while (v >= 10) v /= 10, d++;
    return d;
}

static char *put_number(char *w, long long v, int d) {
    for (int i = d - 1; i >= 0; i--, v /= 10) w[i] = (char)('0' + v % 10);
    return w + d;
}

static char *put(char *w, PyObject *b) {
    memcpy(w, PyBytes_AS_STRING(b), (size_t)PyBytes_GET_SIZE(b));
    return w + PyBytes_GET_SIZE(b);
}

static const char CHAIN_OPEN[] = "\" chain=\"", CHAIN_CLOSE[] = "\"] ";

/* The frame of one line (see the top of the file); NULL with an exception. */
static PyObject *frame_of(const char *p, Py_ssize_t n, const parts_t *parts, PyObject *head, PyObject *stamp, int lf) {
    PyObject *pri = PyTuple_GET_ITEM(head, 0), *after = PyTuple_GET_ITEM(head, 1);
    int seq_d = digits(parts->seq);
    Py_ssize_t msg = PyBytes_GET_SIZE(pri) + PyBytes_GET_SIZE(stamp) + PyBytes_GET_SIZE(after) + seq_d
                     + (Py_ssize_t)(sizeof CHAIN_OPEN - 1) + CHAIN_HEX + (Py_ssize_t)(sizeof CHAIN_CLOSE - 1) + n;
    int len_d = lf ? 0 : digits(msg);
    PyObject *frame = PyBytes_FromStringAndSize(NULL, lf ? msg + 1 : len_d + 1 + msg);
    if (frame == NULL) return NULL;
    char *w = PyBytes_AS_STRING(frame);
    if (!lf) {
        w = put_number(w, msg, len_d);
        *w++ = ' ';
    }
    w = put(w, pri), w = put(w, stamp), w = put(w, after);
    w = put_number(w, parts->seq, seq_d);
    memcpy(w, CHAIN_OPEN, sizeof CHAIN_OPEN - 1), w += sizeof CHAIN_OPEN - 1;
    memcpy(w, parts->hex, CHAIN_HEX), w += CHAIN_HEX;
    memcpy(w, CHAIN_CLOSE, sizeof CHAIN_CLOSE - 1), w += sizeof CHAIN_CLOSE - 1;
    memcpy(w, p, (size_t)n), w += n;
    if (lf) *w = '\n';
    return frame;
}

static PyObject *sealed_frames(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 13 || !PyList_CheckExact(args[0]) || !PyList_CheckExact(args[1]) || !PyLong_CheckExact(args[3])
            || !PyLong_CheckExact(args[4]) || !PyLong_CheckExact(args[5]) || !PyDict_CheckExact(args[6])
            || !PyDict_CheckExact(args[7])) {
        PyErr_SetString(PyExc_TypeError, "sealed_frames(lines: list, out: list, prev_chain: str, want: int, "
                                         "max_records: int, max_bytes: int, heads: dict, stamps: dict, lf: bool, "
                                         "timestamp_key, chain_key, format_member, seq_key: bytes)");
        return NULL;
    }
    keys_t k;
    if (keys_of(args + 9, &k) < 0 || ascii_chain(args[2]) < 0) return NULL;
    PyObject *lines = args[0], *out = args[1], *heads = args[6], *stamps = args[7];
    if (lines == out) {
        PyErr_SetString(PyExc_ValueError, "sealed_frames: lines and out must be two lists");
        return NULL;
    }
    long long want = PyLong_AsLongLong(args[3]);
    Py_ssize_t max_records = PyLong_AsSsize_t(args[4]), max_bytes = PyLong_AsSsize_t(args[5]);
    int lf = PyObject_IsTrue(args[8]);
    if (PyErr_Occurred() || lf < 0) return NULL;

    const char *prev = PyUnicode_DATA(args[2]);
    Py_ssize_t prev_n = PyUnicode_GET_LENGTH(args[2]);
    char last[CHAIN_HEX];
    memo_t segments = {NULL, NULL}, stamp_memo = {NULL, NULL};
    PyObject *missing = NULL, *result = NULL;
    Py_ssize_t len = PyList_GET_SIZE(lines), i = len, taken = 0, line_bytes = 0;
    int kind = 0;
    while (i > 0 && taken < max_records && line_bytes < max_bytes) {
        PyObject *line = PyList_GET_ITEM(lines, i - 1);
        parts_t parts;
        if (!PyBytes_CheckExact(line)) {
            kind = 1;
            break;
        }
        const char *p = PyBytes_AS_STRING(line);
        Py_ssize_t n = PyBytes_GET_SIZE(line);
        if (!scan_line(p, n, prev, prev_n, &k, &parts) || parts.seq != want) {
            kind = 1;
            break;
        }
        PyObject *head = look_up(heads, p + parts.seg_at, parts.seg_n, &segments, &missing);
        if (head == NULL) {
            if (missing == NULL) goto done;
            kind = 2;
            break;
        }
        PyObject *stamp = head == Py_None ? NULL : look_up(stamps, p + parts.stamp_at, parts.stamp_n, &stamp_memo,
                                                           &missing);
        if (head != Py_None && stamp == NULL) {
            if (missing == NULL) goto done;
            kind = 3;
            break;
        }
        if (head == Py_None || stamp == Py_None) {
            kind = 1;
            break;
        }
        if (!PyTuple_CheckExact(head) || PyTuple_GET_SIZE(head) != 2 || !PyBytes_CheckExact(PyTuple_GET_ITEM(head, 0))
                || !PyBytes_CheckExact(PyTuple_GET_ITEM(head, 1)) || !PyBytes_CheckExact(stamp)) {
            PyErr_SetString(PyExc_TypeError, "sealed_frames: heads' values must be (bytes, bytes), stamps' bytes");
            goto done;
        }
        PyObject *frame = frame_of(p, n, &parts, head, stamp, lf);
        if (frame == NULL) goto done;
        int failed = PyList_Append(out, frame);
        Py_DECREF(frame);
        if (failed < 0) goto done;
        memcpy(last, parts.hex, CHAIN_HEX);
        prev = last, prev_n = CHAIN_HEX;
        want++, taken++, line_bytes += n, i--;
    }
    if (taken > 0 && PyList_SetSlice(lines, i, len, NULL) < 0) goto done;
    PyObject *chain = taken > 0 ? chain_str(last) : Py_NewRef(Py_None);
    if (chain == NULL) goto done;
    result = Py_BuildValue("(nnNiN)", taken, line_bytes, chain, kind, missing != NULL ? missing : Py_NewRef(Py_None));
    missing = NULL;
done:
    Py_XDECREF(missing);
    Py_XDECREF(segments.key);
    Py_XDECREF(stamp_memo.key);
    return result;
}

/* lines_reversed(data) -> (lines, tail): data.split(b"\n") with its last item (the text after the last newline, b""
 * after one) as `tail` and the others reversed in `lines`, the next line last (the tailer pops them). CPython splits
 * on one byte a byte at a time; memchr finds a newline many bytes at a time (1.5 KB lines: ~12 % of the forwarder's
 * CPU the other way). */
static PyObject *lines_reversed(PyObject *mod, PyObject *data) {
    if (!PyBytes_CheckExact(data)) {
        PyErr_SetString(PyExc_TypeError, "lines_reversed(data: bytes)");
        return NULL;
    }
    const char *p = PyBytes_AS_STRING(data), *end = p + PyBytes_GET_SIZE(data), *nl;
    PyObject *lines = PyList_New(0), *tail = NULL;
    if (lines == NULL) return NULL;
    while ((nl = memchr(p, '\n', (size_t)(end - p))) != NULL) {
        PyObject *line = PyBytes_FromStringAndSize(p, nl - p);
        if (line == NULL || PyList_Append(lines, line) < 0) {
            Py_XDECREF(line);
            Py_DECREF(lines);
            return NULL;
        }
        Py_DECREF(line);
        p = nl + 1;
    }
    if (PyList_Reverse(lines) < 0 || (tail = PyBytes_FromStringAndSize(p, end - p)) == NULL) {
        Py_DECREF(lines);
        return NULL;
    }
    return Py_BuildValue("(NN)", lines, tail);
}

static PyMethodDef methods[] = {
    {"sealed_parts", (PyCFunction)(void (*)(void))sealed_parts, METH_FASTCALL,
     "sealed_parts(line, prev_chain, timestamp_key, chain_key, format_member, seq_key) -> "
     "(chain, segment, seq, stamp) or None: sealed_line.scan_sealed's byte work"},
    {"sealed_frames", (PyCFunction)(void (*)(void))sealed_frames, METH_FASTCALL,
     "sealed_frames(lines, out, prev_chain, want, max_records, max_bytes, heads, stamps, lf, timestamp_key, "
     "chain_key, format_member, seq_key) -> (taken, line_bytes, chain, miss_kind, miss_key): the syslog frames "
     "of a run of sealed lines (auditlog/syslog/framer.py)"},
    {"lines_reversed", (PyCFunction)lines_reversed, METH_O,
     "lines_reversed(data) -> (lines, tail): data's lines without their newlines, the next one last, and the text "
     "after the last newline"},
    {NULL}};

int sealed_parts_add(PyObject *module) { return PyModule_AddFunctions(module, methods); }
