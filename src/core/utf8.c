// SPDX-License-Identifier: Apache-2.0
// UTF-8 validation and escaping (src/core/utf8.h), after RFC 3629 / Unicode table 3-7 (the
// well-formed byte sequences).
#include "core/utf8.h"

size_t kiln_utf8_seq_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    // Lead byte: number of continuation bytes and the allowed range of the first one.
    size_t len;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0; // no overlong forms
        if (c == 0xED) hi = 0x9F; // no surrogates U+D800..U+DFFF
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90; // no overlong forms
        if (c == 0xF4) hi = 0x8F; // nothing above U+10FFFF
    } else {
        return 0; // continuation byte, C0/C1 overlong lead, or F5..FF
    }
    if (n < len) return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < len; i++) {
        if (s[i] < 0x80 || s[i] > 0xBF) return 0;
    }
    return len;
}

// A control character: C0, DEL, or C1 (U+0080..U+009F, encoded C2 80..C2 9F).
static int is_control(const unsigned char *s, size_t len) {
    if (len == 1) return s[0] < 0x20 || s[0] == 0x7F;
    return len == 2 && s[0] == 0xC2 && s[1] <= 0x9F;
}

size_t kiln_utf8_check(const char *text, size_t n) {
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0;
    while (i < n) {
        size_t len = kiln_utf8_seq_len(s + i, n - i);
        if (len == 0 || is_control(s + i, len)) return i;
        i += len;
    }
    return n;
}

const char *kiln_utf8_problem(const char *text, size_t n) {
    const unsigned char *s = (const unsigned char *)text;
    return n > 0 && kiln_utf8_seq_len(s, n) != 0 ? "a control character" : "not valid UTF-8";
}

size_t kiln_utf8_escape(char *out, size_t out_nbytes, const char *text, size_t n,
                        size_t *consumed) {
    static const char hex[] = "0123456789abcdef";
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0, w = 0;
    while (i < n) {
        size_t len = kiln_utf8_seq_len(s + i, n - i);
        if (len != 0 && !is_control(s + i, len)) {
            if (w + len >= out_nbytes) break;
            for (size_t k = 0; k < len; k++) out[w++] = (char)s[i + k];
            i += len;
            continue;
        }
        // Escape one byte (a control character's every byte is escaped in turn).
        if (len == 0) len = 1;
        if (w + 4 * len >= out_nbytes) break;
        for (size_t k = 0; k < len; k++) {
            out[w++] = '\\';
            out[w++] = 'x';
            out[w++] = hex[s[i + k] >> 4];
            out[w++] = hex[s[i + k] & 15];
        }
        i += len;
    }
    out[w] = '\0';
    if (consumed != NULL) *consumed = i;
    return w;
}
