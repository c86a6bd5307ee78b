// SPDX-License-Identifier: Apache-2.0
// The rows of a state that calls have written, for the writes whose positions the caller
// passes: a layer index_copy(state, dim, index, rows) whose output is the state itself (an
// update in place) and whose index is an input binding, when the state starts as zeros and no
// other layer writes it. Before each execute whose position inputs are in host memory, the
// runtime checks every such write: a position outside the state is refused (KILN_ERR_INVALID_ARG
// naming the input, the position and the rows; the CUDA kernels would skip the row), and, for a
// KV cache (the state reaches an sdpa's keys or values through views), so is a write that leaves
// a row below its position unwritten (a decode before its prefill, or a position skipped):
// attention would read there values no call wrote. Nothing has run when a call is refused, so
// the state keeps its contents. After a successful execute the written rows are recorded. The
// record of a state is shared by the contexts that share the state (kiln_context_share_states)
// and cleared with it (kiln_context_reset_states). Positions in device memory are not read (no
// synchronization is added to an execute): such calls are neither checked nor recorded.
#ifndef KILN_RUNTIME_STATE_ROWS_H
#define KILN_RUNTIME_STATE_ROWS_H

#include <stdint.h>

#include "kiln/kiln.h"
#include "runtime/plan.h"

// One guarded write of an engine (found in its plan at load).
typedef struct kiln_row_write {
    uint32_t input; // the input binding holding the positions (int32 or int64)
    uint32_t state; // the STATE tensor written
    uint32_t dim;   // the dim of the state the positions index
    int64_t rows;   // the state's size along dim
    int wrap;       // negative positions count from the end
    int cache;      // a KV cache: an sdpa reads the state as keys or values
    uint32_t layer; // for messages
} kiln_row_write;

// The written rows of one state (reference counted: shared between contexts).
typedef struct kiln_state_rows kiln_state_rows;

// The guarded writes of a plan (*out NULL and *n 0 when there are none).
kiln_status kiln_row_writes_find(const kiln_plan *p, kiln_row_write **out, uint32_t *n);
void kiln_row_writes_free(kiln_row_write *w, uint32_t n);

// A context's records: rows[t] for each STATE tensor t some write guards (NULL otherwise).
kiln_status kiln_state_rows_new(const kiln_plan *p, const kiln_row_write *w, uint32_t n,
                                kiln_state_rows ***out);
void kiln_state_rows_free(const kiln_plan *p, kiln_state_rows **rows);

// Checks the writes of one execute against the records. in_data[i] is input i's host data
// (NULL: in device memory, not checked) and in_numel[i] its element count; gaps: unwritten rows
// below a position are refused (the option check_cache_rows), else only positions outside.
kiln_status kiln_state_rows_check(const kiln_plan *p, const kiln_row_write *w, uint32_t n,
                                  kiln_state_rows *const *rows, const void *const *in_data,
                                  const int64_t *in_numel, int gaps);
// Records the rows an execute that succeeded wrote (the same arguments as the check).
void kiln_state_rows_commit(const kiln_plan *p, const kiln_row_write *w, uint32_t n,
                            kiln_state_rows *const *rows, const void *const *in_data,
                            const int64_t *in_numel);
// Forgets every written row (the states were reset to their initial values).
void kiln_state_rows_clear(const kiln_plan *p, kiln_state_rows *const *rows);
// After kiln_context_share_states (rows and owner_rows may be NULL: no records): rows[t]
// becomes owner_rows[map[t]] for the shared states; a shared state the owner keeps no record of
// (it writes it at positions it computes, or not at all) is no longer checked here, and one
// this engine writes without a record is no longer checked by the owner's record. Does not
// fail.
kiln_status kiln_state_rows_share(const kiln_plan *p, kiln_state_rows **rows,
                                  const kiln_plan *owner_p, kiln_state_rows **owner_rows,
                                  const uint32_t *map);

#endif // KILN_RUNTIME_STATE_ROWS_H
