// SPDX-License-Identifier: Apache-2.0
// The kiln CLI: `kiln inspect FILE [--json]` prints an engine (header, section table with CRCs,
// bindings, layers with shapes and fused tails, memory plan, weights); `kiln --version`;
// `kiln help`. Only the CLI may exit: the library never does. Exit codes: 0 ok, 1 the file could
// not be read or is not a valid engine, 2 usage error.
//
// Structure: commands are a table (name, handler, help); `inspect` reads the file, detects its
// kind from the first bytes (detect_kind) and dispatches to a printer per kind. Programs (.pte)
// are read by the Python `kiln` command (python/kiln/_cli, docs/cli.md); this tool names it.
// Names and paths are printed escaped (put_text); --json prints kiln_engine_describe's text,
// and with --json a failure is a JSON document on stdout as well as a message on stderr.
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "kiln/kiln.h"
#include "runtime/format.h"
#include "runtime/load.h"

#define EXIT_INVALID 1
#define EXIT_USAGE 2

static const char *prog = "kiln";
// With --json, failures are reported as {"file": ..., "error": {...}} on stdout too.
static int json_mode = 0;
static const char *json_file = NULL;

static void put_text(FILE *f, const char *s);
static void put_json_string(FILE *f, const char *s);

static void die(int code, const char *fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s: ", prog);
    put_text(stderr, msg);
    fputc('\n', stderr);
    if (json_mode) {
        fputs("{\"file\":", stdout);
        if (json_file != NULL)
            put_json_string(stdout, json_file);
        else
            fputs("null", stdout);
        fprintf(stdout,
                ",\"error\":{\"kind\":\"%s\",\"message\":", code == EXIT_USAGE ? "usage" : "error");
        put_json_string(stdout, msg);
        fputs("}}\n", stdout);
    }
    exit(code);
}

// Reads a whole file (malloc'd; the CLI owns it).
static uint8_t *read_file(const char *path, size_t *out_n) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) die(EXIT_INVALID, "cannot open '%s': %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    uint8_t *buf = malloc(cap);
    for (;;) {
        if (buf == NULL) die(EXIT_INVALID, "'%s': out of memory", path);
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        cap *= 2;
        buf = realloc(buf, cap);
    }
    if (ferror(f)) die(EXIT_INVALID, "cannot read '%s': %s", path, strerror(errno));
    fclose(f);
    *out_n = n;
    return buf;
}

// --- escaping: names and paths are untrusted bytes

// Length of the valid UTF-8 sequence at p (2-4 bytes), or 0 if the bytes there are not one.
static size_t utf8_seq(const unsigned char *p) {
    unsigned c = p[0], cp, min;
    size_t n;
    if (c >= 0xc2 && c <= 0xdf) {
        n = 2;
        min = 0x80;
    } else if (c >= 0xe0 && c <= 0xef) {
        n = 3;
        min = 0x800;
    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4;
        min = 0x10000;
    } else {
        return 0;
    }
    cp = c & (0x3fu >> (n - 1));
    for (size_t k = 1; k < n; k++) {
        if ((p[k] & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (p[k] & 0x3fu);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    if (cp >= 0x80 && cp < 0xa0) return 0; // C1 controls: escaped like C0
    return n;
}

// Writes s for a terminal: printable ASCII and valid UTF-8 as they are, every other byte (controls,
// DEL, bytes that are not UTF-8) as \xNN.
static void put_text(FILE *f, const char *s) {
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        size_t n = *p >= 0x80 ? utf8_seq(p) : 0;
        if (*p >= 0x20 && *p < 0x7f) {
            fputc(*p, f);
            p++;
        } else if (n > 0) {
            fwrite(p, 1, n, f);
            p += n;
        } else {
            fprintf(f, "\\x%02x", *p);
            p++;
        }
    }
}

// A JSON string: the same escapes as kiln_engine_describe (bytes that are not UTF-8 as \u00XX).
static void put_json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        size_t n = *p >= 0x80 ? utf8_seq(p) : 0;
        if (*p == '"' || *p == '\\') {
            fputc('\\', f);
            fputc(*p++, f);
        } else if (*p >= 0x20 && *p < 0x7f) {
            fputc(*p++, f);
        } else if (n > 0) {
            fwrite(p, 1, n, f);
            p += n;
        } else {
            fprintf(f, "\\u%04x", *p++);
        }
    }
    fputc('"', f);
}

