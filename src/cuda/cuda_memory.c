// SPDX-License-Identifier: Apache-2.0
// The CUDA backend's device memory beyond the engine's activation arena (cuda_backend.h):
//  - per engine, the weights block: every weight in tensor order, then the KRSC (O, kh, kw, C)
//    copies of the weights of the convolutions the layout pass keeps NHWC (cuDNN's NHWC filter
//    order; C padded with zero filters where the layout pads it); all live for the whole engine,
//    so they are laid out one after another;
//  - per process and device, the shared weights: an external weight of at least
//    KILN_CUDA_SHARE_MIN bytes whose key names its SHA-256 digest ("kiln-t-<hex>"), checked
//    against it at load (the option verify_weights), gets a shared copy, found by (device, key,
//    bytes) by every engine that loads the same weight, reference-counted and released with the
//    last of them: the methods of one program (an LLM's prefill and decode) and programs sharing
//    weights hold one device copy. The copies one load makes sit in one allocation (each in its
//    own cudaMalloc, the 2 MiB granularity rounded BERT-base's 4.5 MiB weights up to 6: 36 MiB of
//    its 217), freed with the last copy in it. Unchecked weights are never shared;
//  - per context, the states block (plan.h: KILN_TENSOR_STATE, a model's mutable buffers such as
//    a KV cache): every state at a fixed offset (the context's CUDA graphs hold the addresses;
//    only kiln_context_share_states re-points them, and drops the graph), dense and row-major;
//    the states with an initial value first, in tensor order, then the zero-initialised ones;
//    per engine a device copy of the first part (the initial values), so that setting a
//    context's states is one device copy and one memset. Contexts sharing states share one
//    block, reference-counted;
//  - per context, the workspace the libraries and the split kernels share: KILN_CUDA_WORKSPACE
//    bytes while the context is planned, then as much as its layers used in the warm-up run
//    (cuda_backend.c);
//  - per context, the extras block, zeroed, placed by libkiln's memory planner (the builder's,
//    src/core/plan_memory.h): the I/O bindings' staging buffers, the tensors' copies in the other
//    layout (live from their first to their last
//    reading layer; a channel-padded copy for the whole execute, so that its zero channels stay
//    zero) and the folded attention bases the fold moved out of the arena (live from their
//    producer to their last read through the views).
// So every buffer the plugin adds has a place in one of these blocks (arena, weights, states,
// extras) and a lifetime the planner respects; execute allocates nothing.
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "core/checked.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_ops.h"

static int64_t pad8(int64_t c) { return (c + 7) / 8 * 8; }

uint64_t kiln_cuda_tensor_max_nbytes(const cuda_engine *e, uint32_t i) {
    const kiln_plan_tensor *t = &e->plan->tensors[i];
    uint64_t n = kiln_cuda_dtype_size(t->dtype);
    for (uint32_t d = 0; d < t->shape.rank && d < KILN_MAX_RANK; d++) {
        int64_t v = t->shape.max[d];
        if (d == 1 && t->shape.rank == 4 && e->layout.padc != NULL && e->layout.padc[i]) {
            v = pad8(v);
        }
        n *= (uint64_t)(v > 0 ? v : 0);
    }
    return n;
}

// --- uploads from host memory
//
// One cudaMemcpy from pageable memory moves about 5 GB/s on the H200's host (the driver copies
// through its own staging buffer, one piece at a time; benchmarks.md "Start-up"). A load instead
// cuts what it uploads into pieces and hands them to a few threads, each copying a piece into one
// of its two page-locked staging buffers and queueing the device copy on its own stream: the host
// copies run in parallel and the DMA overlaps them. Small uploads stay on the calling thread.

#define UPLOAD_PIECE ((size_t)2 << 20)
#define UPLOAD_THREADS 4
#define UPLOAD_MIN_PARALLEL ((uint64_t)16 << 20)

typedef struct upload_item {
    void *dst;
    const void *src;
    size_t nbytes;
} upload_item;

typedef struct upload_job {
    int device;
    const upload_item *items;
    const size_t *piece_item; // per piece: its item (pieces in item order)
    const size_t *piece_off;  // per piece: its offset in the item
    size_t n_pieces;
    atomic_size_t next;
    atomic_int failed; // set by the first worker that fails: the others stop
    cudaError_t error; // that failure (written once, under failed)
    const char *where; // the call that failed
} upload_job;

static void upload_fail(upload_job *j, cudaError_t err, const char *where) {
    int expect = 0;
    if (atomic_compare_exchange_strong(&j->failed, &expect, 1)) {
        j->error = err;
        j->where = where;
    }
}

