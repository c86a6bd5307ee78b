// SPDX-License-Identifier: Apache-2.0
// What the two files of libkiln_executorch.so share (not exported: see kiln_executorch.map).
#ifndef KILN_ADAPTER_INTERNAL_H
#define KILN_ADAPTER_INTERNAL_H

#include <cstdint>

// The most memory one method may plan: kiln_program_set_planned_limit's value, or the machine's
// physical memory when none was set. Applies to ExecuTorch's planned buffers (the program API)
// and to the activation arena of a Kiln engine that runs on the CPU (the delegate).
uint64_t kiln_adapter_planned_limit();

#endif // KILN_ADAPTER_INTERNAL_H
