// SPDX-License-Identifier: Apache-2.0
// Runtime options: one table (name, type, default, scope), process-wide values, and per-load
// overrides resolved into a kiln_options snapshot at engine load. docs/options.md documents it.
#ifndef KILN_CORE_OPTIONS_H
#define KILN_CORE_OPTIONS_H

#include <stdint.h>

#include "kiln/kiln.h"

typedef struct kiln_options {
    char device[32];                   // "auto" | "cpu" | "cuda:N"
    int use_cuda_graphs;               // bool
    int use_shared_activation_scratch; // bool
    int64_t num_threads;               // CPU backend threads (1..64)
} kiln_options;

// The process-wide options with per-load settings applied on top (validated: unknown names and
// wrong types are KILN_ERR_INVALID_ARG naming the valid options).
kiln_status kiln_options_resolve(const kiln_option_setting *settings, uint32_t n_settings,
                                 kiln_options *out);

#endif // KILN_CORE_OPTIONS_H
