// SPDX-License-Identifier: Apache-2.0
// The tuning cache's file and this process's copies of it (tune_cache.h).
//
// File layout (little-endian), format 1:
//   0  char[8] "KILNTUNE"
//   8  u32 format version (1)
//  12  u32 number of records
//  16  u64 body bytes
//  24  u32 CRC-32 of the body
//  28  u32 CRC-32 of bytes 0..27
//  32  body: per record u16 key bytes, u16 value bytes, the key, the value
// The body must hold exactly the records the header counts, each within the limits.
#define _POSIX_C_SOURCE 200809L
#include "core/tune_cache.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/crc32.h"
#include "core/env.h"
#include "core/status.h"

#define MAGIC "KILNTUNE"
#define FORMAT 1u
#define HEADER 32u
#define FILE_MAX ((uint64_t)64 << 20)
#define MAX_STORES 8

typedef struct rec {
    uint16_t kn, vn;
    unsigned char *b; // key then value
} rec;

typedef struct store {
    char path[1100];
    int loaded, dirty;
    rec *r;
    uint32_t n, cap;
} store;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static store stores[MAX_STORES];
static store program; // records programs carry (kiln_tune_cache_add_image): read, never written
static unsigned tmp_counter;

static uint32_t rd32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t rd64(const unsigned char *p) { return rd32(p) | (uint64_t)rd32(p + 4) << 32; }
static void wr32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void wr64(unsigned char *p, uint64_t v) {
    wr32(p, (uint32_t)v);
    wr32(p + 4, (uint32_t)(v >> 32));
}

int kiln_tune_cache_path(const char *where, char *buf, size_t n) {
    int w;
    if (where == NULL || strcmp(where, "off") == 0 || where[0] == '\0') return 0;
    if (strcmp(where, "auto") != 0) {
        w = snprintf(buf, n, "%s", where);
    } else {
        const char *xdg = kiln_env("XDG_CACHE_HOME"), *home = kiln_env("HOME");
        if (xdg != NULL && xdg[0] == '/') {
            w = snprintf(buf, n, "%s/kiln/tuning.kilncache", xdg);
        } else if (home != NULL && home[0] == '/') {
            w = snprintf(buf, n, "%s/.cache/kiln/tuning.kilncache", home);
        } else {
            return 0;
        }
    }
    return w > 0 && (size_t)w < n;
}

static void recs_free(rec *r, uint32_t n, uint32_t cap) {
    for (uint32_t i = 0; i < n; i++) kiln_free(r[i].b, (size_t)r[i].kn + r[i].vn + 1);
    kiln_free(r, (size_t)cap * sizeof *r);
}

static long find(const store *s, const void *key, size_t kn) {
    for (uint32_t i = 0; i < s->n; i++) {
        if (s->r[i].kn == kn && memcmp(s->r[i].b, key, kn) == 0) return (long)i;
    }
    return -1;
}

// Adds or replaces a record; 0 when memory or the record limit ran out.
static int put(store *s, const void *key, size_t kn, const void *val, size_t vn) {
    unsigned char *b;
    long at = find(s, key, kn);
    if (at < 0 && s->n == KILN_TUNE_RECORDS_MAX) return 0;
    b = kiln_malloc(kn + vn + 1, 1);
    if (b == NULL) return 0;
    memcpy(b, key, kn);
    if (vn > 0) memcpy(b + kn, val, vn);
    if (at >= 0) {
        rec *r = &s->r[at];
        kiln_free(r->b, (size_t)r->kn + r->vn + 1);
        r->b = b;
        r->vn = (uint16_t)vn;
        return 1;
    }
    if (s->n == s->cap) {
        uint32_t cap = s->cap ? 2 * s->cap : 64;
        rec *r = kiln_malloc((size_t)cap * sizeof *r, sizeof(void *));
        if (r == NULL) {
            kiln_free(b, kn + vn + 1);
            return 0;
        }
        if (s->n > 0) memcpy(r, s->r, (size_t)s->n * sizeof *r);
        kiln_free(s->r, (size_t)s->cap * sizeof *s->r);
        s->r = r;
        s->cap = cap;
    }
    s->r[s->n].kn = (uint16_t)kn;
    s->r[s->n].vn = (uint16_t)vn;
    s->r[s->n].b = b;
    s->n++;
    return 1;
}

