// SPDX-License-Identifier: Apache-2.0
// GEMM: the cache-blocked core shared by linear, matmul, conv and attention, and the linear and
// matmul ops. Goto-style blocking: for each NC-column block of B, KC-deep slices of B are packed
// once per MB rows and slices of A per MC rows (both converted to float32, into NR-column and
// MR-row panels); a fixed-size MR x NR micro-kernel (plain loops the compiler vectorizes)
// accumulates into an f32 block that the epilogue finally stores (scale, bias, dtype).
#include <string.h>

#include "cpu/cpu_internal.h"

#define MR KILN_CPU_MR
#define NR KILN_CPU_NR
#define MC KILN_CPU_MC
#define KC KILN_CPU_KC
#define NC KILN_CPU_NC
#define MB KILN_CPU_MB

_Static_assert(MC % MR == 0, "MC must be a multiple of MR");
_Static_assert(NC % NR == 0, "NC must be a multiple of NR");
_Static_assert(MB % MC == 0, "MB must be a multiple of MC");

static int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// --- packing

void kiln_cpu_pack_a_matrix(const void *ctx, int64_t m0, int64_t mc, int64_t k0, int64_t kc,
                            float *dst) {
    const kiln_cpu_matrix *a = (const kiln_cpu_matrix *)ctx;
    float tmp[KC];
    KILN_ASSERT(kc <= KC);
    for (int64_t p = 0; p < mc; p += MR) {
        float *d = dst + p * kc;
        int64_t rows = min64(MR, mc - p);
        if (a->dtype == KILN_DTYPE_F32 && a->rs == 1) { // columns of A are contiguous
            const float *s = (const float *)a->data + a->offset + (m0 + p) + k0 * a->cs;
            for (int64_t kk = 0; kk < kc; kk++) {
                int64_t i = 0;
                for (; i < rows; i++) d[kk * MR + i] = s[kk * a->cs + i];
                for (; i < MR; i++) d[kk * MR + i] = 0.0f;
            }
            continue;
        }
        for (int64_t i = 0; i < MR; i++) {
            if (i >= rows) {
                for (int64_t kk = 0; kk < kc; kk++) d[kk * MR + i] = 0.0f;
                continue;
            }
            int64_t off = a->offset + (m0 + p + i) * a->rs + k0 * a->cs;
            const float *s = tmp;
            if (a->dtype == KILN_DTYPE_F32 && a->cs == 1) {
                s = (const float *)a->data + off;
            } else {
                kiln_cpu_load_f32(a->data, a->dtype, off, a->cs, kc, tmp);
            }
            for (int64_t kk = 0; kk < kc; kk++) d[kk * MR + i] = s[kk];
        }
    }
}

void kiln_cpu_pack_b_matrix(const void *ctx, int64_t k0, int64_t kc, int64_t n0, int64_t nc,
                            float *dst) {
    const kiln_cpu_matrix *b = (const kiln_cpu_matrix *)ctx;
    float tmp[KC];
    KILN_ASSERT(kc <= KC);
    for (int64_t q = 0; q < nc; q += NR) {
        float *d = dst + q * kc;
        int64_t cols = min64(NR, nc - q);
        if (b->dtype == KILN_DTYPE_F32 && b->cs == 1) { // rows of B are contiguous
            const float *s = (const float *)b->data + b->offset + k0 * b->rs + (n0 + q);
            for (int64_t kk = 0; kk < kc; kk++) {
                int64_t j = 0;
                for (; j < cols; j++) d[kk * NR + j] = s[kk * b->rs + j];
                for (; j < NR; j++) d[kk * NR + j] = 0.0f;
            }
            continue;
        }
        for (int64_t j = 0; j < NR; j++) {
            if (j >= cols) {
                for (int64_t kk = 0; kk < kc; kk++) d[kk * NR + j] = 0.0f;
                continue;
            }
            int64_t off = b->offset + k0 * b->rs + (n0 + q + j) * b->cs;
            const float *s = tmp;
            if (b->dtype == KILN_DTYPE_F32 && b->rs == 1) {
                s = (const float *)b->data + off;
            } else {
                kiln_cpu_load_f32(b->data, b->dtype, off, b->rs, kc, tmp);
            }
            for (int64_t kk = 0; kk < kc; kk++) d[kk * NR + j] = s[kk];
        }
    }
}