static void *upload_worker(void *arg) {
    upload_job *j = arg;
    cudaStream_t stream = NULL;
    cudaEvent_t ev[2] = {NULL, NULL};
    void *raw = NULL;
    uint8_t *stage = NULL;
    const size_t raw_nbytes = 2 * UPLOAD_PIECE + 4096;
    int registered = 0, used[2] = {0, 0};
    cudaError_t err = cudaSetDevice(j->device);
    if (err == cudaSuccess) err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    for (int k = 0; k < 2 && err == cudaSuccess; k++) {
        err = cudaEventCreateWithFlags(&ev[k], cudaEventDisableTiming);
    }
    if (err == cudaSuccess) {
        raw = kiln_cuda_malloc(raw_nbytes);
        if (raw != NULL) {
            stage = (uint8_t *)(((uintptr_t)raw + 4095) & ~(uintptr_t)4095);
            registered =
                cudaHostRegister(stage, 2 * UPLOAD_PIECE, cudaHostRegisterDefault) == cudaSuccess;
            (void)cudaGetLastError(); // (an unregistered buffer: synchronous copies below)
        }
    }
    if (err != cudaSuccess) upload_fail(j, err, "cudaStreamCreate or cudaEventCreate (upload)");
    for (size_t p, k = 0; err == cudaSuccess && !atomic_load(&j->failed) &&
                          (p = atomic_fetch_add(&j->next, 1)) < j->n_pieces;
         k++) {
        const upload_item *it = &j->items[j->piece_item[p]];
        const size_t off = j->piece_off[p];
        const size_t n = it->nbytes - off < UPLOAD_PIECE ? it->nbytes - off : UPLOAD_PIECE;
        const uint8_t *src = (const uint8_t *)it->src + off;
        uint8_t *dst = (uint8_t *)it->dst + off;
        if (!registered) {
            err = cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice);
            if (err != cudaSuccess) upload_fail(j, err, "cudaMemcpy (weight upload)");
            continue;
        }
        const int slot = (int)(k % 2);
        if (used[slot]) err = cudaEventSynchronize(ev[slot]);
        if (err == cudaSuccess) {
            memcpy(stage + slot * UPLOAD_PIECE, src, n);
            err = cudaMemcpyAsync(dst, stage + slot * UPLOAD_PIECE, n, cudaMemcpyHostToDevice,
                                  stream);
        }
        if (err == cudaSuccess) err = cudaEventRecord(ev[slot], stream);
        used[slot] = 1;
        if (err != cudaSuccess) upload_fail(j, err, "cudaMemcpyAsync (weight upload)");
    }
    if (stream != NULL) {
        cudaError_t e2 = cudaStreamSynchronize(stream);
        if (e2 != cudaSuccess && err == cudaSuccess)
            upload_fail(j, e2, "cudaStreamSynchronize (upload)");
        cudaStreamDestroy(stream);
    }
    for (int k = 0; k < 2; k++) {
        if (ev[k] != NULL) cudaEventDestroy(ev[k]);
    }
    if (registered) cudaHostUnregister(stage);
    kiln_cuda_free(raw, raw_nbytes);
    return NULL;
}

static void *upload_thread(void *arg) {
    kiln_cuda_quiet_thread(); // (never enters the caller's log hook)
    return upload_worker(arg);
}

// Copies every item from host to device memory on device `device` (current on this thread).
static kiln_status upload_all(int device, const upload_item *items, size_t n_items) {
    uint64_t total = 0;
    size_t n_pieces = 0;
    for (size_t i = 0; i < n_items; i++) {
        total += items[i].nbytes;
        n_pieces += (items[i].nbytes + UPLOAD_PIECE - 1) / UPLOAD_PIECE;
    }
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (total < UPLOAD_MIN_PARALLEL || cpus < 2 || n_pieces < 2) {
        for (size_t i = 0; i < n_items; i++) {
            if (items[i].nbytes == 0) continue;
            cudaError_t err =
                cudaMemcpy(items[i].dst, items[i].src, items[i].nbytes, cudaMemcpyHostToDevice);
            if (err != cudaSuccess) return kiln_cuda_call_failed("cudaMemcpy (weight upload)", err);
        }
        return KILN_OK;
    }
    const size_t table_nbytes = n_pieces * sizeof(size_t);
    size_t *piece_item = kiln_cuda_malloc(table_nbytes),
           *piece_off = kiln_cuda_malloc(table_nbytes);
    if (piece_item == NULL || piece_off == NULL) {
        kiln_cuda_free(piece_item, table_nbytes);
        kiln_cuda_free(piece_off, table_nbytes);
        return kiln_cuda_fail(KILN_ERR_NO_MEMORY, "out of memory (upload table)");
    }
    size_t p = 0;
    for (size_t i = 0; i < n_items; i++) {
        for (size_t off = 0; off < items[i].nbytes; off += UPLOAD_PIECE, p++) {
            piece_item[p] = i;
            piece_off[p] = off;
        }
    }
    upload_job job = {.device = device,
                      .items = items,
                      .piece_item = piece_item,
                      .piece_off = piece_off,
                      .n_pieces = n_pieces};
    atomic_init(&job.next, 0);
    atomic_init(&job.failed, 0);
    pthread_t threads[UPLOAD_THREADS];
    int n_threads = 0;
    long want = cpus / 2 < UPLOAD_THREADS ? cpus / 2 : UPLOAD_THREADS;
    for (; n_threads < want && (size_t)n_threads < n_pieces; n_threads++) {
        if (pthread_create(&threads[n_threads], NULL, upload_thread, &job) != 0) break;
    }
    if (n_threads == 0) upload_worker(&job); // no thread could be started: this one does it all
    for (int t = 0; t < n_threads; t++) pthread_join(threads[t], NULL);
    kiln_cuda_free(piece_item, table_nbytes);
    kiln_cuda_free(piece_off, table_nbytes);
    (void)cudaSetDevice(device); // (a worker that ran on this thread left it there already)
    if (atomic_load(&job.failed)) return kiln_cuda_call_failed(job.where, job.error);
    return KILN_OK;
}

