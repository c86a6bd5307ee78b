// SPDX-License-Identifier: Apache-2.0
// The engine runtime (include/kiln/kiln_engine.h): load = validate the bytes into a plan
// (src/runtime/load.c), resolve external weights, resolve options, pick a backend and let it
// place the weights; contexts bind caller memory, infer concrete shapes with the builder's own
// shape inference (src/ir/shape.h) when the input shapes change, check them against the plan's
// ranges and the output capacities, and hand the layer loop to the backend.
//
// Execute allocates nothing: every array it touches is sized at context creation.
#define _POSIX_C_SOURCE 200809L // sysconf
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/dtype.h"
#include "core/sha256.h"
#include "core/status.h"
#include "core/tune_cache.h"
#include "ir/shape.h"
#include "runtime/engine_internal.h"
#include "runtime/load.h"

// --- helpers

// Bytes of a tensor of `dtype` with dims; false on overflow.
static int tensor_nbytes(uint32_t dtype, uint32_t rank, const int64_t *dims, uint64_t *out) {
    uint64_t n = kiln_dtype_size((kiln_dtype)dtype);
    for (uint32_t i = 0; i < rank; i++) {
        if (dims[i] < 0 || !kiln_mul_u64(n, (uint64_t)dims[i], &n)) return 0;
    }
    *out = n;
    return 1;
}

// Writes "[2, 3, 4]" into buf (truncated to n bytes).
static const char *dims_str(char *buf, size_t n, uint32_t rank, const int64_t *dims) {
    size_t used = 0;
    buf[0] = '\0';
    for (uint32_t i = 0; i <= rank; i++) {
        int w = i < rank ? snprintf(buf + used, n - used, "%s%" PRId64, i ? ", " : "[", dims[i])
                         : snprintf(buf + used, n - used, "%s]", rank ? "" : "[");
        if (w < 0 || (size_t)w >= n - used) break;
        used += (size_t)w;
    }
    return buf;
}

static const char *tensor_name(const kiln_plan *p, uint32_t id) {
    return kiln_plan_string(p, p->tensors[id].name);
}

// --- load

void kiln_load_options_init(kiln_load_options *options) {
    if (options == NULL) return;
    memset(options, 0, sizeof *options);
    options->struct_nbytes = (uint32_t)sizeof *options;
}

static kiln_status check_load_options(const kiln_load_options *o) {
    if (o == NULL) return KILN_OK;
    KILN_CHECK(o->struct_nbytes == sizeof *o, KILN_ERR_INVALID_ARG,
               "kiln_load_options.struct_nbytes = %u, expected %u: initialize the options with "
               "kiln_load_options_init",
               o->struct_nbytes, (unsigned)sizeof *o);
    KILN_CHECK(o->n_settings == 0 || o->settings != NULL, KILN_ERR_INVALID_ARG,
               "kiln_load_options: n_settings = %u but settings is NULL", o->n_settings);
    return KILN_OK;
}

static kiln_status choose_backend(const kiln_options *o, const kiln_backend_ops **out, char *device,
                                  size_t device_nbytes) {
    const kiln_backend_ops *cuda;
    if (strcmp(o->device, "cpu") == 0) {
        *out = &kiln_backend_cpu;
        snprintf(device, device_nbytes, "cpu");
        return KILN_OK;
    }
    cuda = kiln_backend_cuda_get();
    if (strcmp(o->device, "auto") == 0) {
        if (cuda != NULL) {
            *out = cuda;
            snprintf(device, device_nbytes, "cuda:0");
        } else {
            kiln_log(KILN_LOG_INFO, "device 'auto': no CUDA backend is available (built without "
                                    "CUDA or no GPU visible); the engine runs on the CPU");
            *out = &kiln_backend_cpu;
            snprintf(device, device_nbytes, "cpu");
        }
        return KILN_OK;
    }
    // "cuda:N" (the options module validated the form).
    KILN_CHECK(cuda != NULL, KILN_ERR_DEVICE,
               "device '%s' was requested but no CUDA backend is available (libkiln was built "
               "without CUDA, the CUDA plugin was not found, or no GPU is visible); use device "
               "'cpu', or 'auto' to fall back to the CPU",
               o->device);
    *out = cuda;
    snprintf(device, device_nbytes, "%s", o->device);
    return KILN_OK;
}

// --- weight verification: an external weight's key names the SHA-256 digest of its bytes (the
// tree digest for "kiln-t-<hex>", src/builder/plan_emit.c; the plain digest for "kiln-w-<hex>",
// engines written before it), so the bytes a resolver returns can be checked against the engine,
// which is itself CRC-protected. Keys of another form (hand-made engines) name no digest and are
// not checked.

#define KEY_PREFIX_NBYTES 7

// 2 for a tree digest's key, 1 for a plain digest's, 0 for a key that names no digest.
static int key_digest(const char *key, uint8_t digest[KILN_SHA256_NBYTES]) {
    int kind = strncmp(key, "kiln-t-", KEY_PREFIX_NBYTES) == 0   ? 2
               : strncmp(key, "kiln-w-", KEY_PREFIX_NBYTES) == 0 ? 1
                                                                 : 0;
    if (kind == 0) return 0;
    const char *h = key + KEY_PREFIX_NBYTES;
    for (int i = 0; i < 2 * KILN_SHA256_NBYTES; i++) {
        if (!((h[i] >= '0' && h[i] <= '9') || (h[i] >= 'a' && h[i] <= 'f'))) return 0;
    }
    if (h[2 * KILN_SHA256_NBYTES] != '\0') return 0;
    for (int i = 0; i < KILN_SHA256_NBYTES; i++) {
        int hi = h[2 * i] <= '9' ? h[2 * i] - '0' : h[2 * i] - 'a' + 10;
        int lo = h[2 * i + 1] <= '9' ? h[2 * i + 1] - '0' : h[2 * i + 1] - 'a' + 10;
        digest[i] = (uint8_t)(hi << 4 | lo);
    }
    return kind;
}

typedef struct ext_weight {
    const void *data;
    uint64_t nbytes;
    uint32_t tensor;
    int kind;      // what key_digest says of its key (0: no digest, not checked)
    int tree;      // the key is a tree digest: leaves hashed apart, then combined
    uint32_t dup;  // 1 + the entry holding the same buffer, hashed once there (0: none)
    int mismatch;  // its bytes do not hash to its key
    uint8_t *leaf; // tree: its leaves' digests (in the check table's leaf block)
    uint8_t want[KILN_SHA256_NBYTES];
    uint8_t got[KILN_SHA256_NBYTES];
} ext_weight;

static int cmp_ext(const void *a, const void *b) {
    const ext_weight *x = a, *y = b;
    uintptr_t px = (uintptr_t)x->data, py = (uintptr_t)y->data;
    if (px != py) return px < py ? -1 : 1;
    if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
    return x->tensor < y->tensor ? -1 : (x->tensor > y->tensor);
}

// One piece of hashing: a tree weight's leaf, or a whole plain-digest weight.
typedef struct hash_item {
    ext_weight *w;
    size_t leaf; // tree: the leaf's index
} hash_item;

typedef struct verify_job {
    hash_item *items;
    size_t n;
    atomic_size_t next; // the next item to hash
} verify_job;