// --- micro-kernel: c[MR x NR] (row stride ldc) += a panel (kc x MR) * b panel (kc x NR)

static void micro_kernel(int64_t kc, const float *a, const float *b, float *c, int64_t ldc) {
    float acc[MR][NR];
    for (int i = 0; i < MR; i++) {
        for (int j = 0; j < NR; j++) acc[i][j] = 0.0f;
    }
    for (int64_t k = 0; k < kc; k++) {
        for (int i = 0; i < MR; i++) {
            const float ai = a[i];
            for (int j = 0; j < NR; j++) acc[i][j] += ai * b[j];
        }
        a += MR;
        b += NR;
    }
    for (int i = 0; i < MR; i++) {
        for (int j = 0; j < NR; j++) c[i * ldc + j] += acc[i][j];
    }
}

// --- driver

size_t kiln_cpu_gemm_scratch_nbytes(int64_t m, int64_t n, int64_t k) {
    if (m <= 0 || n <= 0) return 0;
    int64_t mc = min64(MC, round_up(m, MR)), mb = min64(MB, round_up(m, MR));
    int64_t nc = min64(NC, round_up(n, NR)), kc = k < 1 ? 1 : min64(KC, k);
    return kiln_cpu_f32_nbytes(mc * kc) + kiln_cpu_f32_nbytes(kc * nc) +
           kiln_cpu_f32_nbytes(mb * nc);
}

// Loop order: NC columns (jc) > MB rows (ib, the f32 accumulator) > KC depth (pc: B packed
// once) > MC rows (ic: A packed) > NR x MR micro-tiles.
kiln_status kiln_cpu_gemm_run(const kiln_cpu_gemm *g, kiln_cpu_scratch *s) {
    int64_t m = g->m, n = g->n, k = g->k;
    if (m <= 0 || n <= 0) return KILN_OK;
    int64_t mcm = min64(MC, round_up(m, MR)), mbm = min64(MB, round_up(m, MR));
    int64_t ncm = min64(NC, round_up(n, NR)), kcm = k < 1 ? 1 : min64(KC, k);
    float *apack, *bpack, *cbuf;
    if ((apack = kiln_cpu_scratch_f32(s, mcm * kcm, "gemm packed A")) == NULL ||
        (bpack = kiln_cpu_scratch_f32(s, kcm * ncm, "gemm packed B")) == NULL ||
        (cbuf = kiln_cpu_scratch_f32(s, mbm * ncm, "gemm accumulator")) == NULL)
        return KILN_ERR_INTERNAL;
    for (int64_t jc = 0; jc < n; jc += NC) {
        int64_t nc = min64(NC, n - jc), ncp = round_up(nc, NR);
        for (int64_t ib = 0; ib < m; ib += MB) {
            int64_t mb = min64(MB, m - ib);
            memset(cbuf, 0, (size_t)(round_up(mb, MR) * ncp) * sizeof(float));
            for (int64_t pc = 0; pc < k; pc += KC) {
                int64_t kc = min64(KC, k - pc);
                g->pack_b(g->b_ctx, pc, kc, jc, nc, bpack);
                for (int64_t ic = 0; ic < mb; ic += MC) {
                    int64_t mc = min64(MC, mb - ic), mcp = round_up(mc, MR);
                    g->pack_a(g->a_ctx, ib + ic, mc, pc, kc, apack);
                    float *cblk = cbuf + ic * ncp;
                    for (int64_t jr = 0; jr < ncp; jr += NR) {
                        for (int64_t ir = 0; ir < mcp; ir += MR) {
                            micro_kernel(kc, apack + ir * kc, bpack + jr * kc, cblk + ir * ncp + jr,
                                         ncp);
                        }
                    }
                }
            }
            g->epilogue(g->e_ctx, ib, mb, jc, nc, cbuf, ncp);
        }
    }
    return KILN_OK;
}