// --- the weights block

// Writes the KRSC (O, kh, kw, C) copy of OIHW weight t (device bytes src) at dst, C rounded up to
// cp with zero filters, on stream.
static kiln_status krsc_device(const cuda_engine *e, const kiln_plan_tensor *t, const void *src,
                               void *dst, int64_t cp, cudaStream_t stream) {
    const size_t es = kiln_cuda_dtype_size(t->dtype);
    const int64_t o = t->shape.max[0], c = t->shape.max[1];
    const int64_t hw = t->shape.max[2] * t->shape.max[3];
    if (t->shape.rank != 4 || es == 0 || (uint64_t)(o * c * hw) * es != t->nbytes) {
        return kiln_cuda_fail(KILN_ERR_CORRUPT, "conv2d weight of %llu bytes is not OIHW",
                              (unsigned long long)t->nbytes);
    }
    if (cp != c) {
        cudaError_t err = cudaMemsetAsync(dst, 0, (size_t)(o * hw * cp) * es, stream);
        if (err != cudaSuccess) return kiln_cuda_call_failed("cudaMemsetAsync (KRSC copy)", err);
    }
    kiln_cuda_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    ctx.stream = stream;
    ctx.policy = &e->policy;
    ctx.where = "the KRSC copy of a conv2d weight";
    const int64_t dims[3] = {o, c, hw}, dst_strides[3] = {hw * cp, 1, cp};
    const int64_t src_strides[3] = {c * hw, hw, 1};
    return kiln_cuda_copy_strided(&ctx, dst, src, es, 3, dims, dst_strides, src_strides);
}

// --- weights shared between engines (the file's comment)

#define SHARE_KEY_MAX 80 // "kiln-t-" and 64 hex digits fit

// One allocation holding the shared copies one load made; freed with the last of them.
typedef struct cuda_shared_block {
    void *data;    // device
    uint32_t refs; // the copies in it still referenced
} cuda_shared_block;

typedef struct cuda_shared_weight {
    struct cuda_shared_weight *next;
    int device;
    char key[SHARE_KEY_MAX];
    uint64_t nbytes;
    void *data; // device, inside block
    cuda_shared_block *block;
    uint32_t refs;
    // The engine that made the copy while the runtime still checks its bytes (the runtime
    // hashes them beside the upload: backend.h, weights_checked); no other engine finds it
    // until kiln_cuda_weights_checked. NULL: checked.
    const cuda_engine *pending;
} cuda_shared_weight;

static pthread_mutex_t shared_mtx = PTHREAD_MUTEX_INITIALIZER;
static cuda_shared_weight *shared_list;

// 1 when weight tensor i of e's plan is shared (the file's comment; not a weight read only
// through its KRSC copy, which holds other bytes).
static int shareable(const cuda_engine *e, uint32_t i, int verified) {
    const kiln_plan *p = e->plan;
    const kiln_plan_tensor *t = &p->tensors[i];
    if (!verified || t->kind != KILN_TENSOR_WEIGHT || t->key == KILN_NO_KEY ||
        t->nbytes < KILN_CUDA_SHARE_MIN || e->layout.krsc_only[i])
        return 0;
    const char *key = kiln_plan_string(p, t->key);
    if ((strncmp(key, "kiln-t-", 7) != 0 && strncmp(key, "kiln-w-", 7) != 0) ||
        strlen(key) != 7 + 64) {
        return 0;
    }
    for (int j = 7; j < 7 + 64; j++) {
        if (!((key[j] >= '0' && key[j] <= '9') || (key[j] >= 'a' && key[j] <= 'f'))) return 0;
    }
    return 1;
}