static void hash_item_run(const hash_item *it) {
    ext_weight *w = it->w;
    if (!w->tree) {
        kiln_sha256_fast(w->data, (size_t)w->nbytes, w->got);
        return;
    }
    size_t off = it->leaf * KILN_SHA256_LEAF_NBYTES;
    size_t n = (size_t)w->nbytes - off;
    if (n > KILN_SHA256_LEAF_NBYTES) n = KILN_SHA256_LEAF_NBYTES;
    kiln_sha256_fast((const uint8_t *)w->data + off, n, w->leaf + it->leaf * KILN_SHA256_NBYTES);
}

static void *hash_worker(void *arg) {
    verify_job *j = arg;
    for (size_t i; (i = atomic_fetch_add(&j->next, 1)) < j->n;) hash_item_run(&j->items[i]);
    return NULL;
}

// Hashes the items on up to 16 threads when there is enough to hash (the calling thread works
// too, and does everything if no thread can be started), leaving `reserve` of the machine's
// cores to other work of the load. A tree weight's leaves are separate items, so one large
// tensor (an embedding table) spreads over the threads.
static void hash_all(hash_item *items, size_t n, uint64_t total, long reserve) {
    verify_job job = {items, n, 0};
    pthread_t threads[15];
    int n_threads = 0;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN) - reserve;
    if (total >= (UINT64_C(16) << 20) && cpus > 1 && n > 1) {
        long want = cpus - 1 < 15 ? cpus - 1 : 15;
        for (; n_threads < want && (size_t)n_threads + 1 < n; n_threads++) {
            if (pthread_create(&threads[n_threads], NULL, hash_worker, &job) != 0) break;
        }
    }
    hash_worker(&job);
    for (int t = 0; t < n_threads; t++) pthread_join(threads[t], NULL);
}

// Plain-digest weights first (each one item that cannot be split), largest first, so that the
// leaves fill in around them.
static int cmp_item(const void *a, const void *b) {
    const hash_item *x = a, *y = b;
    if (x->w->tree != y->w->tree) return x->w->tree ? 1 : -1;
    if (!x->w->tree && x->w->nbytes != y->w->nbytes) return x->w->nbytes > y->w->nbytes ? -1 : 1;
    return 0;
}

static kiln_status mismatch_error(const kiln_plan *p, const ext_weight *w) {
    const kiln_plan_tensor *t = &p->tensors[w->tensor];
    const char *key = kiln_plan_string(p, t->key);
    const char *name = kiln_plan_string(p, t->name);
    char got_hex[65];
    kiln_sha256_hex(w->got, got_hex);
    return kiln_fail(KILN_ERR_CORRUPT,
                     "external weight '%s' (tensor %u%s%s%s, %s %s, %" PRIu64
                     " bytes) does not match the SHA-256 its key names (the bytes given hash to "
                     "%.16s...): the named data in the .pte or the .ptd file holding it is "
                     "damaged or belongs to another export; re-export, or the file was damaged in "
                     "transit (only for trusted files: the option verify_weights = false skips "
                     "this check)",
                     key, w->tensor, name[0] ? " '" : "", name, name[0] ? "'" : "",
                     kiln_dtype_name((kiln_dtype)t->dtype),
                     dims_str((char[96]){0}, 96, t->shape.rank, t->shape.max), w->nbytes, got_hex);
}

// A weight or a state's initial value stored outside the engine.
static int has_data_key(const kiln_plan_tensor *t) {
    return (t->kind == KILN_TENSOR_WEIGHT || t->kind == KILN_TENSOR_STATE) && t->key != KILN_NO_KEY;
}

// The check of one load's external weights: its tables, and the thread hashing them when the
// check runs beside the backend's upload.
typedef struct weight_check {
    const kiln_plan *plan;
    ext_weight *w;
    size_t w_nbytes;
    uint32_t n;
    hash_item *items;
    size_t items_nbytes, n_items;
    uint8_t *leaf;
    size_t leaf_nbytes;
    uint64_t total;   // distinct bytes to hash
    pthread_t thread; // valid when `threaded`
    int threaded;
} weight_check;

// The machine's cores left to the backend's upload while a check runs beside it (its threads).
#define UPLOAD_CORES 4

static void *check_thread(void *arg) {
    weight_check *c = arg;
    hash_all(c->items, c->n_items, c->total, UPLOAD_CORES);
    return NULL;
}

static void check_release(weight_check *c) {
    kiln_free(c->items, c->items_nbytes);
    kiln_free(c->leaf, c->leaf_nbytes);
    kiln_free(c->w, c->w_nbytes);
    memset(c, 0, sizeof *c);
}

// Starts the check of every external weight whose key names a digest, each distinct buffer once
// (tensors sharing a key usually get the same bytes back): hashed on this thread before it
// returns, or with `background` on a thread of its own, so that the caller can upload the
// weights meanwhile. check_finish gives the verdict (and must be called once check_start
// succeeded).
static kiln_status check_start(const kiln_plan *p, const void **weight_data, int background,
                               weight_check *c) {
    memset(c, 0, sizeof *c);
    c->plan = p;
    for (uint32_t i = 0; i < p->n_tensors; i++) {
        c->n += has_data_key(&p->tensors[i]);
    }
    if (c->n == 0) return KILN_OK;
    c->w_nbytes = (size_t)c->n * sizeof(ext_weight);
    ext_weight *w = c->w = kiln_calloc(c->w_nbytes, KILN_ALIGN);
    KILN_CHECK(w != NULL, KILN_ERR_NO_MEMORY,
               "out of memory allocating the weight check table (%u weights)", c->n);
    uint32_t k = 0;
    for (uint32_t i = 0; i < p->n_tensors; i++) {
        const kiln_plan_tensor *t = &p->tensors[i];
        if (!has_data_key(t)) continue;
        w[k].data = weight_data[i];
        w[k].nbytes = t->nbytes;
        w[k].tensor = i;
        k++;
    }
    // Sorted by buffer: a buffer given for several tensors is hashed once.
    qsort(w, c->n, sizeof *w, cmp_ext);
    size_t n_leaves = 0;
    uint32_t last = UINT32_MAX; // the last entry hashed
    for (uint32_t j = 0; j < c->n; j++) {
        w[j].kind = key_digest(kiln_plan_string(p, p->tensors[w[j].tensor].key), w[j].want);
        w[j].tree = w[j].kind == 2;
        if (w[j].kind == 0) continue;
        if (last != UINT32_MAX && w[j].data == w[last].data && w[j].nbytes == w[last].nbytes &&
            w[j].kind == w[last].kind) {
            w[j].dup = last + 1;
            continue;
        }
        last = j;
        c->total += w[j].nbytes; // weight bytes: the loader bounded their sum
        size_t leaves = w[j].tree ? kiln_sha256_tree_leaves(w[j].nbytes) : 1;
        c->n_items += leaves;
        if (w[j].tree) n_leaves += leaves;
    }
    c->items_nbytes = c->n_items * sizeof(hash_item) + 1;
    c->leaf_nbytes = n_leaves * KILN_SHA256_NBYTES + 1;
    c->items = kiln_calloc(c->items_nbytes, KILN_ALIGN);
    c->leaf = kiln_calloc(c->leaf_nbytes, KILN_ALIGN);
    if (c->items == NULL || c->leaf == NULL) {
        size_t n_items = c->n_items;
        check_release(c);
        return kiln_fail(KILN_ERR_NO_MEMORY,
                         "out of memory allocating the weight check table (%zu pieces)", n_items);
    }
    size_t it = 0, lf = 0;
    for (uint32_t j = 0; j < c->n; j++) {
        if (w[j].kind == 0 || w[j].dup != 0) continue;
        if (!w[j].tree) {
            c->items[it++] = (hash_item){&w[j], 0};
            continue;
        }
        size_t leaves = kiln_sha256_tree_leaves(w[j].nbytes);
        w[j].leaf = c->leaf + lf * KILN_SHA256_NBYTES;
        lf += leaves;
        for (size_t l = 0; l < leaves; l++) c->items[it++] = (hash_item){&w[j], l};
    }
    qsort(c->items, c->n_items, sizeof *c->items, cmp_item);
    // (a thread that cannot be started: the hashing is done here instead)
    c->threaded =
        background && c->n_items > 0 && pthread_create(&c->thread, NULL, check_thread, c) == 0;
    if (!c->threaded) hash_all(c->items, c->n_items, c->total, 0);
    return KILN_OK;
}

