// SPDX-License-Identifier: Apache-2.0
// PyTorch goldens for the CPU backend: reads every file listed in tests/golden/MANIFEST (written
// by tests/golden/make_golden.py, which documents the format), runs each case through
// kiln_cpu_run with exactly the scratch kiln_cpu_scratch_nbytes asks for, and compares with the
// PyTorch eager output within per-dtype tolerances. Runs from the repository root (ctest's
// working directory); KILN_GOLDEN_DIR overrides the directory.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/dtype.h"
#include "core/ops.h"
#include "cpu/cpu.h"

#define MAX_TENSORS 80
#define MAX_TAIL 8

typedef struct reader {
    const uint8_t *p, *end;
    int bad;
} reader;

static int rd(reader *r, void *out, size_t n) {
    if (r->bad || (size_t)(r->end - r->p) < n) {
        r->bad = 1;
        memset(out, 0, n);
        return 0;
    }
    memcpy(out, r->p, n);
    r->p += n;
    return 1;
}
static uint32_t rd_u32(reader *r) {
    uint32_t v;
    rd(r, &v, 4);
    return v;
}

// Attribute storage for one op.
typedef struct attr_store {
    kiln_attr_ref refs[KILN_MAX_ATTRS];
    int64_t ints[64];
    double floats[16];
    kiln_attrs view;
} attr_store;

static int rd_attrs(reader *r, attr_store *a) {
    uint32_t n = rd_u32(r), ni = 0, nf = 0;
    if (n > KILN_MAX_ATTRS) return r->bad = 1, 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t kind = rd_u32(r), cnt = rd_u32(r);
        a->refs[i].kind = kind;
        a->refs[i].n = cnt;
        if (kind == KILN_ATTR_INTS && ni + cnt <= 64) {
            a->refs[i].begin = ni;
            for (uint32_t j = 0; j < cnt; j++) rd(r, &a->ints[ni++], 8);
        } else if (kind == KILN_ATTR_FLOATS && nf + cnt <= 16) {
            a->refs[i].begin = nf;
            for (uint32_t j = 0; j < cnt; j++) rd(r, &a->floats[nf++], 8);
        } else {
            return r->bad = 1, 0;
        }
    }
    a->view.refs = a->refs;
    a->view.n_attrs = n;
    a->view.ints = a->ints;
    a->view.floats = a->floats;
    return !r->bad;
}

// Reads a tensor into malloc'd (aligned) memory.
static kiln_tensor *rd_tensor(reader *r) {
    kiln_tensor *t = (kiln_tensor *)calloc(1, sizeof *t);
    t->dtype = rd_u32(r);
    t->rank = rd_u32(r);
    if (!kiln_dtype_valid(t->dtype) || t->rank > KILN_MAX_RANK) {
        r->bad = 1;
        free(t);
        return NULL;
    }
    uint64_t n = 1;
    for (uint32_t i = 0; i < t->rank; i++) {
        rd(r, &t->dims[i], 8);
        if (t->dims[i] < 0 || t->dims[i] > (1 << 24))
            r->bad = 1;
        else
            n *= (uint64_t)t->dims[i];
    }
    size_t nbytes = r->bad ? 0 : (size_t)n * kiln_dtype_size((kiln_dtype)t->dtype);
    t->data = malloc(nbytes ? nbytes : 1);
    rd(r, t->data, nbytes);
    return t;
}
static kiln_tensor *rd_opt_tensor(reader *r) { return rd_u32(r) ? rd_tensor(r) : NULL; }

static void free_tensor(kiln_tensor *t) {
    if (t) free(t->data);
    free(t);
}

// Base tolerances per output dtype; a case may scale them.
static void tolerances(uint32_t dtype, double *atol, double *rtol) {
    switch (dtype) {
    case KILN_DTYPE_F32: *atol = 1e-4, *rtol = 1e-4; break;
    case KILN_DTYPE_F16: *atol = 5e-3, *rtol = 5e-3; break;
    case KILN_DTYPE_BF16: *atol = 3e-2, *rtol = 1.6e-2; break;
    default: *atol = 0, *rtol = 0; break; // integers and bool: exact
    }
}

static double get(const kiln_tensor *t, int64_t i) {
    if (t->dtype == KILN_DTYPE_I64) return (double)((const int64_t *)t->data)[i];
    return (double)kiln_load_f32(t->data, t->dtype, i);
}

static int n_cases_run;

