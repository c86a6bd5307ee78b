// SPDX-License-Identifier: Apache-2.0
// The Kiln program C API (include/kiln/kiln_program.h): ExecuTorch programs run from C through
// ExecuTorch's Module API, in libkiln_executorch.so beside the KilnBackend delegate.
//
// Every entry point catches everything (no exception crosses the C boundary), records failures
// in a thread-local message, and checks what ExecuTorch would otherwise abort on (device-planned
// memory without an allocator) before calling it.
#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor_ptr.h>
#include <executorch/runtime/backend/backend_options_map.h>
#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/backend/options.h>
#include <executorch/runtime/core/device_allocator.h>
#include <executorch/runtime/core/error.h>
#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/core/hierarchical_allocator.h>
#include <executorch/runtime/core/tag.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include <unistd.h>

#include "kiln/kiln.h"
#include "kiln/kiln_program.h"
#include "kiln_adapter_internal.h"

extern "C" {
#include "core/utf8.h"
}

namespace {

using executorch::aten::ScalarType;
using executorch::aten::SizesType;
using executorch::extension::Module;
using executorch::extension::TensorPtr;
using executorch::runtime::BackendOption;
using executorch::runtime::Error;
using executorch::runtime::EValue;
using executorch::runtime::HierarchicalAllocator;
using executorch::runtime::LoadBackendOptionsMap;
using executorch::runtime::MethodMeta;
using executorch::runtime::Program;
using executorch::runtime::Result;
using executorch::runtime::Tag;
using executorch::runtime::TensorInfo;
using executorch::runtime::etensor::Device;
using executorch::runtime::etensor::DeviceType;

constexpr const char *kBackendName = "KilnBackend";
constexpr size_t kErrorCapacity = 8192; // Kiln's whole message (4095) and the context around it

thread_local char t_error[kErrorCapacity];

// As UTF-8 text: a method name or a path may carry bytes that are not (escaped as \xNN).
void set_error_v(const char *fmt, va_list ap) {
    char raw[kErrorCapacity];
    std::vsnprintf(raw, sizeof raw, fmt, ap);
    kiln_utf8_escape(t_error, sizeof t_error, raw, std::strlen(raw), nullptr);
}

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
kiln_status
fail(kiln_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    set_error_v(fmt, ap);
    va_end(ap);
    return st;
}

void clear_error() { t_error[0] = '\0'; }

const char *et_error_name(Error e) { return executorch::runtime::to_string(e); }

// ExecuTorch errors with no more specific explanation -> Kiln status.
kiln_status from_et(Error e) {
    switch (e) {
    case Error::Ok: return KILN_OK;
    case Error::InvalidState: return KILN_ERR_INVALID_STATE;
    case Error::NotSupported:
    case Error::NotImplemented:
    case Error::OperatorMissing: return KILN_ERR_UNSUPPORTED;
    case Error::InvalidArgument:
    case Error::InvalidType: return KILN_ERR_INVALID_ARG;
    case Error::NotFound: return KILN_ERR_INVALID_ARG;
    case Error::MemoryAllocationFailed:
    case Error::DelegateMemoryAllocationFailed:
    case Error::OutOfResources: return KILN_ERR_NO_MEMORY;
    case Error::AccessFailed: return KILN_ERR_IO;
    case Error::InvalidProgram: return KILN_ERR_CORRUPT;
    case Error::InvalidExternalData: return KILN_ERR_MISSING_DATA;
    case Error::DelegateInvalidCompatibility: return KILN_ERR_VERSION;
    default: return KILN_ERR_INTERNAL;
    }
}

// The cause of a failure inside the delegate, which runs on the calling thread: the failure it
// recorded (its Kiln status and whole message: kiln_executorch_last_error), else Kiln's last
// message; as ": KilnBackend: ..." or "".
std::string kiln_detail() {
    if (kiln_executorch_last_status() != KILN_OK) {
        return std::string(": KilnBackend: ") + kiln_executorch_last_error();
    }
    const char *msg = kiln_last_error();
    if (msg == nullptr || msg[0] == '\0') return std::string();
    return std::string(": Kiln: ") + msg;
}

// The status of a failure ExecuTorch reported as `e`: the delegate's own when it recorded one
// (a corrupt engine stays KILN_ERR_CORRUPT, a missing GPU KILN_ERR_DEVICE), else the mapping.
kiln_status status_of(Error e) {
    kiln_status st = kiln_executorch_last_status();
    return st != KILN_OK ? st : from_et(e);
}

bool to_scalar_type(kiln_dtype dt, ScalarType *out) {
    switch (dt) {
    case KILN_DTYPE_F32: *out = ScalarType::Float; return true;
    case KILN_DTYPE_F16: *out = ScalarType::Half; return true;
    case KILN_DTYPE_BF16: *out = ScalarType::BFloat16; return true;
    case KILN_DTYPE_I32: *out = ScalarType::Int; return true;
    case KILN_DTYPE_I64: *out = ScalarType::Long; return true;
    case KILN_DTYPE_BOOL: *out = ScalarType::Bool; return true;
    default: return false;
    }
}

kiln_dtype from_scalar_type(ScalarType t) {
    switch (t) {
    case ScalarType::Float: return KILN_DTYPE_F32;
    case ScalarType::Half: return KILN_DTYPE_F16;
    case ScalarType::BFloat16: return KILN_DTYPE_BF16;
    case ScalarType::Int: return KILN_DTYPE_I32;
    case ScalarType::Long: return KILN_DTYPE_I64;
    case ScalarType::Bool: return KILN_DTYPE_BOOL;
    default: return KILN_DTYPE_INVALID;
    }
}

std::string scalar_type_name(ScalarType t) {
    kiln_dtype dt = from_scalar_type(t);
    if (dt != KILN_DTYPE_INVALID) return kiln_dtype_name(dt);
    return "ExecuTorch scalar type " + std::to_string(static_cast<int>(t));
}

const char *tag_name(Tag t) {
    switch (t) {
    case Tag::None: return "None";
    case Tag::Tensor: return "Tensor";
    case Tag::String: return "String";
    case Tag::Double: return "Double";
    case Tag::Int: return "Int";
    case Tag::Bool: return "Bool";
    case Tag::ListBool: return "ListBool";
    case Tag::ListDouble: return "ListDouble";
    case Tag::ListInt: return "ListInt";
    case Tag::ListTensor: return "ListTensor";
    case Tag::ListScalar: return "ListScalar";
    case Tag::ListOptionalTensor: return "ListOptionalTensor";
    default: return "Unknown";
    }
}

template <typename Dims> std::string shape_str(const Dims &dims, size_t rank) {
    std::string s = "[";
    for (size_t i = 0; i < rank; i++) {
        if (i) s += ", ";
        s += std::to_string(static_cast<long long>(dims[i]));
    }
    return s + "]";
}

std::string registered_backends() {
    std::string s;
    size_t n = executorch::runtime::get_num_registered_backends();
    for (size_t i = 0; i < n; i++) {
        Result<const char *> name = executorch::runtime::get_backend_name(i);
        if (!name.ok()) continue;
        if (!s.empty()) s += ", ";
        s += name.get();
    }
    return s.empty() ? std::string("none") : s;
}

struct MethodState {
    std::string name;
    bool loaded = false;
    bool executed = false;
    std::vector<uint8_t> input_is_tensor;
    std::vector<uint8_t> input_planned;
    std::vector<uint8_t> input_set;
    std::vector<uint8_t> output_is_tensor;
    std::vector<uint8_t> output_planned;
    std::vector<uint8_t> output_bound;
    std::vector<uint8_t> output_memory;    // kiln_memory of the caller's buffer per output
    std::vector<TensorPtr> input_tensors;  // the caller's data, wrapped (kept until re-bound)
    std::vector<TensorPtr> output_tensors; // caller output buffers, wrapped
    std::vector<EValue> outputs;           // of the last successful execute
    // A program exported with share_mutable_buffers: the method's planned memory, its own
    // buffers but the second (mem_id 2), which is the program's shared_state (plan_shared).
    std::vector<std::vector<uint8_t>> planned;
    std::vector<executorch::runtime::Span<uint8_t>> spans;
    std::unique_ptr<HierarchicalAllocator> hier;
};

} // namespace

