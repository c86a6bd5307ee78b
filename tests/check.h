// SPDX-License-Identifier: Apache-2.0
// A tiny test harness: CHECK macros that count failures, and a summary line CI can read
// ("N passed, N failed"). Each test executable calls CHECK_* then returns check_summary().
#ifndef KILN_TESTS_CHECK_H
#define KILN_TESTS_CHECK_H

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kiln/kiln.h"

static int check_passed_, check_failed_;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (cond) {                                                                                \
            check_passed_++;                                                                       \
        } else {                                                                                   \
            check_failed_++;                                                                       \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);               \
        }                                                                                          \
    } while (0)

#define CHECK_MSG(cond, ...)                                                                       \
    do {                                                                                           \
        if (cond) {                                                                                \
            check_passed_++;                                                                       \
        } else {                                                                                   \
            check_failed_++;                                                                       \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);               \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                                         \
    do {                                                                                           \
        long long check_a_ = (long long)(a), check_b_ = (long long)(b);                            \
        CHECK_MSG(check_a_ == check_b_, "%s = %lld, %s = %lld", #a, check_a_, #b, check_b_);       \
    } while (0)

// A Kiln call's status; prints kiln_last_error() when it differs.
#define CHECK_STATUS(expr, expected)                                                               \
    do {                                                                                           \
        kiln_status check_st_ = (expr);                                                            \
        CHECK_MSG(check_st_ == (expected), "%s returned %s (%d), expected %s: %s", #expr,          \
                  kiln_status_str(check_st_), (int)check_st_, kiln_status_str(expected),           \
                  kiln_last_error());                                                              \
    } while (0)

#define CHECK_OK(expr) CHECK_STATUS(expr, KILN_OK)

// |a - b| <= atol + rtol * |b|
#define CHECK_NEAR(a, b, atol, rtol)                                                               \
    do {                                                                                           \
        double check_x_ = (double)(a), check_y_ = (double)(b);                                     \
        CHECK_MSG(fabs(check_x_ - check_y_) <= (atol) + (rtol)*fabs(check_y_),                     \
                  "%s = %.9g, %s = %.9g", #a, check_x_, #b, check_y_);                             \
    } while (0)

static inline int check_summary(void) {
    printf("%d passed, %d failed\n", check_passed_, check_failed_);
    return check_failed_ == 0 ? 0 : 1;
}

// A small deterministic PRNG (xorshift64*) for fresh random inputs: seed from the time unless
// KILN_TEST_SEED is set, and print the seed so a failure can be replayed.
static uint64_t check_rng_state_ = 0;
static inline uint64_t check_rng_seed(void) {
    const char *s = getenv("KILN_TEST_SEED");
    uint64_t seed = s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL) ^ (uint64_t)clock();
    if (seed == 0) seed = 1;
    check_rng_state_ = seed;
    fprintf(stderr, "KILN_TEST_SEED=%" PRIu64 "\n", seed);
    return seed;
}
static inline uint64_t check_rng_u64(void) {
    if (check_rng_state_ == 0) check_rng_seed();
    uint64_t x = check_rng_state_;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    check_rng_state_ = x;
    return x * 0x2545F4914F6CDD1DULL;
}
// Uniform in [lo, hi).
static inline float check_rng_uniform(float lo, float hi) {
    return lo + (hi - lo) * (float)((check_rng_u64() >> 40) * (1.0 / 16777216.0));
}
// Uniform integer in [lo, hi].
static inline int64_t check_rng_int(int64_t lo, int64_t hi) {
    return lo + (int64_t)(check_rng_u64() % (uint64_t)(hi - lo + 1));
}

#endif // KILN_TESTS_CHECK_H
