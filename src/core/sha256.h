// SPDX-License-Identifier: Apache-2.0
// SHA-256 (FIPS 180-4), used to name external weights by content ("kiln-t-<hex>", the tree digest
// below; "kiln-w-<hex>", the plain digest, in engines written before it): the same bytes always get
// the same key, so weights shared between engines are stored once, and a load can check the bytes
// it is given against the engine.
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
// The tree digest that names external weights: SHA-256 over the byte count (8 bytes,
// little-endian) followed by the SHA-256 of each KILN_SHA256_LEAF_NBYTES piece of the data in
// order (the last piece shorter; no piece for no bytes). Unlike the plain digest, one large
// tensor's leaves can be hashed on several threads (src/runtime/engine.c).
#define KILN_SHA256_LEAF_NBYTES ((size_t)4 << 20)
// Leaves of nbytes bytes.
size_t kiln_sha256_tree_leaves(uint64_t nbytes);
// The tree digest from the leaves' digests (n_leaves = kiln_sha256_tree_leaves(nbytes)).
void kiln_sha256_tree_combine(uint64_t nbytes, const uint8_t *leaf_digests, size_t n_leaves,
                              uint8_t out[KILN_SHA256_NBYTES]);
// The tree digest of data on the calling thread (leaves through kiln_sha256_fast).
void kiln_sha256_tree(const void *data, size_t nbytes, uint8_t out[KILN_SHA256_NBYTES]);
// Lower-case hex of a digest (64 characters and a NUL).
void kiln_sha256_hex(const uint8_t digest[KILN_SHA256_NBYTES], char out[65]);

#endif // KILN_CORE_SHA256_H
