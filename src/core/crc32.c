// SPDX-License-Identifier: Apache-2.0
// CRC-32, zlib polynomial, bytewise table (fast enough for engine-sized inputs).
#include "core/crc32.h"

static uint32_t table[256];
static int table_ready;

static void make_table(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        table[i] = c;
    }
    table_ready = 1; // race-benign: every thread computes the same table
}

uint32_t kiln_crc32(uint32_t crc, const void *data, size_t nbytes) {
    const unsigned char *p = data;
    if (!table_ready) make_table();
    crc = ~crc;
    for (size_t i = 0; i < nbytes; i++) crc = table[(crc ^ p[i]) & 0xffu] ^ (crc >> 8);
    return ~crc;
}