// The copy of (device, key, nbytes) engine e may use: a checked one, or one e made.
static cuda_shared_weight *shared_find(const cuda_engine *e, const char *key, uint64_t nbytes) {
    for (cuda_shared_weight *w = shared_list; w != NULL; w = w->next) {
        if (w->device == e->device && w->nbytes == nbytes && strcmp(w->key, key) == 0 &&
            (w->pending == NULL || w->pending == e)) {
            return w;
        }
    }
    return NULL;
}

// Drops one reference of w (shared_mtx held); the last one releases the copy, and the last copy
// of a block frees the block.
static void shared_unref(cuda_shared_weight *w) {
    if (w == NULL || --w->refs > 0) return;
    for (cuda_shared_weight **pp = &shared_list; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == w) {
            *pp = w->next;
            break;
        }
    }
    if (--w->block->refs == 0) {
        cudaFree(w->block->data);
        kiln_cuda_free(w->block, sizeof *w->block);
    }
    kiln_cuda_free(w, sizeof *w);
}

// Takes a reference on the shared copy of every shareable weight of e (e->shared, weight_ptrs):
// the ones another engine made are found; the new ones are placed in one block allocated here
// and listed in items (their bytes to upload; *n_items more). The caller holds shared_mtx and,
// on failure, drops e's references.
static kiln_status shared_take(cuda_engine *e, const void *const *weight_data, int verified,
                               upload_item *items, size_t *n_items) {
    const kiln_plan *p = e->plan;
    uint64_t total = 0;
    // the size of the new copies' block (an upper bound: a weight the engine lists twice is
    // placed once, and the builder merges equal constants, so that is rare)
    for (uint32_t i = 0; i < p->n_tensors; i++) {
        if (!shareable(e, i, verified) || weight_data[i] == NULL) continue;
        const kiln_plan_tensor *t = &p->tensors[i];
        if (shared_find(e, kiln_plan_string(p, t->key), t->nbytes) != NULL) continue;
        if (!kiln_align_up_u64(total, KILN_CUDA_BLOCK_ALIGN, &total) ||
            !kiln_add_u64(total, t->nbytes, &total)) {
            return kiln_cuda_fail(KILN_ERR_UNSUPPORTED, "the engine's weights are too large");
        }
    }
    cuda_shared_block *block = NULL;
    if (total > 0) {
        block = kiln_cuda_calloc(sizeof *block);
        cudaError_t err = cudaErrorMemoryAllocation;
        if (block != NULL) err = cudaMalloc(&block->data, (size_t)total);
        if (err != cudaSuccess) {
            kiln_cuda_free(block, sizeof *block);
            kiln_cuda_consume(); // allocation failures are not sticky: clear them
            return kiln_cuda_call_failed("cudaMalloc (shared weights)", err);
        }
    }
    uint64_t off = 0;
    for (uint32_t i = 0; i < p->n_tensors; i++) {
        if (!shareable(e, i, verified) || weight_data[i] == NULL) continue;
        const kiln_plan_tensor *t = &p->tensors[i];
        const char *key = kiln_plan_string(p, t->key);
        cuda_shared_weight *w = shared_find(e, key, t->nbytes);
        if (w == NULL) { // new: placed in this load's block (sized above, so it fits)
            w = kiln_cuda_calloc(sizeof *w);
            if (w == NULL) {
                if (block != NULL && block->refs == 0) {
                    cudaFree(block->data);
                    kiln_cuda_free(block, sizeof *block);
                }
                return kiln_cuda_fail(KILN_ERR_NO_MEMORY, "out of memory (shared weight)");
            }
            off = (off + KILN_CUDA_BLOCK_ALIGN - 1) / KILN_CUDA_BLOCK_ALIGN * KILN_CUDA_BLOCK_ALIGN;
            w->device = e->device;
            w->nbytes = t->nbytes;
            w->data = (uint8_t *)block->data + off;
            w->block = block;
            w->pending = e; // until the runtime's verdict on the bytes
            block->refs++;
            off += t->nbytes;
            memcpy(w->key, key, strlen(key) + 1);
            w->next = shared_list;
            shared_list = w;
            items[(*n_items)++] = (upload_item){w->data, weight_data[i], (size_t)w->nbytes};
        } else if (w->block != block) {
            e->shared_found_nbytes += w->nbytes;
        }
        w->refs++;
        e->shared[e->n_shared++] = w;
        e->weight_ptrs[i] = w->data;
        e->shared_nbytes += w->nbytes;
    }
    return KILN_OK;
}

void kiln_cuda_weights_checked(cuda_engine *e) {
    pthread_mutex_lock(&shared_mtx);
    for (uint32_t k = 0; k < e->n_shared; k++) {
        if (e->shared[k]->pending == e) e->shared[k]->pending = NULL;
    }
    pthread_mutex_unlock(&shared_mtx);
}

