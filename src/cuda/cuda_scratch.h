// SPDX-License-Identifier: Apache-2.0
// The CUDA backend's shared activation arenas (option use_shared_activation_scratch; host C only,
// cuda_scratch.c): one process-wide registry holding, per CUDA device, one arena that every
// context of a sharing engine on that device uses instead of its own.
//
// An arena has a device block (zeroed when allocated), its size (the largest size any of its
// users asked for: it grows, never shrinks, and is freed with its last user), a user count, a
// generation (bumped whenever the block is replaced: a user that bound tensor views at another
// generation re-points them and drops what recorded the old addresses, such as a CUDA graph) and
// an execution lock. A user holds the execution lock for as long as work of its own that touches
// the arena may be in flight (a whole execute, through its final synchronize): users of one
// arena therefore run one at a time, whatever their threads and streams. Growing takes the
// execution lock and synchronizes the device before the old block is freed.
//
// Lock order: the registry's lock, then an arena's execution lock (never the other way round).
// Only the per-context activation arena is shared; a context's fold pool, layout copies, I/O
// staging buffers and cuBLASLt/cuDNN workspace stay its own.
#ifndef KILN_CUDA_CUDA_SCRATCH_H
#define KILN_CUDA_CUDA_SCRATCH_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/kiln.h"

// The devices the registry holds arenas for (cuda:0 .. cuda:63).
#define KILN_CUDA_SCRATCH_MAX_DEVICES 64

typedef struct kiln_cuda_scratch kiln_cuda_scratch;

// Joins the shared arena of `device` (the calling thread's current device) as one more user,
// growing it to at least nbytes (> 0). Growth waits for every user's execute to finish (the
// execution lock), then for the whole device (cudaDeviceSynchronize), so it belongs at context
// creation only. Failures: KILN_ERR_NO_MEMORY when the larger block cannot be allocated,
// KILN_ERR_DEVICE for another CUDA error, KILN_ERR_UNSUPPORTED for a device beyond the registry;
// on failure nothing changes (the current block stays valid for its users). *out is written
// only on success.
kiln_status kiln_cuda_scratch_acquire(int device, size_t nbytes, kiln_cuda_scratch **out);

// Leaves the arena (NULL: nothing). The caller's work on it must be finished. The last user
// frees the block (on the arena's device; the caller's current device is kept).
void kiln_cuda_scratch_release(kiln_cuda_scratch *s);

// Takes the execution lock; returns the block and writes its generation. Both stay valid until
// kiln_cuda_scratch_unlock. Blocks while another user holds the lock.
void *kiln_cuda_scratch_lock(kiln_cuda_scratch *s, uint64_t *generation);
void kiln_cuda_scratch_unlock(kiln_cuda_scratch *s);

#endif // KILN_CUDA_CUDA_SCRATCH_H
