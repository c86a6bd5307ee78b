// SPDX-License-Identifier: Apache-2.0
// SHA-256 after FIPS 180-4 section 6.2: a straightforward, portable implementation (big-endian
// words read byte by byte, so no alignment or endianness assumptions), and kiln_sha256_fast,
// which hands large inputs to the system's libcrypto (OpenSSL: SHA-NI / ARMv8 crypto
// instructions, about ten times faster) when one can be loaded, and uses the portable code
// otherwise. The digest is the same either way.
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include "core/sha256.h"

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static void block(kiln_sha256_ctx *s, const uint8_t *p) {
    uint32_t w[64], a, b, c, d, e, f, g, h;
    for (int i = 0; i < 16; i++) {
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
               (uint32_t)p[4 * i + 2] << 8 | (uint32_t)p[4 * i + 3];
    }
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    a = s->h[0];
    b = s->h[1];
    c = s->h[2];
    d = s->h[3];
    e = s->h[4];
    f = s->h[5];
    g = s->h[6];
    h = s->h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t S1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
        uint32_t ch = (e & f) ^ (~e & g);
        uint32_t t1 = h + S1 + ch + K[i] + w[i];
        uint32_t S0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
        uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
        uint32_t t2 = S0 + maj;
        h = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    s->h[0] += a;
    s->h[1] += b;
    s->h[2] += c;
    s->h[3] += d;
    s->h[4] += e;
    s->h[5] += f;
    s->h[6] += g;
    s->h[7] += h;
}

void kiln_sha256_init(kiln_sha256_ctx *s) {
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, h0, sizeof h0);
    s->nbytes = 0;
    s->nbuf = 0;
}

void kiln_sha256_update(kiln_sha256_ctx *s, const void *data, size_t nbytes) {
    const uint8_t *p = data;
    s->nbytes += nbytes;
    if (s->nbuf > 0) {
        size_t take = 64 - s->nbuf < nbytes ? 64 - s->nbuf : nbytes;
        memcpy(s->buf + s->nbuf, p, take);
        s->nbuf += (uint32_t)take;
        p += take;
        nbytes -= take;
        if (s->nbuf < 64) return;
        block(s, s->buf);
        s->nbuf = 0;
    }
    for (; nbytes >= 64; p += 64, nbytes -= 64) block(s, p);
    if (nbytes > 0) memcpy(s->buf, p, nbytes);
    s->nbuf = (uint32_t)nbytes;
}

void kiln_sha256_final(kiln_sha256_ctx *s, uint8_t out[KILN_SHA256_NBYTES]) {
    uint64_t bits = s->nbytes * 8;
    uint8_t pad[72];
    size_t npad = (s->nbuf < 56 ? 56 : 120) - s->nbuf;
    memset(pad, 0, sizeof pad);
    pad[0] = 0x80;
    for (int i = 0; i < 8; i++) pad[npad + (size_t)i] = (uint8_t)(bits >> (56 - 8 * i));
    kiln_sha256_update(s, pad, npad + 8);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(s->h[i] >> 24);
        out[4 * i + 1] = (uint8_t)(s->h[i] >> 16);
        out[4 * i + 2] = (uint8_t)(s->h[i] >> 8);
        out[4 * i + 3] = (uint8_t)s->h[i];
    }
}

void kiln_sha256(const void *data, size_t nbytes, uint8_t out[KILN_SHA256_NBYTES]) {
    kiln_sha256_ctx s;
    kiln_sha256_init(&s);
    kiln_sha256_update(&s, data, nbytes);
    kiln_sha256_final(&s, out);
}

void kiln_sha256_hex(const uint8_t digest[KILN_SHA256_NBYTES], char out[65]) {
    static const char hex[] = "0123456789abcdef";
    for (int i = 0; i < KILN_SHA256_NBYTES; i++) {
        out[2 * i] = hex[digest[i] >> 4];
        out[2 * i + 1] = hex[digest[i] & 15];
    }
    out[64] = '\0';
}

// --- libcrypto, loaded at first use (never linked: libkiln has no dependency it cannot run
// without). EVP_Digest and EVP_sha256 have the same signatures in OpenSSL 1.1 and 3.

typedef const void *(*evp_md_fn)(void);
typedef int (*evp_digest_fn)(const void *data, size_t count, unsigned char *md, unsigned int *size,
                             const void *type, void *impl);

static pthread_once_t crypto_once = PTHREAD_ONCE_INIT;
static evp_digest_fn crypto_digest;
static const void *crypto_sha256;

static void crypto_load(void) {
    static const char *const names[] = {"libcrypto.so.3", "libcrypto.so.1.1", "libcrypto.so"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (h == NULL) continue;
        evp_digest_fn digest;
        evp_md_fn md;
        // POSIX: a function pointer round-trips through the void * of dlsym.
        void *sym_digest = dlsym(h, "EVP_Digest"), *sym_md = dlsym(h, "EVP_sha256");
        memcpy(&digest, &sym_digest, sizeof digest);
        memcpy(&md, &sym_md, sizeof md);
        const void *type = md != NULL ? md() : NULL;
        if (digest != NULL && type != NULL) {
            crypto_digest = digest;
            crypto_sha256 = type;
            return; // kept loaded for the life of the process
        }
        dlclose(h);
    }
}

int kiln_sha256_accelerated(void) {
    pthread_once(&crypto_once, crypto_load);
    return crypto_digest != NULL;
}

void kiln_sha256_fast(const void *data, size_t nbytes, uint8_t out[KILN_SHA256_NBYTES]) {
    // Below a few KiB the portable code is as fast as a call into libcrypto.
    if (nbytes >= 4096 && kiln_sha256_accelerated()) {
        unsigned int n = 0;
        if (crypto_digest(data, nbytes, out, &n, crypto_sha256, NULL) == 1 &&
            n == KILN_SHA256_NBYTES)
            return;
    }
    kiln_sha256(data, nbytes, out);
}

size_t kiln_sha256_tree_leaves(uint64_t nbytes) {
    return (size_t)(nbytes / KILN_SHA256_LEAF_NBYTES + (nbytes % KILN_SHA256_LEAF_NBYTES != 0));
}

void kiln_sha256_tree_combine(uint64_t nbytes, const uint8_t *leaf_digests, size_t n_leaves,
                              uint8_t out[KILN_SHA256_NBYTES]) {
    uint8_t len[8];
    kiln_sha256_ctx s;
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)(nbytes >> (8 * i));
    kiln_sha256_init(&s);
    kiln_sha256_update(&s, len, sizeof len);
    if (n_leaves > 0) kiln_sha256_update(&s, leaf_digests, n_leaves * KILN_SHA256_NBYTES);
    kiln_sha256_final(&s, out);
}

void kiln_sha256_tree(const void *data, size_t nbytes, uint8_t out[KILN_SHA256_NBYTES]) {
    uint8_t len[8], leaf[KILN_SHA256_NBYTES];
    kiln_sha256_ctx s;
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)((uint64_t)nbytes >> (8 * i));
    kiln_sha256_init(&s);
    kiln_sha256_update(&s, len, sizeof len);
    for (size_t off = 0; off < nbytes; off += KILN_SHA256_LEAF_NBYTES) {
        size_t n = nbytes - off < KILN_SHA256_LEAF_NBYTES ? nbytes - off : KILN_SHA256_LEAF_NBYTES;
        kiln_sha256_fast((const uint8_t *)data + off, n, leaf);
        kiln_sha256_update(&s, leaf, sizeof leaf);
    }
    kiln_sha256_final(&s, out);
}