// Drops the engine's references (its device is current); the last one frees the copy.
static void shared_release(cuda_engine *e) {
    pthread_mutex_lock(&shared_mtx);
    for (uint32_t k = 0; k < e->n_shared; k++) shared_unref(e->shared[k]);
    pthread_mutex_unlock(&shared_mtx);
    kiln_cuda_free(e->shared, (size_t)e->plan->n_tensors * sizeof *e->shared + 1);
    e->shared = NULL;
    e->n_shared = 0;
}

kiln_status kiln_cuda_weights_upload(cuda_engine *e, const void *const *weight_data, int verified) {
    const kiln_plan *p = e->plan;
    const uint32_t nt = p->n_tensors;
    uint64_t total = 0;
    kiln_status st = KILN_OK;
    e->weight_offsets = kiln_cuda_calloc((size_t)nt * sizeof *e->weight_offsets + 1);
    e->krsc_offsets = kiln_cuda_calloc((size_t)nt * sizeof *e->krsc_offsets + 1);
    e->weight_ptrs = kiln_cuda_calloc((size_t)nt * sizeof *e->weight_ptrs + 1);
    e->shared = kiln_cuda_calloc((size_t)nt * sizeof *e->shared + 1);
    if (e->weight_offsets == NULL || e->krsc_offsets == NULL || e->weight_ptrs == NULL ||
        e->shared == NULL) {
        return kiln_cuda_fail(KILN_ERR_NO_MEMORY, "out of memory (CUDA weight table)");
    }
    // Every upload (the new shared copies, the weights block, the KRSC copies) in one table.
    const size_t items_nbytes = (size_t)2 * nt * sizeof(upload_item) + 1;
    upload_item *items = kiln_cuda_calloc(items_nbytes);
    size_t n_items = 0;
    if (items == NULL) return kiln_cuda_fail(KILN_ERR_NO_MEMORY, "out of memory (upload table)");
    // The shared copies: found, or made and uploaded before another engine can find them (the
    // lock is held over their upload).
    pthread_mutex_lock(&shared_mtx);
    st = shared_take(e, weight_data, verified, items, &n_items);
    if (st == KILN_OK) st = upload_all(e->device, items, n_items);
    if (st != KILN_OK) {
        // nothing half-uploaded stays findable: this engine's references go now
        for (uint32_t k = 0; k < e->n_shared; k++) shared_unref(e->shared[k]);
        memset(e->weight_ptrs, 0, (size_t)nt * sizeof *e->weight_ptrs);
        e->n_shared = 0;
        e->shared_nbytes = e->shared_found_nbytes = 0;
    }
    pthread_mutex_unlock(&shared_mtx);
    n_items = 0;
    if (st != KILN_OK) {
        kiln_cuda_free(items, items_nbytes);
        return st;
    }
    // Weights are live for the whole engine, so nothing shares bytes and no planning is needed:
    // they are laid out in tensor order (the order the layers read them, so that one layer's
    // weights stream from neighbouring pages), then the KRSC copies in the same order. A weight
    // read only through its KRSC copy has no OIHW slot: its bytes go to a scratch block.
    uint64_t scratch_nbytes = 0;
    for (uint32_t k = 0; k < 2 * nt && st == KILN_OK; k++) {
        const uint32_t i = k < nt ? k : k - nt;
        const kiln_plan_tensor *t = &p->tensors[i];
        const int weight = t->kind == KILN_TENSOR_WEIGHT && e->weight_ptrs[i] == NULL;
        uint64_t n = k < nt ? (weight && !e->layout.krsc_only[i] ? t->nbytes : 0)
                            : (e->layout.krsc[i] ? kiln_cuda_tensor_max_nbytes(e, i) : 0);
        uint64_t *at = &total, end = 0;
        if (k < nt && weight && e->layout.krsc_only[i] && t->nbytes > 0) {
            n = t->nbytes; // into the scratch block
            at = &scratch_nbytes;
        }
        if (n == 0) continue;
        if (!kiln_align_up_u64(*at, KILN_CUDA_BLOCK_ALIGN, at) || !kiln_add_u64(*at, n, &end)) {
            st = kiln_cuda_fail(KILN_ERR_UNSUPPORTED, "the engine's weights are too large");
            break;
        }
        if (k >= nt) {
            e->krsc_offsets[i] = *at;
        } else {
            e->weight_offsets[i] = *at; // (an offset in the scratch block for a KRSC-only one)
        }
        *at = end;
    }
    if (st != KILN_OK || total == 0) {
        kiln_cuda_free(items, items_nbytes);
        return st;
    }
    e->weights_nbytes = (size_t)total;
    void *scratch = NULL;
    cudaError_t err = cudaMalloc(&e->weights, e->weights_nbytes);
    if (err == cudaSuccess && scratch_nbytes > 0) err = cudaMalloc(&scratch, scratch_nbytes);
    if (err != cudaSuccess) {
        cudaFree(e->weights);
        e->weights = NULL;
        kiln_cuda_free(items, items_nbytes);
        kiln_cuda_consume();
        return kiln_cuda_call_failed("cudaMalloc (weights)", err);
    }
    for (uint32_t i = 0; i < nt; i++) {
        const kiln_plan_tensor *t = &p->tensors[i];
        if (t->kind != KILN_TENSOR_WEIGHT || t->nbytes == 0 || e->weight_ptrs[i] != NULL) continue;
        uint8_t *dst = e->layout.krsc_only[i] ? (uint8_t *)scratch + e->weight_offsets[i]
                                              : (uint8_t *)e->weights + e->weight_offsets[i];
        items[n_items++] = (upload_item){dst, weight_data[i], (size_t)t->nbytes};
        // the layers read a KRSC-only weight's copy through its tensor view too
        e->weight_ptrs[i] =
            e->layout.krsc_only[i] ? (uint8_t *)e->weights + e->krsc_offsets[i] : dst;
    }
    if (st == KILN_OK) st = upload_all(e->device, items, n_items);
    // The KRSC copies, made on the device from the uploaded OIHW bytes.
    cudaStream_t stream = NULL;
    if (st == KILN_OK && e->layout.n_conv_nhwc > 0) {
        err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
        if (err != cudaSuccess) st = kiln_cuda_call_failed("cudaStreamCreate (KRSC copies)", err);
    }
    for (uint32_t i = 0; i < nt && st == KILN_OK && stream != NULL; i++) {
        const kiln_plan_tensor *t = &p->tensors[i];
        if (!e->layout.krsc[i] || t->kind != KILN_TENSOR_WEIGHT) continue;
        const void *src =
            e->layout.krsc_only[i] ? (uint8_t *)scratch + e->weight_offsets[i] : e->weight_ptrs[i];
        st = krsc_device(e, t, src, (uint8_t *)e->weights + e->krsc_offsets[i],
                         e->layout.padc[i] ? pad8(t->shape.max[1]) : t->shape.max[1], stream);
    }
    if (stream != NULL) {
        err = cudaStreamSynchronize(stream);
        if (err != cudaSuccess && st == KILN_OK) {
            st = kiln_cuda_call_failed("cudaStreamSynchronize (KRSC copies)", err);
        }
        cudaStreamDestroy(stream);
    }
    cudaFree(scratch);
    kiln_cuda_free(items, items_nbytes);
    if (st != KILN_OK) kiln_cuda_consume(); // allocation failures are not sticky: clear them
    return st;
}