// Checks an image of a cache file (img[0..size)): NULL when its header, CRCs and every record
// check, else why not.
static const char *check_image(const unsigned char *img, uint64_t size, uint32_t *n_rec) {
    if (size < HEADER) return "shorter than its header";
    if (size > FILE_MAX) return "larger than 64 MiB";
    if (memcmp(img, MAGIC, 8) != 0) return "not a Kiln tuning cache (magic)";
    if (kiln_crc32(0, img, 28) != rd32(img + 28)) return "header CRC mismatch";
    if (rd32(img + 8) != FORMAT) return "another format version";
    const uint64_t body_n = rd64(img + 16);
    const unsigned char *body = img + HEADER;
    *n_rec = rd32(img + 12);
    if (body_n != size - HEADER) return "truncated or extended (body size)";
    if (*n_rec > KILN_TUNE_RECORDS_MAX) return "too many records";
    if (kiln_crc32(0, body, (size_t)body_n) != rd32(img + 24)) return "body CRC mismatch";
    uint64_t at = 0; // every record in bounds before any is taken
    for (uint32_t i = 0; i < *n_rec; i++) {
        if (body_n - at < 4) return "a record out of bounds";
        const uint32_t kn = body[at] | (uint32_t)body[at + 1] << 8;
        const uint32_t vn = body[at + 2] | (uint32_t)body[at + 3] << 8;
        if (kn == 0 || kn > KILN_TUNE_KEY_MAX || vn > KILN_TUNE_VALUE_MAX ||
            body_n - at - 4 < (uint64_t)kn + vn)
            return "a record out of bounds";
        at += 4 + (uint64_t)kn + vn;
    }
    return at != body_n ? "bytes after the last record" : NULL;
}

// The records of a checked image into s (those of s win with keep_ours); how many were taken.
static uint32_t take_image(store *s, const unsigned char *img, uint32_t n_rec, int keep_ours) {
    const unsigned char *body = img + HEADER;
    uint64_t at = 0;
    uint32_t taken = 0;
    for (uint32_t i = 0; i < n_rec; i++) {
        const uint32_t kn = body[at] | (uint32_t)body[at + 1] << 8;
        const uint32_t vn = body[at + 2] | (uint32_t)body[at + 3] << 8;
        const unsigned char *k = body + at + 4;
        if (!keep_ours || find(s, k, kn) < 0) taken += (uint32_t)put(s, k, kn, k + kn, vn);
        at += 4 + (uint64_t)kn + vn;
    }
    return taken;
}

// Reads and checks the file at path into s (records added; those of s win). Returns 1 when the
// file was read, 0 when it is absent, -1 when it was discarded (logged at INFO, naming why).
static int read_file(store *s, const char *path, int keep_ours) {
    unsigned char *img = NULL;
    const char *why = NULL;
    uint64_t size = 0;
    uint32_t n_rec = 0;
    struct stat st;
    int ok = -1;
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        if (errno == ENOENT) return 0;
        kiln_log(KILN_LOG_INFO, "tuning cache %s: cannot be read (%s): not used", path,
                 strerror(errno));
        return -1;
    }
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        why = "not a regular file";
        goto done;
    }
    size = (uint64_t)st.st_size;
    if (size < HEADER || size > FILE_MAX) {
        why = size < HEADER ? "shorter than its header" : "larger than 64 MiB";
        goto done;
    }
    img = kiln_malloc((size_t)size + 1, 1);
    if (img == NULL) {
        why = "out of memory";
        goto done;
    }
    if (fread(img, 1, (size_t)size, f) != size) {
        why = "truncated";
        goto done;
    }
    why = check_image(img, size, &n_rec);
    if (why != NULL) goto done;
    take_image(s, img, n_rec, keep_ours);
    ok = 1;