// --- engine printing helpers

static const char *precision_name(uint32_t p) {
    return p == KILN_PRECISION_FP16 ? "fp16" : p == KILN_PRECISION_BF16 ? "bf16" : "fp32";
}

static void print_shape(FILE *f, const kiln_shape *s) {
    fputc('[', f);
    for (uint32_t d = 0; d < s->rank; d++) {
        if (d) fputs(", ", f);
        if (s->min[d] == s->max[d])
            fprintf(f, "%" PRId64, s->min[d]);
        else
            fprintf(f, "%" PRId64 "..%" PRId64, s->min[d], s->max[d]);
    }
    fputc(']', f);
}

static void print_tensor_ref(FILE *f, const kiln_plan *p, int32_t id) {
    if (id < 0) {
        fputs("(none)", f);
        return;
    }
    const kiln_plan_tensor *t = &p->tensors[id];
    const char *name = kiln_plan_string(p, t->name);
    if (name[0])
        put_text(f, name);
    else
        fprintf(f, "t%" PRId32, id);
    fprintf(f, " %s ", kiln_dtype_name((kiln_dtype)t->dtype));
    print_shape(f, &t->shape);
}

static void print_attrs(FILE *f, const kiln_plan *p, const kiln_plan_layer *l) {
    for (uint32_t a = 0; a < l->n_attrs; a++) {
        kiln_attr_info info;
        if (kiln_op_get_attr_info(l->op, a, &info) != KILN_OK) continue;
        const kiln_attr_ref *r = &p->attr_refs[l->attr_begin + a];
        fprintf(f, "%s%s=", a ? " " : " {", info.name);
        if (r->n != 1) fputc('[', f);
        for (uint32_t k = 0; k < r->n; k++) {
            if (k) fputs(", ", f);
            if (r->kind == KILN_ATTR_INTS)
                fprintf(f, "%" PRId64, p->ints[r->begin + k]);
            else
                fprintf(f, "%g", p->floats[r->begin + k]);
        }
        if (r->n != 1) fputc(']', f);
        if (a + 1 == l->n_attrs) fputc('}', f);
    }
}

typedef struct weight_stats {
    uint32_t n_inline, n_external;
    uint64_t inline_nbytes, external_nbytes;
    uint32_t n_activations;
} weight_stats;

static weight_stats stats_of(const kiln_plan *p) {
    weight_stats w = {0};
    for (uint32_t i = 0; i < p->n_tensors; i++) {
        const kiln_plan_tensor *t = &p->tensors[i];
        if (t->kind == KILN_TENSOR_ACTIVATION) w.n_activations++;
        if (t->kind != KILN_TENSOR_WEIGHT) continue;
        if (t->key == KILN_NO_KEY) {
            w.n_inline++;
            w.inline_nbytes += t->nbytes;
        } else {
            w.n_external++;
            w.external_nbytes += t->nbytes;
        }
    }
    return w;
}

