// SPDX-License-Identifier: Apache-2.0
// KilnBackend: the ExecuTorch delegate. Translation only: ExecuTorch types <-> the Kiln C API
// (include/kiln/kiln.h), Kiln status -> ExecuTorch Error (one mapping), registration.
//
// Contract with the ahead-of-time side (python/kiln/executorch/backend.py): the delegate's
// processed bytes are one Kiln engine; delegate inputs are the engine's input bindings in order,
// delegate outputs its output bindings in order; external weights are named data (in the .pte or
// a .ptd) read through the NamedDataMap at init.
#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/backend/options.h>
#include <executorch/runtime/core/error.h>
#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/core/exec_aten/util/tensor_util.h>
#include <executorch/runtime/core/named_data_map.h>
#include <executorch/runtime/platform/log.h>

#include <algorithm>
#include <array>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "kiln/kiln_program.h"
#include "kiln_adapter_internal.h"

extern "C" {
#include "core/utf8.h"
}

#define KILN_ET_API extern "C" __attribute__((visibility("default")))

namespace {

using executorch::aten::ScalarType;
using executorch::aten::SizesType;
using executorch::aten::Tensor;
using executorch::runtime::ArrayRef;
using executorch::runtime::Backend;
using executorch::runtime::BackendExecutionContext;
using executorch::runtime::BackendInitContext;
using executorch::runtime::BackendInterface;
using executorch::runtime::BackendOption;
using executorch::runtime::BackendOptionContext;
using executorch::runtime::CompileSpec;
using executorch::runtime::DelegateHandle;
using executorch::runtime::Error;
using executorch::runtime::EValue;
using executorch::runtime::FreeableBuffer;
using executorch::runtime::NamedDataMap;
using executorch::runtime::Result;
using executorch::runtime::Span;

constexpr const char *kBackendName = "KilnBackend";

// One Kiln status -> one ExecuTorch error.
Error to_et_error(kiln_status st) {
    switch (st) {
    case KILN_OK: return Error::Ok;
    case KILN_ERR_INVALID_ARG: return Error::InvalidArgument;
    case KILN_ERR_NO_MEMORY: return Error::MemoryAllocationFailed;
    case KILN_ERR_NOT_ENGINE: return Error::InvalidProgram;
    case KILN_ERR_CORRUPT: return Error::InvalidProgram;
    case KILN_ERR_VERSION: return Error::DelegateInvalidCompatibility;
    case KILN_ERR_UNSUPPORTED: return Error::NotSupported;
    case KILN_ERR_SHAPE: return Error::InvalidArgument;
    case KILN_ERR_MISSING_DATA: return Error::InvalidExternalData;
    // No GPU (or no CUDA backend) where one was asked for: "not supported here", not a bug.
    case KILN_ERR_DEVICE: return Error::NotSupported;
    case KILN_ERR_IO: return Error::AccessFailed;
    case KILN_ERR_BUSY: return Error::InvalidState;
    case KILN_ERR_INVALID_STATE: return Error::InvalidState;
    case KILN_ERR_INTERNAL: return Error::Internal;
    default: return Error::Internal;
    }
}

bool to_kiln_dtype(ScalarType t, kiln_dtype *out) {
    switch (t) {
    case ScalarType::Float: *out = KILN_DTYPE_F32; return true;
    case ScalarType::Half: *out = KILN_DTYPE_F16; return true;
    case ScalarType::BFloat16: *out = KILN_DTYPE_BF16; return true;
    case ScalarType::Int: *out = KILN_DTYPE_I32; return true;
    case ScalarType::Long: *out = KILN_DTYPE_I64; return true;
    case ScalarType::Bool: *out = KILN_DTYPE_BOOL; return true;
    default: return false;
    }
}

// --- logging through ExecuTorch: ET_LOG formats into 256 bytes and cuts the rest (at any byte,
// which can split a UTF-8 character; ExecuTorch's Python log sink aborts the process on bytes
// that are not UTF-8). So every line handed to it is UTF-8 text (escaped here when it quotes
// strings from a file) and short enough; a long message becomes several lines.

constexpr size_t kLogChunk = 200; // + prefix: well below ExecuTorch's 256-byte line

// Kiln's level (KILN_LOG_LEVEL) already filtered the messages: debug ones go out at ExecuTorch's
// Info, since release builds of ExecuTorch compile its Debug level out, and warnings at its Error
// (it has no warning level), each named by a prefix.
void et_log_line(kiln_log_level level, const char *line) {
    switch (level) {
    case KILN_LOG_DEBUG: ET_LOG(Info, "(debug) %s", line); break;
    case KILN_LOG_INFO: ET_LOG(Info, "%s", line); break;
    case KILN_LOG_WARN: ET_LOG(Error, "(warning) %s", line); break;
    default: ET_LOG(Error, "%s", line); break;
    }
}

void log_text(kiln_log_level level, const char *prefix, const char *message) {
    char safe[8192];
    size_t n = kiln_utf8_escape(safe, sizeof safe, message, std::strlen(message), nullptr);
    size_t at = 0;
    bool first = true;
    do {
        // Cut at a character boundary: never before a UTF-8 continuation byte.
        size_t len = std::min(kLogChunk, n - at);
        while (at + len < n && len > 0 &&
               (static_cast<unsigned char>(safe[at + len]) & 0xC0) == 0x80)
            len--;
        char line[kLogChunk + 64];
        std::snprintf(line, sizeof line, "%s%s%.*s", prefix, first ? "" : "(cont.) ",
                      static_cast<int>(len), safe + at);
        et_log_line(level, line);
        at += len;
        first = false;
    } while (at < n);
}

// Kiln's log hook forwarded to ExecuTorch's log (installed lazily, never at static init).
// KilnBackend's own lines (engine ready, failures) are filtered by ExecuTorch's log level only.
void forward_log(void *, kiln_log_level level, const char *message) {
    if (level < KILN_LOG_ERROR && level < kiln_log_get_level()) return; // Kiln's log level
    log_text(level, "Kiln: ", message);
}

// --- the last failure of KilnBackend on this thread (ExecuTorch's error codes carry no text):
// read by the program API and, through kiln_executorch_last_error, by Python.

constexpr size_t kFailureNbytes = 8192;
thread_local kiln_status t_fail_status = KILN_OK;
thread_local char t_fail_message[kFailureNbytes];

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
Error record_failure(kiln_status st, const char *fmt, ...) {
    char raw[kFailureNbytes];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    kiln_utf8_escape(t_fail_message, sizeof t_fail_message, raw, std::strlen(raw), nullptr);
    t_fail_status = st;
    log_text(KILN_LOG_ERROR, "KilnBackend: ", t_fail_message);
    return to_et_error(st);
}

// A DEBUG line of KilnBackend's own, filtered by Kiln's log level (KILN_LOG_LEVEL) like Kiln's.
void log_debug(const std::string &message) {
    if (kiln_log_get_level() <= KILN_LOG_DEBUG) {
        log_text(KILN_LOG_DEBUG, "KilnBackend: ", message.c_str());
    }
}

std::once_flag g_log_once;
void install_log_hook() {
    std::call_once(g_log_once, [] { kiln_log_set(forward_log, nullptr, kiln_log_get_level()); });
}

struct KilnHandle;

// Engines with states (a model's mutable buffers: a KV cache) of one loaded program share them
// across methods: a `prefill` and a `decode` method update one cache, as the buffers of the
// exported module are one. A loaded program is known by its NamedDataMap (one per
// executorch::runtime::Program, so two loads of a file keep two caches). Each handle with
// states is listed under its program until destroyed; a new one shares the states of the first
// listed handle whose engine has states of the same names, dtypes and shapes.
struct StateRegistry {
    std::mutex mu;
    std::vector<std::pair<const void *, KilnHandle *>> entries;
};
StateRegistry &state_registry() {
    static StateRegistry r;
    return r;
}

struct KilnHandle {
    kiln_engine *engine = nullptr;
    kiln_context *context = nullptr;
    uint32_t n_inputs = 0;
    uint32_t n_outputs = 0;
    bool listed = false; // in state_registry()
    // Links with the other Kiln delegates of the method (null: none): kiln_links.cpp.
    std::unique_ptr<kiln_link::DelegateLinks> links;
    ~KilnHandle() {
        links.reset(); // unpublished and its memory freed while the engine lives
        if (listed) {
            StateRegistry &r = state_registry();
            std::lock_guard<std::mutex> lock(r.mu);
            r.entries.erase(std::remove_if(r.entries.begin(), r.entries.end(),
                                           [this](const std::pair<const void *, KilnHandle *> &e) {
                                               return e.second == this;
                                           }),
                            r.entries.end());
        }
        kiln_context_free(context);
        kiln_engine_free(engine);
    }
};

// Shares each state with the earliest earlier handle of the same program that has a state of
// its name (the handles are visited latest first, so an earlier one's sharing re-points last;
// an earlier handle's states already point where the earliest one's do), and lists this handle
// for later ones. A state no earlier method has stays this method's own. An earlier method with
// a state of the same name but another dtype or shape shares nothing with this one, with a
// warning naming the state: the two methods then see different values.
void share_program_states(KilnHandle *h, const void *program, const std::string &method) {
    if (program == nullptr || kiln_engine_n_states(h->engine) == 0) return;
    StateRegistry &r = state_registry();
    try {
        std::lock_guard<std::mutex> lock(r.mu);
        int shared_with = 0;
        for (auto it = r.entries.rbegin(); it != r.entries.rend(); ++it) {
            if (it->first != program) continue;
            const kiln_status st = kiln_context_share_states(h->context, it->second->context);
            if (st == KILN_OK) {
                shared_with++;
            } else if (st != KILN_ERR_INVALID_ARG) { // (INVALID_ARG: no state in common)
                char msg[768];
                std::snprintf(msg, sizeof msg,
                              "method '%s' shares no state with an earlier method of the "
                              "program: %s",
                              method.c_str(), kiln_last_error());
                log_text(KILN_LOG_WARN, "KilnBackend: ", msg);
            }
        }
        if (shared_with > 0) {
            char msg[256];
            std::snprintf(msg, sizeof msg,
                          "method '%s' shares states with %d earlier method%s of the program "
                          "(%u states; those no earlier method has are its own)",
                          method.c_str(), shared_with, shared_with == 1 ? "" : "s",
                          kiln_engine_n_states(h->engine));
            log_text(KILN_LOG_INFO, "KilnBackend: ", msg);
        }
        r.entries.emplace_back(program, h);
        h->listed = true;
    } catch (...) {
        // Out of memory listing the handle: it keeps its own states.
    }
}

// Tuning records the program carries (the compile spec kiln.tuning names a tuning cache image in
// its named data; the export option tuning_records stores one): added to the process once per
// key, before the engine loads, so that its context applies them instead of timing. Records that
// cannot be read or do not check are not used (an INFO line says why); never a failure.
void add_program_tuning(const NamedDataMap *map, ArrayRef<CompileSpec> specs,
                        const std::string &method) {
    static std::mutex mtx;
    static std::vector<std::string> added;
    for (size_t i = 0; i < specs.size(); i++) {
        if (specs[i].key == nullptr || std::strcmp(specs[i].key, "kiln.tuning") != 0) continue;
        if (specs[i].value.buffer == nullptr || specs[i].value.nbytes == 0) return;
        std::string key(static_cast<const char *>(specs[i].value.buffer), specs[i].value.nbytes);
        std::lock_guard<std::mutex> guard(mtx);
        if (std::find(added.begin(), added.end(), key) != added.end()) return;
        added.push_back(key);
        std::string why;
        if (map == nullptr) {
            why = "the program was loaded without its named data (.ptd)";
        } else {
            Result<FreeableBuffer> buf = map->get_data(key.c_str());
            if (!buf.ok()) {
                why = std::string("its named data has no key '") + key + "'";
            } else {
                uint32_t n = 0;
                if (kiln_add_tuning_records(buf->data(), buf->size(), &n) != KILN_OK) {
                    why = kiln_last_error();
                }
                buf->Free();
            }
        }
        if (!why.empty()) {
            std::string msg =
                "method '" + method + "': the program's tuning records are not used: " + why;
            log_text(KILN_LOG_INFO, "KilnBackend: ", msg.c_str());
        }
        return;
    }
}

// Reads the delegate's link record (compile spec kiln.link, written by the export for a method
// whose Kiln delegates pass tensors to each other) unless the engine was loaded with the option
// link_delegates off. A damaged record fails the init (a record of a newer Kiln is not used);
// without a record, or with the option off, every tensor goes through its host buffer.
Error setup_links(KilnHandle *h, ArrayRef<CompileSpec> specs, const std::string &method,
                  std::string *summary) {
    const CompileSpec *spec = nullptr;
    for (size_t i = 0; i < specs.size(); i++) {
        if (specs[i].key != nullptr && std::strcmp(specs[i].key, kiln_link::kSpecKey) == 0) {
            spec = &specs[i];
        }
    }
    if (spec == nullptr) return Error::Ok;
    char on[16] = "";
    if (kiln_engine_get_option(h->engine, "link_delegates", on, sizeof on) != KILN_OK ||
        std::strcmp(on, "true") != 0) {
        log_debug("method '" + method +
                  "': option link_delegates is off: this delegate's tensors pass through host "
                  "memory");
        return Error::Ok;
    }
    kiln_link::Record record;
    std::string why;
    switch (kiln_link::parse_record(spec->value.buffer, spec->value.nbytes, h->n_inputs,
                                    h->n_outputs, &record, &why)) {
    case kiln_link::Parse::kOk: break;
    case kiln_link::Parse::kNewer:
        log_text(KILN_LOG_INFO, "KilnBackend: ",
                 ("method '" + method + "': the delegate's link record is not used (" + why +
                  "): its tensors pass through host memory; upgrade Kiln's runtime to keep them "
                  "on the device")
                     .c_str());
        return Error::Ok;
    case kiln_link::Parse::kCorrupt:
        return record_failure(KILN_ERR_CORRUPT,
                              "method '%s': the link record of a Kiln delegate (compile spec "
                              "'%s', %zu bytes) is damaged: %s. Re-export the program, or set "
                              "the option link_delegates to false to run it with the tensors "
                              "between delegates passed through host memory",
                              method.c_str(), kiln_link::kSpecKey, spec->value.nbytes, why.c_str());
    }
    auto links =
        std::unique_ptr<kiln_link::DelegateLinks>(new (std::nothrow) kiln_link::DelegateLinks());
    if (links == nullptr) {
        return record_failure(KILN_ERR_NO_MEMORY, "method '%s': out of memory (KilnBackend links)",
                              method.c_str());
    }
    std::string notes;
    links->setup(h->engine, record, kiln_adapter_planned_limit(), &notes);
    if (!notes.empty()) {
        log_debug("method '" + method + "', delegate " + std::to_string(record.delegate) + ": " +
                  notes);
    }
    char text[160];
    std::snprintf(text, sizeof text,
                  "; link group %016llx, delegate %u: %zu outputs passed to other Kiln delegates "
                  "in its memory, %zu inputs read in theirs",
                  static_cast<unsigned long long>(record.group), record.delegate,
                  record.outputs.size(), record.inputs.size());
    *summary = text;
    if (links->has_outputs() || links->has_inputs()) h->links = std::move(links);
    return Error::Ok;
}

// Resolves external weight keys through the NamedDataMap; the buffers stay alive until
// kiln_engine_load returns (then they are freed: the engine has copied or uploaded them).
struct Resolver {
    const NamedDataMap *map = nullptr;
    std::vector<FreeableBuffer> held;
    std::string method;
    std::string detail; // why the first key failed, for the failure message

