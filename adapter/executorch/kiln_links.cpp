// SPDX-License-Identifier: Apache-2.0
// Links between the Kiln delegates of one method (docs/runtime.md, "Between delegates"): a
// tensor that one Kiln delegate outputs and another Kiln delegate of the same method reads stays
// in memory the producing engine owns on its device (kiln_engine_alloc_memory), and the reader
// binds that memory as its input, instead of a copy to ExecuTorch's host buffer and back.
//
// The export records each such edge (compile spec "kiln.link", python/kiln/executorch/_links.py):
// the producer learns which outputs are linked, how many Kiln inputs read each and whether a
// reader outside Kiln (an ExecuTorch kernel, the method's outputs) needs the host buffer too;
// the reader learns which producer output each linked input is. Host pointers alone say nothing
// (ExecuTorch's memory plan gives one buffer to many values in turn); the record says which
// value an input is, and the registry below finds the producer of the same method instance:
//
//  - the producer publishes each linked output after a successful execute: its device memory,
//    the ExecuTorch buffer it stands for (the value's host pointer), dtype and shape; it clears
//    the publication when its next execute starts, so a publication is always the current run's
//    (within a method the producer runs before its readers, every run, on the calling thread);
//  - a reader finds the publication of (group, producer, output) whose host pointer is its own
//    input's: the same ExecuTorch value (two loaded instances of a program have distinct planned
//    buffers, so the pointer also tells the instances apart), checks dtype, shape and device,
//    and binds the device memory (or reads the host buffer, with the reason logged at DEBUG);
//  - the producer leaves the host buffer unwritten only for an output that no reader outside
//    Kiln needs and that every one of its Kiln readers took by link in the previous run; a
//    reader that finds the value but cannot take the link (another device) finds the host copy
//    missing and makes it from the producer's memory first (kiln_engine_copy_memory). So a
//    reader that falls back, a record turned off or lost on one side, or an option that differs
//    between delegates, costs copies, never a wrong value.
#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "kiln/kiln_engine.h"
#include "kiln/kiln_program.h"
#include "kiln_adapter_internal.h"

extern "C" {
#include "core/crc32.h"
}