// `file` is "<op>.kgold": every case in it must carry that op's id (catches id drift between
// make_golden.py and kiln_ops.h).
static void run_case(reader *r, const char *file, const char *op_name) {
    uint32_t name_len = rd_u32(r);
    char name[128] = "";
    if (name_len >= sizeof name) {
        r->bad = 1;
        return;
    }
    rd(r, name, name_len);
    name[name_len] = '\0';
    uint32_t op = rd_u32(r);
    CHECK_MSG(strcmp(kiln_op_name(op), op_name) == 0, "%s: case %s has op id %u (%s), not %s", file,
              name, op, kiln_op_name(op), op_name);
    attr_store attrs, tail_attrs[MAX_TAIL];
    rd_attrs(r, &attrs);
    uint32_t n_in = rd_u32(r);
    if (n_in > MAX_TENSORS) {
        r->bad = 1;
        return;
    }
    kiln_tensor *ins[MAX_TENSORS] = {NULL};
    for (uint32_t i = 0; i < n_in && !r->bad; i++) ins[i] = rd_opt_tensor(r);
    uint32_t n_tail = rd_u32(r);
    kiln_tail_op tail[MAX_TAIL];
    kiln_tensor *operands[MAX_TAIL] = {NULL};
    if (n_tail > MAX_TAIL) r->bad = 1;
    for (uint32_t i = 0; i < n_tail && !r->bad; i++) {
        tail[i].op = rd_u32(r);
        rd_attrs(r, &tail_attrs[i]);
        tail[i].attrs = tail_attrs[i].view;
        tail[i].running_is_lhs = (int)rd_u32(r);
        operands[i] = rd_opt_tensor(r);
        tail[i].operand = operands[i];
    }
    kiln_tensor *expected = r->bad ? NULL : rd_tensor(r);
    double scale = 1.0;
    rd(r, &scale, 8);
    CHECK_MSG(!r->bad, "%s: malformed golden case after '%s'", file, name);
    if (!r->bad) {
        kiln_tensor got = *expected;
        size_t nbytes =
            (size_t)kiln_tensor_numel(expected) * kiln_dtype_size((kiln_dtype)expected->dtype);
        got.data = malloc(nbytes ? nbytes : 1);
        memset(got.data, 0xA5, nbytes ? nbytes : 1);
        kiln_kernel_args args;
        memset(&args, 0, sizeof args);
        args.op = op;
        args.attrs = attrs.view;
        for (uint32_t i = 0; i < n_in; i++) args.in[i] = ins[i];
        args.n_in = n_in;
        args.out = &got;
        args.tail = n_tail ? tail : NULL;
        args.n_tail = n_tail;
        size_t sn = kiln_cpu_scratch_nbytes(&args);
        args.scratch = sn ? malloc(sn) : NULL;
        args.scratch_nbytes = sn;
        if (args.scratch) memset(args.scratch, 0xFF, sn);
        kiln_status st = kiln_cpu_run(&args);
        CHECK_MSG(st == KILN_OK, "%s: kiln_cpu_run returned %s: %s", name, kiln_status_str(st),
                  kiln_last_error());
        if (st == KILN_OK) {
            double atol, rtol;
            tolerances(expected->dtype, &atol, &rtol);
            atol *= scale;
            rtol *= scale;
            int64_t bad = 0, n = kiln_tensor_numel(expected);
            for (int64_t i = 0; i < n; i++) {
                double g = get(&got, i), e = get(expected, i);
                int ok = (isnan(e) && isnan(g)) || g == e || fabs(g - e) <= atol + rtol * fabs(e);
                if (!ok && bad++ < 5) {
                    fprintf(stderr, "  %s [%s]: element %lld: got %.9g, expected %.9g\n", name,
                            kiln_dtype_name((kiln_dtype)expected->dtype), (long long)i, g, e);
                }
            }
            CHECK_MSG(bad == 0, "%s: %lld of %lld elements outside atol %g rtol %g", name,
                      (long long)bad, (long long)n, atol, rtol);
        }
        free(args.scratch);
        free(got.data);
        n_cases_run++;
    }
    for (uint32_t i = 0; i < n_in; i++) free_tensor(ins[i]);
    for (uint32_t i = 0; i < n_tail && i < MAX_TAIL; i++) free_tensor(operands[i]);
    free_tensor(expected);
}

static void run_file(const char *dir, const char *file) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "rb");
    CHECK_MSG(f != NULL, "cannot open %s (run from the repository root)", path);
    if (f == NULL) return;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = (uint8_t *)malloc(size > 0 ? (size_t)size : 1);
    size_t got = size > 0 ? fread(buf, 1, (size_t)size, f) : 0;
    fclose(f);
    reader r = {buf, buf + got, 0};
    char magic[8];
    rd(&r, magic, 8);
    CHECK_MSG(memcmp(magic, "KGOLD001", 8) == 0, "%s: bad magic", path);
    char op_name[256];
    snprintf(op_name, sizeof op_name, "%s", file);
    op_name[strcspn(op_name, ".")] = '\0';
    uint32_t n = rd_u32(&r);
    for (uint32_t i = 0; i < n && !r.bad; i++) run_case(&r, path, op_name);
    CHECK_MSG(!r.bad && r.p == r.end, "%s: %s", path,
              r.bad ? "truncated or malformed" : "trailing bytes");
    free(buf);
}

int main(void) {
    const char *dir = getenv("KILN_GOLDEN_DIR");
    if (dir == NULL) dir = "tests/golden";
    char path[512];
    snprintf(path, sizeof path, "%s/MANIFEST", dir);
    FILE *m = fopen(path, "r");
    CHECK_MSG(m != NULL, "cannot open %s: run from the repository root or set KILN_GOLDEN_DIR",
              path);
    if (m == NULL) return check_summary();
    char line[256];
    int n_files = 0;
    while (fgets(line, sizeof line, m)) {
        line[strcspn(line, "\r\n")] = '\0';
        if (line[0] == '\0' || line[0] == '#') continue;
        run_file(dir, line);
        n_files++;
    }
    fclose(m);
    CHECK(n_files > 0);
    CHECK(n_cases_run > 100);
    fprintf(stderr, "golden: %d cases from %d files\n", n_cases_run, n_files);
    return check_summary();
}