    // Called from C (kiln_engine_load): no exception may leave it.
    static kiln_status resolve(void *ud, const char *key, const void **out_data,
                               size_t *out_nbytes) noexcept {
        try {
            return resolve_impl(static_cast<Resolver *>(ud), key, out_data, out_nbytes);
        } catch (...) {
            return KILN_ERR_NO_MEMORY;
        }
    }

    static kiln_status resolve_impl(Resolver *self, const char *key, const void **out_data,
                                    size_t *out_nbytes) {
        if (self->map == nullptr) {
            if (self->detail.empty()) {
                self->detail = "the program has no named data at all: load it with its .ptd file "
                               "(e.g. Module(pte, ptd) or kiln.load(pte, data_path=ptd))";
            }
            return KILN_ERR_MISSING_DATA;
        }
        Result<FreeableBuffer> buf = self->map->get_data(key);
        if (!buf.ok()) {
            if (self->detail.empty()) {
                self->detail = std::string("ExecuTorch's named data has no key '") + key + "' (" +
                               executorch::runtime::to_string(buf.error()) +
                               "): load the program with the .ptd file it was exported with";
            }
            return KILN_ERR_MISSING_DATA;
        }
        self->held.push_back(std::move(buf.get()));
        *out_data = self->held.back().data();
        *out_nbytes = self->held.back().size();
        return KILN_OK;
    }
    ~Resolver() {
        for (auto &b : held) b.Free();
    }
};

// A failed Kiln call: its status name and Kiln's whole message, recorded and logged.
Error fail(kiln_status st, const char *what, const std::string &method,
           const std::string &extra = std::string()) {
    return record_failure(st, "%s failed (method '%s'): %s (%s): %s%s%s", what, method.c_str(),
                          kiln_status_name(st), kiln_status_str(st), kiln_last_error(),
                          extra.empty() ? "" : "; ", extra.c_str());
}

class KilnBackend final : public BackendInterface {
  public:
    bool is_available() const override;

