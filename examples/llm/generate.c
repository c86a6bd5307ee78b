// SPDX-License-Identifier: Apache-2.0
// Greedy generation from C over an ExecuTorch program whose decoder keeps its KV cache inside
// the Kiln engine (examples/llm/README.md): the prompt in one call of the `prefill` method, then
// one token per call of `decode` (a program with only `forward` uses it for both). Each method
// takes (tokens int64 [1, L], positions int64 [L]) and returns float logits [1, vocab] (or
// [1, L, vocab]: the last row is used). Prints the generated token ids and the timings.
//
//   kiln_llm_generate PROGRAM.pte [--data WEIGHTS.ptd] --prompt 1,2,3 [--tokens N]
//                     [--option NAME=VALUE]...
#define _POSIX_C_SOURCE 200809L // clock_gettime
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kiln/kiln.h"
#include "kiln/kiln_program.h"

#define MAX_PROMPT 4096
#define MAX_OPTIONS 8

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static int fail(const char *what) {
    fprintf(stderr, "kiln_llm_generate: %s: %s\n", what, kiln_program_last_error());
    return 1;
}

// Runs `method` on tokens [1, n] at positions start .. start + n - 1; *next = argmax of the
// last row of the logits.
static int step(kiln_program *p, const char *method, const int64_t *tokens, int64_t n,
                int64_t start, int64_t *next) {
    static int64_t pos[MAX_PROMPT];
    int64_t tdims[2] = {1, n}, pdims[1] = {n};
    for (int64_t i = 0; i < n; i++) pos[i] = start + i;
    kiln_input in[2] = {{tokens, KILN_DTYPE_I64, 2, tdims, KILN_MEMORY_HOST, 0},
                        {pos, KILN_DTYPE_I64, 1, pdims, KILN_MEMORY_HOST, 0}};
    kiln_output out;
    if (kiln_program_set_inputs(p, method, 2, in) != KILN_OK) return fail(method);
    if (kiln_program_execute(p, method) != KILN_OK) return fail(method);
    if (kiln_program_output(p, method, 0, &out) != KILN_OK) return fail(method);
    if (out.dtype != KILN_DTYPE_F32 || out.rank < 2) {
        fprintf(stderr,
                "kiln_llm_generate: %s returns %u-D logits of dtype %d; expected float32 "
                "[1, vocab] or [1, L, vocab]\n",
                method, out.rank, (int)out.dtype);
        return 1;
    }
    int64_t vocab = out.dims[out.rank - 1];
    const float *row = (const float *)out.data + (out.nbytes / sizeof(float) - (uint64_t)vocab);
    int64_t best = 0;
    for (int64_t v = 1; v < vocab; v++) best = row[v] > row[best] ? v : best;
    *next = best;
    return 0;
}