// Waits for the hashing and compares. When several weights are damaged, the message names the
// one of the lowest tensor index, whatever the order of the work. Releases the tables.
static kiln_status check_finish(weight_check *c) {
    if (c->threaded) pthread_join(c->thread, NULL);
    c->threaded = 0;
    const ext_weight *bad = NULL;
    ext_weight *w = c->w;
    for (uint32_t j = 0; j < c->n; j++) {
        if (w[j].kind == 0) continue;
        if (w[j].dup != 0) {
            memcpy(w[j].got, w[w[j].dup - 1].got, sizeof w[j].got); // (an earlier entry: done)
        } else if (w[j].tree) {
            kiln_sha256_tree_combine(w[j].nbytes, w[j].leaf, kiln_sha256_tree_leaves(w[j].nbytes),
                                     w[j].got);
        }
        w[j].mismatch = memcmp(w[j].want, w[j].got, sizeof w[j].want) != 0;
        if (w[j].mismatch && (bad == NULL || w[j].tensor < bad->tensor)) bad = &w[j];
    }
    kiln_status st = bad != NULL ? mismatch_error(c->plan, bad) : KILN_OK;
    check_release(c);
    return st;
}

// Fills weight_data[i] for every WEIGHT tensor and every STATE with an initial value: inline
// data from the plan, external data from the resolver (size-checked). Sums the weight bytes
// (states are not weights: every context holds its own copy).
static kiln_status resolve_weights(const kiln_plan *p, const kiln_load_options *o,
                                   const void **weight_data, uint64_t *out_nbytes) {
    uint64_t total = 0;
    for (uint32_t i = 0; i < p->n_tensors; i++) {
        const kiln_plan_tensor *t = &p->tensors[i];
        const char *key;
        const void *data = NULL;
        size_t n = 0;
        kiln_status st;
        if (t->kind == KILN_TENSOR_STATE && t->key == KILN_NO_KEY) {
            weight_data[i] = t->offset == KILN_STATE_ZERO ? NULL : p->weights + t->offset;
            continue;
        }
        if (t->kind != KILN_TENSOR_WEIGHT && t->kind != KILN_TENSOR_STATE) continue;
        if (t->kind == KILN_TENSOR_WEIGHT) {
            KILN_CHECK(kiln_add_u64(total, t->nbytes, &total), KILN_ERR_CORRUPT,
                       "weight bytes overflow at tensor %u", i);
        }
        if (t->key == KILN_NO_KEY) {
            weight_data[i] = p->weights + t->offset;
            continue;
        }
        key = kiln_plan_string(p, t->key);
        KILN_CHECK(o != NULL && o->resolve != NULL, KILN_ERR_MISSING_DATA,
                   "weight '%s' (tensor %u, %" PRIu64 " bytes) is stored outside the engine: "
                   "load it with the .ptd data file it was exported with, or pass a "
                   "kiln_weight_resolver in kiln_load_options.resolve",
                   key, i, t->nbytes);
        st = o->resolve(o->resolve_user_data, key, &data, &n);
        if (st != KILN_OK) {
            if ((unsigned)st >= KILN_STATUS_COUNT) st = KILN_ERR_MISSING_DATA;
            return kiln_fail(st,
                             "external weight '%s' (tensor %u, %" PRIu64 " bytes) could not be "
                             "resolved: the resolver returned '%s'; pass the .ptd data file that "
                             "was exported with this engine",
                             key, i, t->nbytes, kiln_status_str(st));
        }
        KILN_CHECK((uint64_t)n == t->nbytes, KILN_ERR_CORRUPT,
                   "external weight '%s' (tensor %u): the resolver returned %zu bytes but the "
                   "engine expects %" PRIu64 " (%s %s): the .ptd or the .pte's named data does not "
                   "belong to this engine, or is damaged; pass the .ptd written with this "
                   "engine, re-export, or the file was damaged in transit",
                   key, i, n, t->nbytes, kiln_dtype_name((kiln_dtype)t->dtype),
                   dims_str((char[96]){0}, 96, t->shape.rank, t->shape.max));
        KILN_CHECK(data != NULL || n == 0, KILN_ERR_MISSING_DATA,
                   "external weight '%s': the resolver returned success with NULL data", key);
        weight_data[i] = data;
    }
    *out_nbytes = total;
    return KILN_OK;
}