static void print_engine_text(const char *path, const kiln_format_info *h, const kiln_plan *p) {
    FILE *f = stdout;
    uint32_t wv = h->writer_version;
    fputs("engine: ", f);
    put_text(f, path);
    fprintf(f, " (%" PRIu64 " bytes)\n", h->file_nbytes);
    fprintf(f,
            "  magic ok, format_version %" PRIu32 ", header %" PRIu32 " bytes, flags 0x%08" PRIx32
            ", header crc32 0x%08" PRIx32 " ok\n",
            h->format_version, h->header_nbytes, h->flags, h->header_crc32);
    fprintf(f, "  written by kiln %u.%u.%u, precision %s\n", wv >> 16, (wv >> 8) & 0xffu,
            wv & 0xffu, precision_name(p->precision));
    fprintf(f, "sections (%" PRIu32 "):\n", h->n_sections);
    fprintf(f, "  %-3s %-10s %12s %12s  %s\n", "#", "kind", "offset", "nbytes", "crc32");
    for (uint32_t i = 0; i < h->n_sections; i++) {
        const kiln_format_section *s = &h->sections[i];
        fprintf(f, "  %-3" PRIu32 " %-10s %12" PRIu64 " %12" PRIu64 "  0x%08" PRIx32 " ok%s\n", i,
                s->kind < KILN_SECTION_KIND_COUNT ? kiln_format_section_name(s->kind) : "optional",
                s->offset, s->nbytes, s->crc32,
                s->kind < KILN_SECTION_KIND_COUNT ? "" : " (unknown kind, skipped)");
    }
    for (int io = 1; io >= 0; io--) {
        uint32_t n = io ? p->n_inputs : p->n_outputs;
        fprintf(f, "%s (%" PRIu32 "):\n", io ? "inputs" : "outputs", n);
        for (uint32_t i = 0; i < n; i++) {
            fprintf(f, "  %-3" PRIu32 " ", i);
            print_tensor_ref(f, p, (int32_t)(io ? p->inputs[i] : p->outputs[i]));
            fputc('\n', f);
        }
    }
    fprintf(f, "layers (%" PRIu32 "):\n", p->n_layers);
    for (uint32_t i = 0; i < p->n_layers; i++) {
        const kiln_plan_layer *l = &p->layers[i];
        if (l->flags & KILN_LAYER_TAIL) continue; // printed with its head
        fprintf(f, "  %-4" PRIu32 " %s(", i, kiln_op_name(l->op));
        for (uint32_t k = 0; k < l->n_inputs; k++) {
            if (k) fputs(", ", f);
            print_tensor_ref(f, p, p->ids[l->input_begin + k]);
        }
        fputc(')', f);
        print_attrs(f, p, l);
        fputs(" -> ", f);
        print_tensor_ref(f, p, p->ids[l->output_begin]);
        fputc('\n', f);
        for (uint32_t t = 1; t <= l->n_tail && i + t < p->n_layers; t++) {
            const kiln_plan_layer *tl = &p->layers[i + t];
            int32_t running = p->ids[l->output_begin];
            fprintf(f, "       + %s", kiln_op_name(tl->op));
            for (uint32_t k = 0; k < tl->n_inputs; k++) {
                int32_t id = p->ids[tl->input_begin + k];
                if (id == running) continue;
                fputs(" with ", f);
                print_tensor_ref(f, p, id);
            }
            print_attrs(f, p, tl);
            fprintf(f, "   (fused, layer %" PRIu32 ")\n", i + t);
        }
    }
    weight_stats w = stats_of(p);
    fprintf(f, "memory plan: arena %" PRIu64 " bytes, %" PRIu32 " activations\n", p->arena_nbytes,
            w.n_activations);
    fprintf(f,
            "weights: %" PRIu32 " inline (%" PRIu64 " bytes, section %" PRIu64 " bytes), %" PRIu32
            " external (%" PRIu64 " bytes)\n",
            w.n_inline, w.inline_nbytes, p->weights_nbytes, w.n_external, w.external_nbytes);
    for (uint32_t i = 0; i < p->n_tensors; i++) {
        const kiln_plan_tensor *t = &p->tensors[i];
        if (t->kind != KILN_TENSOR_WEIGHT || t->key == KILN_NO_KEY) continue;
        fputs("  key ", f);
        put_text(f, kiln_plan_string(p, t->key));
        fputs(": ", f);
        print_tensor_ref(f, p, (int32_t)i);
        fprintf(f, ", %" PRIu64 " bytes\n", t->nbytes);
    }
}

// The JSON of kiln_engine_describe with the file's path first.
static int print_engine_json(const char *path, const uint8_t *data, size_t n) {
    size_t len = 0;
    kiln_status st = kiln_engine_describe(data, n, NULL, 0, &len);
    char *text = st == KILN_OK ? malloc(len + 1) : NULL;
    if (st == KILN_OK && text == NULL) die(EXIT_INVALID, "out of memory describing the engine");
    if (st == KILN_OK) st = kiln_engine_describe(data, n, text, len + 1, &len);
    if (st != KILN_OK) {
        free(text);
        return 0;
    }
    fputs("{\"file\":", stdout);
    put_json_string(stdout, path);
    fprintf(stdout, ",%s\n", text + 1); // text starts with '{'
    free(text);
    return 1;
}

// --- file kinds

typedef enum file_kind { FILE_UNKNOWN, FILE_ENGINE, FILE_PROGRAM } file_kind;

static file_kind detect_kind(const uint8_t *data, size_t n) {
    if (n >= KILN_FORMAT_MAGIC_NBYTES &&
        memcmp(data, KILN_FORMAT_MAGIC, KILN_FORMAT_MAGIC_NBYTES) == 0)
        return FILE_ENGINE;
    // ExecuTorch programs: flatbuffer file identifier "ET12" at offset 4.
    if (n >= 8 && memcmp(data + 4, "ET12", 4) == 0) return FILE_PROGRAM;
    return FILE_UNKNOWN;
}