    Result<DelegateHandle *> init(BackendInitContext &context, FreeableBuffer *processed,
                                  ArrayRef<CompileSpec> compile_specs) const override {
        ET_CHECK_OK_OR_RETURN_ERROR(check_registration());
        install_log_hook();
        std::string method = context.get_method_name() ? context.get_method_name() : "";
        add_program_tuning(context.get_named_data_map(), compile_specs, method);
        if (processed == nullptr || processed->data() == nullptr) {
            return record_failure(KILN_ERR_CORRUPT,
                                  "method '%s': the program gives KilnBackend no engine bytes "
                                  "(an empty delegate payload): re-export the program",
                                  method.c_str());
        }

        // Per-load options (Module::load with a LoadBackendOptionsMap for "KilnBackend").
        Span<const BackendOption> specs = context.runtime_specs();
        std::vector<kiln_option_setting> settings;
        settings.reserve(specs.size());
        for (size_t i = 0; i < specs.size(); i++) {
            kiln_option_setting s{};
            s.name = specs[i].key;
            if (auto *b = std::get_if<bool>(&specs[i].value)) {
                s.type = KILN_OPTION_BOOL;
                s.int_value = *b ? 1 : 0;
            } else if (auto *n = std::get_if<int>(&specs[i].value)) {
                s.type = KILN_OPTION_INT;
                s.int_value = *n;
            } else {
                s.type = KILN_OPTION_STRING;
                s.string_value =
                    std::get<std::array<char, executorch::runtime::kMaxOptionValueLength>>(
                        specs[i].value)
                        .data();
            }
            settings.push_back(s);
        }

        Resolver resolver;
        resolver.map = context.get_named_data_map();
        resolver.method = method;
        kiln_load_options opts;
        kiln_load_options_init(&opts);
        opts.resolve = &Resolver::resolve;
        opts.resolve_user_data = &resolver;
        opts.settings = settings.empty() ? nullptr : settings.data();
        opts.n_settings = static_cast<uint32_t>(settings.size());

        KilnHandle *handle = new (std::nothrow) KilnHandle();
        if (handle == nullptr) {
            return record_failure(KILN_ERR_NO_MEMORY,
                                  "method '%s': out of memory (KilnBackend "
                                  "handle)",
                                  method.c_str());
        }
        kiln_status st =
            kiln_engine_load(processed->data(), processed->size(), &opts, &handle->engine);
        if (st != KILN_OK) {
            delete handle;
            return fail(st, "loading the Kiln engine", method,
                        st == KILN_ERR_MISSING_DATA ? resolver.detail : std::string());
        }
        // The activation arena is sized by the engine: on the CPU it is host memory, bounded
        // like the program's own planned memory (a damaged size must not take the machine).
        uint64_t arena = kiln_engine_arena_nbytes(handle->engine);
        uint64_t limit = kiln_adapter_planned_limit();
        if (std::strcmp(kiln_engine_device(handle->engine), "cpu") == 0 && arena > limit) {
            delete handle;
            return record_failure(KILN_ERR_NO_MEMORY,
                                  "method '%s': the Kiln engine's activation arena needs %llu "
                                  "bytes, more than the %llu of kiln_program_set_planned_limit "
                                  "(default: this machine's physical memory): the engine is "
                                  "damaged, or too large for this machine; re-export it",
                                  method.c_str(), static_cast<unsigned long long>(arena),
                                  static_cast<unsigned long long>(limit));
        }
        st = kiln_context_new(handle->engine, &handle->context);
        if (st != KILN_OK) {
            delete handle;
            return fail(st, "creating the Kiln execution context", method);
        }
        handle->n_inputs = kiln_engine_n_inputs(handle->engine);
        handle->n_outputs = kiln_engine_n_outputs(handle->engine);
        std::string links;
        Error link_err = setup_links(handle, compile_specs, method, &links);
        if (link_err != Error::Ok) {
            delete handle;
            return link_err;
        }
        share_program_states(handle, context.get_named_data_map(), method);
        processed->Free(); // the engine holds its own copy of everything it needs
        char ready[512];
        std::snprintf(ready, sizeof ready,
                      "engine ready for method '%s' on %s (%u inputs, %u "
                      "outputs%s)",
                      method.c_str(), kiln_engine_device(handle->engine), handle->n_inputs,
                      handle->n_outputs, links.c_str());
        log_text(KILN_LOG_INFO, "KilnBackend: ", ready);
        return handle;
    }