void kiln_cpu_epilogue_store(void *ctx, int64_t m0, int64_t mc, int64_t n0, int64_t nc,
                             const float *tile, int64_t ld) {
    const kiln_cpu_store *st = (const kiln_cpu_store *)ctx;
    float row[NC];
    KILN_ASSERT(nc <= NC);
    for (int64_t i = 0; i < mc; i++) {
        const float *t = tile + i * ld;
        float rb = st->row_bias ? st->row_bias[m0 + i] : 0.0f;
        int64_t off = st->offset + (m0 + i) * st->ld + n0;
        float *d = st->dtype == KILN_DTYPE_F32 ? (float *)st->data + off : row;
        if (st->col_bias) {
            const float *cb = st->col_bias + n0;
            for (int64_t j = 0; j < nc; j++) d[j] = st->alpha * t[j] + rb + cb[j];
        } else {
            for (int64_t j = 0; j < nc; j++) d[j] = st->alpha * t[j] + rb;
        }
        if (st->dtype != KILN_DTYPE_F32) kiln_cpu_store_f32(st->data, st->dtype, off, nc, row);
    }
}

// --- linear: x[.., K] w[N, K] bias?[N] -> y[.., N] = x w^T + b

static void linear_dims(const kiln_kernel_args *args, int64_t *m, int64_t *n, int64_t *k) {
    const kiln_tensor *x = args->in[0], *y = args->out;
    *k = x->rank > 0 ? x->dims[x->rank - 1] : 1;
    *n = y->rank > 0 ? y->dims[y->rank - 1] : 1;
    *m = 1;
    for (uint32_t i = 0; i + 1 < y->rank; i++) *m *= y->dims[i];
}

static const kiln_tensor *opt_in(const kiln_kernel_args *args, uint32_t i) {
    return i < args->n_in ? args->in[i] : NULL;
}

size_t kiln_cpu_linear_scratch(const kiln_kernel_args *args) {
    int64_t m, n, k;
    linear_dims(args, &m, &n, &k);
    size_t bias = opt_in(args, 2) ? kiln_cpu_f32_nbytes(n) : 0;
    return KILN_CPU_SCRATCH_SLACK + bias + kiln_cpu_gemm_scratch_nbytes(m, n, k);
}

kiln_status kiln_cpu_linear(const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0], *w = args->in[1], *b = opt_in(args, 2);
    kiln_tensor *y = args->out;
    int64_t m, n, k;
    linear_dims(args, &m, &n, &k);
    KILN_CHECK(w->rank == 2 && w->dims[0] == n && w->dims[1] == k, KILN_ERR_INVALID_ARG,
               "cpu linear: weight must be [%lld, %lld]", (long long)n, (long long)k);
    KILN_CHECK(b == NULL || kiln_tensor_numel(b) == n, KILN_ERR_INVALID_ARG,
               "cpu linear: bias must have %lld elements", (long long)n);
    kiln_cpu_scratch s;
    kiln_cpu_scratch_init(&s, args);
    float *bias = NULL;
    if (b != NULL) {
        bias = kiln_cpu_scratch_f32(&s, n, "linear bias");
        if (bias == NULL) return KILN_ERR_INTERNAL;
        kiln_cpu_load_f32(b->data, b->dtype, 0, 1, n, bias);
    }
    kiln_cpu_matrix am = {x->data, x->dtype, 0, k, 1};
    kiln_cpu_matrix bm = {w->data, w->dtype, 0, 1, k}; // B[k][n] = w[n][k]
    kiln_cpu_store st = {y->data, y->dtype, 0, n, 1.0f, NULL, bias};
    kiln_cpu_gemm g = {
        m,  n, k, kiln_cpu_pack_a_matrix, &am, kiln_cpu_pack_b_matrix, &bm, kiln_cpu_epilogue_store,
        &st};
    return kiln_cpu_gemm_run(&g, &s);
}

// One GEMM of row-major matrices: y at yoff (m x n) = a at aoff (m x k, rows a_rs apart) @ b at
// boff (k x n, rows b_rs apart); the scratch it takes is given back after.
static kiln_status gemm_rows(kiln_cpu_scratch *s, const kiln_tensor *a, int64_t aoff, int64_t a_rs,
                             const kiln_tensor *b, int64_t boff, int64_t b_rs, kiln_tensor *y,
                             int64_t yoff, int64_t m, int64_t n, int64_t k) {
    kiln_cpu_matrix am = {a->data, a->dtype, aoff, a_rs, 1};
    kiln_cpu_matrix bm = {b->data, b->dtype, boff, b_rs, 1};
    kiln_cpu_store st = {y->data, y->dtype, yoff, n, 1.0f, NULL, NULL};
    kiln_cpu_gemm g = {
        m,  n, k, kiln_cpu_pack_a_matrix, &am, kiln_cpu_pack_b_matrix, &bm, kiln_cpu_epilogue_store,
        &st};
    size_t mark = s->used;
    kiln_status st_run = kiln_cpu_gemm_run(&g, s);
    s->used = mark;
    return st_run;
}