kiln_status kiln_engine_from_plan(kiln_plan *plan, const kiln_load_options *options,
                                  kiln_engine **out) {
    kiln_engine *e = NULL;
    const void **weight_data = NULL;
    size_t weight_data_nbytes = 0;
    kiln_options opts;
    const kiln_backend_ops *backend = NULL;
    char device[32];
    weight_check check = {0};
    int checking = 0; // the check's thread is hashing: check_finish is still due
    kiln_status st;

    st = check_load_options(options);
    if (st != KILN_OK) goto fail;
    st = kiln_options_resolve(options ? options->settings : NULL, options ? options->n_settings : 0,
                              &opts);
    if (st != KILN_OK) goto fail;
    st = choose_backend(&opts, &backend, device, sizeof device);
    if (st != KILN_OK) goto fail;

    e = kiln_calloc(sizeof *e, KILN_ALIGN);
    if (e == NULL) {
        st = kiln_fail(KILN_ERR_NO_MEMORY, "out of memory allocating the engine");
        goto fail;
    }
    e->plan = *plan; // ownership moves to the engine
    memset(plan, 0, sizeof *plan);
    e->options = opts;
    e->backend = backend;
    memcpy(e->device, device, sizeof e->device);

    weight_data_nbytes = (size_t)e->plan.n_tensors * sizeof *weight_data;
    weight_data = kiln_calloc(weight_data_nbytes, KILN_ALIGN);
    if (weight_data == NULL) {
        st = kiln_fail(KILN_ERR_NO_MEMORY, "out of memory allocating the weight table (%u tensors)",
                       e->plan.n_tensors);
        goto fail;
    }
    if (backend->warm_up != NULL) backend->warm_up(&e->plan, &e->options);
    st = resolve_weights(&e->plan, options, weight_data, &e->weight_nbytes);
    if (st != KILN_OK) goto fail;
    // The weights' check runs beside the backend's upload where the backend can hold back what
    // it shares with other engines until the verdict (weights_checked); otherwise before it.
    if (e->options.verify_weights) {
        st = check_start(&e->plan, weight_data, backend->weights_checked != NULL, &check);
        if (st != KILN_OK) goto fail;
        checking = check.threaded;
        if (!checking) st = check_finish(&check); // (hashed already, on this thread)
        if (st != KILN_OK) goto fail;
    }
    st = kiln_row_writes_find(&e->plan, &e->row_writes, &e->n_row_writes);
    if (st == KILN_OK) st = kiln_index_inputs_find(&e->plan, &e->index_inputs, &e->n_index_inputs);
    if (st == KILN_OK) {
        st = backend->engine_init(&e->plan, weight_data, &e->options, &e->backend_state);
    }
    if (checking) {
        // A damaged weight is the cause to report, whatever the upload said.
        checking = 0;
        kiln_status verdict = check_finish(&check);
        if (verdict != KILN_OK) {
            if (st == KILN_OK) backend->engine_free(e->backend_state);
            e->backend_state = NULL;
            st = verdict;
        }
    }
    if (st != KILN_OK) goto fail;
    if (e->options.verify_weights && backend->weights_checked != NULL) {
        backend->weights_checked(e->backend_state);
    }
    kiln_free(weight_data, weight_data_nbytes);

    // The backend holds its own copy of the weights now.
    kiln_free(e->plan.weights, (size_t)e->plan.weights_nbytes);
    e->plan.weights = NULL;
    e->plan.weights_nbytes = 0;
    *out = e;
    return KILN_OK;

fail:
    kiln_free(weight_data, weight_data_nbytes);
    if (e != NULL) {
        kiln_row_writes_free(e->row_writes, e->n_row_writes);
        kiln_index_inputs_free(e->index_inputs, e->n_index_inputs);
        kiln_plan_release(&e->plan);
        kiln_free(e, sizeof *e);
    } else {
        kiln_plan_release(plan);
    }
    return st;
}

kiln_status kiln_engine_load(const void *data, size_t nbytes, const kiln_load_options *options,
                             kiln_engine **out) {
    kiln_plan plan;
    KILN_CHECK(out != NULL, KILN_ERR_INVALID_ARG, "kiln_engine_load: out is NULL");
    KILN_CHECK(data != NULL || nbytes == 0, KILN_ERR_INVALID_ARG,
               "kiln_engine_load: data is NULL but nbytes = %zu", nbytes);
    KILN_TRY(check_load_options(options));
    memset(&plan, 0, sizeof plan);
    KILN_TRY(kiln_load_plan(data, nbytes, &plan));
    return kiln_engine_from_plan(&plan, options, out);
}

void kiln_engine_free(kiln_engine *engine) {
    if (engine == NULL) return;
    if (engine->backend != NULL) engine->backend->engine_free(engine->backend_state);
    kiln_row_writes_free(engine->row_writes, engine->n_row_writes);
    kiln_index_inputs_free(engine->index_inputs, engine->n_index_inputs);
    kiln_plan_release(&engine->plan);
    kiln_free(engine, sizeof *engine);
}

const kiln_plan *kiln_engine_plan(const kiln_engine *engine) {
    return engine ? &engine->plan : NULL;
}

// --- engine queries

uint32_t kiln_engine_n_inputs(const kiln_engine *engine) {
    return engine ? engine->plan.n_inputs : 0;
}

uint32_t kiln_engine_n_outputs(const kiln_engine *engine) {
    return engine ? engine->plan.n_outputs : 0;
}

kiln_status kiln_engine_binding(const kiln_engine *engine, int32_t is_input, uint32_t index,
                                kiln_binding_info *out) {
    const kiln_plan *p;
    const kiln_plan_tensor *t;
    uint32_t n;
    uint64_t nbytes = 0;
    kiln_binding_info info;
    KILN_CHECK(engine != NULL && out != NULL, KILN_ERR_INVALID_ARG,
               "kiln_engine_binding: engine and out must not be NULL");
    p = &engine->plan;
    n = is_input ? p->n_inputs : p->n_outputs;
    KILN_CHECK(index < n, KILN_ERR_INVALID_ARG,
               "kiln_engine_binding: %s index %u is out of range (the engine has %u)",
               is_input ? "input" : "output", index, n);
    t = &p->tensors[is_input ? p->inputs[index] : p->outputs[index]];
    memset(&info, 0, sizeof info);
    info.name = kiln_plan_string(p, t->name);
    info.dtype = (kiln_dtype)t->dtype;
    info.rank = t->shape.rank;
    for (uint32_t d = 0; d < t->shape.rank; d++) {
        info.dim_min[d] = t->shape.min[d];
        info.dim_max[d] = t->shape.max[d];
    }
    info.is_input = is_input != 0;
    KILN_CHECK(tensor_nbytes(t->dtype, t->shape.rank, t->shape.max, &nbytes), KILN_ERR_INTERNAL,
               "binding '%s': byte size overflows", info.name);
    info.max_nbytes = nbytes;
    *out = info;
    return KILN_OK;
}

const char *kiln_engine_device(const kiln_engine *engine) { return engine ? engine->device : ""; }

uint64_t kiln_engine_arena_nbytes(const kiln_engine *engine) {
    return engine ? engine->plan.arena_nbytes : 0;
}

uint64_t kiln_engine_weight_nbytes(const kiln_engine *engine) {
    return engine ? engine->weight_nbytes : 0;
}

uint32_t kiln_engine_n_states(const kiln_engine *engine) {
    uint32_t n = 0;
    if (engine == NULL) return 0;
    for (uint32_t i = 0; i < engine->plan.n_tensors; i++) {
        n += engine->plan.tensors[i].kind == KILN_TENSOR_STATE;
    }
    return n;
}

kiln_status kiln_engine_get_option(const kiln_engine *engine, const char *name, char *buf,
                                   size_t buf_nbytes) {
    KILN_CHECK(engine != NULL, KILN_ERR_INVALID_ARG, "kiln_engine_get_option: engine is NULL");
    return kiln_options_get(&engine->options, name, buf, buf_nbytes);
}

// --- memory where the engine runs (I/O bound without staging)

kiln_status kiln_engine_alloc_memory(const kiln_engine *engine, size_t nbytes, void **out) {
    void *p = NULL;
    KILN_CHECK(engine != NULL && out != NULL, KILN_ERR_INVALID_ARG,
               "kiln_engine_alloc_memory: engine and out must not be NULL");
    KILN_CHECK(engine->backend->memory_alloc != NULL, KILN_ERR_UNSUPPORTED,
               "kiln_engine_alloc_memory: the %s backend has no memory of its own to lend",
               engine->backend->name);
    KILN_TRY(engine->backend->memory_alloc(engine->backend_state, nbytes, &p));
    *out = p;
    return KILN_OK;
}

void kiln_engine_free_memory(const kiln_engine *engine, void *data, size_t nbytes) {
    if (engine == NULL || data == NULL || engine->backend->memory_free == NULL) return;
    engine->backend->memory_free(engine->backend_state, data, nbytes);
}

