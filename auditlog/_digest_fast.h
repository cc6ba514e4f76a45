/* auditlog/_digest_fast.c's part of the auditlog._record_fast module (see that file): the record path's digests and
 * texts in this module's own code, not OpenSSL's or libc's. */
#ifndef NPAUDIT_DIGEST_FAST_H
#define NPAUDIT_DIGEST_FAST_H
#include <Python.h>
#include <stddef.h>

/* SHA-1 of `data` (the Community ID's: 40 bytes at most in practice, any length taken) */
void np_sha1(const unsigned char *data, size_t len, unsigned char out[20]);

/* SHA-256 of `data`: the CPU's SHA extensions where it has them, else OpenSSL's */
void np_sha256(const unsigned char *data, size_t len, unsigned char out[32]);

/* "YYYY-MM-DDTHH:MM:SS" of epoch seconds 0 .. 253402300799 (the year 9999's end) into out[19] */
void np_utc_second(long long seconds, char out[19]);

/* a non-negative integer in decimal into `out` (20 bytes hold any): its length */
size_t np_decimal(unsigned long long v, char *out);

/* The 4 bytes of a dotted quad exactly as inet_pton(AF_INET) takes it (1-3 digits a part, no leading zero, each at
 * most 255): 1, else 0 (the caller asks inet_pton, which decides). */
int np_ipv4(const char *s, size_t n, unsigned char out[4]);

/* Adds sha256, digest_impl, utc_second, decimal and ipv4 (each for this module's tests) to `module`: 0, or -1 with
 * an exception set. */
int digest_add(PyObject *module);

#endif