    Error execute(BackendExecutionContext &context, DelegateHandle *opaque,
                  Span<EValue *> args) const override {
        std::string method = context.get_method_name() ? context.get_method_name() : "";
        auto *h = static_cast<KilnHandle *>(opaque);
        if (h == nullptr) {
            return record_failure(KILN_ERR_INVALID_STATE,
                                  "method '%s': no Kiln engine (the "
                                  "delegate's init did not succeed)",
                                  method.c_str());
        }
        if (args.size() != h->n_inputs + h->n_outputs) {
            return record_failure(KILN_ERR_INVALID_ARG,
                                  "method '%s': the engine takes %u inputs and %u outputs, the "
                                  "program passes %zu values: the program does not match its "
                                  "engine; re-export it",
                                  method.c_str(), h->n_inputs, h->n_outputs, args.size());
        }
        kiln_link::DelegateLinks *links = h->links.get();
        if (links != nullptr) links->begin_execute();
        for (uint32_t i = 0; i < h->n_inputs; i++) {
            if (!args[i]->isTensor()) {
                return record_failure(KILN_ERR_INVALID_ARG,
                                      "method '%s': Kiln input %u is not a tensor", method.c_str(),
                                      i);
            }
            const Tensor &t = args[i]->toTensor();
            kiln_binding_info info;
            kiln_engine_binding(h->engine, 1, i, &info);
            kiln_dtype dt;
            if (!to_kiln_dtype(t.scalar_type(), &dt) || dt != info.dtype) {
                return record_failure(KILN_ERR_SHAPE,
                                      "method '%s': Kiln input %u ('%s') has ExecuTorch scalar "
                                      "type %d, the engine expects %s",
                                      method.c_str(), i, info.name,
                                      static_cast<int>(t.scalar_type()),
                                      kiln_dtype_name(info.dtype));
            }
            int64_t dims[KILN_MAX_RANK];
            if (static_cast<size_t>(t.dim()) > KILN_MAX_RANK) {
                return record_failure(KILN_ERR_SHAPE,
                                      "method '%s': Kiln input %u ('%s') has rank %zd, above "
                                      "Kiln's maximum %d",
                                      method.c_str(), i, info.name, static_cast<ssize_t>(t.dim()),
                                      KILN_MAX_RANK);
            }
            for (ssize_t d = 0; d < t.dim(); d++) dims[d] = t.size(d);
            const void *data = t.const_data_ptr();
            if (links != nullptr) {
                std::string why;
                kiln_status st = links->input_memory(i, data, dt, static_cast<uint32_t>(t.dim()),
                                                     dims, &data, &why);
                if (st != KILN_OK) return fail(st, "copying a linked input to host memory", method);
                if (!why.empty()) log_debug("method '" + method + "': " + why);
            }
            kiln_status st =
                kiln_context_set_input(h->context, i, static_cast<uint32_t>(t.dim()), dims, data);
            if (st != KILN_OK) return fail(st, "binding an input", method);
        }
        kiln_status st = kiln_context_infer_shapes(h->context);
        if (st != KILN_OK) return fail(st, "inferring output shapes", method);
        for (uint32_t o = 0; o < h->n_outputs; o++) {
            EValue *ev = args[h->n_inputs + o];
            if (!ev->isTensor()) {
                return record_failure(KILN_ERR_INVALID_ARG,
                                      "method '%s': Kiln output %u is not a tensor", method.c_str(),
                                      o);
            }
            Tensor &t = ev->toTensor();
            uint32_t rank = 0;
            int64_t dims[KILN_MAX_RANK];
            kiln_context_output_shape(h->context, o, &rank, dims);
            std::array<SizesType, KILN_MAX_RANK> sizes{};
            for (uint32_t d = 0; d < rank; d++) sizes[d] = static_cast<SizesType>(dims[d]);
            // A 0-d ExecuTorch output is left as it is when Kiln reports the same one element.
            if (!(t.dim() == 0 && rank == 0)) {
                Error err =
                    executorch::runtime::resize_tensor(t, ArrayRef<SizesType>(sizes.data(), rank));
                if (err != Error::Ok) {
                    return record_failure(KILN_ERR_SHAPE,
                                          "method '%s': cannot resize output %u to the shape Kiln "
                                          "computed (rank %u): ExecuTorch error %s (0x%x); was the "
                                          "program exported with matching dynamic shapes?",
                                          method.c_str(), o, rank,
                                          executorch::runtime::to_string(err),
                                          static_cast<unsigned>(err));
                }
            }
            if (t.mutable_data_ptr() == nullptr && t.nbytes() != 0) {
                return record_failure(KILN_ERR_INVALID_STATE,
                                      "method '%s': output %u has no memory: supply it with "
                                      "set_output_data_ptr",
                                      method.c_str(), o);
            }
            size_t capacity = 0;
            void *memory = links != nullptr ? links->output_memory(o, &capacity) : nullptr;
            st = memory != nullptr
                     ? kiln_context_set_output(h->context, o, memory, capacity)
                     : kiln_context_set_output(h->context, o, t.mutable_data_ptr(), t.nbytes());
            if (st != KILN_OK) return fail(st, "binding an output", method);
        }
        st = kiln_context_execute(h->context);
        if (st != KILN_OK) return fail(st, "executing the engine", method);
        for (uint32_t o = 0; links != nullptr && o < h->n_outputs; o++) {
            size_t capacity = 0;
            if (links->output_memory(o, &capacity) == nullptr) continue;
            Tensor &t = args[h->n_inputs + o]->toTensor();
            kiln_binding_info info;
            uint32_t rank = 0;
            int64_t dims[KILN_MAX_RANK];
            kiln_engine_binding(h->engine, 0, o, &info);
            kiln_context_output_shape(h->context, o, &rank, dims);
            std::string why;
            st = links->publish(o, t.mutable_data_ptr(), t.nbytes(), info.dtype, rank, dims, &why);
            if (st != KILN_OK && !why.empty()) {
                return record_failure(st, "method '%s': %s", method.c_str(), why.c_str());
            }
            if (st != KILN_OK) return fail(st, "copying a linked output to host memory", method);
        }
        return Error::Ok;
    }