kiln_status kiln_engine_copy_memory(const kiln_engine *engine, void *dst, const void *src,
                                    size_t nbytes) {
    KILN_CHECK(engine != NULL, KILN_ERR_INVALID_ARG, "kiln_engine_copy_memory: engine is NULL");
    if (nbytes == 0) return KILN_OK;
    KILN_CHECK(dst != NULL && src != NULL, KILN_ERR_INVALID_ARG,
               "kiln_engine_copy_memory: dst and src must not be NULL for %zu bytes", nbytes);
    KILN_CHECK(engine->backend->memory_copy != NULL, KILN_ERR_UNSUPPORTED,
               "kiln_engine_copy_memory: the %s backend cannot copy memory", engine->backend->name);
    return engine->backend->memory_copy(engine->backend_state, dst, src, nbytes,
                                        kiln_thread_stream());
}

uint32_t kiln_engine_n_layers(const kiln_engine *engine) {
    return engine ? engine->plan.n_layers : 0;
}

// --- contexts

static kiln_status acquire(kiln_context *c, const char *fn) {
    if (atomic_exchange_explicit(&c->busy, 1, memory_order_acquire) != 0) {
        return kiln_fail(KILN_ERR_BUSY,
                         "%s: the context is in use by another thread; use one kiln_context per "
                         "thread (contexts of one engine may run concurrently)",
                         fn);
    }
    return KILN_OK;
}

static void release(kiln_context *c) { atomic_store_explicit(&c->busy, 0, memory_order_release); }

static size_t array_nbytes(uint32_t n, size_t elem) { return (size_t)n * elem; }

static void context_free_arrays(kiln_context *c, const kiln_plan *p) {
    kiln_state_rows_free(p, c->rows);
    kiln_free(c->row_in, array_nbytes(p->n_inputs, sizeof *c->row_in));
    kiln_free(c->row_numel, array_nbytes(p->n_inputs, sizeof *c->row_numel));
    kiln_free(c->tensors, array_nbytes(p->n_tensors, sizeof *c->tensors));
    kiln_free(c->descs, array_nbytes(p->n_tensors, sizeof *c->descs));
    kiln_free(c->inputs, array_nbytes(p->n_inputs, sizeof *c->inputs));
    kiln_free(c->outputs, array_nbytes(p->n_outputs, sizeof *c->outputs));
}

kiln_status kiln_context_new(kiln_engine *engine, kiln_context **out) {
    kiln_context *c;
    const kiln_plan *p;
    kiln_status st;
    KILN_CHECK(engine != NULL && out != NULL, KILN_ERR_INVALID_ARG,
               "kiln_context_new: engine and out must not be NULL");
    p = &engine->plan;
    c = kiln_calloc(sizeof *c, KILN_ALIGN);
    KILN_CHECK(c != NULL, KILN_ERR_NO_MEMORY, "out of memory allocating an execution context");
    c->engine = engine;
    atomic_init(&c->busy, 0);
    c->tensors = kiln_calloc(array_nbytes(p->n_tensors, sizeof *c->tensors), KILN_ALIGN);
    c->descs = kiln_calloc(array_nbytes(p->n_tensors, sizeof *c->descs), KILN_ALIGN);
    c->inputs = kiln_calloc(array_nbytes(p->n_inputs, sizeof *c->inputs), KILN_ALIGN);
    c->outputs = kiln_calloc(array_nbytes(p->n_outputs, sizeof *c->outputs), KILN_ALIGN);
    if (c->tensors == NULL || c->descs == NULL || c->inputs == NULL || c->outputs == NULL) {
        st = kiln_fail(KILN_ERR_NO_MEMORY,
                       "out of memory allocating the context's tensor tables (%u tensors)",
                       p->n_tensors);
        goto fail;
    }
    // Until the first inference every tensor carries its planned range (weights are static).
    for (uint32_t i = 0; i < p->n_tensors; i++) {
        const kiln_plan_tensor *t = &p->tensors[i];
        c->descs[i].dtype = t->dtype;
        c->descs[i].shape = t->shape;
        c->tensors[i].dtype = t->dtype;
        c->tensors[i].rank = t->shape.rank;
        memcpy(c->tensors[i].dims, t->shape.max, sizeof c->tensors[i].dims);
    }
    c->shapes_changed = 1;
    if (engine->n_row_writes > 0) {
        st = kiln_state_rows_new(p, engine->row_writes, engine->n_row_writes, &c->rows);
        if (st != KILN_OK) goto fail;
    }
    if (engine->n_row_writes > 0 || engine->n_index_inputs > 0) {
        c->row_in = kiln_calloc(array_nbytes(p->n_inputs, sizeof *c->row_in) + 1, KILN_ALIGN);
        c->row_numel = kiln_calloc(array_nbytes(p->n_inputs, sizeof *c->row_numel) + 1, KILN_ALIGN);
        if (c->row_in == NULL || c->row_numel == NULL) {
            st = kiln_fail(KILN_ERR_NO_MEMORY, "out of memory allocating the context's tables");
            goto fail;
        }
    }
    st = engine->backend->context_init(engine->backend_state, &c->backend_state);
    if (st != KILN_OK) goto fail;
    *out = c;
    return KILN_OK;

fail:
    context_free_arrays(c, p);
    kiln_free(c, sizeof *c);
    return st;
}

void kiln_context_free(kiln_context *context) {
    if (context == NULL) return;
    context->engine->backend->context_free(context->backend_state);
    context_free_arrays(context, &context->engine->plan);
    kiln_free(context, sizeof *context);
}

kiln_status kiln_context_reset_states(kiln_context *context) {
    kiln_status st;
    KILN_CHECK(context != NULL, KILN_ERR_INVALID_ARG, "kiln_context_reset_states: context is NULL");
    KILN_TRY(acquire(context, "kiln_context_reset_states"));
    st = context->engine->backend->reset_states(context->backend_state);
    if (st == KILN_OK) kiln_state_rows_clear(&context->engine->plan, context->rows);
    release(context);
    return st;
}

