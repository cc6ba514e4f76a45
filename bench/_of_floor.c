/* bench/_of_floor.py --append, in C: the floor of a record's latency for a reader that runs no Python.
 *
 * Usage: _of_floor TARGET FILE, TARGET a unix socket path or tcp:HOST:PORT (TCP_NODELAY, as the agent's own
 * connection). It sends the handshake bench/_of_floor.py sends (OFPT_HELLO for OpenFlow 1.5, OFPT_SET_CONFIG
 * with miss_send_len 0xffff, NXT_SET_PACKET_IN_FORMAT NXT_PACKET_IN2), prints "ready", then reads in a loop:
 * per NXT_PACKET_IN2 whose frame is untagged IPv4 UDP, its destination port as a line appended to FILE (one
 * write(2) each); each echo request answered. bench/agent_latency.py --c-floor compiles it with gcc at run time.
 * After a quiet spell a Python reader pays for what the interpreter lost while the vCPU slept (bench/RESULTS.md,
 * agent_latency --trace); this is what the same reading and writing cost without it. */
#define _GNU_SOURCE
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <fcntl.h>

static const unsigned char HANDSHAKE[] = {
    0x06, 0x00, 0x00, 0x08, 0, 0, 0, 1,                                   /* OFPT_HELLO */
    0x06, 0x09, 0x00, 0x0c, 0, 0, 0, 2, 0x00, 0x00, 0xff, 0xff,            /* OFPT_SET_CONFIG */
    0x06, 0x04, 0x00, 0x14, 0, 0, 0, 3, 0x00, 0x00, 0x23, 0x20,            /* OFPT_EXPERIMENTER, NX_VENDOR */
    0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x02,                        /* NXT_SET_PACKET_IN_FORMAT, NXT2 */
};

static unsigned be16(const unsigned char *p) { return (unsigned)p[0] << 8 | p[1]; }
static uint32_t be32(const unsigned char *p) { return (uint32_t)be16(p) << 16 | be16(p + 2); }

static int send_all(int s, const unsigned char *p, size_t n) {
    while (n) {
        ssize_t k = send(s, p, n, MSG_NOSIGNAL);
        if (k <= 0)
            return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static int connect_target(const char *target) {
    if (strncmp(target, "tcp:", 4) == 0) {
        char host[256];
        const char *colon = strrchr(target + 4, ':');
        if (!colon || (size_t)(colon - target - 4) >= sizeof host)
            return -1;
        memcpy(host, target + 4, (size_t)(colon - target - 4));
        host[colon - target - 4] = 0;
        struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res;
        if (getaddrinfo(host, colon + 1, &hints, &res) != 0)
            return -1;
        int s = socket(res->ai_family, SOCK_STREAM, 0);
        if (s < 0 || connect(s, res->ai_addr, res->ai_addrlen) < 0) {
            freeaddrinfo(res);
            return -1;
        }
        freeaddrinfo(res);
        int one = 1;
        setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        return s;
    }
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(target) >= sizeof addr.sun_path)
        return -1;
    strcpy(addr.sun_path, target);
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    if (s < 0 || connect(s, (struct sockaddr *)&addr, sizeof addr) < 0)
        return -1;
    return s;
}

/* The frame's UDP destination port in an NXT_PACKET_IN2 (its NXPINT_PACKET property); -1 if it is not untagged
 * IPv4 UDP (bench/_of_floor.py udp_dst_port). */
static int udp_dst_port(const unsigned char *msg, size_t len) {
    size_t pos = 16; /* OpenFlow header, experimenter id, subtype */
    while (pos + 4 <= len) {
        unsigned type = be16(msg + pos), plen = be16(msg + pos + 2);
        if (plen < 4 || pos + plen > len)
            return -1;
        if (type == 0) {
            const unsigned char *f = msg + pos + 4;
            size_t flen = plen - 4;
            if (flen < 34 || f[12] != 0x08 || f[13] != 0x00 || f[23] != 17)
                return -1;
            size_t udp = 14 + (size_t)(f[14] & 0x0f) * 4;
            return flen >= udp + 4 ? (int)be16(f + udp + 2) : -1;
        }
        pos += (plen + 7) / 8 * 8;
    }
    return -1;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s TARGET FILE\n", argv[0]);
        return 2;
    }
    int out = open(argv[2], O_WRONLY | O_APPEND | O_CREAT, 0644);
    int s = connect_target(argv[1]);
    if (out < 0 || s < 0 || send_all(s, HANDSHAKE, sizeof HANDSHAKE) < 0) {
        perror(argv[1]);
        return 1;
    }
    printf("ready\n");
    fflush(stdout);
    static unsigned char buf[1 << 18];
    size_t have = 0;
    for (;;) {
        ssize_t n = recv(s, buf + have, sizeof buf - have, 0);
        if (n <= 0)
            return 0;
        have += (size_t)n;
        size_t pos = 0;
        while (have - pos >= 8) {
            unsigned char *m = buf + pos;
            size_t len = be16(m + 2);
            if (len < 8 || len > sizeof buf) {
                fprintf(stderr, "OpenFlow message of length %zu\n", len);
                return 1;
            }
            if (have - pos < len)
                break;
            if (m[1] == 4 && len >= 16 && be32(m + 8) == 0x2320 && be32(m + 12) == 30) {
                int port = udp_dst_port(m, len);
                if (port >= 0) {
                    char line[8];
                    int k = snprintf(line, sizeof line, "%d\n", port);
                    if (write(out, line, (size_t)k) != k)
                        return 1;
                }
            } else if (m[1] == 2) { /* OFPT_ECHO_REQUEST: the same message back as OFPT_ECHO_REPLY */
                m[1] = 3;
                if (send_all(s, m, len) < 0)
                    return 0;
            }
            pos += len;
        }
        memmove(buf, buf + pos, have - pos);
        have -= pos;
    }
}
