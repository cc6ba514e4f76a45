/* The record path's digests and texts in this module's own code: SHA-1 (the Community ID), SHA-256 (the chain's
 * seal), a second's UTC text, a decimal, a dotted quad's bytes.
 *
 * Why not OpenSSL's and libc's, which the module used before: a lone packet-in's record is made after a quiet spell,
 * when little of the process is still in the CPU's caches, and every page of code a call runs through is fetched
 * again. OpenSSL's SHA-1 and SHA-256 (init, update, its block-function dispatch, final), snprintf (vfprintf) and
 * gmtime_r + strftime each cost 9-13 µs the first time after 100 ms asleep, and 0.2-0.7 µs back to back, on this
 * project's machines (a C program of their calls alone; more in the agent's process, whose pages crowd the TLB):
 * ~40 µs of a lone record's way to the file for ~1.5 µs of work. Here each is a few hundred bytes of code beside
 * the encoder's. SHA-256 takes the CPU's SHA extensions (SHA-NI: as fast as OpenSSL's, which takes them too) and
 * OpenSSL's code where the CPU has none; `digest_impl()` says which. bench/agent_path.py --stages measures the
 * record path's C calls cold; tests/unit/auditlog/test_digest_fast.py compares each with hashlib, time and
 * socket. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <arpa/inet.h>
#include <stdint.h>
#include <string.h>
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/sha.h>

#include "_digest_fast.h"

#ifndef NP_HAVE_SHA_NI  /* -DNP_HAVE_SHA_NI=0 builds the other path on x86 too */
#if defined(__x86_64__) || defined(__i386__)
#define NP_HAVE_SHA_NI 1
#else
#define NP_HAVE_SHA_NI 0
#endif
#endif
#if NP_HAVE_SHA_NI
#include <cpuid.h>
#include <immintrin.h>
#endif

static inline uint32_t rol32(uint32_t x, int n) { return (x << n) | (x >> (32 - n)); }
static inline uint32_t be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
static inline void put_be32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24); p[1] = (unsigned char)(v >> 16); p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

/* The last one or two blocks of a Merkle-Damgard message: the tail of `data` after its whole blocks, 0x80, zeros,
 * the length in bits (big-endian). Returns how many blocks (1 or 2) `pad` holds. */
static int final_blocks(const unsigned char *data, size_t len, unsigned char pad[128]) {
    size_t rest = len % 64;
    memset(pad, 0, 128);
    memcpy(pad, data + len - rest, rest);
    pad[rest] = 0x80;
    int blocks = rest < 56 ? 1 : 2;
    uint64_t bits = (uint64_t)len * 8;
    for (int i = 0; i < 8; i++) pad[blocks * 64 - 1 - i] = (unsigned char)(bits >> (8 * i));
    return blocks;
}

/* ---- SHA-1 (FIPS 180-4), plain C ----------------------------------------------------------------- */

static void sha1_block(uint32_t h[5], const unsigned char *p) {
    uint32_t w[80];
    for (int t = 0; t < 16; t++) w[t] = be32(p + 4 * t);
    for (int t = 16; t < 80; t++) w[t] = rol32(w[t - 3] ^ w[t - 8] ^ w[t - 14] ^ w[t - 16], 1);
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4];
    for (int t = 0; t < 80; t++) {
        uint32_t f, k;
        if (t < 20) { f = (b & c) | (~b & d); k = 0x5A827999; }
        else if (t < 40) { f = b ^ c ^ d; k = 0x6ED9EBA1; }
        else if (t < 60) { f = (b & c) | (b & d) | (c & d); k = 0x8F1BBCDC; }
        else { f = b ^ c ^ d; k = 0xCA62C1D6; }
        uint32_t tmp = rol32(a, 5) + f + e + k + w[t];
        e = d; d = c; c = rol32(b, 30); b = a; a = tmp;
    }
    h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e;
}

static int have_sha_ni(void);
static void sha1_ni_blocks(uint32_t h[5], const unsigned char *data, size_t blocks);

/* SHA-1 in plain C ("c") or with the SHA extensions ("sha-ni": only where have_sha_ni()) */
static void sha1_with(int ni, const unsigned char *data, size_t len, unsigned char out[20]) {
    uint32_t h[5] = {0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476, 0xC3D2E1F0};
    unsigned char pad[128];
    int blocks = final_blocks(data, len, pad);
    if (ni) {
        sha1_ni_blocks(h, data, len / 64);
        sha1_ni_blocks(h, pad, (size_t)blocks);
    } else {
        for (size_t i = 0; i < len / 64; i++) sha1_block(h, data + 64 * i);
        for (int i = 0; i < blocks; i++) sha1_block(h, pad + 64 * i);
    }
    for (int i = 0; i < 5; i++) put_be32(out + 4 * i, h[i]);
}