int main(int argc, char **argv) {
    const char *pte = NULL, *data = NULL, *prompt_arg = NULL;
    long n_new = 32;
    kiln_option_setting settings[MAX_OPTIONS];
    char option_names[MAX_OPTIONS][128];
    uint32_t n_settings = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--data") == 0 && i + 1 < argc) {
            data = argv[++i];
        } else if (strcmp(argv[i], "--prompt") == 0 && i + 1 < argc) {
            prompt_arg = argv[++i];
        } else if (strcmp(argv[i], "--tokens") == 0 && i + 1 < argc) {
            n_new = strtol(argv[++i], NULL, 10);
        } else if (strcmp(argv[i], "--option") == 0 && i + 1 < argc && n_settings < MAX_OPTIONS) {
            const char *kv = argv[++i], *eq = strchr(kv, '=');
            if (eq == NULL || (size_t)(eq - kv) >= sizeof option_names[0]) {
                fprintf(stderr, "kiln_llm_generate: --option takes NAME=VALUE, got '%s'\n", kv);
                return 2;
            }
            memcpy(option_names[n_settings], kv, (size_t)(eq - kv));
            option_names[n_settings][eq - kv] = '\0';
            memset(&settings[n_settings], 0, sizeof settings[n_settings]);
            settings[n_settings].name = option_names[n_settings];
            char *end = NULL;
            long v = strtol(eq + 1, &end, 10);
            if (strcmp(eq + 1, "true") == 0 || strcmp(eq + 1, "false") == 0) {
                settings[n_settings].type = KILN_OPTION_BOOL;
                settings[n_settings].int_value = eq[1] == 't';
            } else if (end != eq + 1 && *end == '\0') {
                settings[n_settings].type = KILN_OPTION_INT;
                settings[n_settings].int_value = v;
            } else {
                settings[n_settings].type = KILN_OPTION_STRING;
                settings[n_settings].string_value = eq + 1;
            }
            n_settings++;
        } else if (pte == NULL && argv[i][0] != '-') {
            pte = argv[i];
        } else {
            fprintf(stderr, "usage: kiln_llm_generate PROGRAM.pte [--data WEIGHTS.ptd] --prompt "
                            "1,2,3 [--tokens N] [--option NAME=VALUE]...\n");
            return 2;
        }
    }
    if (pte == NULL || prompt_arg == NULL || n_new < 1) {
        fprintf(stderr, "kiln_llm_generate: give a program, --prompt token ids (comma-separated) "
                        "and --tokens N >= 1\n");
        return 2;
    }
    static int64_t prompt[MAX_PROMPT];
    int64_t n_prompt = 0;
    for (const char *s = prompt_arg; *s != '\0' && n_prompt < MAX_PROMPT;) {
        char *end;
        long long v = strtoll(s, &end, 10);
        if (end == s) {
            fprintf(stderr, "kiln_llm_generate: --prompt '%s' is not comma-separated integers\n",
                    prompt_arg);
            return 2;
        }
        prompt[n_prompt++] = v;
        s = *end == ',' ? end + 1 : end;
    }

    kiln_program_options o;
    kiln_program_options_init(&o);
    o.data_paths = data != NULL ? &data : NULL;
    o.n_data_paths = data != NULL ? 1 : 0;
    o.settings = n_settings > 0 ? settings : NULL;
    o.n_settings = n_settings;
    kiln_program *p = NULL;
    if (kiln_program_load(pte, &o, &p) != KILN_OK) return fail("loading the program");
    uint32_t n_methods = 0;
    int has_prefill = 0, has_decode = 0;
    kiln_program_method_count(p, &n_methods);
    for (uint32_t i = 0; i < n_methods; i++) {
        const char *name = NULL;
        if (kiln_program_method_name(p, i, &name) != KILN_OK) continue;
        has_prefill |= strcmp(name, "prefill") == 0;
        has_decode |= strcmp(name, "decode") == 0;
    }
    const char *prefill = has_prefill ? "prefill" : "forward";
    const char *decode = has_decode ? "decode" : "forward";

    int64_t tok = 0;
    double t0 = now_ms();
    int rc = step(p, prefill, prompt, n_prompt, 0, &tok);
    double t_first = now_ms() - t0;
    printf("tokens:");
    if (rc == 0) printf(" %lld", (long long)tok);
    double t1 = now_ms();
    for (long i = 1; i < n_new && rc == 0; i++) {
        rc = step(p, decode, &tok, 1, n_prompt + i - 1, &tok);
        if (rc == 0) printf(" %lld", (long long)tok);
    }
    double t_decode = now_ms() - t1;
    printf("\n");
    if (rc == 0) {
        printf("prompt %lld tokens, first token %.2f ms; decode %.3f ms/token (%.0f tokens/s) over "
               "%ld tokens\n",
               (long long)n_prompt, t_first, n_new > 1 ? t_decode / (double)(n_new - 1) : 0.0,
               n_new > 1 ? 1e3 * (double)(n_new - 1) / t_decode : 0.0, n_new - 1);
    }
    kiln_program_free(p);
    return rc;
}
