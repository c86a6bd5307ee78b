// SPDX-License-Identifier: Apache-2.0
// The untrusted-file battery through the C program API: for every case of a manifest (written
// by python/tests/test_untrusted.py) a child process loads the program (and its .ptd), runs it on
// the case's input and compares the output with the reference byte for byte. A case that
// crashes, hangs (20 s) or exits early is reported with its signal, so the parent test fails on
// it; every other case prints its status and Kiln's whole message. Cases run in groups of
// CASES_PER_CHILD in one child (default 1); after a crash the next group starts after the case.
//
//   check_files MANIFEST [CASES_PER_CHILD]
//   manifest line:  id <TAB> program.pte <TAB> data.ptd or - <TAB> input.bin <TAB> d0,d1,...
//                   <TAB> reference.bin
//   output line:    id <TAB> result <TAB> status name <TAB> message
//                   result: ok (output identical) | differs | refused | signal N | exit N
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kiln/kiln_program.h"

static void *read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *b = malloc(len > 0 ? (size_t)len : 1);
    if (b != NULL && fread(b, 1, (size_t)len, f) != (size_t)len) {
        free(b);
        b = NULL;
    }
    fclose(f);
    *n = (size_t)len;
    return b;
}

typedef struct kase {
    char *id, *pte, *ptd, *input, *dims, *ref;
} kase;

// Runs one case; writes its result line to fd `out`. In the child process.
static int run_case(const kase *k, FILE *out) {
    kiln_program_options o;
    kiln_program_options_init(&o);
    const char *paths[1] = {k->ptd};
    if (strcmp(k->ptd, "-") != 0) {
        o.data_paths = paths;
        o.n_data_paths = 1;
    }
    kiln_program *p = NULL;
    kiln_status st = kiln_program_load(k->pte, &o, &p);
    if (st == KILN_OK) {
        size_t n_in = 0, n_ref = 0;
        void *x = read_file(k->input, &n_in), *ref = read_file(k->ref, &n_ref);
        int64_t dims[KILN_MAX_RANK];
        uint32_t rank = 0;
        for (char *s = k->dims; s && *s && rank < KILN_MAX_RANK; rank++) {
            dims[rank] = strtoll(s, &s, 10);
            if (*s == ',') s++;
        }
        kiln_input in = {.data = x, .dtype = KILN_DTYPE_F32, .rank = rank, .dims = dims};
        st = kiln_program_set_input(p, NULL, 0, &in);
        if (st == KILN_OK) st = kiln_program_execute(p, NULL);
        kiln_output y;
        if (st == KILN_OK) st = kiln_program_output(p, NULL, 0, &y);
        if (st == KILN_OK) {
            int same = y.nbytes == n_ref && memcmp(y.data, ref, n_ref) == 0;
            fprintf(out, "%s\t%s\t%s\t\n", k->id, same ? "ok" : "differs", kiln_status_name(st));
        }
        free(x);
        free(ref);
    }
    if (st != KILN_OK) {
        fprintf(out, "%s\trefused\t%s\t%s\n", k->id, kiln_status_name(st),
                kiln_program_last_error());
    }
    kiln_program_free(p);
    fflush(out);
    return 0;
}

// Runs cases [begin, end) in one child process; returns the index of the first case not run
// (a case the child died in is reported with its signal or exit status and counts as run).
static int run_group(kase *cases, int begin, int end) {
    int fds[2];
    if (pipe(fds) != 0) return end;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        for (int i = begin; i < end; i++) {
            alarm(20);  // a hang becomes SIGALRM
            char c = 1; // "case i starts": lets the parent name the case a signal hits
            if (write(fds[1], &c, 1) != 1) _exit(3);
            run_case(&cases[i], stdout);
        }
        _exit(0);
    }
    close(fds[1]);
    int started = 0;
    char c;
    while (read(fds[0], &c, 1) == 1) started++;
    close(fds[0]);
    int ws = 0;
    while (waitpid(pid, &ws, 0) < 0 && errno == EINTR) {
    }
    if (WIFSIGNALED(ws) || WEXITSTATUS(ws) != 0) {
        int at = begin + (started > 0 ? started - 1 : 0);
        if (WIFSIGNALED(ws))
            printf("%s\tsignal %d\t\t\n", cases[at].id, WTERMSIG(ws));
        else
            printf("%s\texit %d\t\t\n", cases[at].id, WEXITSTATUS(ws));
        return at + 1;
    }
    return end;
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: %s MANIFEST [CASES_PER_CHILD]\n", argv[0]);
        return 2;
    }
    int group = argc > 2 ? atoi(argv[2]) : 1;
    if (group < 1) group = 1;
    size_t n = 0;
    char *m = read_file(argv[1], &n);
    if (m == NULL) {
        fprintf(stderr, "cannot read %s\n", argv[1]);
        return 2;
    }
    m = realloc(m, n + 1);
    m[n] = '\0';
    int n_cases = 0, cap = 0;
    kase *cases = NULL;
    for (char *line = strtok(m, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        char *f[6];
        int nf = 0;
        for (char *t = line; nf < 6; nf++) {
            f[nf] = t;
            char *tab = strchr(t, '\t');
            if (tab == NULL) {
                nf++;
                break;
            }
            *tab = '\0';
            t = tab + 1;
        }
        if (nf != 6) {
            fprintf(stderr, "bad manifest line: %s\n", line);
            return 2;
        }
        if (n_cases == cap) {
            cap = cap ? 2 * cap : 256;
            cases = realloc(cases, (size_t)cap * sizeof *cases);
        }
        cases[n_cases++] = (kase){f[0], f[1], f[2], f[3], f[4], f[5]};
    }
    for (int i = 0; i < n_cases;) {
        int end = i + group < n_cases ? i + group : n_cases;
        i = run_group(cases, i, end);
    }
    fflush(stdout);
    fprintf(stderr, "%d cases, %d per child process\n", n_cases, group);
    free(cases);
    free(m);
    return 0;
}