void np_sha1(const unsigned char *data, size_t len, unsigned char out[20]) { sha1_with(have_sha_ni(), data, len, out); }

/* ---- SHA-256 with the SHA extensions ---------------------------------------------------------------- */

#if NP_HAVE_SHA_NI
static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

static int sha_ni = -1;  /* whether the CPU has the SHA extensions (and SSSE3, SSE4.1 the code also uses) */

static int cpu_has_sha_ni(void) {
    unsigned int a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 9)) || !(c & (1u << 19))) return 0;  /* SSSE3, SSE4.1 */
    if (__get_cpuid_max(0, NULL) < 7) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    return (b & (1u << 29)) != 0;  /* SHA */
}

/* `blocks` 64-byte blocks into `state` (the eight words in their usual order) */
__attribute__((target("sha,ssse3,sse4.1")))
static void sha256_ni_blocks(uint32_t state[8], const unsigned char *data, size_t blocks) {
    const __m128i swap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);  /* words big-endian */
    __m128i tmp = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&state[0]), 0xB1);     /* CDAB */
    __m128i s1 = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&state[4]), 0x1B);      /* EFGH */
    __m128i s0 = _mm_alignr_epi8(tmp, s1, 8);                                               /* ABEF */
    s1 = _mm_blend_epi16(s1, tmp, 0xF0);                                                     /* CDGH */
    for (; blocks; blocks--, data += 64) {
        __m128i abef = s0, cdgh = s1, w[4];
        for (int i = 0; i < 4; i++) w[i] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(data + 16 * i)), swap);
#pragma GCC unroll 16
        for (int g = 0; g < 16; g++) {  /* four rounds a step; the message words of step g + 4 into g's slot */
            __m128i msg = _mm_add_epi32(w[g & 3], _mm_loadu_si128((const __m128i *)&K256[4 * g]));
            s1 = _mm_sha256rnds2_epu32(s1, s0, msg);
            s0 = _mm_sha256rnds2_epu32(s0, s1, _mm_shuffle_epi32(msg, 0x0E));
            if (g < 12) {
                __m128i t = _mm_sha256msg1_epu32(w[g & 3], w[(g + 1) & 3]);
                t = _mm_add_epi32(t, _mm_alignr_epi8(w[(g + 3) & 3], w[(g + 2) & 3], 4));
                w[g & 3] = _mm_sha256msg2_epu32(t, w[(g + 3) & 3]);
            }
        }
        s0 = _mm_add_epi32(s0, abef);
        s1 = _mm_add_epi32(s1, cdgh);
    }
    tmp = _mm_shuffle_epi32(s0, 0x1B);    /* FEBA */
    s1 = _mm_shuffle_epi32(s1, 0xB1);     /* DCHG */
    s0 = _mm_blend_epi16(tmp, s1, 0xF0);  /* DCBA */
    s1 = _mm_alignr_epi8(s1, tmp, 8);     /* HGFE */
    _mm_storeu_si128((__m128i *)&state[0], s0);
    _mm_storeu_si128((__m128i *)&state[4], s1);
}

/* four rounds of SHA-1's round function `f` (0..3: the immediate must be a constant) */
__attribute__((target("sha,ssse3,sse4.1")))
static inline __m128i sha1_rounds(__m128i abcd, __m128i e, int f) {
    switch (f) {
    case 0: return _mm_sha1rnds4_epu32(abcd, e, 0);
    case 1: return _mm_sha1rnds4_epu32(abcd, e, 1);
    case 2: return _mm_sha1rnds4_epu32(abcd, e, 2);
    default: return _mm_sha1rnds4_epu32(abcd, e, 3);
    }
}

/* `blocks` 64-byte blocks into `h` with the SHA extensions: twenty steps of four rounds; the message words of step
 * g + 4 made into g's slot */
__attribute__((target("sha,ssse3,sse4.1")))
static void sha1_ni_blocks(uint32_t h[5], const unsigned char *data, size_t blocks) {
    const __m128i swap = _mm_set_epi64x(0x0001020304050607ULL, 0x08090a0b0c0d0e0fULL);  /* words big-endian, reversed */
    __m128i abcd = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)h), 0x1B);
    __m128i e0 = _mm_set_epi32((int)h[4], 0, 0, 0);
    for (; blocks; blocks--, data += 64) {
        __m128i abcd_save = abcd, e_save = e0, w[4], prev = abcd;
        for (int i = 0; i < 4; i++) w[i] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(data + 16 * i)), swap);
