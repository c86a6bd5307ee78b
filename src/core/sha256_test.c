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
    return check_summary();
}