void kiln_cuda_weights_free(cuda_engine *e) {
    const size_t nt = e->plan->n_tensors;
    if (e->shared != NULL) shared_release(e);
    kiln_cuda_free(e->weight_ptrs, nt * sizeof *e->weight_ptrs + 1);
    e->weight_ptrs = NULL;
    kiln_cuda_free(e->weight_offsets, nt * sizeof *e->weight_offsets + 1);
    kiln_cuda_free(e->krsc_offsets, nt * sizeof *e->krsc_offsets + 1);
    e->weight_offsets = e->krsc_offsets = NULL;
}

// --- the states

static uint64_t dense_nbytes(const kiln_plan_tensor *t) {
    uint64_t n = kiln_cuda_dtype_size(t->dtype);
    for (uint32_t d = 0; d < t->shape.rank && d < KILN_MAX_RANK; d++) {
        n *= (uint64_t)(t->shape.max[d] > 0 ? t->shape.max[d] : 0);
    }
    return n;
}

kiln_status kiln_cuda_states_upload(cuda_engine *e, const void *const *weight_data) {
    const kiln_plan *p = e->plan;
    const uint32_t nt = p->n_tensors;
    uint64_t total = 0;
    e->state_offsets = kiln_cuda_calloc((size_t)nt * sizeof *e->state_offsets + 1);
    if (e->state_offsets == NULL) {
        return kiln_cuda_fail(KILN_ERR_NO_MEMORY, "out of memory (CUDA state table)");
    }
    // Pass 0: the states with an initial value (the block's first part, mirrored by state_init);
    // pass 1: the zero-initialised ones.
    for (int pass = 0; pass < 2; pass++) {
        for (uint32_t i = 0; i < nt; i++) {
            const kiln_plan_tensor *t = &p->tensors[i];
            if (t->kind != KILN_TENSOR_STATE) continue;
            if ((weight_data[i] == NULL) != (pass == 1)) continue;
            uint64_t end = 0;
            e->n_states++;
            if (dense_nbytes(t) != t->nbytes) {
                return kiln_cuda_fail(KILN_ERR_CORRUPT,
                                      "state %u (tensor %u) holds %llu bytes, its shape %llu",
                                      t->binding, i, (unsigned long long)t->nbytes,
                                      (unsigned long long)dense_nbytes(t));
            }
            if (!kiln_align_up_u64(total, KILN_CUDA_BLOCK_ALIGN, &total) ||
                !kiln_add_u64(total, t->nbytes, &end)) {
                return kiln_cuda_fail(KILN_ERR_UNSUPPORTED, "the engine's states are too large");
            }
            e->state_offsets[i] = total;
            total = end;
        }
        if (pass == 0) e->states_init_nbytes = total;
    }
    e->states_nbytes = total;
    if (e->states_init_nbytes == 0) return KILN_OK;
    cudaError_t err = cudaMalloc(&e->state_init, (size_t)e->states_init_nbytes);
    if (err != cudaSuccess) {
        e->state_init = NULL;
        kiln_cuda_consume();
        return kiln_cuda_call_failed("cudaMalloc (states' initial values)", err);
    }
    // zeroed: the alignment gaps, copied with the values, hold defined bytes
    err = cudaMemset(e->state_init, 0, (size_t)e->states_init_nbytes);
    if (err != cudaSuccess) {
        kiln_cuda_consume();
        return kiln_cuda_call_failed("cudaMemset (states' initial values)", err);
    }
    for (uint32_t i = 0; i < nt; i++) {
        const kiln_plan_tensor *t = &p->tensors[i];
        if (t->kind != KILN_TENSOR_STATE || weight_data[i] == NULL || t->nbytes == 0) continue;
        err = cudaMemcpy((uint8_t *)e->state_init + e->state_offsets[i], weight_data[i],
                         (size_t)t->nbytes, cudaMemcpyHostToDevice);
        if (err != cudaSuccess) {
            kiln_cuda_consume();
            return kiln_cuda_call_failed("cudaMemcpy (state's initial value)", err);
        }
    }
    return KILN_OK;
}