static kiln_status share_locked(kiln_context *c, kiln_context *owner, uint32_t *map) {
    const kiln_plan *p = &c->engine->plan, *q = &owner->engine->plan;
    KILN_CHECK(c->engine->backend == owner->engine->backend &&
                   strcmp(c->engine->device, owner->engine->device) == 0,
               KILN_ERR_UNSUPPORTED,
               "kiln_context_share_states: the engines run on %s and %s; contexts share states on "
               "one device only (load both engines with the same option device)",
               c->engine->device, owner->engine->device);
    KILN_CHECK(c->engine->backend->share_states != NULL, KILN_ERR_UNSUPPORTED,
               "kiln_context_share_states: the %s backend cannot share states",
               c->engine->backend->name);
    uint32_t n_shared = 0;
    for (uint32_t i = 0; i < p->n_tensors; i++) {
        const kiln_plan_tensor *t = &p->tensors[i];
        const char *name = kiln_plan_string(p, t->name);
        map[i] = UINT32_MAX; // not shared: the context keeps its own
        if (t->kind != KILN_TENSOR_STATE) continue;
        for (uint32_t j = 0; j < q->n_tensors && map[i] == UINT32_MAX; j++) {
            if (q->tensors[j].kind == KILN_TENSOR_STATE &&
                strcmp(kiln_plan_string(q, q->tensors[j].name), name) == 0) {
                map[i] = j;
            }
        }
        if (map[i] == UINT32_MAX) continue;
        n_shared++;
        {
            const kiln_plan_tensor *u = &q->tensors[map[i]];
            int same = t->dtype == u->dtype && t->shape.rank == u->shape.rank;
            for (uint32_t d = 0; same && d < t->shape.rank; d++) {
                same = t->shape.max[d] == u->shape.max[d];
            }
            KILN_CHECK(same, KILN_ERR_SHAPE,
                       "kiln_context_share_states: state '%s' is %s %s here but %s %s in the "
                       "owner's engine; shared states have one dtype and shape (export the methods "
                       "from buffers of one dtype and shape, or give them different names)",
                       name, kiln_dtype_name((kiln_dtype)t->dtype),
                       dims_str((char[96]){0}, 96, t->shape.rank, t->shape.max),
                       kiln_dtype_name((kiln_dtype)u->dtype),
                       dims_str((char[96]){0}, 96, u->shape.rank, u->shape.max));
        }
    }
    KILN_CHECK(n_shared > 0, KILN_ERR_INVALID_ARG,
               "kiln_context_share_states: no state of this context's engine (%u states) is a "
               "state of the owner's engine; contexts share the states of the same names",
               kiln_engine_n_states(c->engine));
    KILN_TRY(c->engine->backend->share_states(c->backend_state, owner->backend_state, map));
    return kiln_state_rows_share(p, c->rows, q, owner->rows, map);
}

kiln_status kiln_context_share_states(kiln_context *context, kiln_context *owner) {
    static const char fn[] = "kiln_context_share_states";
    uint32_t *map;
    size_t map_nbytes;
    kiln_status st;
    KILN_CHECK(context != NULL && owner != NULL && context != owner, KILN_ERR_INVALID_ARG,
               "%s: context and owner must be two contexts", fn);
    map_nbytes = array_nbytes(context->engine->plan.n_tensors, sizeof *map);
    map = kiln_malloc(map_nbytes > 0 ? map_nbytes : 1, KILN_ALIGN);
    KILN_CHECK(map != NULL, KILN_ERR_NO_MEMORY, "%s: out of memory", fn);
    st = acquire(context, fn);
    if (st == KILN_OK) {
        st = acquire(owner, fn);
        if (st == KILN_OK) {
            st = share_locked(context, owner, map);
            release(owner);
        }
        release(context);
    }
    kiln_free(map, map_nbytes > 0 ? map_nbytes : 1);
    return st;
}

// Whether data is aligned to its elements (the backends' kernels load and store them whole).
static int element_aligned(const void *data, kiln_dtype dtype) {
    const size_t a = kiln_dtype_size(dtype);
    return a <= 1 || (uintptr_t)data % a == 0;
}

static kiln_status set_input_locked(kiln_context *c, uint32_t index, uint32_t rank,
                                    const int64_t *dims, const void *data) {
    const kiln_plan *p = &c->engine->plan;
    const kiln_plan_tensor *t;
    const char *name;
    kiln_input_binding *b;
    int64_t numel = 1;
    KILN_CHECK(index < p->n_inputs, KILN_ERR_INVALID_ARG,
               "kiln_context_set_input: input index %u is out of range (the engine has %u inputs)",
               index, p->n_inputs);
    t = &p->tensors[p->inputs[index]];
    name = kiln_plan_string(p, t->name);
    KILN_CHECK(rank == t->shape.rank, KILN_ERR_SHAPE,
               "input %u '%s': rank %u given, the engine expects rank %u", index, name, rank,
               t->shape.rank);
    KILN_CHECK(rank == 0 || dims != NULL, KILN_ERR_INVALID_ARG,
               "kiln_context_set_input: input %u '%s': dims is NULL for rank %u", index, name,
               rank);
    for (uint32_t d = 0; d < rank; d++) {
        KILN_CHECK(dims[d] >= t->shape.min[d] && dims[d] <= t->shape.max[d], KILN_ERR_SHAPE,
                   "input %u '%s': dimension %u = %" PRId64
                   " is outside the engine's range [%" PRId64 ", %" PRId64
                   "]; rebuild the engine with a wider range to accept it",
                   index, name, d, dims[d], t->shape.min[d], t->shape.max[d]);
    }
    {
        // Within the ranges this cannot exceed the loader's 2^62-byte limit; checked anyway, so
        // that no shape reaches the backends whose byte size does not fit.
        uint64_t n = 1, nbytes = 0;
        int fits = 1;
        for (uint32_t d = 0; d < rank && fits; d++) fits = kiln_mul_u64(n, (uint64_t)dims[d], &n);
        fits = fits && kiln_mul_u64(n, kiln_dtype_size((kiln_dtype)t->dtype), &nbytes) &&
               nbytes <= KILN_FORMAT_MAX_TENSOR_NBYTES;
        KILN_CHECK(fits, KILN_ERR_SHAPE,
                   "input %u '%s': shape %s needs more than 2^62 bytes, Kiln's limit for one "
                   "tensor",
                   index, name, dims_str((char[96]){0}, 96, rank, dims));
        numel = (int64_t)n;
    }
    KILN_CHECK(data != NULL || numel == 0, KILN_ERR_INVALID_ARG,
               "kiln_context_set_input: input %u '%s': data is NULL for %" PRId64 " elements",
               index, name, numel);
    KILN_CHECK(numel == 0 || element_aligned(data, (kiln_dtype)t->dtype), KILN_ERR_INVALID_ARG,
               "kiln_context_set_input: input %u '%s': data at %p is not aligned to its %s "
               "elements (%zu bytes); pass a buffer aligned to the element size (from an "
               "ExecuTorch program: its memory plan is damaged, re-export it)",
               index, name, data, kiln_dtype_name((kiln_dtype)t->dtype),
               kiln_dtype_size((kiln_dtype)t->dtype));
    b = &c->inputs[index];
    if (!b->bound || b->rank != rank ||
        (rank > 0 && memcmp(b->dims, dims, rank * sizeof *dims) != 0)) {
        c->shapes_valid = 0;
    }
    b->bound = 1;
    b->rank = rank;
    memset(b->dims, 0, sizeof b->dims);
    if (rank > 0) memcpy(b->dims, dims, rank * sizeof *dims);
    b->data = data;
    return KILN_OK;
}

kiln_status kiln_context_set_input(kiln_context *context, uint32_t index, uint32_t rank,
                                   const int64_t *dims, const void *data) {
    kiln_status st;
    KILN_CHECK(context != NULL, KILN_ERR_INVALID_ARG, "kiln_context_set_input: context is NULL");
    KILN_TRY(acquire(context, "kiln_context_set_input"));
    st = set_input_locked(context, index, rank, dims, data);
    release(context);
    return st;
}