// --- matmul: torch.matmul, with 1-D operands and batch broadcasting

typedef struct mm_shape {
    int64_t m, n, k;
    int nb;                       // batch rank of the output
    int64_t bdims[KILN_MAX_RANK]; // output batch dims
    int64_t astr[KILN_MAX_RANK];  // a's element stride per output batch dim (0: broadcast)
    int64_t bstr[KILN_MAX_RANK];
    int64_t a_rs, b_rs; // row strides inside one matrix
    int fold;           // b is shared by every batch: fold the batch into m
} mm_shape;

static void mm_analyze(const kiln_kernel_args *args, mm_shape *sh) {
    const kiln_tensor *a = args->in[0], *b = args->in[1], *y = args->out;
    memset(sh, 0, sizeof *sh);
    int ar = (int)a->rank, br = (int)b->rank;
    sh->k = a->dims[ar - 1];
    sh->m = ar >= 2 ? a->dims[ar - 2] : 1;
    sh->n = br >= 2 ? b->dims[br - 1] : 1;
    sh->a_rs = sh->k;
    sh->b_rs = br >= 2 ? sh->n : 1;
    int nab = ar >= 2 ? ar - 2 : 0, nbb = br >= 2 ? br - 2 : 0;
    sh->nb = nab > nbb ? nab : nbb;
    int64_t as[KILN_MAX_RANK], bs[KILN_MAX_RANK];
    kiln_cpu_strides(a, as);
    kiln_cpu_strides(b, bs);
    int64_t bnumel = 1;
    for (int d = 0; d < sh->nb; d++) {
        int ia = d - (sh->nb - nab), ib = d - (sh->nb - nbb);
        int64_t da = ia >= 0 ? a->dims[ia] : 1, db = ib >= 0 ? b->dims[ib] : 1;
        sh->bdims[d] = da > db ? da : db;
        if (da == 0 || db == 0) sh->bdims[d] = 0;
        sh->astr[d] = (ia >= 0 && da != 1) ? as[ia] : 0;
        sh->bstr[d] = (ib >= 0 && db != 1) ? bs[ib] : 0;
        if (ib >= 0) bnumel *= db;
    }
    (void)y;
    sh->fold = bnumel == 1;
}

size_t kiln_cpu_matmul_scratch(const kiln_kernel_args *args) {
    mm_shape sh;
    mm_analyze(args, &sh);
    int64_t batch = 1;
    for (int d = 0; d < sh.nb; d++) batch *= sh.bdims[d];
    // Sized for the folded GEMM (m * batch rows) whether or not these shapes fold: the runtime
    // sizes scratch once at the largest shapes, where b may have batch dims that a smaller
    // execution does not, so the need must not shrink when the shapes grow.
    return KILN_CPU_SCRATCH_SLACK + kiln_cpu_gemm_scratch_nbytes(sh.m * batch, sh.n, sh.k);
}