kiln_status kiln_cuda_states_new(const cuda_engine *e, cuda_states **out) {
    cuda_states *s;
    *out = NULL;
    if (e->states_nbytes == 0) return KILN_OK;
    s = kiln_cuda_calloc(sizeof *s);
    if (s == NULL) return kiln_cuda_fail(KILN_ERR_NO_MEMORY, "out of memory (CUDA states)");
    atomic_init(&s->refs, 1);
    cudaError_t err = cudaMalloc(&s->data, (size_t)e->states_nbytes);
    if (err != cudaSuccess) {
        kiln_cuda_free(s, sizeof *s);
        kiln_cuda_consume();
        return kiln_cuda_call_failed("cudaMalloc (states block)", err);
    }
    *out = s;
    return KILN_OK;
}

void kiln_cuda_states_release(cuda_states *s, int free_device) {
    if (s == NULL || atomic_fetch_sub(&s->refs, 1) != 1) return;
    if (free_device) cudaFree(s->data);
    kiln_cuda_free(s, sizeof *s);
}

void kiln_cuda_states_free(cuda_engine *e) {
    kiln_cuda_free(e->state_offsets, (size_t)e->plan->n_tensors * sizeof *e->state_offsets + 1);
    e->state_offsets = NULL;
}

kiln_status kiln_cuda_states_set(const cuda_engine *e, void *states, cudaStream_t stream) {
    cudaError_t err;
    if (states == NULL || e->states_nbytes == 0) return KILN_OK;
    if (e->states_init_nbytes > 0) {
        err = cudaMemcpyAsync(states, e->state_init, (size_t)e->states_init_nbytes,
                              cudaMemcpyDeviceToDevice, stream);
        if (err != cudaSuccess) return kiln_cuda_call_failed("cudaMemcpyAsync (states)", err);
    }
    if (e->states_nbytes > e->states_init_nbytes) {
        err = cudaMemsetAsync((uint8_t *)states + e->states_init_nbytes, 0,
                              (size_t)(e->states_nbytes - e->states_init_nbytes), stream);
        if (err != cudaSuccess) return kiln_cuda_call_failed("cudaMemsetAsync (states)", err);
    }
    return KILN_OK;
}

kiln_status kiln_cuda_states_set_views(const cuda_engine *e, const kiln_tensor *views,
                                       cudaStream_t stream) {
    const kiln_plan *p = e->plan;
    for (uint32_t i = 0; i < p->n_tensors; i++) {
        const kiln_plan_tensor *t = &p->tensors[i];
        cudaError_t err;
        if (t->kind != KILN_TENSOR_STATE || t->nbytes == 0 || views[i].data == NULL) continue;
        if (e->state_offsets[i] < e->states_init_nbytes) { // placed among those with a value
            err =
                cudaMemcpyAsync(views[i].data, (const uint8_t *)e->state_init + e->state_offsets[i],
                                (size_t)t->nbytes, cudaMemcpyDeviceToDevice, stream);
        } else {
            err = cudaMemsetAsync(views[i].data, 0, (size_t)t->nbytes, stream);
        }
        if (err != cudaSuccess) {
            return kiln_cuda_call_failed(e->state_offsets[i] < e->states_init_nbytes
                                             ? "cudaMemcpyAsync (state)"
                                             : "cudaMemsetAsync (state)",
                                         err);
        }
    }
    return KILN_OK;
}

