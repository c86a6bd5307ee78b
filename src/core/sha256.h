// SPDX-License-Identifier: Apache-2.0
// SHA-256 (FIPS 180-4), used to name external weights by content ("kiln-w-<hex>"): the same
// bytes always get the same key, so weights shared between engines are stored once.
#ifndef KILN_CORE_SHA256_H
#define KILN_CORE_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define KILN_SHA256_NBYTES 32

typedef struct kiln_sha256_ctx {
    uint32_t h[8];
    uint64_t nbytes; // message bytes so far
    uint8_t buf[64];
    uint32_t nbuf;
} kiln_sha256_ctx;

void kiln_sha256_init(kiln_sha256_ctx *s);
void kiln_sha256_update(kiln_sha256_ctx *s, const void *data, size_t nbytes);
void kiln_sha256_final(kiln_sha256_ctx *s, uint8_t out[KILN_SHA256_NBYTES]);

// One-shot digest.
void kiln_sha256(const void *data, size_t nbytes, uint8_t out[KILN_SHA256_NBYTES]);
// The same digest, computed by the system's libcrypto when it can be loaded (much faster on CPUs
// with SHA instructions) and by the portable code above otherwise. Thread-safe.
void kiln_sha256_fast(const void *data, size_t nbytes, uint8_t out[KILN_SHA256_NBYTES]);
// 1 when kiln_sha256_fast uses libcrypto in this process, else 0.
int kiln_sha256_accelerated(void);
// Lower-case hex of a digest (64 characters and a NUL).
void kiln_sha256_hex(const uint8_t digest[KILN_SHA256_NBYTES], char out[65]);

#endif // KILN_CORE_SHA256_H