struct kiln_program {
    // A shared program (kiln_program_share) keeps the Module that loaded it alive: ExecuTorch's
    // Program reads through that Module's data loader. Declared first, destroyed last.
    std::shared_ptr<Module> origin;
    std::shared_ptr<Module> module;
    bool lazy = false;
    std::string path;
    std::vector<std::string> data_paths;
    std::vector<MethodState> methods; // the program's order
    std::vector<BackendOption> settings;
    // ExecuTorch's shared mutable-buffer arena (mem_id 2: buffers several methods update that
    // stay outside the delegates), one per loaded program, sized for its largest method.
    std::vector<uint8_t> shared_state;
    bool shared_state_sized = false;
    std::atomic<bool> busy{false};
};

namespace {

// Claims a program for one mutating call (KILN_ERR_BUSY when another thread holds it).
class Claim {
  public:
    explicit Claim(kiln_program *p) : p_(p) {
        bool expected = false;
        ok_ = p_->busy.compare_exchange_strong(expected, true, std::memory_order_acquire);
    }
    ~Claim() {
        if (ok_) p_->busy.store(false, std::memory_order_release);
    }
    Claim(const Claim &) = delete;
    Claim &operator=(const Claim &) = delete;
    bool ok() const { return ok_; }

  private:
    kiln_program *p_;
    bool ok_ = false;
};

kiln_status busy_error(const kiln_program *p) {
    return fail(KILN_ERR_BUSY,
                "the program '%s' is in use by another thread: a kiln_program is single-owner "
                "(use one program per thread, or serialize the calls)",
                p->path.c_str());
}

std::string method_list(const kiln_program *p) {
    std::string s;
    for (const MethodState &m : p->methods) {
        if (!s.empty()) s += ", ";
        s += "'" + m.name + "'";
    }
    return s.empty() ? std::string("none") : s;
}

kiln_status find_method(const kiln_program *p, const char *method, size_t *out) {
    const char *name = method != nullptr ? method : "forward";
    for (size_t i = 0; i < p->methods.size(); i++) {
        if (p->methods[i].name == name) {
            *out = i;
            return KILN_OK;
        }
    }
    return fail(KILN_ERR_INVALID_ARG, "the program '%s' has no method '%s'; its methods: %s",
                p->path.c_str(), name, method_list(p).c_str());
}

// Finds a method and reads its metadata (the common start of the metadata queries).
kiln_status method_meta_of(const kiln_program *p, const char *method,
                           std::optional<MethodMeta> *out) {
    size_t mi;
    kiln_status st = find_method(p, method, &mi);
    if (st != KILN_OK) return st;
    Result<MethodMeta> meta = p->module->program()->method_meta(p->methods[mi].name.c_str());
    if (!meta.ok()) {
        return fail(from_et(meta.error()), "the metadata of method '%s' is unreadable",
                    p->methods[mi].name.c_str());
    }
    out->emplace(meta.get());
    return KILN_OK;
}

kiln_status method_meta(const kiln_program *p, const MethodState &m,
                        std::optional<MethodMeta> *out) {
    Result<MethodMeta> meta = p->module->program()->method_meta(m.name.c_str());
    if (!meta.ok()) {
        return fail(from_et(meta.error()), "reading the metadata of method '%s' failed: %s (0x%x)",
                    m.name.c_str(), et_error_name(meta.error()),
                    static_cast<unsigned>(meta.error()));
    }
    out->emplace(meta.get());
    return KILN_OK;
}

// kiln_program_set_planned_limit's value, or the physical memory when it is 0.
std::atomic<uint64_t> g_planned_limit{0};

} // namespace

uint64_t kiln_adapter_planned_limit() {
    uint64_t v = g_planned_limit.load(std::memory_order_relaxed);
    if (v != 0) return v;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0) return UINT64_MAX;
    return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
}