    Error set_option(BackendOptionContext &context,
                     const Span<BackendOption> &backend_options) override {
        (void)context;
        for (size_t i = 0; i < backend_options.size(); i++) {
            const BackendOption &o = backend_options[i];
            kiln_status st;
            if (auto *b = std::get_if<bool>(&o.value)) {
                st = kiln_set_option_bool(o.key, *b ? 1 : 0);
            } else if (auto *n = std::get_if<int>(&o.value)) {
                st = kiln_set_option_int(o.key, *n);
            } else {
                st = kiln_set_option_string(
                    o.key,
                    std::get<std::array<char, executorch::runtime::kMaxOptionValueLength>>(o.value)
                        .data());
            }
            if (st != KILN_OK) return fail(st, "setting an option", "");
        }
        return Error::Ok;
    }

    Error get_option(BackendOptionContext &context, Span<BackendOption> &backend_options) override {
        (void)context;
        for (size_t i = 0; i < backend_options.size(); i++) {
            BackendOption &o = backend_options[i];
            char buf[executorch::runtime::kMaxOptionValueLength];
            kiln_status st = kiln_get_option(o.key, buf, sizeof buf);
            if (st != KILN_OK) return fail(st, "reading an option", "");
            if (std::holds_alternative<bool>(o.value)) {
                o.value = std::strcmp(buf, "true") == 0;
            } else if (std::holds_alternative<int>(o.value)) {
                o.value = static_cast<int>(std::strtol(buf, nullptr, 10));
            } else {
                std::array<char, executorch::runtime::kMaxOptionValueLength> v{};
                std::memcpy(v.data(), buf, std::min(std::strlen(buf), v.size() - 1));
                o.value = v;
            }
        }
        return Error::Ok;
    }