// --- the extras block

void kiln_cuda_extras_free(const kiln_plan *p, cuda_extras *x) {
    const size_t nt = p->n_tensors, nio = (size_t)p->n_inputs + p->n_outputs;
    kiln_cuda_free(x->staging_off, nio * sizeof *x->staging_off + 1);
    kiln_cuda_free(x->copy_off, nt * sizeof *x->copy_off + 1);
    kiln_cuda_free(x->reloc_off, nt * sizeof *x->reloc_off + 1);
    memset(x, 0, sizeof *x);
}

kiln_status kiln_cuda_extras_plan(cuda_engine *e) {
    const kiln_plan *p = e->plan;
    const uint32_t nt = p->n_tensors, nio = p->n_inputs + p->n_outputs;
    const int32_t whole = (int32_t)p->n_layers; // live over every layer
    cuda_extras *x = &e->extras;
    // items: staging (nio), copies (nt), relocated bases (nt)
    const uint32_t n_items = nio + 2 * nt;
    kiln_mem_item *it = kiln_cuda_calloc((size_t)n_items * sizeof *it);
    kiln_status st;
    x->staging_off = kiln_cuda_calloc((size_t)nio * sizeof *x->staging_off + 1);
    x->copy_off = kiln_cuda_calloc((size_t)nt * sizeof *x->copy_off + 1);
    x->reloc_off = kiln_cuda_calloc((size_t)nt * sizeof *x->reloc_off + 1);
    if (it == NULL || x->staging_off == NULL || x->copy_off == NULL || x->reloc_off == NULL) {
        kiln_cuda_free(it, (size_t)n_items * sizeof *it);
        return kiln_cuda_fail(KILN_ERR_NO_MEMORY, "out of memory (CUDA memory plan)");
    }
    for (uint32_t i = 0; i < n_items; i++) {
        it[i].first = INT32_MAX; // "not used" until a use is found
        it[i].last = -1;
    }
    for (uint32_t b = 0; b < nio; b++) {
        uint32_t t = kiln_cuda_binding_tensor(p, b);
        it[b].nbytes = kiln_cuda_tensor_max_nbytes(e, t);
        it[b].first = 0;
        it[b].last = whole;
    }
    // a copy lives from its first to its last reading group (a padded one for the whole run)
    for (uint32_t li = 0; li < p->n_layers; li += 1 + p->layers[li].n_tail) {
        for (uint32_t g = li; g <= li + p->layers[li].n_tail; g++) {
            const kiln_plan_layer *l = &p->layers[g];
            for (uint32_t j = 0; j < l->n_inputs; j++) {
                const uint32_t slot = l->input_begin + j;
                const int32_t t = p->ids[slot];
                if (t < 0 || !e->layout.alt[slot]) continue;
                kiln_mem_item *c = &it[nio + (uint32_t)t];
                if ((int32_t)li < c->first) c->first = (int32_t)li;
                if ((int32_t)li > c->last) c->last = (int32_t)li;
            }
        }
    }
    for (uint32_t t = 0; t < nt; t++) {
        kiln_mem_item *c = &it[nio + t];
        if (!e->layout.copy[t] || c->last < 0) {
            c->first = c->last = 0;
            continue;
        }
        c->nbytes = kiln_cuda_tensor_max_nbytes(e, t);
        if (e->layout.padc[t]) c->first = 0, c->last = whole;
    }
    for (uint32_t t = 0; t < nt; t++) {
        kiln_mem_item *r = &it[nio + nt + t];
        if (!e->fold.reloc[t]) {
            r->first = r->last = 0;
            continue;
        }
        r->nbytes = p->tensors[t].nbytes;
        r->first = (int32_t)e->fold.live_first[t];
        r->last = (int32_t)e->fold.live_last[t];
    }
    st = kiln_cuda_plan_memory(it, n_items, KILN_CUDA_BLOCK_ALIGN, &x->nbytes);
    if (st == KILN_OK) {
        for (uint32_t b = 0; b < nio; b++) {
            x->staging_off[b] = it[b].nbytes > 0 ? it[b].offset : KILN_CUDA_NO_OFFSET;
        }
        for (uint32_t t = 0; t < nt; t++) {
            x->copy_off[t] = it[nio + t].nbytes > 0 ? it[nio + t].offset : KILN_CUDA_NO_OFFSET;
            x->reloc_off[t] =
                it[nio + nt + t].nbytes > 0 ? it[nio + nt + t].offset : KILN_CUDA_NO_OFFSET;
        }
    }
    kiln_cuda_free(it, (size_t)n_items * sizeof *it);
    return st;
}