namespace {

uint64_t planned_limit() { return kiln_adapter_planned_limit(); }

// Before Module::load_method: the checks ExecuTorch would otherwise answer with an abort or
// an unexplained error code.
kiln_status precheck_method(const kiln_program *p, const MethodState &m, const MethodMeta &meta) {
    for (size_t i = 0; i < meta.num_backends(); i++) {
        Result<const char *> name = meta.get_backend_name(i);
        if (!name.ok()) continue;
        if (executorch::runtime::get_backend_class(name.get()) == nullptr) {
            return fail(KILN_ERR_UNSUPPORTED,
                        "method '%s' of '%s' delegates to '%s', which is not registered in this "
                        "process (registered: %s): link the library that provides it (for Kiln: "
                        "kiln::executorch_backend, which links libkiln_executorch.so with "
                        "--no-as-needed)",
                        m.name.c_str(), p->path.c_str(), name.get(), registered_backends().c_str());
        }
    }
    // ExecuTorch allocates (and zeroes) the planned buffers the file asks for when the method
    // loads: a damaged size must not take the machine's memory (or the process).
    uint64_t planned = 0;
    for (size_t i = 0; i < meta.num_memory_planned_buffers(); i++) {
        Result<int64_t> size = meta.memory_planned_buffer_size(i);
        if (!size.ok() || size.get() < 0) {
            return fail(KILN_ERR_CORRUPT,
                        "method '%s' of '%s': the size of planned buffer %zu is unreadable or "
                        "negative: the program is damaged; re-export it",
                        m.name.c_str(), p->path.c_str(), i);
        }
        uint64_t sz = static_cast<uint64_t>(size.get());
        uint64_t limit = planned_limit();
        if (sz > UINT64_MAX - planned || planned + sz > limit) {
            return fail(KILN_ERR_NO_MEMORY,
                        "method '%s' of '%s' plans more than %llu bytes of memory (buffer %zu "
                        "alone: %llu bytes), the limit of kiln_program_set_planned_limit "
                        "(default: this machine's physical memory): the program is damaged, or "
                        "too large for this machine; re-export it, or raise the limit",
                        m.name.c_str(), p->path.c_str(), static_cast<unsigned long long>(limit), i,
                        static_cast<unsigned long long>(sz));
        }
        planned += sz;
    }
    for (size_t i = 0; i < meta.num_memory_planned_buffers(); i++) {
        Result<Device> dev = meta.memory_planned_buffer_device(i);
        if (!dev.ok() || dev.get().type() == DeviceType::CPU) continue;
        if (executorch::runtime::get_device_allocator(dev.get().type()) == nullptr) {
            Result<int64_t> size = meta.memory_planned_buffer_size(i);
            return fail(KILN_ERR_UNSUPPORTED,
                        "method '%s' of '%s' plans %lld bytes of CUDA memory (buffer %zu) but no "
                        "CUDA DeviceAllocator is registered in this process (the executorch CPU "
                        "wheel has none): export without target_device (Kiln moves data to the "
                        "GPU itself), or run with an ExecuTorch CUDA runtime",
                        m.name.c_str(), p->path.c_str(),
                        static_cast<long long>(size.ok() ? size.get() : -1), i);
        }
    }
    return KILN_OK;
}

kiln_status explain_load_failure(const kiln_program *p, const MethodState &m, Error e) {
    std::string detail = kiln_detail();
    kiln_status delegate_st = kiln_executorch_last_status();
    if (delegate_st != KILN_OK && delegate_st != KILN_ERR_MISSING_DATA) {
        std::string files = "'" + p->path + "'";
        for (const std::string &d : p->data_paths) files += ", '" + d + "'";
        return fail(delegate_st,
                    "loading method '%s' of '%s' failed (ExecuTorch error %s, 0x%x)%s [files: %s]",
                    m.name.c_str(), p->path.c_str(), et_error_name(e), static_cast<unsigned>(e),
                    detail.c_str(), files.c_str());
    }
    if (e == Error::InvalidExternalData || (e == Error::NotFound && p->data_paths.empty())) {
        if (p->data_paths.empty()) {
            return fail(KILN_ERR_MISSING_DATA,
                        "loading method '%s' of '%s' failed (%s): it needs external weights (a "
                        ".ptd file) and none was given: pass the .ptd written with this program "
                        "in kiln_program_options.data_paths%s",
                        m.name.c_str(), p->path.c_str(), et_error_name(e), detail.c_str());
        }
        std::string given;
        for (const std::string &d : p->data_paths) given += (given.empty() ? "'" : ", '") + d + "'";
        return fail(KILN_ERR_MISSING_DATA,
                    "loading method '%s' of '%s' failed (%s): its external weights are not in "
                    "the .ptd file(s) given (%s): pass the .ptd written together with this "
                    "program%s",
                    m.name.c_str(), p->path.c_str(), et_error_name(e), given.c_str(),
                    detail.c_str());
    }
    if (e == Error::OperatorMissing) {
        return fail(KILN_ERR_UNSUPPORTED,
                    "loading method '%s' of '%s' failed: an operator outside the delegates has "
                    "no kernel in this process (ExecuTorch logs 'Missing operator'): link "
                    "executorch::kernels_optimized into the application",
                    m.name.c_str(), p->path.c_str());
    }
    return fail(status_of(e), "loading method '%s' of '%s' failed: ExecuTorch error %s (0x%x)%s",
                m.name.c_str(), p->path.c_str(), et_error_name(e), static_cast<unsigned>(e),
                detail.empty() ? ": see the ExecuTorch log above" : detail.c_str());
}

// A method with two or more planned buffers, all in host memory, was exported with
// share_mutable_buffers (mem_id 2, planned buffer 1, holds the state its methods share;
// ExecuTorch's Module would give each method its own, unless every arena is shared, outputs
// included): its planned memory is its own but for that buffer, which is the program's
// shared_state, sized once for the largest method. (A method with buffers on an accelerator keeps
// ExecuTorch's own arenas, as ExecuTorch's runtime does.)
kiln_status plan_shared(kiln_program *p, MethodState &m, const MethodMeta &meta) {
    if (!p->shared_state_sized) {
        int64_t largest = 0;
        for (MethodState &q : p->methods) {
            std::optional<MethodMeta> qm;
            kiln_status st = method_meta(p, q, &qm);
            if (st != KILN_OK) return st;
            if (qm->num_memory_planned_buffers() < 2) continue;
            Result<int64_t> size = qm->memory_planned_buffer_size(1);
            if (size.ok() && size.get() > largest) largest = size.get();
        }
        uint64_t limit = planned_limit();
        if (static_cast<uint64_t>(largest) > limit) {
            return fail(KILN_ERR_NO_MEMORY,
                        "'%s' plans %lld bytes of state shared between its methods, over the "
                        "limit of kiln_program_set_planned_limit (%llu bytes): the program is "
                        "damaged, or too large for this machine; re-export it, or raise the limit",
                        p->path.c_str(), static_cast<long long>(largest),
                        static_cast<unsigned long long>(limit));
        }
        p->shared_state.assign(static_cast<size_t>(largest), 0);
        p->shared_state_sized = true;
    }
    const size_t n = meta.num_memory_planned_buffers();
    m.planned.assign(n, {});
    m.spans.clear();
    for (size_t i = 0; i < n; i++) {
        Result<int64_t> size = meta.memory_planned_buffer_size(i); // checked by precheck_method
        const size_t sz = size.ok() ? static_cast<size_t>(size.get()) : 0;
        if (i == 1) {
            m.spans.emplace_back(p->shared_state.data(), sz); // sz <= the largest method's
        } else {
            m.planned[i].assign(sz, 0);
            m.spans.emplace_back(m.planned[i].data(), sz);
        }
    }
    m.hier = std::make_unique<HierarchicalAllocator>(
        executorch::runtime::Span<executorch::runtime::Span<uint8_t>>(m.spans.data(),
                                                                      m.spans.size()));
    return KILN_OK;
}

kiln_status ensure_loaded(kiln_program *p, MethodState &m) {
    if (m.loaded) return KILN_OK;
    std::optional<MethodMeta> opt;
    kiln_status st = method_meta(p, m, &opt);
    if (st != KILN_OK) return st;
    const MethodMeta &meta = *opt;
    st = precheck_method(p, m, meta);
    if (st != KILN_OK) return st;
    kiln_clear_error();
    kiln_executorch_clear_error();
    bool host_planned = true; // buffers placed on an accelerator: ExecuTorch's own arenas
    for (size_t i = 0; i < meta.num_memory_planned_buffers(); i++) {
        Result<Device> dev = meta.memory_planned_buffer_device(i);
        if (!dev.ok() || dev.get().type() != DeviceType::CPU) host_planned = false;
    }
    if (meta.num_memory_planned_buffers() >= 2 && host_planned) {
        st = plan_shared(p, m, meta);
        if (st != KILN_OK) return st;
    }
    Error e = p->module->load_method(m.name, m.hier.get());
    if (e != Error::Ok) return explain_load_failure(p, m, e);

    size_t n_in = meta.num_inputs(), n_out = meta.num_outputs();
    m.input_is_tensor.assign(n_in, 0);
    m.input_planned.assign(n_in, 0);
    m.input_set.assign(n_in, 0);
    m.input_tensors.assign(n_in, nullptr);
    m.output_is_tensor.assign(n_out, 0);
    m.output_planned.assign(n_out, 0);
    m.output_bound.assign(n_out, 0);
    m.output_memory.assign(n_out, KILN_MEMORY_HOST);
    m.output_tensors.assign(n_out, nullptr);
    for (size_t i = 0; i < n_in; i++) {
        Result<Tag> tag = meta.input_tag(i);
        if (!tag.ok() || tag.get() != Tag::Tensor) continue;
        m.input_is_tensor[i] = 1;
        Result<TensorInfo> info = meta.input_tensor_meta(i);
        m.input_planned[i] = info.ok() && info.get().is_memory_planned() ? 1 : 0;
    }
    for (size_t i = 0; i < n_out; i++) {
        Result<Tag> tag = meta.output_tag(i);
        if (!tag.ok() || tag.get() != Tag::Tensor) continue;
        m.output_is_tensor[i] = 1;
        Result<TensorInfo> info = meta.output_tensor_meta(i);
        m.output_planned[i] = info.ok() && info.get().is_memory_planned() ? 1 : 0;
    }
    m.loaded = true;
    return KILN_OK;
}

kiln_status fill_info(const MethodMeta &meta, bool is_input, uint32_t index,
                      kiln_tensor_info *out) {
    size_t n = is_input ? meta.num_inputs() : meta.num_outputs();
    const char *what = is_input ? "input" : "output";
    if (index >= n) {
        return fail(KILN_ERR_INVALID_ARG, "method '%s' has %zu %ss; %s index %u is out of range",
                    meta.name(), n, what, what, index);
    }
    kiln_tensor_info info;
    std::memset(&info, 0, sizeof info);
    Result<Tag> tag = is_input ? meta.input_tag(index) : meta.output_tag(index);
    if (!tag.ok()) {
        return fail(KILN_ERR_CORRUPT, "method '%s': the tag of %s %u is unreadable (%s)",
                    meta.name(), what, index, et_error_name(tag.error()));
    }
    if (tag.get() == Tag::Tensor) {
        Result<TensorInfo> ti =
            is_input ? meta.input_tensor_meta(index) : meta.output_tensor_meta(index);
        if (!ti.ok()) {
            return fail(KILN_ERR_CORRUPT, "method '%s': the metadata of %s %u is unreadable (%s)",
                        meta.name(), what, index, et_error_name(ti.error()));
        }
        const TensorInfo &t = ti.get();
        if (t.sizes().size() > KILN_MAX_RANK) {
            return fail(KILN_ERR_UNSUPPORTED, "method '%s': %s %u has rank %zu (at most %d here)",
                        meta.name(), what, index, t.sizes().size(), KILN_MAX_RANK);
        }
        info.is_tensor = 1;
        info.scalar_type = static_cast<int32_t>(t.scalar_type());
        info.dtype = from_scalar_type(t.scalar_type());
        info.rank = static_cast<uint32_t>(t.sizes().size());
        for (size_t d = 0; d < t.sizes().size(); d++) info.dims[d] = t.sizes()[d];
        info.nbytes = t.nbytes();
        info.memory_planned = t.is_memory_planned() ? 1 : 0;
    }
    *out = info;
    return KILN_OK;
}

kiln_status info_common(const kiln_program *p, const char *method, bool is_input, uint32_t index,
                        kiln_tensor_info *out) {
    if (p == nullptr || out == nullptr) {
        return fail(KILN_ERR_INVALID_ARG, "kiln_program_%s_info: program or out is NULL",
                    is_input ? "input" : "output");
    }
    size_t mi;
    kiln_status st = find_method(p, method, &mi);
    if (st != KILN_OK) return st;
    std::optional<MethodMeta> meta;
    st = method_meta(p, p->methods[mi], &meta);
    if (st != KILN_OK) return st;
    return fill_info(*meta, is_input, index, out);
}

// Settings for KilnBackend at load: validated against Kiln's option table (name, type, scope)
// so a typo fails here even for a program without Kiln engines.
kiln_status convert_settings(const kiln_option_setting *settings, uint32_t n,
                             std::vector<BackendOption> *out) {
    if (n > 0 && settings == nullptr) {
        return fail(KILN_ERR_INVALID_ARG, "kiln_program_options: %u settings but settings is NULL",
                    n);
    }
    std::string valid;
    for (uint32_t k = 0; k < kiln_option_count(); k++) {
        const char *name, *def, *scope;
        kiln_option_type type;
        if (kiln_option_info(k, &name, &type, &def, &scope) != KILN_OK) continue;
        if (std::strcmp(scope, "process") == 0) continue;
        valid += (valid.empty() ? "" : ", ") + std::string(name);
    }
    out->clear();
    out->reserve(n);
    for (uint32_t i = 0; i < n; i++) {
        const kiln_option_setting &s = settings[i];
        if (s.name == nullptr) {
            return fail(KILN_ERR_INVALID_ARG, "kiln_program_options.settings[%u].name is NULL", i);
        }
        const char *name = nullptr, *def = nullptr, *scope = nullptr;
        kiln_option_type type = KILN_OPTION_BOOL;
        bool found = false;
        for (uint32_t k = 0; k < kiln_option_count() && !found; k++) {
            if (kiln_option_info(k, &name, &type, &def, &scope) == KILN_OK &&
                std::strcmp(name, s.name) == 0)
                found = true;
        }
        if (!found) {
            return fail(KILN_ERR_INVALID_ARG,
                        "unknown Kiln option '%s' in kiln_program_options.settings[%u]; options "
                        "that can be set per load: %s",
                        s.name, i, valid.c_str());
        }
        if (std::strcmp(scope, "process") == 0) {
            return fail(KILN_ERR_INVALID_ARG,
                        "option '%s' is process-wide; set it with kiln_set_option_* (kiln.h) "
                        "instead of per load",
                        s.name);
        }
        if (s.type != type) {
            static const char *names[] = {"?", "bool", "int", "string"};
            int given = (s.type >= KILN_OPTION_BOOL && s.type <= KILN_OPTION_STRING) ? s.type : 0;
            return fail(KILN_ERR_INVALID_ARG, "option '%s' takes a %s value, got a %s", s.name,
                        names[type], names[given]);
        }
        BackendOption o;
        size_t klen = std::strlen(s.name);
        if (klen >= executorch::runtime::kMaxOptionKeyLength) {
            return fail(KILN_ERR_INVALID_ARG, "option name '%s' is too long", s.name);
        }
        std::memcpy(o.key, s.name, klen + 1);
        if (type == KILN_OPTION_BOOL) {
            o.value = s.int_value != 0;
        } else if (type == KILN_OPTION_INT) {
            if (s.int_value < INT_MIN || s.int_value > INT_MAX) {
                return fail(KILN_ERR_INVALID_ARG, "option '%s' = %lld does not fit an int", s.name,
                            static_cast<long long>(s.int_value));
            }
            o.value = static_cast<int>(s.int_value);
        } else {
            if (s.string_value == nullptr) {
                return fail(KILN_ERR_INVALID_ARG, "option '%s': string_value is NULL", s.name);
            }
            std::array<char, executorch::runtime::kMaxOptionValueLength> v{};
            size_t vlen = std::strlen(s.string_value);
            if (vlen >= v.size()) {
                return fail(KILN_ERR_INVALID_ARG, "option '%s': value is longer than %zu bytes",
                            s.name, v.size() - 1);
            }
            std::memcpy(v.data(), s.string_value, vlen + 1);
            o.value = v;
        }
        out->push_back(o);
    }
    return KILN_OK;
}

kiln_status check_readable(const char *what, const char *path) {
    std::FILE *f = std::fopen(path, "rb");
    if (f == nullptr) {
        int err = errno;
        return fail(KILN_ERR_IO, "cannot open %s '%s': %s", what, path, std::strerror(err));
    }
    std::fclose(f);
    return KILN_OK;
}

kiln_status load_impl(const char *path, const kiln_program_options *options, kiln_program **out) {
    if (path == nullptr || out == nullptr) {
        return fail(KILN_ERR_INVALID_ARG, "kiln_program_load: path or out is NULL");
    }
    kiln_program_options opts;
    kiln_program_options_init(&opts);
    if (options != nullptr) {
        if (options->struct_nbytes < offsetof(kiln_program_options, lazy_methods) ||
            options->struct_nbytes > sizeof opts) {
            return fail(KILN_ERR_INVALID_ARG,
                        "kiln_program_options.struct_nbytes is %u: initialize the options with "
                        "kiln_program_options_init",
                        options->struct_nbytes);
        }
        std::memcpy(&opts, options, options->struct_nbytes);
    }
    if (opts.n_data_paths > 0 && opts.data_paths == nullptr) {
        return fail(KILN_ERR_INVALID_ARG,
                    "kiln_program_options: %u data_paths but the array is "
                    "NULL",
                    opts.n_data_paths);
    }
    kiln_status st = check_readable("program", path);
    if (st != KILN_OK) return st;
    // ExecuTorch's method loader dereferences fields its Verifier lets a damaged file omit:
    // Kiln walks the program's flatbuffer first (kiln_pte_check_file).
    st = kiln_pte_check_file(path);
    if (st == KILN_ERR_CORRUPT) {
        return fail(st, "'%s' is not a valid ExecuTorch program (%s): %s", path,
                    kiln_status_name(st), kiln_last_error());
    }
    if (st != KILN_OK) return fail(st, "%s (%s)", kiln_last_error(), kiln_status_name(st));

    std::unique_ptr<kiln_program> p(new kiln_program());
    p->path = path;
    for (uint32_t i = 0; i < opts.n_data_paths; i++) {
        if (opts.data_paths[i] == nullptr) {
            return fail(KILN_ERR_INVALID_ARG, "kiln_program_options.data_paths[%u] is NULL", i);
        }
        st = check_readable("data file", opts.data_paths[i]);
        if (st != KILN_OK) return st;
        // ExecuTorch's .ptd reader trusts every offset in the file (it can crash on a damaged
        // one): Kiln checks it completely first (kiln_ptd_check_file).
        st = kiln_ptd_check_file(opts.data_paths[i]);
        if (st != KILN_OK) {
            return fail(st, "%s (%s) [program '%s']", kiln_last_error(), kiln_status_name(st),
                        path);
        }
        p->data_paths.emplace_back(opts.data_paths[i]);
    }
    st = convert_settings(opts.settings, opts.n_settings, &p->settings);
    if (st != KILN_OK) return st;

    Module::LoadMode mode = opts.use_mmap ? Module::LoadMode::Mmap : Module::LoadMode::File;
    if (p->data_paths.empty()) {
        p->module = std::make_shared<Module>(p->path, mode);
    } else {
        p->module = std::make_shared<Module>(p->path, p->data_paths, mode);
    }
    // The program's flatbuffer is verified in full (InternalConsistency), not only its header
    // (ExecuTorch's default, Minimal): the file is untrusted like the engines inside it.
    const Program::Verification verify = Program::Verification::InternalConsistency;
    Error e;
    if (p->settings.empty()) {
        e = p->module->load(verify);
    } else {
        LoadBackendOptionsMap map;
        e = map.set_options(kBackendName, executorch::runtime::Span<BackendOption>(
                                              p->settings.data(), p->settings.size()));
        if (e == Error::Ok) e = p->module->load(map, verify);
    }
    if (e != Error::Ok) {
        if (e == Error::InvalidProgram || e == Error::InvalidArgument) {
            return fail(KILN_ERR_CORRUPT,
                        "'%s' is not a valid ExecuTorch program (ExecuTorch error %s, 0x%x)%s",
                        path, et_error_name(e), static_cast<unsigned>(e),
                        p->data_paths.empty() ? ""
                                              : ", or a .ptd file given is not ExecuTorch named "
                                                "data");
        }
        if (e == Error::InvalidExternalData && !p->data_paths.empty()) {
            return fail(KILN_ERR_MISSING_DATA,
                        "the data file(s) given with '%s' could not be read as ExecuTorch named "
                        "data (.ptd) (ExecuTorch error %s, 0x%x)",
                        path, et_error_name(e), static_cast<unsigned>(e));
        }
        return fail(from_et(e), "loading the program '%s' failed: ExecuTorch error %s (0x%x)", path,
                    et_error_name(e), static_cast<unsigned>(e));
    }
    const Program *prog = p->module->program().get();
    size_t n = prog->num_methods();
    p->methods.resize(n);
    for (size_t i = 0; i < n; i++) {
        Result<const char *> name = prog->get_method_name(i);
        if (!name.ok()) {
            return fail(KILN_ERR_CORRUPT, "'%s': the name of method %zu is unreadable (%s)", path,
                        i, et_error_name(name.error()));
        }
        p->methods[i].name = name.get();
    }
    p->lazy = opts.lazy_methods != 0;
    if (!opts.lazy_methods) {
        for (MethodState &m : p->methods) {
            st = ensure_loaded(p.get(), m);
            if (st != KILN_OK) return st;
        }
    }
    *out = p.release();
    return KILN_OK;
}

kiln_status check_input(const MethodState &m, const MethodMeta &meta, uint32_t index,
                        const kiln_input *in) {
    size_t n = meta.num_inputs();
    if (index >= n) {
        return fail(KILN_ERR_INVALID_ARG,
                    "method '%s' takes %zu input%s; input index %u is out "
                    "of range",
                    m.name.c_str(), n, n == 1 ? "" : "s", index);
    }
    if (in == nullptr) {
        return fail(KILN_ERR_INVALID_ARG, "method '%s': input %u is NULL", m.name.c_str(), index);
    }
    if (!m.input_is_tensor[index]) {
        Result<Tag> tag = meta.input_tag(index);
        return fail(KILN_ERR_INVALID_ARG,
                    "method '%s': input %u is a %s value, not a tensor; this API binds tensors "
                    "only (the program's value is used)",
                    m.name.c_str(), index, tag.ok() ? tag_name(tag.get()) : "non-tensor");
    }
    Result<TensorInfo> ti = meta.input_tensor_meta(index);
    if (!ti.ok()) {
        return fail(KILN_ERR_CORRUPT, "method '%s': the metadata of input %u is unreadable",
                    m.name.c_str(), index);
    }
    const TensorInfo &t = ti.get();
    ScalarType given = ScalarType::Float;
    if (!to_scalar_type(in->dtype, &given)) {
        return fail(KILN_ERR_INVALID_ARG, "method '%s': input %u has an invalid dtype %d",
                    m.name.c_str(), index, static_cast<int>(in->dtype));
    }
    if (given != t.scalar_type()) {
        return fail(KILN_ERR_SHAPE, "method '%s': input %u has dtype %s, the program expects %s",
                    m.name.c_str(), index, kiln_dtype_name(in->dtype),
                    scalar_type_name(t.scalar_type()).c_str());
    }
    size_t rank = t.sizes().size();
    if (in->rank != rank) {
        return fail(KILN_ERR_SHAPE,
                    "method '%s': input %u has rank %u, the program expects rank %zu (shape %s)",
                    m.name.c_str(), index, in->rank, rank, shape_str(t.sizes(), rank).c_str());
    }
    if (rank > 0 && in->dims == nullptr) {
        return fail(KILN_ERR_INVALID_ARG, "method '%s': input %u has rank %u but dims is NULL",
                    m.name.c_str(), index, in->rank);
    }
    for (size_t d = 0; d < rank; d++) {
        if (in->dims[d] < 0 || in->dims[d] > t.sizes()[d]) {
            return fail(KILN_ERR_SHAPE,
                        "method '%s': input %u dimension %zu is %lld, the program allows at most "
                        "%d (exported shape %s; dynamic dimensions may be smaller, static ones "
                        "must match)",
                        m.name.c_str(), index, d, static_cast<long long>(in->dims[d]),
                        static_cast<int>(t.sizes()[d]), shape_str(t.sizes(), rank).c_str());
        }
    }
    if (in->memory != KILN_MEMORY_HOST && in->memory != KILN_MEMORY_CUDA) {
        return fail(KILN_ERR_INVALID_ARG, "method '%s': input %u has an invalid memory kind %d",
                    m.name.c_str(), index, static_cast<int>(in->memory));
    }
    if (in->memory == KILN_MEMORY_CUDA && m.input_planned[index]) {
        return fail(KILN_ERR_UNSUPPORTED,
                    "method '%s': input %u is memory-planned in host memory, so ExecuTorch "
                    "copies it in and needs host data: pass host memory, or export with "
                    "MemoryPlanningPass(alloc_graph_input=False) to bind device memory in place",
                    m.name.c_str(), index);
    }
    if (in->data == nullptr && t.nbytes() > 0) {
        return fail(KILN_ERR_INVALID_ARG, "method '%s': input %u data is NULL", m.name.c_str(),
                    index);
    }
    return KILN_OK;
}

Device device_of(kiln_memory memory, int32_t index) {
    if (memory == KILN_MEMORY_CUDA) {
        return Device(DeviceType::CUDA, static_cast<executorch::runtime::etensor::DeviceIndex>(
                                            index < 0 ? 0 : index));
    }
    return Device(DeviceType::CPU);
}

kiln_status set_input_impl(kiln_program *p, MethodState &m, const MethodMeta &meta, uint32_t index,
                           const kiln_input *in) {
    kiln_status st = check_input(m, meta, index, in);
    if (st != KILN_OK) return st;
    std::vector<SizesType> sizes(in->rank);
    for (uint32_t d = 0; d < in->rank; d++) sizes[d] = static_cast<SizesType>(in->dims[d]);
    ScalarType type = ScalarType::Float;
    to_scalar_type(in->dtype, &type);
    TensorPtr t =
        executorch::extension::make_tensor_ptr(std::move(sizes), const_cast<void *>(in->data), type,
                                               device_of(in->memory, in->device_index));
    m.input_set[index] = 0;
    Error e = p->module->set_input(m.name, EValue(*t), index);
    if (e != Error::Ok) {
        Result<TensorInfo> ti = meta.input_tensor_meta(index);
        std::string expected = ti.ok() ? shape_str(ti.get().sizes(), ti.get().sizes().size()) : "?";
        if (e == Error::InvalidArgument || e == Error::NotSupported) {
            return fail(KILN_ERR_SHAPE,
                        "method '%s': input %u with shape %s was refused (ExecuTorch error %s): "
                        "the program was exported with shape %s; a static dimension must match "
                        "it exactly",
                        m.name.c_str(), index, shape_str(in->dims, in->rank).c_str(),
                        et_error_name(e), expected.c_str());
        }
        return fail(from_et(e), "method '%s': binding input %u failed: ExecuTorch error %s (0x%x)",
                    m.name.c_str(), index, et_error_name(e), static_cast<unsigned>(e));
    }
    m.input_tensors[index] = std::move(t);
    m.input_set[index] = 1;
    return KILN_OK;
}

// Common prologue of the mutating per-method calls: program check, method lookup, lazy load.
kiln_status begin_method(kiln_program *p, const char *method, const char *fn, MethodState **out_m,
                         std::unique_ptr<MethodMeta> *out_meta) {
    if (p == nullptr) return fail(KILN_ERR_INVALID_ARG, "%s: program is NULL", fn);
    size_t mi;
    kiln_status st = find_method(p, method, &mi);
    if (st != KILN_OK) return st;
    MethodState &m = p->methods[mi];
    st = ensure_loaded(p, m);
    if (st != KILN_OK) return st;
    std::optional<MethodMeta> meta;
    st = method_meta(p, m, &meta);
    if (st != KILN_OK) return st;
    out_meta->reset(new MethodMeta(*meta));
    *out_m = &m;
    return KILN_OK;
}

template <typename F> kiln_status guarded(const char *fn, F &&body) {
    clear_error();
    try {
        return body();
    } catch (const std::bad_alloc &) {
        return fail(KILN_ERR_NO_MEMORY, "%s: out of host memory", fn);
    } catch (const std::exception &ex) {
        return fail(KILN_ERR_INTERNAL, "%s: unexpected C++ exception: %s", fn, ex.what());
    } catch (...) {
        return fail(KILN_ERR_INTERNAL, "%s: unexpected C++ exception", fn);
    }
}

} // namespace