    void destroy(DelegateHandle *opaque) const override {
        delete static_cast<KilnHandle *>(opaque);
    }

    static Error check_registration();
};

KilnBackend g_backend;
Backend g_backend_record{kBackendName, &g_backend};
// Static registration: the result is kept and checked at first use (no logging at static init).
Error g_registration = executorch::runtime::register_backend(g_backend_record);

Error KilnBackend::check_registration() {
    if (g_registration != Error::Ok) {
        record_failure(KILN_ERR_INVALID_STATE,
                       "KilnBackend registration failed (ExecuTorch error 0x%x): another library "
                       "registered 'KilnBackend' first, or ExecuTorch's backend table is full",
                       static_cast<unsigned>(g_registration));
    }
    return g_registration;
}

bool KilnBackend::is_available() const { return check_registration() == Error::Ok; }

} // namespace

// --- C entry points for the Python registration package (ctypes)

// ExecuTorch's error code from the static registration (0 = registered by this library).
KILN_ET_API uint32_t kiln_executorch_registration_error(void) {
    return static_cast<uint32_t>(g_registration);
}

// 1 when ExecuTorch's registry maps "KilnBackend" to this library's backend, else 0.
KILN_ET_API int kiln_executorch_owns_registration(void) {
    return executorch::runtime::get_backend_class(kBackendName) == &g_backend ? 1 : 0;
}

// The ExecuTorch version this library was built against.
KILN_ET_API const char *kiln_executorch_built_against(void) { return KILN_EXECUTORCH_VERSION; }

KILN_ET_API kiln_status kiln_executorch_last_status(void) { return t_fail_status; }

KILN_ET_API const char *kiln_executorch_last_error(void) {
    return t_fail_status == KILN_OK ? "" : t_fail_message;
}

KILN_ET_API void kiln_executorch_link_stats_get(kiln_executorch_link_stats *out) {
    if (out != nullptr) kiln_link::stats_get(out);
}

KILN_ET_API void kiln_executorch_link_stats_reset(void) { kiln_link::stats_reset(); }

KILN_ET_API void kiln_executorch_clear_error(void) {
    t_fail_status = KILN_OK;
    t_fail_message[0] = '\0';
}