kiln_status kiln_context_set_output(kiln_context *context, uint32_t index, void *data,
                                    size_t capacity_nbytes) {
    const kiln_plan *p;
    KILN_CHECK(context != NULL, KILN_ERR_INVALID_ARG, "kiln_context_set_output: context is NULL");
    p = &context->engine->plan;
    KILN_CHECK(index < p->n_outputs, KILN_ERR_INVALID_ARG,
               "kiln_context_set_output: output index %u is out of range (the engine has %u "
               "outputs)",
               index, p->n_outputs);
    KILN_CHECK(data != NULL || capacity_nbytes == 0, KILN_ERR_INVALID_ARG,
               "kiln_context_set_output: output %u '%s': data is NULL with capacity %zu", index,
               tensor_name(p, p->outputs[index]), capacity_nbytes);
    {
        const kiln_dtype dt = (kiln_dtype)p->tensors[p->outputs[index]].dtype;
        KILN_CHECK(capacity_nbytes == 0 || element_aligned(data, dt), KILN_ERR_INVALID_ARG,
                   "kiln_context_set_output: output %u '%s': data at %p is not aligned to its %s "
                   "elements (%zu bytes); pass a buffer aligned to the element size (from an "
                   "ExecuTorch program: its memory plan is damaged, re-export it)",
                   index, tensor_name(p, p->outputs[index]), data, kiln_dtype_name(dt),
                   kiln_dtype_size(dt));
    }
    KILN_TRY(acquire(context, "kiln_context_set_output"));
    context->outputs[index].bound = 1;
    context->outputs[index].data = data;
    context->outputs[index].capacity_nbytes = capacity_nbytes;
    release(context);
    return KILN_OK;
}

// The per-thread stream of kiln_set_thread_stream (consulted by execute after the context's).
static _Thread_local void *thread_stream;

kiln_status kiln_set_thread_stream(void *stream) {
    thread_stream = stream;
    return KILN_OK;
}

void *kiln_thread_stream(void) { return thread_stream; }

kiln_status kiln_context_set_stream(kiln_context *context, void *stream) {
    KILN_CHECK(context != NULL, KILN_ERR_INVALID_ARG, "kiln_context_set_stream: context is NULL");
    KILN_TRY(acquire(context, "kiln_context_set_stream"));
    context->stream = stream;
    release(context);
    return KILN_OK;
}

// Concrete shapes of every tensor from the bound input shapes: the builder's inference, run on
// min == max, layer by layer; each result must lie inside the planned range.
static kiln_status infer_shapes(kiln_context *c) {
    const kiln_plan *p = &c->engine->plan;
    for (uint32_t i = 0; i < p->n_inputs; i++) {
        uint32_t id = p->inputs[i];
        const kiln_input_binding *b = &c->inputs[i];
        kiln_shape *s = &c->descs[id].shape;
        s->rank = b->rank;
        for (uint32_t d = 0; d < KILN_MAX_RANK; d++) s->min[d] = s->max[d] = b->dims[d];
        c->tensors[id].rank = b->rank;
        memcpy(c->tensors[id].dims, b->dims, sizeof b->dims);
    }
    for (uint32_t li = 0; li < p->n_layers; li++) {
        const kiln_plan_layer *l = &p->layers[li];
        const kiln_value_desc *ins[KILN_MAX_INPUTS];
        kiln_attrs attrs = kiln_plan_layer_attrs(p, l);
        kiln_value_desc out;
        const kiln_plan_tensor *t;
        char what[64];
        uint32_t id;
        KILN_ASSERT(l->n_inputs <= KILN_MAX_INPUTS && l->n_outputs == 1);
        for (uint32_t j = 0; j < l->n_inputs; j++) {
            int32_t in = p->ids[l->input_begin + j];
            ins[j] = in < 0 ? NULL : &c->descs[in];
        }
        snprintf(what, sizeof what, "layer %u (%s)", li, kiln_op_name(l->op));
        KILN_TRY(kiln_infer(l->op, &attrs, ins, l->n_inputs, what, &out));
        id = (uint32_t)p->ids[l->output_begin];
        t = &p->tensors[id];
        KILN_CHECK(out.dtype == t->dtype && out.shape.rank == t->shape.rank, KILN_ERR_INTERNAL,
                   "%s: inferred %s rank %u, the plan has %s rank %u for tensor %u '%s'", what,
                   kiln_dtype_name((kiln_dtype)out.dtype), out.shape.rank,
                   kiln_dtype_name((kiln_dtype)t->dtype), t->shape.rank, id, tensor_name(p, id));
        for (uint32_t d = 0; d < out.shape.rank; d++) {
            int64_t v = out.shape.max[d];
            KILN_CHECK(out.shape.min[d] == v, KILN_ERR_INTERNAL,
                       "%s: inference gave a range [%" PRId64 ", %" PRId64 "] for a concrete "
                       "dimension %u",
                       what, out.shape.min[d], v, d);
            KILN_CHECK(v >= t->shape.min[d] && v <= t->shape.max[d], KILN_ERR_SHAPE,
                       "%s: output tensor %u '%s' dimension %u = %" PRId64 " is outside its "
                       "planned range [%" PRId64 ", %" PRId64 "] for these input shapes; rebuild "
                       "the engine with input ranges that cover this combination",
                       what, id, tensor_name(p, id), d, v, t->shape.min[d], t->shape.max[d]);
        }
        c->descs[id].shape = out.shape;
        c->tensors[id].rank = out.shape.rank;
        memset(c->tensors[id].dims, 0, sizeof c->tensors[id].dims);
        memcpy(c->tensors[id].dims, out.shape.max, out.shape.rank * sizeof(int64_t));
    }
    return KILN_OK;
}

// Checks that every input is bound and infers the shapes unless they are cached.
static kiln_status ensure_shapes(kiln_context *c, const char *fn) {
    const kiln_plan *p = &c->engine->plan;
    for (uint32_t i = 0; i < p->n_inputs; i++) {
        KILN_CHECK(c->inputs[i].bound, KILN_ERR_INVALID_STATE,
                   "%s: input %u '%s' is not bound; call kiln_context_set_input first", fn, i,
                   tensor_name(p, p->inputs[i]));
    }
    if (!c->shapes_valid) {
        KILN_TRY(infer_shapes(c));
        c->shapes_valid = 1;
        c->shapes_changed = 1;
    }
    return KILN_OK;
}

kiln_status kiln_context_infer_shapes(kiln_context *context) {
    kiln_status st;
    KILN_CHECK(context != NULL, KILN_ERR_INVALID_ARG, "kiln_context_infer_shapes: context is NULL");
    KILN_TRY(acquire(context, "kiln_context_infer_shapes"));
    st = ensure_shapes(context, "kiln_context_infer_shapes");
    release(context);
    return st;
}

