// SPDX-License-Identifier: Apache-2.0
// SHA-256 against the FIPS 180-4 / NIST example vectors, and streaming in random chunk sizes
// against the one-shot digest.
#include "check.h"
#include "core/sha256.h"

static void expect_hex(const void *data, size_t n, const char *want) {
    uint8_t d[32];
    char hex[65];
    kiln_sha256(data, n, d);
    kiln_sha256_hex(d, hex);
    CHECK_MSG(strcmp(hex, want) == 0, "sha256 of %zu bytes: %s, expected %s", n, hex, want);
}

int main(void) {
    static const char m448[] = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    static const char m896[] = "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmn"
                               "hijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu";
    expect_hex("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    expect_hex("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    expect_hex(m448, strlen(m448),
               "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    expect_hex(m896, strlen(m896),
               "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
    {
        // one million 'a' (FIPS 180-2 appendix B.3), fed in uneven chunks
        static char a[1000000];
        uint8_t d[32];
        char hex[65];
        kiln_sha256_ctx s;
        memset(a, 'a', sizeof a);
        expect_hex(a, sizeof a, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
        kiln_sha256_init(&s);
        for (size_t off = 0; off < sizeof a;) {
            size_t n = (size_t)check_rng_int(0, 200);
            if (n > sizeof a - off) n = sizeof a - off;
            kiln_sha256_update(&s, a + off, n);
            off += n;
        }
        kiln_sha256_final(&s, d);
        kiln_sha256_hex(d, hex);
        CHECK(strcmp(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0") == 0);
    }
    // padding boundaries: lengths 55, 56, 63, 64, 65 streamed byte by byte equal one-shot
    for (size_t n = 50; n < 130; n++) {
        uint8_t buf[130], d1[32], d2[32];
        kiln_sha256_ctx s;
        for (size_t i = 0; i < n; i++) buf[i] = (uint8_t)check_rng_u64();
        kiln_sha256(buf, n, d1);
        kiln_sha256_init(&s);
        for (size_t i = 0; i < n; i++) kiln_sha256_update(&s, buf + i, 1);
        kiln_sha256_final(&s, d2);
        CHECK(memcmp(d1, d2, 32) == 0);
    }
    // 55 and 56 bytes of 'a' (single- and two-block padding), from a reference implementation
    expect_hex("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", 55,
               "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318");
    expect_hex("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", 56,
               "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a");
    // The tree digest (the key of an external weight), against Python's hashlib computing the
    // definition: sha256(u64le(n) || sha256(leaf 0) || ...), leaves of 4 MiB.
    {
        static const struct {
            size_t n;
            const char *hex;
        } tv[] = {
            {0, "af5570f5a1810b7af78caf4bc70a660f0df51e42baf91d4de5b2328de0e83dfc"},
            {3, "80a67215aff0c585b6c055e38aa04b76d4b208e2d0c3eb31bfd02822ae62e1c0"},
            {((size_t)9 << 20) | 5,
             "870a71994ab6cfd8e6131656dbe662356c42e586e2dea2a3ba282e1c685505c3"},
        };
        const size_t big = ((size_t)9 << 20) | 5;
        char *a = malloc(big);
        CHECK(a != NULL);
        if (a != NULL) {
            memset(a, 'a', big);
            memcpy(a, "abc", 3);
            for (size_t i = 0; i < sizeof tv / sizeof tv[0]; i++) {
                uint8_t d[32], leaves[3 * 32], d2[32];
                char hex[65];
                const char *src = tv[i].n == big ? (memset(a, 'a', 3), a) : a;
                kiln_sha256_tree(src, tv[i].n, d);
                kiln_sha256_hex(d, hex);
                CHECK_MSG(strcmp(hex, tv[i].hex) == 0, "tree digest of %zu bytes: %s", tv[i].n,
                          hex);
                // the same from leaves hashed one by one (as the load's threads do)
                size_t nl = kiln_sha256_tree_leaves(tv[i].n);
                CHECK(nl == (tv[i].n + KILN_SHA256_LEAF_NBYTES - 1) / KILN_SHA256_LEAF_NBYTES);
                for (size_t l = 0; l < nl && l < 3; l++) {
                    size_t off = l * KILN_SHA256_LEAF_NBYTES;
                    size_t n = tv[i].n - off < KILN_SHA256_LEAF_NBYTES ? tv[i].n - off
                                                                       : KILN_SHA256_LEAF_NBYTES;
                    kiln_sha256(src + off, n, leaves + 32 * l);
                }
                kiln_sha256_tree_combine(tv[i].n, leaves, nl, d2);
                CHECK(memcmp(d, d2, 32) == 0);
                memcpy(a, "abc", 3);
            }
            free(a);
        }
    }
    return check_summary();
}