// --- the C API

extern "C" {

KILN_API void kiln_program_options_init(kiln_program_options *options) {
    if (options == nullptr) return;
    std::memset(options, 0, sizeof *options);
    options->struct_nbytes = sizeof *options;
}

KILN_API const char *kiln_program_last_error(void) { return t_error; }

KILN_API kiln_status kiln_program_load(const char *path, const kiln_program_options *options,
                                       kiln_program **out) {
    return guarded("kiln_program_load", [&] { return load_impl(path, options, out); });
}

KILN_API void kiln_program_set_planned_limit(uint64_t nbytes) {
    g_planned_limit.store(nbytes, std::memory_order_relaxed);
}

KILN_API kiln_status kiln_program_share(const kiln_program *program, kiln_program **out) {
    return guarded("kiln_program_share", [&] {
        if (program == nullptr || out == nullptr) {
            return fail(KILN_ERR_INVALID_ARG, "kiln_program_share: program or out is NULL");
        }
        if (!program->data_paths.empty()) {
            return fail(KILN_ERR_UNSUPPORTED,
                        "kiln_program_share: '%s' was loaded with .ptd data files, which "
                        "ExecuTorch %s's Module cannot attach to a shared program: load the "
                        "program once per thread instead (kiln_program_load)",
                        program->path.c_str(), KILN_EXECUTORCH_VERSION);
        }
        std::unique_ptr<kiln_program> q(new kiln_program());
        q->origin = program->origin ? program->origin : program->module;
        q->module = std::make_shared<Module>(program->module->program());
        q->lazy = program->lazy;
        q->path = program->path;
        q->settings = program->settings;
        q->methods.resize(program->methods.size());
        for (size_t i = 0; i < program->methods.size(); i++) {
            q->methods[i].name = program->methods[i].name;
        }
        Error e = Error::Ok;
        if (!q->settings.empty()) {
            // The per-load options, installed on the new Module (the program is loaded already).
            LoadBackendOptionsMap map;
            e = map.set_options(kBackendName, executorch::runtime::Span<BackendOption>(
                                                  q->settings.data(), q->settings.size()));
            if (e == Error::Ok)
                e = q->module->load(map, Program::Verification::InternalConsistency);
        }
        if (e != Error::Ok) {
            return fail(from_et(e), "kiln_program_share: '%s': ExecuTorch error %s (0x%x)",
                        q->path.c_str(), et_error_name(e), static_cast<unsigned>(e));
        }
        if (!q->lazy) {
            for (MethodState &m : q->methods) {
                kiln_status st = ensure_loaded(q.get(), m);
                if (st != KILN_OK) return st;
            }
        }
        *out = q.release();
        return KILN_OK;
    });
}

KILN_API void kiln_program_free(kiln_program *program) {
    if (program == nullptr) return;
    try {
        delete program;
    } catch (...) {
        // Destructors of ExecuTorch objects do not throw; nothing to report if one did.
    }
}

KILN_API kiln_status kiln_program_method_count(const kiln_program *program, uint32_t *out_count) {
    return guarded("kiln_program_method_count", [&] {
        if (program == nullptr || out_count == nullptr) {
            return fail(KILN_ERR_INVALID_ARG, "kiln_program_method_count: program or out is NULL");
        }
        *out_count = static_cast<uint32_t>(program->methods.size());
        return KILN_OK;
    });
}

KILN_API kiln_status kiln_program_method_name(const kiln_program *program, uint32_t index,
                                              const char **out_name) {
    return guarded("kiln_program_method_name", [&] {
        if (program == nullptr || out_name == nullptr) {
            return fail(KILN_ERR_INVALID_ARG, "kiln_program_method_name: program or out is NULL");
        }
        if (index >= program->methods.size()) {
            return fail(KILN_ERR_INVALID_ARG,
                        "the program '%s' has %zu methods; method index %u is out of range",
                        program->path.c_str(), program->methods.size(), index);
        }
        *out_name = program->methods[index].name.c_str();
        return KILN_OK;
    });
}

KILN_API kiln_status kiln_program_load_method(kiln_program *program, const char *method) {
    return guarded("kiln_program_load_method", [&] {
        if (program == nullptr) {
            return fail(KILN_ERR_INVALID_ARG, "kiln_program_load_method: program is NULL");
        }
        Claim claim(program);
        if (!claim.ok()) return busy_error(program);
        size_t mi;
        kiln_status st = find_method(program, method, &mi);
        if (st != KILN_OK) return st;
        return ensure_loaded(program, program->methods[mi]);
    });
}

KILN_API kiln_status kiln_program_method_uses_kiln(const kiln_program *program, const char *method,
                                                   int32_t *out_uses_kiln) {
    return guarded("kiln_program_method_uses_kiln", [&] {
        if (program == nullptr || out_uses_kiln == nullptr) {
            return fail(KILN_ERR_INVALID_ARG,
                        "kiln_program_method_uses_kiln: program or out is NULL");
        }
        std::optional<MethodMeta> meta;
        kiln_status st = method_meta_of(program, method, &meta);
        if (st != KILN_OK) return st;
        *out_uses_kiln = meta->uses_backend(kBackendName) ? 1 : 0;
        return KILN_OK;
    });
}

KILN_API kiln_status kiln_program_n_inputs(const kiln_program *program, const char *method,
                                           uint32_t *out_count) {
    return guarded("kiln_program_n_inputs", [&] {
        if (program == nullptr || out_count == nullptr) {
            return fail(KILN_ERR_INVALID_ARG, "kiln_program_n_inputs: program or out is NULL");
        }
        std::optional<MethodMeta> meta;
        kiln_status st = method_meta_of(program, method, &meta);
        if (st != KILN_OK) return st;
        *out_count = static_cast<uint32_t>(meta->num_inputs());
        return KILN_OK;
    });
}

KILN_API kiln_status kiln_program_n_outputs(const kiln_program *program, const char *method,
                                            uint32_t *out_count) {
    return guarded("kiln_program_n_outputs", [&] {
        if (program == nullptr || out_count == nullptr) {
            return fail(KILN_ERR_INVALID_ARG, "kiln_program_n_outputs: program or out is NULL");
        }
        std::optional<MethodMeta> meta;
        kiln_status st = method_meta_of(program, method, &meta);
        if (st != KILN_OK) return st;
        *out_count = static_cast<uint32_t>(meta->num_outputs());
        return KILN_OK;
    });
}

KILN_API kiln_status kiln_program_input_info(const kiln_program *program, const char *method,
                                             uint32_t index, kiln_tensor_info *out) {
    return guarded("kiln_program_input_info",
                   [&] { return info_common(program, method, true, index, out); });
}

KILN_API kiln_status kiln_program_output_info(const kiln_program *program, const char *method,
                                              uint32_t index, kiln_tensor_info *out) {
    return guarded("kiln_program_output_info",
                   [&] { return info_common(program, method, false, index, out); });
}

KILN_API kiln_status kiln_program_set_input(kiln_program *program, const char *method,
                                            uint32_t index, const kiln_input *input) {
    return guarded("kiln_program_set_input", [&] {
        if (program == nullptr) {
            return fail(KILN_ERR_INVALID_ARG, "kiln_program_set_input: program is NULL");
        }
        Claim claim(program);
        if (!claim.ok()) return busy_error(program);
        MethodState *m;
        std::unique_ptr<MethodMeta> meta;
        kiln_status st = begin_method(program, method, "kiln_program_set_input", &m, &meta);
        if (st != KILN_OK) return st;
        return set_input_impl(program, *m, *meta, index, input);
    });
}

KILN_API kiln_status kiln_program_set_inputs(kiln_program *program, const char *method,
                                             uint32_t n_inputs, const kiln_input *inputs) {
    return guarded("kiln_program_set_inputs", [&] {
        if (program == nullptr) {
            return fail(KILN_ERR_INVALID_ARG, "kiln_program_set_inputs: program is NULL");
        }
        Claim claim(program);
        if (!claim.ok()) return busy_error(program);
        MethodState *m;
        std::unique_ptr<MethodMeta> meta;
        kiln_status st = begin_method(program, method, "kiln_program_set_inputs", &m, &meta);
        if (st != KILN_OK) return st;
        size_t n = meta->num_inputs();
        if (n_inputs != n) {
            return fail(KILN_ERR_INVALID_ARG, "method '%s' takes %zu input%s, got %u",
                        m->name.c_str(), n, n == 1 ? "" : "s", n_inputs);
        }
        if (n_inputs > 0 && inputs == nullptr) {
            return fail(KILN_ERR_INVALID_ARG, "kiln_program_set_inputs: inputs is NULL");
        }
        for (uint32_t i = 0; i < n_inputs; i++) {
            st = set_input_impl(program, *m, *meta, i, &inputs[i]);
            if (st != KILN_OK) return st;
        }
        return KILN_OK;
    });
}

KILN_API kiln_status kiln_program_set_output_buffer(kiln_program *program, const char *method,
                                                    uint32_t index, void *data,
                                                    size_t capacity_nbytes, kiln_memory memory) {
    return guarded("kiln_program_set_output_buffer", [&] {
        if (program == nullptr) {
            return fail(KILN_ERR_INVALID_ARG, "kiln_program_set_output_buffer: program is NULL");
        }
        Claim claim(program);
        if (!claim.ok()) return busy_error(program);
        MethodState *m;
        std::unique_ptr<MethodMeta> meta;
        kiln_status st = begin_method(program, method, "kiln_program_set_output_buffer", &m, &meta);
        if (st != KILN_OK) return st;
        kiln_tensor_info info;
        st = fill_info(*meta, false, index, &info);
        if (st != KILN_OK) return st;
        if (!info.is_tensor) {
            return fail(KILN_ERR_INVALID_ARG, "method '%s': output %u is not a tensor",
                        m->name.c_str(), index);
        }
        if (info.memory_planned) {
            return fail(KILN_ERR_UNSUPPORTED,
                        "method '%s': output %u is memory-planned by the program (exported with "
                        "alloc_graph_output=True, ExecuTorch's default), so it cannot take a "
                        "caller buffer: read it with kiln_program_output after execute, or export "
                        "with MemoryPlanningPass(alloc_graph_output=False)",
                        m->name.c_str(), index);
        }
        if (memory != KILN_MEMORY_HOST && memory != KILN_MEMORY_CUDA) {
            return fail(KILN_ERR_INVALID_ARG, "method '%s': output %u: invalid memory kind %d",
                        m->name.c_str(), index, static_cast<int>(memory));
        }
        if (data == nullptr || capacity_nbytes < info.nbytes) {
            return fail(KILN_ERR_INVALID_ARG,
                        "method '%s': output %u needs a buffer of %llu bytes (shape %s, %s), got "
                        "%s%zu bytes",
                        m->name.c_str(), index, static_cast<unsigned long long>(info.nbytes),
                        shape_str(info.dims, info.rank).c_str(),
                        info.dtype != KILN_DTYPE_INVALID ? kiln_dtype_name(info.dtype) : "?",
                        data == nullptr ? "NULL with " : "", capacity_nbytes);
        }
        std::vector<SizesType> sizes(info.rank);
        for (uint32_t d = 0; d < info.rank; d++) sizes[d] = static_cast<SizesType>(info.dims[d]);
        TensorPtr t = executorch::extension::make_tensor_ptr(
            std::move(sizes), data, static_cast<ScalarType>(info.scalar_type),
            device_of(memory, 0));
        m->output_bound[index] = 0;
        Error e = program->module->set_output(m->name, EValue(*t), index);
        if (e != Error::Ok) {
            return fail(from_et(e),
                        "method '%s': ExecuTorch refused the buffer for output %u: error %s "
                        "(0x%x)",
                        m->name.c_str(), index, et_error_name(e), static_cast<unsigned>(e));
        }
        m->output_tensors[index] = std::move(t);
        m->output_bound[index] = 1;
        // ExecuTorch keeps only the data pointer of a caller's buffer, not its device: remember
        // where it lives so kiln_program_output reports it truthfully.
        m->output_memory[index] = static_cast<uint8_t>(memory);
        return KILN_OK;
    });
}

KILN_API kiln_status kiln_program_execute(kiln_program *program, const char *method) {
    return guarded("kiln_program_execute", [&] {
        if (program == nullptr) {
            return fail(KILN_ERR_INVALID_ARG, "kiln_program_execute: program is NULL");
        }
        Claim claim(program);
        if (!claim.ok()) return busy_error(program);
        MethodState *m;
        std::unique_ptr<MethodMeta> meta;
        kiln_status st = begin_method(program, method, "kiln_program_execute", &m, &meta);
        if (st != KILN_OK) return st;
        for (size_t i = 0; i < m->input_set.size(); i++) {
            if (m->input_is_tensor[i] && !m->input_set[i]) {
                return fail(KILN_ERR_INVALID_STATE,
                            "method '%s': input %zu is not bound: call kiln_program_set_input "
                            "(or _set_inputs) for every input before each execute (the "
                            "method takes %zu inputs)",
                            m->name.c_str(), i, m->input_set.size());
            }
        }
        for (size_t i = 0; i < m->output_bound.size(); i++) {
            if (m->output_is_tensor[i] && !m->output_planned[i] && !m->output_bound[i]) {
                return fail(KILN_ERR_INVALID_STATE,
                            "method '%s': output %zu is not memory-planned and has no buffer: "
                            "supply one with kiln_program_set_output_buffer",
                            m->name.c_str(), i);
            }
        }
        m->executed = false;
        m->outputs.clear();
        kiln_clear_error();
        kiln_executorch_clear_error();
        Result<std::vector<EValue>> r = program->module->execute(m->name);
        // Memory-planned inputs were copied into memory the program may reuse while it runs.
        for (size_t i = 0; i < m->input_set.size(); i++) {
            if (m->input_planned[i]) m->input_set[i] = 0;
        }
        if (!r.ok()) {
            std::string detail = kiln_detail();
            return fail(status_of(r.error()),
                        "executing method '%s' of '%s' failed: ExecuTorch error %s (0x%x)%s",
                        m->name.c_str(), program->path.c_str(), et_error_name(r.error()),
                        static_cast<unsigned>(r.error()),
                        detail.empty() ? ": see the ExecuTorch log above" : detail.c_str());
        }
        m->outputs = std::move(r.get());
        m->executed = true;
        return KILN_OK;
    });
}

KILN_API kiln_status kiln_program_output(kiln_program *program, const char *method, uint32_t index,
                                         kiln_output *out) {
    return guarded("kiln_program_output", [&] {
        if (program == nullptr || out == nullptr) {
            return fail(KILN_ERR_INVALID_ARG, "kiln_program_output: program or out is NULL");
        }
        Claim claim(program);
        if (!claim.ok()) return busy_error(program);
        size_t mi;
        kiln_status st = find_method(program, method, &mi);
        if (st != KILN_OK) return st;
        MethodState &m = program->methods[mi];
        if (!m.executed) {
            return fail(KILN_ERR_INVALID_STATE,
                        "method '%s' has no outputs yet: call kiln_program_execute first (or the "
                        "last execute failed)",
                        m.name.c_str());
        }
        if (index >= m.outputs.size()) {
            return fail(KILN_ERR_INVALID_ARG,
                        "method '%s' has %zu outputs; output index %u is out of range",
                        m.name.c_str(), m.outputs.size(), index);
        }
        const EValue &v = m.outputs[index];
        if (!v.isTensor()) {
            return fail(KILN_ERR_UNSUPPORTED,
                        "method '%s': output %u is a %s value, not a tensor; this API reads "
                        "tensor outputs only",
                        m.name.c_str(), index, tag_name(v.tag));
        }
        const executorch::aten::Tensor &t = v.toTensor();
        if (static_cast<size_t>(t.dim()) > KILN_MAX_RANK) {
            return fail(KILN_ERR_UNSUPPORTED, "method '%s': output %u has rank %zd (at most %d)",
                        m.name.c_str(), index, static_cast<ssize_t>(t.dim()), KILN_MAX_RANK);
        }
        kiln_output o;
        std::memset(&o, 0, sizeof o);
        o.data = t.mutable_data_ptr();
        o.scalar_type = static_cast<int32_t>(t.scalar_type());
        o.dtype = from_scalar_type(t.scalar_type());
        o.rank = static_cast<uint32_t>(t.dim());
        for (ssize_t d = 0; d < t.dim(); d++) o.dims[d] = t.size(d);
        o.nbytes = t.nbytes();
        o.memory = t.device_type() == DeviceType::CUDA ? KILN_MEMORY_CUDA : KILN_MEMORY_HOST;
        o.device_index = t.device_index();
        if (index < m.output_bound.size() && m.output_bound[index] &&
            m.output_memory[index] == KILN_MEMORY_CUDA) {
            o.memory = KILN_MEMORY_CUDA; // the caller's device buffer (set_output_buffer)
            o.device_index = 0;
        }
        *out = o;
        return KILN_OK;
    });
}

} // extern "C"