static kiln_status execute_locked(kiln_context *c) {
    const kiln_plan *p = &c->engine->plan;
    kiln_exec exec;
    char buf[96];
    KILN_TRY(ensure_shapes(c, "kiln_context_execute"));
    for (uint32_t i = 0; i < p->n_outputs; i++) {
        KILN_CHECK(c->outputs[i].bound, KILN_ERR_INVALID_STATE,
                   "kiln_context_execute: output %u '%s' is not bound; call "
                   "kiln_context_set_output first",
                   i, tensor_name(p, p->outputs[i]));
    }
    for (uint32_t i = 0; i < p->n_outputs; i++) {
        const kiln_tensor *t = &c->tensors[p->outputs[i]];
        uint64_t need = 0;
        KILN_CHECK(tensor_nbytes(t->dtype, t->rank, t->dims, &need), KILN_ERR_INTERNAL,
                   "output %u: byte size overflows", i);
        KILN_CHECK(need <= c->outputs[i].capacity_nbytes, KILN_ERR_SHAPE,
                   "output %u '%s' needs %" PRIu64 " bytes (%s %s) but only %zu bytes are bound; "
                   "bind at least kiln_binding_info.max_nbytes",
                   i, tensor_name(p, p->outputs[i]), need, kiln_dtype_name((kiln_dtype)t->dtype),
                   dims_str(buf, sizeof buf, t->rank, t->dims), c->outputs[i].capacity_nbytes);
    }
    for (uint32_t i = 0; i < p->n_inputs; i++) {
        c->tensors[p->inputs[i]].data = (void *)(uintptr_t)c->inputs[i].data;
    }
    for (uint32_t i = 0; i < p->n_outputs; i++) {
        c->tensors[p->outputs[i]].data = c->outputs[i].data;
    }
    exec.plan = p;
    exec.tensors = c->tensors;
    exec.shapes_changed = c->shapes_changed;
    exec.stream = c->stream != NULL ? c->stream : thread_stream; // NULL: the engine's own
    const kiln_engine *e = c->engine;
    for (uint32_t k = 0; k < e->n_row_writes + e->n_index_inputs; k++) {
        // the host data of the inputs checked below (NULL: in device memory)
        const uint32_t i = k < e->n_row_writes ? e->row_writes[k].input
                                               : e->index_inputs[k - e->n_row_writes].input;
        const kiln_tensor *t = &c->tensors[p->inputs[i]];
        int64_t numel = 1;
        for (uint32_t d = 0; d < t->rank; d++) numel *= t->dims[d];
        int host = e->backend->memory_is_host == NULL ||
                   e->backend->memory_is_host(e->backend_state, c->inputs[i].data);
        c->row_in[i] = host ? c->inputs[i].data : NULL;
        c->row_numel[i] = numel;
    }
    if (e->n_index_inputs > 0) { // token ids against their embeddings (index_inputs.h)
        KILN_TRY(kiln_index_inputs_check(p, e->index_inputs, e->n_index_inputs, c->row_in,
                                         c->row_numel));
    }
    if (e->n_row_writes > 0) { // cache writes at the caller's positions (state_rows.h)
        KILN_TRY(kiln_state_rows_check(p, e->row_writes, e->n_row_writes, c->rows, c->row_in,
                                       c->row_numel, e->options.check_cache_rows));
    }
    KILN_TRY(e->backend->execute(c->backend_state, &exec));
    c->shapes_changed = 0;
    if (e->n_row_writes > 0) {
        kiln_state_rows_commit(p, e->row_writes, e->n_row_writes, c->rows, c->row_in, c->row_numel);
    }
    return KILN_OK;
}

kiln_status kiln_context_execute(kiln_context *context) {
    kiln_status st;
    KILN_CHECK(context != NULL, KILN_ERR_INVALID_ARG, "kiln_context_execute: context is NULL");
    KILN_TRY(acquire(context, "kiln_context_execute"));
    st = execute_locked(context);
    release(context);
    return st;
}

kiln_status kiln_context_output_shape(const kiln_context *context, uint32_t index,
                                      uint32_t *out_rank, int64_t *out_dims) {
    kiln_context *c = (kiln_context *)(uintptr_t)context; // the busy flag is the only write
    const kiln_plan *p;
    const kiln_tensor *t;
    kiln_status st = KILN_OK;
    KILN_CHECK(c != NULL && out_rank != NULL && out_dims != NULL, KILN_ERR_INVALID_ARG,
               "kiln_context_output_shape: context, out_rank and out_dims must not be NULL");
    p = &c->engine->plan;
    KILN_CHECK(index < p->n_outputs, KILN_ERR_INVALID_ARG,
               "kiln_context_output_shape: output index %u is out of range (the engine has %u "
               "outputs)",
               index, p->n_outputs);
    KILN_TRY(acquire(c, "kiln_context_output_shape"));
    if (!c->shapes_valid) {
        st = kiln_fail(KILN_ERR_INVALID_STATE,
                       "kiln_context_output_shape: the shape of output %u '%s' is not known for "
                       "the bound input shapes; call kiln_context_execute or "
                       "kiln_context_infer_shapes first (and check that it succeeded)",
                       index, tensor_name(p, p->outputs[index]));
    } else {
        t = &c->tensors[p->outputs[index]];
        *out_rank = t->rank;
        memcpy(out_dims, t->dims, t->rank * sizeof *out_dims);
    }
    release(c);
    return st;
}

kiln_status kiln_context_layer_info(kiln_context *context, uint32_t layer, kiln_layer_info *out) {
    kiln_layer_info info;
    KILN_CHECK(context != NULL && out != NULL, KILN_ERR_INVALID_ARG,
               "kiln_context_layer_info: context and out must not be NULL");
    const kiln_plan *p = &context->engine->plan;
    KILN_CHECK(layer < p->n_layers, KILN_ERR_INVALID_ARG,
               "kiln_context_layer_info: layer %u is out of range (the engine has %u layers)",
               layer, p->n_layers);
    uint32_t head = layer;
    while (head > 0 && (p->layers[head].flags & KILN_LAYER_TAIL)) head--; // loader: a head exists
    memset(&info, 0, sizeof info);
    info.op = p->layers[layer].op;
    info.head = head;
    info.n_fused = layer == head ? p->layers[head].n_tail : 0;
    info.l2_keep_nbytes = -1;
    info.device_us = info.host_us = -1.0;
    snprintf(info.kernel, sizeof info.kernel, "?");
    KILN_TRY(acquire(context, "kiln_context_layer_info"));
    if (context->engine->backend->describe_layer != NULL) {
        context->engine->backend->describe_layer(context->backend_state, head, &info);
    }
    release(context);
    if (layer != head) { // a fused tail: its group's kernel, none of its own
        char kernel[sizeof info.kernel];
        snprintf(kernel, sizeof kernel, "%s", info.kernel);
        info.op = p->layers[layer].op;
        info.flags = (info.flags & KILN_LAYER_INFO_NHWC) | KILN_LAYER_INFO_TAIL;
        info.n_fused = 0;
        info.workspace_nbytes = 0;
        info.l2_keep_nbytes = -1;
        info.n_profiled = 0;
        info.device_us = info.host_us = -1.0;
        snprintf(info.kernel, sizeof info.kernel, "fused");
        snprintf(info.detail, sizeof info.detail, "into layer %u (%s, %s)", head,
                 kiln_op_name(p->layers[head].op), kernel);
    }
    *out = info;
    return KILN_OK;
}

kiln_status kiln_add_tuning_records(const void *data, size_t nbytes, uint32_t *out_n_records) {
    uint32_t n = 0;
    if (out_n_records != NULL) *out_n_records = 0;
    const char *why = kiln_tune_cache_add_image(data, nbytes, &n);
    KILN_CHECK(why == NULL, KILN_ERR_CORRUPT,
               "the program's tuning records (%zu bytes) are not a Kiln tuning cache: %s; they "
               "are not used (contexts time their choices as without them)",
               nbytes, why != NULL ? why : "");
    if (out_n_records != NULL) *out_n_records = n;
    kiln_log(KILN_LOG_INFO, "tuning records: %u added from a program", (unsigned)n);
    return KILN_OK;
}
