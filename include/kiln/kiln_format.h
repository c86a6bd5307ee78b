// SPDX-License-Identifier: Apache-2.0
// Kiln engine-format constants. The normative byte layout is docs/format.md; this header holds
// the numbers a reader of an engine needs to recognise one and to know which version it is.
#ifndef KILN_FORMAT_H
#define KILN_FORMAT_H

#include "kiln.h"

// The first 8 bytes of every engine. The high byte and the CR LF / SUB bytes catch 7-bit and
// text-mode mangling (the PNG trick).
#define KILN_FORMAT_MAGIC "\x89KLN\r\n\x1a\n"
#define KILN_FORMAT_MAGIC_NBYTES 8

// Format version written by this library, and the newest one it reads. A reader rejects a
// larger version with KILN_ERR_VERSION ("made by a newer Kiln").
#define KILN_FORMAT_VERSION 1

// Alignment of inline weights, relative to the start of the engine.
#define KILN_FORMAT_WEIGHT_ALIGN 64

#endif // KILN_FORMAT_H