#pragma GCC unroll 20
        for (int g = 0; g < 20; g++) {
            __m128i e = g == 0 ? _mm_add_epi32(e0, w[0]) : _mm_sha1nexte_epu32(prev, w[g & 3]);
            prev = abcd;
            abcd = sha1_rounds(abcd, e, g / 5);
            if (g < 16)
                w[g & 3] = _mm_sha1msg2_epu32(_mm_xor_si128(_mm_sha1msg1_epu32(w[g & 3], w[(g + 1) & 3]),
                                                            w[(g + 2) & 3]), w[(g + 3) & 3]);
        }
        e0 = _mm_sha1nexte_epu32(prev, e_save);
        abcd = _mm_add_epi32(abcd, abcd_save);
    }
    _mm_storeu_si128((__m128i *)h, _mm_shuffle_epi32(abcd, 0x1B));
    h[4] = (uint32_t)_mm_extract_epi32(e0, 3);
}
#else
static void sha1_ni_blocks(uint32_t h[5], const unsigned char *data, size_t blocks) { (void)h; (void)data; (void)blocks; }
#endif

static int have_sha_ni(void) {
#if NP_HAVE_SHA_NI
    if (sha_ni < 0) sha_ni = cpu_has_sha_ni();
    return sha_ni;
#else
    return 0;
#endif
}

static void sha256_openssl(const unsigned char *data, size_t len, unsigned char out[32]) {
    SHA256_CTX ctx;
    SHA256_Init(&ctx);
    SHA256_Update(&ctx, data, len);
    SHA256_Final(out, &ctx);
}

#if NP_HAVE_SHA_NI
static void sha256_ni(const unsigned char *data, size_t len, unsigned char out[32]) {
    uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    sha256_ni_blocks(h, data, len / 64);
    unsigned char pad[128];
    sha256_ni_blocks(h, pad, (size_t)final_blocks(data, len, pad));
    for (int i = 0; i < 8; i++) put_be32(out + 4 * i, h[i]);
}
#endif

void np_sha256(const unsigned char *data, size_t len, unsigned char out[32]) {
#if NP_HAVE_SHA_NI
    if (have_sha_ni()) {
        sha256_ni(data, len, out);
        return;
    }
#endif
    sha256_openssl(data, len, out);
}

/* ---- texts -------------------------------------------------------------------------------------------- */

static inline void two(char *o, unsigned v) { o[0] = (char)('0' + v / 10); o[1] = (char)('0' + v % 10); }

void np_utc_second(long long seconds, char out[19]) {
    /* days since 1970-01-01 to the civil date (H. Hinnant's days_from_civil, inverted), for days >= 0 */
    long long days = seconds / 86400, secs = seconds % 86400;
    long long z = days + 719468, era = z / 146097;
    unsigned doe = (unsigned)(z - era * 146097);
    unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100), mp = (5 * doy + 2) / 153;
    unsigned day = doy - (153 * mp + 2) / 5 + 1, month = mp < 10 ? mp + 3 : mp - 9;
    unsigned year = (unsigned)(yoe + era * 400) + (month <= 2);
    two(out, year / 100); two(out + 2, year % 100); out[4] = '-';
    two(out + 5, month); out[7] = '-'; two(out + 8, day); out[10] = 'T';
    two(out + 11, (unsigned)(secs / 3600)); out[13] = ':';
    two(out + 14, (unsigned)(secs / 60 % 60)); out[16] = ':';
    two(out + 17, (unsigned)(secs % 60));
}

size_t np_decimal(unsigned long long v, char *out) {
    char tmp[20];
    size_t i = sizeof tmp;
    do { tmp[--i] = (char)('0' + v % 10); v /= 10; } while (v);
    memcpy(out, tmp + i, sizeof tmp - i);
    return sizeof tmp - i;
}

int np_ipv4(const char *s, size_t n, unsigned char out[4]) {
    size_t i = 0;
    for (int part = 0; part < 4; part++) {
        if (part && (i >= n || s[i++] != '.')) return 0;
        size_t start = i;
        unsigned v = 0;
        while (i < n && i - start < 3 && s[i] >= '0' && s[i] <= '9') v = v * 10 + (unsigned)(s[i++] - '0');
        if (i == start || v > 255 || (s[start] == '0' && i - start > 1)) return 0;
        out[part] = (unsigned char)v;
    }
    return i == n;
}

