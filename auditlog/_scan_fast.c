/* sealed_parts: the byte work of auditlog.syslog.sealed_line.scan_sealed in one call, for the syslog forwarder,
 * which reads every record through it (tests/unit/auditlog/syslog/test_sealed_parts.py compares it with the
 * Python part, sealed_line._parts_of, on sealed lines built to reach every check).
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
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/sha.h>

#include "_scan_fast.h"

#define MAX_SEQ_DIGITS 16  /* sealed_line._SEQ_VALUE: [1-9][0-9]{0,15} */

static PyObject *sealed_parts(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6 || !PyBytes_CheckExact(args[0]) || !PyUnicode_Check(args[1]) || !PyBytes_CheckExact(args[2])
            || !PyBytes_CheckExact(args[3]) || !PyBytes_CheckExact(args[4]) || !PyBytes_CheckExact(args[5])) {
        PyErr_SetString(PyExc_TypeError, "sealed_parts(line: bytes, prev_chain: str, timestamp_key: bytes, "
                                         "chain_key: bytes, format_member: bytes, seq_key: bytes)");
        return NULL;
    }
    if (PyUnicode_READY(args[1]) < 0) return NULL;
    if (!PyUnicode_IS_ASCII(args[1])) {
        PyErr_SetString(PyExc_ValueError, "sealed_parts: prev_chain must be ASCII");
        return NULL;
    }
    const char *p = PyBytes_AS_STRING(args[0]);
    Py_ssize_t n = PyBytes_GET_SIZE(args[0]);
    const char *tk = PyBytes_AS_STRING(args[2]), *ck = PyBytes_AS_STRING(args[3]);
    const char *fm = PyBytes_AS_STRING(args[4]), *sk = PyBytes_AS_STRING(args[5]);
    Py_ssize_t tk_n = PyBytes_GET_SIZE(args[2]), ck_n = PyBytes_GET_SIZE(args[3]);
    Py_ssize_t fm_n = PyBytes_GET_SIZE(args[4]), sk_n = PyBytes_GET_SIZE(args[5]);
    if (ck_n == 0 || sk_n == 0) {
        PyErr_SetString(PyExc_ValueError, "sealed_parts: chain_key and seq_key must not be empty");
        return NULL;
    }

    if (n < tk_n || memcmp(p, tk, (size_t)tk_n) != 0) Py_RETURN_NONE;
    for (Py_ssize_t i = 0; i < n; i++)
        if ((unsigned char)p[i] & 0x80) Py_RETURN_NONE;  /* the writer's lines are ASCII */

    const char *found = memmem(p, (size_t)n, ck, (size_t)ck_n);
    if (found == NULL) Py_RETURN_NONE;
    Py_ssize_t at = found - p, end = at + ck_n + 64 + 2;  /* chain.CHAIN_MEMBER_LEN */
    if (end > n || p[end - 2] != '"' || p[end - 1] != ',' || n - end < fm_n || memcmp(p + end, fm, (size_t)fm_n) != 0)
        Py_RETURN_NONE;

    /* chain.sealed_chain: the digest of the line without its chain member, after prev_chain */
    Py_ssize_t prev_n = PyUnicode_GET_LENGTH(args[1]);
    unsigned char digest[SHA256_DIGEST_LENGTH];
    SHA256_CTX ctx;
    SHA256_Init(&ctx);
    SHA256_Update(&ctx, PyUnicode_DATA(args[1]), (size_t)prev_n);
    SHA256_Update(&ctx, "\n", 1);
    SHA256_Update(&ctx, p, (size_t)at);
    SHA256_Update(&ctx, p + end, (size_t)(n - end));
    SHA256_Final(digest, &ctx);
    char hex[64];
    for (int k = 0; k < 32; k++) {
        hex[2 * k] = "0123456789abcdef"[digest[k] >> 4];
        hex[2 * k + 1] = "0123456789abcdef"[digest[k] & 15];
    }
    if (memcmp(hex, p + at + ck_n, 64) != 0) Py_RETURN_NONE;

    found = memmem(p + end, (size_t)(n - end), sk, (size_t)sk_n);
    if (found == NULL) Py_RETURN_NONE;
    Py_ssize_t seq_at = found - p, d = seq_at + sk_n, e = d;
    if (d >= n || p[d] < '1' || p[d] > '9') Py_RETURN_NONE;
    long long seq = 0;
    while (e < n && e - d < MAX_SEQ_DIGITS && p[e] >= '0' && p[e] <= '9') seq = seq * 10 + (p[e++] - '0');
    if (e >= n || (p[e] != ',' && p[e] != '}')) Py_RETURN_NONE;  /* also a 17th digit: no match */

    /* line[len(timestamp_key):line.find(b'"', len(timestamp_key))], -1 included, as Python slices it */
    const char *quote = memchr(p + tk_n, '"', (size_t)(n - tk_n));
    Py_ssize_t stop = quote != NULL ? quote - p : n - 1;
    if (stop < tk_n) stop = tk_n;

    PyObject *chain = PyUnicode_New(64, 127);
    if (chain == NULL) return NULL;
    memcpy(PyUnicode_DATA(chain), hex, 64);
    return Py_BuildValue("(Ny#Ly#)", chain, p + end, (Py_ssize_t)(seq_at + 1 - end), seq, p + tk_n,
                         (Py_ssize_t)(stop - tk_n));
}

static PyMethodDef methods[] = {
    {"sealed_parts", (PyCFunction)(void (*)(void))sealed_parts, METH_FASTCALL,
     "sealed_parts(line, prev_chain, timestamp_key, chain_key, format_member, seq_key) -> "
     "(chain, segment, seq, stamp) or None: sealed_line.scan_sealed's byte work"},
    {NULL}};

int sealed_parts_add(PyObject *module) { return PyModule_AddFunctions(module, methods); }