kiln_status kiln_cpu_matmul(const kiln_kernel_args *args) {
    const kiln_tensor *a = args->in[0], *b = args->in[1];
    kiln_tensor *y = args->out;
    KILN_CHECK(a->rank >= 1 && b->rank >= 1, KILN_ERR_INVALID_ARG,
               "cpu matmul: operands must have rank >= 1 (got %u and %u)", a->rank, b->rank);
    mm_shape sh;
    mm_analyze(args, &sh);
    KILN_CHECK(b->dims[b->rank >= 2 ? b->rank - 2 : 0] == sh.k, KILN_ERR_INVALID_ARG,
               "cpu matmul: inner dims differ (%lld vs %lld)", (long long)sh.k,
               (long long)b->dims[b->rank >= 2 ? b->rank - 2 : 0]);
    int64_t batch = 1;
    for (int d = 0; d < sh.nb; d++) batch *= sh.bdims[d];
    KILN_CHECK(kiln_tensor_numel(y) == batch * sh.m * sh.n, KILN_ERR_INVALID_ARG,
               "cpu matmul: output has %lld elements, expected %lld",
               (long long)kiln_tensor_numel(y), (long long)(batch * sh.m * sh.n));
    kiln_cpu_scratch s;
    kiln_cpu_scratch_init(&s, args);
    if (sh.fold) {
        // b is one matrix: every batch of a (contiguous, same layout as y) is one tall GEMM.
        kiln_cpu_matrix am = {a->data, a->dtype, 0, sh.a_rs, 1};
        kiln_cpu_matrix bm = {b->data, b->dtype, 0, sh.b_rs, 1};
        kiln_cpu_store st = {y->data, y->dtype, 0, sh.n, 1.0f, NULL, NULL};
        kiln_cpu_gemm g = {sh.m * batch, sh.n,
                           sh.k,         kiln_cpu_pack_a_matrix,
                           &am,          kiln_cpu_pack_b_matrix,
                           &bm,          kiln_cpu_epilogue_store,
                           &st};
        return kiln_cpu_gemm_run(&g, &s);
    }
    int64_t idx[KILN_MAX_RANK] = {0};
    for (int64_t bi = 0; bi < batch; bi++) {
        int64_t aoff = 0, boff = 0;
        for (int d = 0; d < sh.nb; d++) {
            aoff += idx[d] * sh.astr[d];
            boff += idx[d] * sh.bstr[d];
        }
        KILN_TRY(gemm_rows(&s, a, aoff, sh.a_rs, b, boff, sh.b_rs, y, bi * sh.m * sh.n, sh.m, sh.n,
                           sh.k));
        for (int d = sh.nb - 1; d >= 0; d--) {
            if (++idx[d] < sh.bdims[d]) break;
            idx[d] = 0;
        }
    }
    return KILN_OK;
}

// --- gather_matmul: y[b] = w[idx[b]] @ x[b] (ops.h), one GEMM per b over the chosen matrix in
// place

size_t kiln_cpu_gather_matmul_scratch(const kiln_kernel_args *args) {
    const kiln_tensor *w = args->in[0], *x = args->in[2];
    return KILN_CPU_SCRATCH_SLACK +
           kiln_cpu_gemm_scratch_nbytes(w->dims[1], x->rank == 3 ? x->dims[2] : 1, w->dims[2]);
}

kiln_status kiln_cpu_gather_matmul(const kiln_kernel_args *args) {
    const kiln_tensor *w = args->in[0], *idx = args->in[1], *x = args->in[2];
    kiln_tensor *y = args->out;
    KILN_CHECK(
        w->rank == 3 && idx->rank == 1 && x->rank == 3 && y->rank == 3, KILN_ERR_INVALID_ARG,
        "cpu gather_matmul: w [E, M, K], idx [B] and x [B, K, N] expected (ranks %u, %u, %u)",
        w->rank, idx->rank, x->rank);
    const int64_t e = w->dims[0], m = w->dims[1], k = w->dims[2], b = x->dims[0], n = x->dims[2];
    KILN_CHECK(idx->dims[0] == b && x->dims[1] == k && y->dims[0] == b && y->dims[1] == m &&
                   y->dims[2] == n,
               KILN_ERR_INVALID_ARG, "cpu gather_matmul: operand shapes disagree");
    kiln_cpu_scratch s;
    kiln_cpu_scratch_init(&s, args);
    for (int64_t bi = 0; bi < b; bi++) {
        const int64_t ix = idx->dtype == KILN_DTYPE_I32 ? ((const int32_t *)idx->data)[bi]
                                                        : ((const int64_t *)idx->data)[bi];
        const int64_t ei = ix < 0 ? ix + e : ix; // torch's indexing: negative from the end
        KILN_CHECK(ei >= 0 && ei < e, KILN_ERR_INVALID_ARG,
                   "gather_matmul: index %lld at position %lld is out of range for %lld matrices "
                   "(each must be in [-%lld, %lld): the index input, e.g. a router's experts, "
                   "names a matrix that w does not have)",
                   (long long)ix, (long long)bi, (long long)e, (long long)e, (long long)e);
        KILN_TRY(gemm_rows(&s, w, ei * m * k, k, x, bi * k * n, n, y, bi * m * n, m, n, k));
    }
    return KILN_OK;
}