static void quiet_log(void *ud, kiln_log_level level, const char *msg) {
    (void)ud;
    (void)level;
    (void)msg;
}

static int inspect_engine(const char *path, const uint8_t *data, size_t n, int as_json) {
    kiln_format_info h;
    kiln_plan p;
    kiln_status st = kiln_format_parse(data, n, &h);
    if (st == KILN_OK) st = kiln_load_plan(data, n, &p);
    if (st != KILN_OK) {
        die(EXIT_INVALID, "'%s' is not a valid Kiln engine (%s): %s", path, kiln_status_str(st),
            kiln_last_error());
    }
    kiln_plan_release(&p);
    if (as_json) {
        if (!print_engine_json(path, data, n)) {
            die(EXIT_INVALID, "'%s' could not be described: %s", path, kiln_last_error());
        }
    } else {
        if (kiln_load_plan(data, n, &p) != KILN_OK) die(EXIT_INVALID, "%s", kiln_last_error());
        print_engine_text(path, &h, &p);
        kiln_plan_release(&p);
    }
    return 0;
}

static int cmd_inspect(int argc, char **argv) {
    const char *path = NULL;
    int as_json = 0;
    for (int i = 0; i < argc; i++) json_mode |= strcmp(argv[i], "--json") == 0;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0)
            as_json = 1;
        else if (argv[i][0] == '-' && argv[i][1] != '\0')
            die(EXIT_USAGE, "inspect: unknown option '%s'", argv[i]);
        else if (path == NULL)
            path = argv[i];
        else
            die(EXIT_USAGE, "inspect: more than one file ('%s' and '%s')", path, argv[i]);
    }
    if (path == NULL) die(EXIT_USAGE, "inspect: missing FILE (usage: kiln inspect FILE [--json])");
    json_file = path;
    size_t n;
    uint8_t *data = read_file(path, &n);
    // The CLI reports failures itself; keep the library's log quiet.
    kiln_log_set(quiet_log, NULL, KILN_LOG_NONE);
    int rc;
    switch (detect_kind(data, n)) {
    case FILE_ENGINE: rc = inspect_engine(path, data, n, as_json); break;
    case FILE_PROGRAM:
        die(EXIT_INVALID,
            "'%s' is an ExecuTorch program (.pte), not a raw engine: the Python command reads "
            "programs (pip install kiln; kiln inspect PROGRAM.pte), this C tool reads engines",
            path);
        rc = EXIT_INVALID;
        break;
    default:
        die(EXIT_INVALID,
            "'%s' is not a Kiln engine (it does not start with the engine magic "
            "\\x89KLN\\r\\n\\x1a\\n; %zu bytes)",
            path, n);
        rc = EXIT_INVALID;
    }
    free(data);
    return rc;
}

static int cmd_version(int argc, char **argv) {
    (void)argc;
    (void)argv;
    printf("kiln %s (engine format %d)\n", kiln_version_string(), KILN_FORMAT_VERSION);
    return 0;
}

static int cmd_help(int argc, char **argv);

typedef struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *usage;
    const char *help;
} command;

static const command commands[] = {
    {"inspect", cmd_inspect, "inspect FILE [--json]",
     "print an engine: header, sections and CRCs, bindings, layers, memory plan, weights"},
    {"version", cmd_version, "--version", "print the Kiln version and engine format version"},
    {"help", cmd_help, "help", "print this help"},
};

static int cmd_help(int argc, char **argv) {
    (void)argc;
    (void)argv;
    printf("usage: kiln COMMAND [ARGS]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        printf("  %-24s %s\n", commands[i].usage, commands[i].help);
    }
    printf("\nexit status: 0 ok, 1 unreadable or invalid file, 2 usage error\n");
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        cmd_help(0, NULL);
        return EXIT_USAGE;
    }
    const char *name = argv[1];
    if (strcmp(name, "--version") == 0 || strcmp(name, "-V") == 0) name = "version";
    if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0) name = "help";
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(name, commands[i].name) == 0) return commands[i].run(argc - 2, argv + 2);
    }
    die(EXIT_USAGE, "unknown command '%s' (try 'kiln help')", argv[1]);
    return EXIT_USAGE;
}
