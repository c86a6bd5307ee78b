// SPDX-License-Identifier: Apache-2.0
// Runs an ExecuTorch program (.pte) with the KilnBackend delegate from C: loads it, fills every
// input with random values, executes a method and prints its outputs.
//
//   kiln_c_example PROGRAM.pte [--data WEIGHTS.ptd]... [--method NAME] [--seed N]
//                  [--option NAME=VALUE]...
//
// --option sets a Kiln runtime option for this program's engines (e.g. device=cpu,
// num_threads=2): bool options take true/false, int options a number.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"
#include "kiln/kiln_program.h"

#define MAX_DATA 8
#define MAX_OPTIONS 8

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t rng_next(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

// Uniform in [-1, 1).
static float rng_float(void) { return (float)((rng_next() >> 40) * (1.0 / 8388608.0) - 1.0); }

static uint16_t f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, exp = (x >> 23) & 0xffu, man = x & 0x7fffffu;
    if (exp < 113) return (uint16_t)sign; // |f| < 2^-14: flush to zero (inputs are in [-1, 1))
    return (uint16_t)(sign | ((exp - 112) << 10) | (man >> 13));
}

static float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    uint32_t x;
    if (exp == 0) {
        x = sign; // zero (subnormals flushed)
    } else if (exp == 31) {
        x = sign | 0x7f800000u | (man << 13);
    } else {
        x = sign | ((exp + 112) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static void fill_random(void *data, kiln_dtype dtype, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float v = rng_float();
        switch (dtype) {
        case KILN_DTYPE_F32: ((float *)data)[i] = v; break;
        case KILN_DTYPE_F16: ((uint16_t *)data)[i] = f32_to_f16(v); break;
        case KILN_DTYPE_BF16: {
            uint32_t x;
            memcpy(&x, &v, 4);
            ((uint16_t *)data)[i] = (uint16_t)(x >> 16);
            break;
        }
        case KILN_DTYPE_I32: ((int32_t *)data)[i] = (int32_t)(rng_next() % 8); break;
        case KILN_DTYPE_I64: ((int64_t *)data)[i] = (int64_t)(rng_next() % 8); break;
        case KILN_DTYPE_BOOL: ((uint8_t *)data)[i] = (uint8_t)(rng_next() & 1); break;
        default: break;
        }
    }
}

static double element(const void *data, kiln_dtype dtype, size_t i) {
    switch (dtype) {
    case KILN_DTYPE_F32: return ((const float *)data)[i];
    case KILN_DTYPE_F16: return f16_to_f32(((const uint16_t *)data)[i]);
    case KILN_DTYPE_BF16: {
        uint32_t x = (uint32_t)((const uint16_t *)data)[i] << 16;
        float f;
        memcpy(&f, &x, 4);
        return f;
    }
    case KILN_DTYPE_I32: return ((const int32_t *)data)[i];
    case KILN_DTYPE_I64: return (double)((const int64_t *)data)[i];
    case KILN_DTYPE_BOOL: return ((const uint8_t *)data)[i];
    default: return 0.0;
    }
}

static void print_shape(uint32_t rank, const int64_t *dims) {
    printf("[");
    for (uint32_t d = 0; d < rank; d++) printf("%s%lld", d ? ", " : "", (long long)dims[d]);
    printf("]");
}

static int check(kiln_status st, const char *what) {
    if (st == KILN_OK) return 0;
    fprintf(stderr, "error: %s: %s: %s\n", what, kiln_status_str(st), kiln_program_last_error());
    return 1;
}

static int parse_option(const char *arg, kiln_option_setting *out) {
    static char storage[MAX_OPTIONS][128];
    static int used = 0;
    const char *eq = strchr(arg, '=');
    if (eq == NULL || used == MAX_OPTIONS || (size_t)(eq - arg) >= sizeof storage[0]) return 1;
    char *name = storage[used++];
    memcpy(name, arg, (size_t)(eq - arg));
    name[eq - arg] = '\0';
    const char *value = eq + 1;
    memset(out, 0, sizeof *out);
    out->name = name;
    // The option's type comes from Kiln's option table.
    for (uint32_t i = 0; i < kiln_option_count(); i++) {
        const char *oname, *def, *scope;
        kiln_option_type type;
        if (kiln_option_info(i, &oname, &type, &def, &scope) != KILN_OK) continue;
        if (strcmp(oname, name) != 0) continue;
        out->type = type;
        if (type == KILN_OPTION_BOOL) {
            out->int_value = strcmp(value, "true") == 0 || strcmp(value, "1") == 0;
        } else if (type == KILN_OPTION_INT) {
            out->int_value = strtoll(value, NULL, 10);
        } else {
            out->string_value = value;
        }
        return 0;
    }
    out->type = KILN_OPTION_STRING; // unknown: kiln_program_load names the valid options
    out->string_value = value;
    return 0;
}

int main(int argc, char **argv) {
    const char *path = NULL, *method = "forward";
    const char *data_paths[MAX_DATA];
    kiln_option_setting settings[MAX_OPTIONS];
    uint32_t n_data = 0, n_settings = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--data") == 0 && i + 1 < argc && n_data < MAX_DATA) {
            data_paths[n_data++] = argv[++i];
        } else if (strcmp(argv[i], "--method") == 0 && i + 1 < argc) {
            method = argv[++i];
        } else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc) {
            rng_state = strtoull(argv[++i], NULL, 10) * 2654435761u + 1;
        } else if (strcmp(argv[i], "--option") == 0 && i + 1 < argc && n_settings < MAX_OPTIONS) {
            if (parse_option(argv[++i], &settings[n_settings++]) != 0) {
                fprintf(stderr, "error: --option takes NAME=VALUE, got '%s'\n", argv[i]);
                return 2;
            }
        } else if (argv[i][0] != '-' && path == NULL) {
            path = argv[i];
        } else {
            fprintf(stderr,
                    "usage: %s PROGRAM.pte [--data WEIGHTS.ptd]... [--method NAME] [--seed N] "
                    "[--option NAME=VALUE]...\n",
                    argv[0]);
            return 2;
        }
    }
    if (path == NULL) {
        fprintf(stderr, "usage: %s PROGRAM.pte [--data WEIGHTS.ptd]... [--method NAME]\n", argv[0]);
        return 2;
    }

    kiln_program_options options;
    kiln_program_options_init(&options);
    options.data_paths = data_paths;
    options.n_data_paths = n_data;
    options.settings = settings;
    options.n_settings = n_settings;
    kiln_program *program = NULL;
    if (check(kiln_program_load(path, &options, &program), "loading the program")) return 1;

    uint32_t n_methods = 0;
    kiln_program_method_count(program, &n_methods);
    printf("program %s (Kiln %s, ExecuTorch %s): %u method(s):", path, kiln_version_string(),
           kiln_executorch_built_against(), n_methods);
    for (uint32_t i = 0; i < n_methods; i++) {
        const char *name;
        kiln_program_method_name(program, i, &name);
        printf(" %s", name);
    }
    int32_t uses_kiln = 0;
    if (check(kiln_program_method_uses_kiln(program, method, &uses_kiln), "method")) goto fail;
    printf("\nmethod %s: %s\n", method, uses_kiln ? "runs in Kiln" : "no Kiln delegate");

    uint32_t n_inputs = 0, n_outputs = 0;
    kiln_program_n_inputs(program, method, &n_inputs);
    kiln_program_n_outputs(program, method, &n_outputs);
    void **buffers = calloc(n_inputs ? n_inputs : 1, sizeof *buffers);
    int status = 0;
    for (uint32_t i = 0; i < n_inputs && status == 0; i++) {
        kiln_tensor_info info;
        status = check(kiln_program_input_info(program, method, i, &info), "input info");
        if (status || !info.is_tensor) continue;
        size_t n = info.nbytes / (kiln_dtype_size(info.dtype) ? kiln_dtype_size(info.dtype) : 1);
        buffers[i] = malloc(info.nbytes ? info.nbytes : 1);
        fill_random(buffers[i], info.dtype, n);
        kiln_input in = {.data = buffers[i],
                         .dtype = info.dtype,
                         .rank = info.rank,
                         .dims = info.dims,
                         .memory = KILN_MEMORY_HOST};
        printf("input %u: %s ", i, kiln_dtype_name(info.dtype));
        print_shape(info.rank, info.dims);
        printf(" (random)\n");
        status = check(kiln_program_set_input(program, method, i, &in), "binding an input");
    }
    if (status == 0) status = check(kiln_program_execute(program, method), "executing");
    for (uint32_t o = 0; o < n_outputs && status == 0; o++) {
        kiln_output out;
        status = check(kiln_program_output(program, method, o, &out), "reading an output");
        if (status) break;
        size_t esize = kiln_dtype_size(out.dtype);
        size_t n = esize ? out.nbytes / esize : 0;
        double sum = 0.0;
        for (size_t k = 0; k < n; k++) sum += element(out.data, out.dtype, k);
        printf("output %u: %s ", o, kiln_dtype_name(out.dtype));
        print_shape(out.rank, out.dims);
        printf(" sum=%.6g first:", sum);
        for (size_t k = 0; k < n && k < 6; k++) printf(" %.6g", element(out.data, out.dtype, k));
        printf("\n");
    }
    for (uint32_t i = 0; i < n_inputs; i++) free(buffers[i]);
    free(buffers);
    kiln_program_free(program);
    return status;
fail:
    kiln_program_free(program);
    return 1;
}