/* ---- for the tests ------------------------------------------------------------------------------------ */

/* sha256(data, impl="auto"): "auto" (what the module uses), "sha-ni" (ValueError without it) or "openssl" */
static PyObject *sha256_digest(PyObject *mod, PyObject *args) {
    Py_buffer b;
    const char *impl = "auto";
    if (!PyArg_ParseTuple(args, "y*|s", &b, &impl)) return NULL;
    unsigned char out[32];
    if (strcmp(impl, "auto") == 0) {
        np_sha256(b.buf, (size_t)b.len, out);
    } else if (strcmp(impl, "openssl") == 0) {
        sha256_openssl(b.buf, (size_t)b.len, out);
#if NP_HAVE_SHA_NI
    } else if (strcmp(impl, "sha-ni") == 0 && have_sha_ni()) {
        sha256_ni(b.buf, (size_t)b.len, out);
#endif
    } else {
        PyBuffer_Release(&b);
        return PyErr_Format(PyExc_ValueError, "sha256: no implementation %s here", impl);
    }
    PyBuffer_Release(&b);
    return PyBytes_FromStringAndSize((const char *)out, 32);
}

/* sha1_of(data, impl): "c" or "sha-ni" (ValueError without it); the module's sha1 is "auto" */
static PyObject *sha1_of(PyObject *mod, PyObject *args) {
    Py_buffer b;
    const char *impl;
    if (!PyArg_ParseTuple(args, "y*s", &b, &impl)) return NULL;
    int ni = strcmp(impl, "sha-ni") == 0;
    if (!(ni && have_sha_ni()) && strcmp(impl, "c") != 0) {
        PyBuffer_Release(&b);
        return PyErr_Format(PyExc_ValueError, "sha1_of: no implementation %s here", impl);
    }
    unsigned char out[20];
    sha1_with(ni, b.buf, (size_t)b.len, out);
    PyBuffer_Release(&b);
    return PyBytes_FromStringAndSize((const char *)out, 20);
}

static PyObject *digest_impl(PyObject *mod, PyObject *Py_UNUSED(ignored)) {
    return PyUnicode_FromString(have_sha_ni() ? "sha-ni" : "openssl");
}

static PyObject *utc_second(PyObject *mod, PyObject *arg) {
    long long s = PyLong_AsLongLong(arg);
    if (s == -1 && PyErr_Occurred()) return NULL;
    if (s < 0 || s > 253402300799LL) return PyErr_Format(PyExc_ValueError, "utc_second: %lld out of range", s);
    char out[19];
    np_utc_second(s, out);
    return PyUnicode_FromStringAndSize(out, 19);
}

static PyObject *decimal(PyObject *mod, PyObject *arg) {
    unsigned long long v = PyLong_AsUnsignedLongLong(arg);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    char out[20];
    return PyUnicode_FromStringAndSize(out, (Py_ssize_t)np_decimal(v, out));
}

static PyObject *ipv4(PyObject *mod, PyObject *arg) {
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(arg, &n);
    if (s == NULL) return NULL;
    unsigned char out[4];
    if (!np_ipv4(s, (size_t)n, out)) Py_RETURN_NONE;
    return PyBytes_FromStringAndSize((const char *)out, 4);
}

static PyMethodDef digest_methods[] = {
    {"sha256", sha256_digest, METH_VARARGS, "sha256(data, impl='auto') -> 32-byte digest (for this module's tests)"},
    {"sha1_of", sha1_of, METH_VARARGS, "sha1_of(data, impl) -> 20-byte digest, impl 'c' or 'sha-ni' (for the tests)"},
    {"digest_impl", digest_impl, METH_NOARGS, "digest_impl() -> 'sha-ni' or 'openssl': SHA-256 here (SHA-1: 'sha-ni' or plain C)"},
    {"utc_second", utc_second, METH_O, "utc_second(epoch seconds) -> 'YYYY-MM-DDTHH:MM:SS' (for the tests)"},
    {"decimal", decimal, METH_O, "decimal(n) -> str(n) for n >= 0 (for the tests)"},
    {"ipv4", ipv4, METH_O, "ipv4(text) -> 4 bytes, or None where inet_pton decides (for the tests)"},
    {NULL}};

int digest_add(PyObject *module) {
    have_sha_ni();
    return PyModule_AddFunctions(module, digest_methods);
}