done:
    if (why != NULL) {
        kiln_log(KILN_LOG_INFO, "tuning cache %s: %s: discarded (rewritten on the next write)",
                 path, why);
    }
    if (img != NULL) kiln_free(img, (size_t)size + 1);
    fclose(f);
    return ok;
}

static store *get_store(const char *where) {
    char path[1100];
    store *free_slot = NULL;
    if (!kiln_tune_cache_path(where, path, sizeof path)) return NULL;
    for (int i = 0; i < MAX_STORES; i++) {
        if (stores[i].path[0] == '\0') {
            if (free_slot == NULL) free_slot = &stores[i];
            continue;
        }
        if (strcmp(stores[i].path, path) == 0) return &stores[i];
    }
    if (free_slot == NULL) return NULL; // more caches than a process needs: not cached
    memset(free_slot, 0, sizeof *free_slot);
    snprintf(free_slot->path, sizeof free_slot->path, "%s", path);
    return free_slot;
}

static void ensure_loaded(store *s) {
    if (s->loaded) return;
    s->loaded = 1;
    if (read_file(s, s->path, 1) > 0) {
        kiln_log(KILN_LOG_DEBUG, "tuning cache %s: %u records", s->path, (unsigned)s->n);
    }
}

int kiln_tune_cache_get(const char *where, const void *key, size_t kn, void *val, size_t cap,
                        size_t *vn) {
    int found = 0;
    if (key == NULL || kn == 0 || kn > KILN_TUNE_KEY_MAX) return 0;
    pthread_mutex_lock(&lock);
    store *s = get_store(where);
    if (s != NULL) ensure_loaded(s);
    for (int k = 0; k < 2 && !found; k++) { // the file's records, then the programs'
        const store *from = k == 0 ? s : &program;
        const long at = from != NULL ? find(from, key, kn) : -1;
        if (at >= 0 && from->r[at].vn <= cap) {
            if (from->r[at].vn > 0) memcpy(val, from->r[at].b + kn, from->r[at].vn);
            *vn = from->r[at].vn;
            found = 1;
        }
    }
    pthread_mutex_unlock(&lock);
    return found;
}

void kiln_tune_cache_stats(const char *where, const void *prefix, size_t prefix_nbytes,
                           uint32_t *n_records, uint32_t *n_prefix) {
    *n_records = *n_prefix = 0;
    pthread_mutex_lock(&lock);
    store *s = get_store(where);
    if (s != NULL) {
        ensure_loaded(s);
        *n_records = s->n;
        for (uint32_t i = 0; i < s->n; i++) {
            *n_prefix += s->r[i].kn >= prefix_nbytes &&
                         (prefix_nbytes == 0 || memcmp(s->r[i].b, prefix, prefix_nbytes) == 0);
        }
    }
    pthread_mutex_unlock(&lock);
}

void kiln_tune_cache_put(const char *where, const void *key, size_t kn, const void *val,
                         size_t vn) {
    if (key == NULL || kn == 0 || kn > KILN_TUNE_KEY_MAX || vn > KILN_TUNE_VALUE_MAX) return;
    pthread_mutex_lock(&lock);
    store *s = get_store(where);
    if (s != NULL) {
        ensure_loaded(s);
        if (put(s, key, kn, val, vn)) s->dirty = 1;
    }
    pthread_mutex_unlock(&lock);
}

// mkdir -p of path's directory (mode 0700: the cache is the user's).
static void make_parent(const char *path) {
    char dir[1100];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash == NULL || slash == dir) return;
    *slash = '\0';
    for (char *p = dir + 1; *p != '\0'; p++) {
        if (*p != '/') continue;
        *p = '\0';
        (void)mkdir(dir, 0700);
        *p = '/';
    }
    (void)mkdir(dir, 0700);
}

static int write_all(int fd, const unsigned char *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return 0;
        p += w;
        n -= (size_t)w;
    }
    return 1;
}