namespace kiln_link {

// One linked output of a producer: its memory on the engine's device and its publication.
struct Slot {
    // Set when registered, then constant.
    uint64_t group = 0;
    uint32_t producer = 0;
    uint32_t output = 0;
    const kiln_engine *engine = nullptr; // the producer's: outlives the slot
    void *memory = nullptr;              // kiln_engine_alloc_memory, capacity bytes
    size_t capacity = 0;
    uint32_t n_readers = 0; // Kiln inputs that read this output (the record)
    bool host = false;      // a reader outside Kiln needs the ExecuTorch buffer (the record)
    // Guarded by the registry's mutex.
    const void *published = nullptr; // the ExecuTorch buffer of the current run; null: none
    kiln_dtype dtype = KILN_DTYPE_F32;
    uint32_t rank = 0;
    int64_t dims[KILN_MAX_RANK] = {};
    size_t nbytes = 0;
    uint64_t seq = 0;        // publication number (process-wide, increasing)
    bool host_valid = false; // the ExecuTorch buffer holds the publication's values
    uint32_t reads = 0;      // inputs that took the link for the current publication
    uint32_t prev_reads = 0; // ... for the previous one
};

namespace {

constexpr char kMagic[4] = {'K', 'L', 'N', 'K'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderNbytes = 32;
constexpr size_t kEntryNbytes = 16;
constexpr uint32_t kFlagHost = 1u;
constexpr uint32_t kMaxEntries = 1u << 16;

uint16_t rd16(const uint8_t *p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t rd32(const uint8_t *p) {
    return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
           (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}
uint64_t rd64(const uint8_t *p) {
    return static_cast<uint64_t>(rd32(p)) | (static_cast<uint64_t>(rd32(p + 4)) << 32);
}

std::string fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char *f, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, f);
    std::vsnprintf(buf, sizeof buf, f, ap);
    va_end(ap);
    return buf;
}

struct Registry {
    std::mutex mu;
    std::vector<Slot *> slots;
    uint64_t seq = 0;
};
Registry &registry() {
    static Registry r;
    return r;
}

struct Counters {
    std::atomic<uint64_t> inputs_linked{0}, inputs_host{0}, outputs_kept{0}, outputs_copied{0},
        outputs_materialized{0};
};
Counters &counters() {
    static Counters c;
    return c;
}

bool same_shape(const Slot &s, kiln_dtype dt, uint32_t rank, const int64_t *dims) {
    if (s.dtype != dt || s.rank != rank) return false;
    for (uint32_t d = 0; d < rank; d++) {
        if (s.dims[d] != dims[d]) return false;
    }
    return true;
}

} // namespace

Parse parse_record(const void *data, size_t nbytes, uint32_t n_inputs, uint32_t n_outputs,
                   Record *out, std::string *why) {
    const auto *p = static_cast<const uint8_t *>(data);
    if (p == nullptr || nbytes < kHeaderNbytes + 4) {
        *why = fmt("%zu bytes, shorter than the %zu of a record's header and CRC", nbytes,
                   kHeaderNbytes + 4);
        return Parse::kCorrupt;
    }
    if (std::memcmp(p, kMagic, 4) != 0) {
        *why = "it does not start with the magic 'KLNK'";
        return Parse::kCorrupt;
    }
    uint32_t version = rd16(p + 4);
    if (version > kVersion) {
        *why = fmt("record version %u, newer than this runtime's %u", version, kVersion);
        return Parse::kNewer;
    }
    if (version != kVersion || rd16(p + 6) != kHeaderNbytes) {
        *why = fmt("version %u with a header of %u bytes (expected version %u, %zu bytes)", version,
                   rd16(p + 6), kVersion, kHeaderNbytes);
        return Parse::kCorrupt;
    }
    uint32_t crc = rd32(p + nbytes - 4);
    uint32_t want = kiln_crc32(0, p, nbytes - 4);
    if (crc != want) {
        *why = fmt("CRC-32 0x%08x, computed 0x%08x", crc, want);
        return Parse::kCorrupt;
    }
    Record r;
    r.group = rd64(p + 8);
    r.delegate = rd32(p + 16);
    uint32_t n_out = rd32(p + 20), n_in = rd32(p + 24);
    if (n_out > kMaxEntries || n_in > kMaxEntries ||
        nbytes != kHeaderNbytes + (static_cast<size_t>(n_out) + n_in) * kEntryNbytes + 4) {
        *why = fmt("%u output and %u input entries do not fit its %zu bytes", n_out, n_in, nbytes);
        return Parse::kCorrupt;
    }
    if (rd32(p + 28) != 0) {
        *why = "a reserved header field is not zero";
        return Parse::kCorrupt;
    }
    const uint8_t *e = p + kHeaderNbytes;
    for (uint32_t k = 0; k < n_out; k++, e += kEntryNbytes) {
        OutputLink o{rd32(e), rd32(e + 4), (rd32(e + 8) & kFlagHost) != 0};
        if (o.output >= n_outputs) {
            *why = fmt("output entry %u names output %u; the engine has %u outputs", k, o.output,
                       n_outputs);
            return Parse::kCorrupt;
        }
        if (o.n_readers == 0 || (rd32(e + 8) & ~kFlagHost) != 0 || rd32(e + 12) != 0) {
            *why = fmt("output entry %u (output %u) has %s", k, o.output,
                       o.n_readers == 0                  ? "no readers"
                       : (rd32(e + 8) & ~kFlagHost) != 0 ? "unknown flags"
                                                         : "a reserved field that is not zero");
            return Parse::kCorrupt;
        }
        for (const OutputLink &q : r.outputs) {
            if (q.output == o.output) {
                *why = fmt("output %u is listed twice", o.output);
                return Parse::kCorrupt;
            }
        }
        r.outputs.push_back(o);
    }
    for (uint32_t k = 0; k < n_in; k++, e += kEntryNbytes) {
        InputLink i{rd32(e), rd32(e + 4), rd32(e + 8)};
        if (i.input >= n_inputs) {
            *why = fmt("input entry %u names input %u; the engine has %u inputs", k, i.input,
                       n_inputs);
            return Parse::kCorrupt;
        }
        // Ids follow the method's order of execution: a producer runs before its readers.
        if (i.producer >= r.delegate) {
            *why = fmt("input entry %u (input %u) reads delegate %u, which does not run before "
                       "this delegate (%u)",
                       k, i.input, i.producer, r.delegate);
            return Parse::kCorrupt;
        }
        if (rd32(e + 12) != 0) {
            *why =
                fmt("input entry %u (input %u) has a reserved field that is not zero", k, i.input);
            return Parse::kCorrupt;
        }
        for (const InputLink &q : r.inputs) {
            if (q.input == i.input) {
                *why = fmt("input %u is listed twice", i.input);
                return Parse::kCorrupt;
            }
        }
        r.inputs.push_back(i);
    }
    *out = std::move(r);
    return Parse::kOk;
}

DelegateLinks::~DelegateLinks() {
    if (!slots_.empty()) {
        Registry &r = registry();
        std::lock_guard<std::mutex> lock(r.mu);
        r.slots.erase(std::remove_if(r.slots.begin(), r.slots.end(),
                                     [this](Slot *s) {
                                         return std::find(slots_.begin(), slots_.end(), s) !=
                                                slots_.end();
                                     }),
                      r.slots.end());
    }
    // No reader can reach the slots now: their memory goes with them.
    for (Slot *s : slots_) {
        kiln_engine_free_memory(s->engine, s->memory, s->capacity);
        delete s;
    }
}

void DelegateLinks::setup(const kiln_engine *engine, const Record &record, uint64_t host_limit,
                          std::string *notes) {
    engine_ = engine;
    group_ = record.group;
    delegate_ = record.delegate;
    inputs_ = record.inputs;
    input_of_.assign(kiln_engine_n_inputs(engine), -1);
    for (size_t k = 0; k < inputs_.size(); k++) input_of_[inputs_[k].input] = static_cast<int>(k);
    input_noted_.assign(inputs_.size(), 0);
    slot_of_.assign(kiln_engine_n_outputs(engine), -1);
    const bool on_cpu = std::strcmp(kiln_engine_device(engine), "cpu") == 0;
    std::vector<Slot *> made;
    for (const OutputLink &o : record.outputs) {
        kiln_binding_info info;
        if (kiln_engine_binding(engine, 0, o.output, &info) != KILN_OK) continue;
        if (on_cpu && info.max_nbytes > host_limit) {
            *notes += fmt("output %u stays in host memory: its %" PRIu64 " bytes exceed the "
                          "planned-memory limit; ",
                          o.output, info.max_nbytes);
            continue;
        }
        auto *s = new (std::nothrow) Slot();
        void *mem = nullptr;
        if (s == nullptr || kiln_engine_alloc_memory(engine, static_cast<size_t>(info.max_nbytes),
                                                     &mem) != KILN_OK) {
            *notes += fmt("output %u stays in host memory: no memory for its %" PRIu64 " bytes "
                          "on %s (%s); ",
                          o.output, info.max_nbytes, kiln_engine_device(engine),
                          s == nullptr ? "out of host memory" : kiln_last_error());
            delete s;
            continue;
        }
        s->group = record.group;
        s->producer = record.delegate;
        s->output = o.output;
        s->engine = engine;
        s->memory = mem;
        s->capacity = static_cast<size_t>(info.max_nbytes);
        s->n_readers = o.n_readers;
        s->host = o.host;
        made.push_back(s);
    }
    if (!made.empty()) {
        Registry &r = registry();
        try {
            std::lock_guard<std::mutex> lock(r.mu);
            r.slots.insert(r.slots.end(), made.begin(), made.end());
        } catch (...) { // out of memory listing them: these outputs stay unlinked
            for (Slot *s : made) {
                kiln_engine_free_memory(engine, s->memory, s->capacity);
                delete s;
            }
            made.clear();
            *notes += "outputs stay in host memory: out of memory registering them; ";
        }
    }
    for (Slot *s : made) {
        slot_of_[s->output] = static_cast<int>(slots_.size());
        slots_.push_back(s);
    }
}

void DelegateLinks::begin_execute() {
    if (slots_.empty()) return;
    Registry &r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    for (Slot *s : slots_) {
        s->prev_reads = s->reads;
        s->reads = 0;
        s->published = nullptr;
        s->host_valid = false;
    }
}

void *DelegateLinks::output_memory(uint32_t output, size_t *capacity) const {
    if (output >= slot_of_.size() || slot_of_[output] < 0) return nullptr;
    const Slot *s = slots_[static_cast<size_t>(slot_of_[output])];
    *capacity = s->capacity;
    return s->memory;
}

kiln_status DelegateLinks::publish(uint32_t output, void *host, size_t host_nbytes,
                                   kiln_dtype dtype, uint32_t rank, const int64_t *dims,
                                   std::string *why) {
    if (output >= slot_of_.size() || slot_of_[output] < 0) return KILN_OK;
    Slot *s = slots_[static_cast<size_t>(slot_of_[output])];
    size_t nbytes = kiln_dtype_size(dtype);
    for (uint32_t d = 0; d < rank; d++) nbytes *= static_cast<size_t>(dims[d]);
    if (host == nullptr || host_nbytes != nbytes) {
        // Not a host buffer this output can stand for (ExecuTorch's tensor has another size than
        // the engine's output): written to it as without links, not published.
        if (nbytes > host_nbytes) {
            *why = fmt("output %u: ExecuTorch's tensor holds %zu bytes, the engine "
                       "wrote %zu (the program's dtype or shape differs from the engine's): "
                       "re-export the program",
                       output, host_nbytes, nbytes);
            return KILN_ERR_SHAPE;
        }
        counters().outputs_copied++;
        return nbytes > 0 ? kiln_engine_copy_memory(engine_, host, s->memory, nbytes) : KILN_OK;
    }
    // Only the producer writes prev_reads (in begin_execute, on this thread).
    const bool keep = !s->host && s->prev_reads >= s->n_readers;
    if (!keep && nbytes > 0) {
        kiln_status st = kiln_engine_copy_memory(engine_, host, s->memory, nbytes);
        if (st != KILN_OK) return st;
    }
    (keep ? counters().outputs_kept : counters().outputs_copied)++;
    Registry &r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    s->published = host;
    s->dtype = dtype;
    s->rank = rank;
    std::copy(dims, dims + rank, s->dims);
    s->nbytes = nbytes;
    s->seq = ++r.seq;
    s->host_valid = !keep || nbytes == 0;
    return KILN_OK;
}

kiln_status DelegateLinks::input_memory(uint32_t input, const void *host, kiln_dtype dtype,
                                        uint32_t rank, const int64_t *dims, const void **out,
                                        std::string *why) {
    *out = host;
    if (input >= input_of_.size() || input_of_[input] < 0) return KILN_OK;
    const size_t k = static_cast<size_t>(input_of_[input]);
    const InputLink &in = inputs_[k];
    std::string reason;
    kiln_status st = KILN_OK;
    if (host == nullptr) {
        reason = "the input has no ExecuTorch buffer (an empty tensor)";
    } else {
        Registry &r = registry();
        std::lock_guard<std::mutex> lock(r.mu);
        Slot *best = nullptr;
        for (Slot *s : r.slots) {
            if (s->group == group_ && s->producer == in.producer &&
                s->output == in.producer_output && s->published == host &&
                (best == nullptr || s->seq > best->seq)) {
                best = s;
            }
        }
        if (best == nullptr) {
            reason = fmt("delegate %u published no output %u for this buffer in this run (its "
                         "link record is missing, damaged or turned off, or its memory could not "
                         "be had)",
                         in.producer, in.producer_output);
        } else if (!same_shape(*best, dtype, rank, dims)) {
            // Not the value the record says (only a wrong record gets here): the host buffer is
            // this input's own, never written from the producer's memory.
            reason = fmt("delegate %u's output %u has another dtype or shape than this input",
                         in.producer, in.producer_output);
            best = nullptr;
        } else if (std::strcmp(kiln_engine_device(best->engine), kiln_engine_device(engine_)) !=
                   0) {
            reason = fmt("delegate %u runs on %s, this one on %s", in.producer,
                         kiln_engine_device(best->engine), kiln_engine_device(engine_));
        } else {
            *out = best->memory;
            best->reads++;
        }
        if (*out == host && best != nullptr && !best->host_valid) {
            // The same value, which the producer kept in its memory only (on another device than
            // this engine's): write its host buffer now.
            st = kiln_engine_copy_memory(best->engine, const_cast<void *>(host), best->memory,
                                         best->nbytes);
            if (st == KILN_OK) {
                best->host_valid = true;
                counters().outputs_materialized++;
            }
        }
    }
    if (*out == host) {
        counters().inputs_host++;
        if (!input_noted_[k]) {
            input_noted_[k] = 1;
            *why = fmt("input %u reads the host copy of delegate %u's output %u: %s", input,
                       in.producer, in.producer_output, reason.c_str());
        }
    } else {
        counters().inputs_linked++;
    }
    return st;
}

void stats_get(kiln_executorch_link_stats *out) {
    Counters &c = counters();
    out->inputs_linked = c.inputs_linked.load();
    out->inputs_host = c.inputs_host.load();
    out->outputs_kept = c.outputs_kept.load();
    out->outputs_copied = c.outputs_copied.load();
    out->outputs_materialized = c.outputs_materialized.load();
}

void stats_reset() {
    Counters &c = counters();
    c.inputs_linked = 0;
    c.inputs_host = 0;
    c.outputs_kept = 0;
    c.outputs_copied = 0;
    c.outputs_materialized = 0;
}

} // namespace kiln_link
