// SPDX-License-Identifier: Apache-2.0
// CRC-32 (zlib polynomial 0xEDB88320, same values as Python's zlib.crc32).
#ifndef KILN_CORE_CRC32_H
#define KILN_CORE_CRC32_H

#include <stddef.h>
#include <stdint.h>

// Continues a CRC: start with crc = 0.
uint32_t kiln_crc32(uint32_t crc, const void *data, size_t nbytes);

#endif // KILN_CORE_CRC32_H
