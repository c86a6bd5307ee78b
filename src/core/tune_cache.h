// SPDX-License-Identifier: Apache-2.0
// The tuning cache (option tuning_cache, docs/runtime.md "Tuning cache"): records of the choices a
// backend made by timing, as opaque (key, value) byte strings, kept in a file and reused by later
// contexts and processes. libkiln owns the file: the CUDA plugin reaches it through its services
// (src/runtime/backend_plugin.h) and composes keys that name everything a choice depends on (the
// GPU, the driver and library versions, Kiln's version, the policy, the layer's problem), so a
// record made elsewhere never matches. The values are untrusted: their user checks each one.
//
// The file is untrusted input: a header (magic, format version, record count, body size, CRCs)
// and the records, every length bounded; anything that does not check is discarded whole with an
// INFO log, never an error. Writes take an advisory lock on PATH.lock, merge the records on disk
// with those of this process and replace the file by rename(2): readers see the old file or the
// new one, and two processes writing at once lose nothing.
#ifndef KILN_CORE_TUNE_CACHE_H
#define KILN_CORE_TUNE_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/kiln.h"

#define KILN_TUNE_KEY_MAX 1024u      // bytes of a record's key
#define KILN_TUNE_VALUE_MAX 1024u    // bytes of a record's value
#define KILN_TUNE_RECORDS_MAX 65536u // records one file keeps (later ones are not stored)

// The file the option value `where` names: "auto" -> $XDG_CACHE_HOME/kiln/tuning.kilncache or
// ~/.cache/kiln/tuning.kilncache; a path as given. Writes it into buf; 0 when there is none ("off",
// or "auto" without a cache directory) or it does not fit.
int kiln_tune_cache_path(const char *where, char *buf, size_t buf_nbytes);

// The value of key in the cache `where` (loading the file on first use): 1 and *val_nbytes set
// when found and it fits val_cap; 0 otherwise.
int kiln_tune_cache_get(const char *where, const void *key, size_t key_nbytes, void *val,
                        size_t val_cap, size_t *val_nbytes);

// Records (key, value) in this process's copy (replacing a record of the same key). The file is
// written by kiln_tune_cache_flush. Nothing happens with "off"; too long a key or value, or a
// full cache, is skipped.
void kiln_tune_cache_put(const char *where, const void *key, size_t key_nbytes, const void *val,
                         size_t val_nbytes);

// How many records the cache `where` holds (loading the file on first use), and how many of them
// have keys starting with prefix (for a log line: records made elsewhere are never used).
void kiln_tune_cache_stats(const char *where, const void *prefix, size_t prefix_nbytes,
                           uint32_t *n_records, uint32_t *n_prefix);

// Writes the records put since the last flush to the file (merged with it, atomically). A write
// that fails (a read-only directory, a full disk) is logged at INFO: the next flush tries again.
void kiln_tune_cache_flush(const char *where);

// Test support: forgets every cache loaded by this process (the files stay) and the programs'
// records.
void kiln_tune_cache_reset(void);

// Adds the records of an image of a cache file (what a program carries: kiln_add_tuning_records)
// to this process's read-only set, which kiln_tune_cache_get consults after the file of `where`
// (also with "off"). Untrusted: the image is checked whole (header, CRCs, every record's bounds)
// and nothing is taken when it does not check. Returns NULL, or why it was refused; *n_added:
// the records taken.
const char *kiln_tune_cache_add_image(const void *data, size_t nbytes, uint32_t *n_added);

#endif // KILN_CORE_TUNE_CACHE_H
