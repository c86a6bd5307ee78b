// SPDX-License-Identifier: Apache-2.0
// UTF-8 text rules for strings that come from files (engine names and keys, .ptd keys) and for
// every message Kiln hands to the log hook or kiln_last_error: valid UTF-8 (no overlong forms,
// no surrogates, nothing above U+10FFFF) and no control characters (C0 U+0000..U+001F, DEL
// U+007F, C1 U+0080..U+009F). Bytes that break the rule are shown as \xNN escapes.
#ifndef KILN_CORE_UTF8_H
#define KILN_CORE_UTF8_H

#include <stddef.h>

// Length of the valid sequence (1..4) that starts at s[0] within n bytes, or 0 when s[0] does
// not start a valid UTF-8 sequence there (a stray continuation byte, an invalid lead byte, a
// truncated, overlong or surrogate sequence, or one above U+10FFFF).
size_t kiln_utf8_seq_len(const unsigned char *s, size_t n);

// Offset of the first byte of s[0..n) that is not valid UTF-8 or that starts a control
// character; n when the text follows the rule.
size_t kiln_utf8_check(const char *s, size_t n);

// What is wrong at s[0] (a position kiln_utf8_check returned): "a control character" or "not
// valid UTF-8".
const char *kiln_utf8_problem(const char *s, size_t n);

// Copies s[0..n) into out (out_nbytes > 0; always NUL-terminated), writing every byte that
// breaks the rule as \xNN, so the result is valid UTF-8 without control characters. Stops at a
// character or escape boundary when out is full. Returns the bytes written (without the NUL) and
// sets *consumed (may be NULL) to the input bytes copied.
size_t kiln_utf8_escape(char *out, size_t out_nbytes, const char *s, size_t n, size_t *consumed);

#endif // KILN_CORE_UTF8_H