// Writes s to path through a temporary file and rename(2). 1 on success.
static int write_file(const store *s, const char *path, const char **why) {
    char tmp[1200];
    uint64_t body_n = 0;
    unsigned char head[HEADER];
    int fd, ok = 0;
    for (uint32_t i = 0; i < s->n; i++) body_n += 4 + (uint64_t)s->r[i].kn + s->r[i].vn;
    unsigned char *body = kiln_malloc((size_t)body_n + 1, 1);
    if (body == NULL) return *why = "out of memory", 0;
    uint64_t at = 0;
    for (uint32_t i = 0; i < s->n; i++) {
        const rec *r = &s->r[i];
        body[at] = (unsigned char)r->kn;
        body[at + 1] = (unsigned char)(r->kn >> 8);
        body[at + 2] = (unsigned char)r->vn;
        body[at + 3] = (unsigned char)(r->vn >> 8);
        memcpy(body + at + 4, r->b, (size_t)r->kn + r->vn);
        at += 4 + (uint64_t)r->kn + r->vn;
    }
    memcpy(head, MAGIC, 8);
    wr32(head + 8, FORMAT);
    wr32(head + 12, s->n);
    wr64(head + 16, body_n);
    wr32(head + 24, kiln_crc32(0, body, (size_t)body_n));
    wr32(head + 28, kiln_crc32(0, head, 28));
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%u", path, (long)getpid(), tmp_counter++);
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd < 0) {
        *why = strerror(errno);
    } else {
        ok = write_all(fd, head, HEADER) && write_all(fd, body, (size_t)body_n) && fsync(fd) == 0;
        if (!ok) *why = strerror(errno);
        if (close(fd) != 0 && ok) ok = 0, *why = strerror(errno);
        if (ok && rename(tmp, path) != 0) ok = 0, *why = strerror(errno);
        if (!ok) (void)unlink(tmp);
    }
    kiln_free(body, (size_t)body_n + 1);
    return ok;
}

void kiln_tune_cache_flush(const char *where) {
    char lock_path[1200];
    const char *why = "?";
    pthread_mutex_lock(&lock);
    store *s = get_store(where);
    if (s == NULL || !s->dirty) {
        pthread_mutex_unlock(&lock);
        return;
    }
    make_parent(s->path);
    snprintf(lock_path, sizeof lock_path, "%s.lock", s->path);
    int lfd = open(lock_path, O_RDWR | O_CREAT, 0600);
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    int locked = 0;
    if (lfd >= 0) {
        while (!(locked = fcntl(lfd, F_SETLKW, &fl) == 0) && errno == EINTR) {
        }
    }
    // what other processes wrote since this one read the file joins this process's copy
    (void)read_file(s, s->path, 1);
    if (write_file(s, s->path, &why)) {
        s->dirty = 0;
        kiln_log(KILN_LOG_DEBUG, "tuning cache %s: %u records written", s->path, (unsigned)s->n);
    } else {
        kiln_log(KILN_LOG_INFO,
                 "tuning cache %s: not written (%s): the choices are timed again "
                 "by the next process",
                 s->path, why);
    }
    if (locked) {
        fl.l_type = F_UNLCK;
        (void)fcntl(lfd, F_SETLK, &fl);
    }
    if (lfd >= 0) close(lfd);
    pthread_mutex_unlock(&lock);
}

void kiln_tune_cache_reset(void) {
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_STORES; i++) {
        recs_free(stores[i].r, stores[i].n, stores[i].cap);
        memset(&stores[i], 0, sizeof stores[i]);
    }
    recs_free(program.r, program.n, program.cap);
    memset(&program, 0, sizeof program);
    pthread_mutex_unlock(&lock);
}

const char *kiln_tune_cache_add_image(const void *data, size_t nbytes, uint32_t *n_added) {
    uint32_t n_rec = 0;
    *n_added = 0;
    if (data == NULL) return "no data";
    const char *why = check_image(data, nbytes, &n_rec);
    if (why != NULL) return why;
    pthread_mutex_lock(&lock);
    *n_added = take_image(&program, data, n_rec, 0);
    pthread_mutex_unlock(&lock);
    return NULL;
}
