// SPDX-License-Identifier: Apache-2.0
// kiln_runner: runs an ExecuTorch program with the KilnBackend delegate through ExecuTorch's C++
// Module API, checks its outputs and measures latency. Needs no Python: only libexecutorch.so,
// libexecutorch_kernels_optimized.so (+ libexecutorch_threadpool.so) and Kiln's libraries.
//
//   kiln_runner --model m.pte [--data m.ptd]... [--method forward] [--inputs in.bin]
//               [--expected out.bin [--tolerance 1e-4] [--max-relative]]
//               [--iterations 10 --warmup 2] [--device-io] [--option NAME=VALUE]... [--save-outputs
//               out.bin] [--mmap]
//               [--seed N] [--caller-stream] [--link-stats] [--expect-linked]
//
// Inputs come from --inputs (Kiln's tensor file format: examples/cpp/kiln_tensors.py) or are
// random at the exported shapes. --expected compares every output elementwise:
// |out - expected| <= tol + tol * |expected| (exact for integer and bool outputs); with
// --max-relative, |out - expected| <= tol * max |expected| over the output (the benchmark's
// criterion: a half-precision model's large logits differ from a float64 reference by more than
// a per-element tolerance while the output as a whole is right).
// --device-io binds inputs and outputs in CUDA memory (libcudart is opened at run time; the
// program must be exported with alloc_graph_input/output=False: export_for_runner.py
// --device-io). --caller-stream creates a CUDA stream (non-blocking) and hands it to Kiln with
// kiln_set_thread_stream, so the delegate's work runs on the caller's stream. Latency is per
// execute (inputs are bound before each one, outside the timing). --link-stats prints what the
// links between the program's Kiln delegates did (kiln_executorch_link_stats: tensors passed
// from one Kiln delegate to another in the engines' memory, docs/runtime.md "Between
// delegates"); --expect-linked also fails the run unless every linked input read the producer's
// memory, none fell back to host memory, and (after the first execute) an output stayed only in
// its engine's memory: no device-to-host-to-device round trip between Kiln delegates.
// Exit status: 0 ok, 1 a failure or a mismatch, 2 bad usage.
#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor_ptr.h>
#include <executorch/runtime/backend/backend_options_map.h>
#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/backend/options.h>
#include <executorch/runtime/core/error.h>
#include <executorch/runtime/core/evalue.h>

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "kiln/kiln_program.h"

using executorch::aten::ScalarType;
using executorch::aten::SizesType;
using executorch::extension::Module;
using executorch::extension::TensorPtr;
using executorch::runtime::BackendOption;
using executorch::runtime::Error;
using executorch::runtime::EValue;
using executorch::runtime::LoadBackendOptionsMap;
using executorch::runtime::MethodMeta;
using executorch::runtime::Result;
using executorch::runtime::Tag;
using executorch::runtime::TensorInfo;
using executorch::runtime::etensor::Device;
using executorch::runtime::etensor::DeviceType;

namespace {

// --- Kiln's tensor file format (see kiln_tensors.py)

struct HostTensor {
    kiln_dtype dtype = KILN_DTYPE_INVALID;
    std::vector<int64_t> dims;
    std::vector<uint8_t> data;
    size_t numel() const {
        size_t n = 1;
        for (int64_t d : dims) n *= static_cast<size_t>(d);
        return n;
    }
};

[[noreturn]] void die(const std::string &msg) {
    std::fprintf(stderr, "kiln_runner: error: %s\n", msg.c_str());
    std::exit(1);
}

std::vector<HostTensor> read_tensors(const std::string &path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) die("cannot open tensor file '" + path + "'");
    std::vector<uint8_t> buf((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    size_t pos = 0;
    auto need = [&](size_t n, const char *what) {
        if (buf.size() - pos < n) die("'" + path + "' is truncated (reading " + what + ")");
    };
    auto u32 = [&](const char *what) {
        need(4, what);
        uint32_t v;
        std::memcpy(&v, &buf[pos], 4);
        pos += 4;
        return v;
    };
    need(4, "the magic");
    if (std::memcmp(buf.data(), "KLNT", 4) != 0) {
        die("'" + path + "' is not a Kiln tensor file (magic KLNT): write it with kiln_tensors.py");
    }
    pos = 4;
    uint32_t version = u32("the version");
    if (version != 1) die("'" + path + "' has version " + std::to_string(version) + ", expected 1");
    uint32_t count = u32("the count");
    std::vector<HostTensor> out(count);
    for (uint32_t i = 0; i < count; i++) {
        HostTensor &t = out[i];
        uint32_t code = u32("a dtype");
        uint32_t rank = u32("a rank");
        if (code == 0 || code >= KILN_DTYPE_COUNT || rank > KILN_MAX_RANK) {
            die("'" + path + "' tensor " + std::to_string(i) + ": bad dtype code " +
                std::to_string(code) + " or rank " + std::to_string(rank));
        }
        t.dtype = static_cast<kiln_dtype>(code);
        t.dims.resize(rank);
        need(8 * rank, "dims");
        std::memcpy(t.dims.data(), &buf[pos], 8 * rank);
        pos += 8 * rank;
        for (int64_t d : t.dims) {
            if (d < 0 || d > (int64_t(1) << 40)) die("'" + path + "': bad dimension");
        }
        size_t nbytes = t.numel() * kiln_dtype_size(t.dtype);
        need(nbytes, "tensor data");
        t.data.assign(buf.begin() + static_cast<std::ptrdiff_t>(pos),
                      buf.begin() + static_cast<std::ptrdiff_t>(pos + nbytes));
        pos += nbytes;
    }
    if (pos != buf.size()) die("'" + path + "' has trailing bytes after its tensors");
    return out;
}

void write_tensors(const std::string &path, const std::vector<HostTensor> &tensors) {
    std::ofstream f(path, std::ios::binary);
    if (!f) die("cannot write '" + path + "'");
    auto put = [&](const void *p, size_t n) { f.write(static_cast<const char *>(p), n); };
    uint32_t head[2] = {1, static_cast<uint32_t>(tensors.size())};
    put("KLNT", 4);
    put(head, sizeof head);
    for (const HostTensor &t : tensors) {
        uint32_t h[2] = {static_cast<uint32_t>(t.dtype), static_cast<uint32_t>(t.dims.size())};
        put(h, sizeof h);
        put(t.dims.data(), 8 * t.dims.size());
        put(t.data.data(), t.data.size());
    }
    if (!f) die("writing '" + path + "' failed");
}

// --- dtypes

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

float half_to_float(uint16_t h) {
    uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu,
             man = h & 0x3ffu, x;
    if (exp == 0) {
        if (man == 0) {
            x = sign;
        } else { // subnormal: normalize
            int e = -1;
            do {
                man <<= 1;
                e++;
            } while ((man & 0x400u) == 0);
            x = sign | static_cast<uint32_t>(112 - e) << 23 | (man & 0x3ffu) << 13;
        }
    } else if (exp == 31) {
        x = sign | 0x7f800000u | man << 13;
    } else {
        x = sign | (exp + 112) << 23 | man << 13;
    }
    float f;
    std::memcpy(&f, &x, 4);
    return f;
}

double element(const void *data, kiln_dtype dt, size_t i) {
    switch (dt) {
    case KILN_DTYPE_F32: return static_cast<const float *>(data)[i];
    case KILN_DTYPE_F16: return half_to_float(static_cast<const uint16_t *>(data)[i]);
    case KILN_DTYPE_BF16: {
        uint32_t x = static_cast<uint32_t>(static_cast<const uint16_t *>(data)[i]) << 16;
        float f;
        std::memcpy(&f, &x, 4);
        return f;
    }
    case KILN_DTYPE_I32: return static_cast<const int32_t *>(data)[i];
    case KILN_DTYPE_I64: return static_cast<double>(static_cast<const int64_t *>(data)[i]);
    case KILN_DTYPE_BOOL: return static_cast<const uint8_t *>(data)[i];
    default: return 0.0;
    }
}

std::string shape_str(const std::vector<int64_t> &dims) {
    std::string s = "[";
    for (size_t i = 0; i < dims.size(); i++) s += (i ? ", " : "") + std::to_string(dims[i]);
    return s + "]";
}

const char *et_error(Error e) { return executorch::runtime::to_string(e); }

// --- CUDA, opened at run time (the runner is built without the CUDA toolkit)

struct Cuda {
    void *lib = nullptr;
    int (*malloc_)(void **, size_t) = nullptr;
    int (*free_)(void *) = nullptr;
    int (*memcpy_)(void *, const void *, size_t, int) = nullptr;
    int (*synchronize)() = nullptr;
    int (*stream_create)(void **, unsigned) = nullptr;
    int (*stream_synchronize)(void *) = nullptr;
    int (*stream_destroy)(void *) = nullptr;
    const char *(*error_string)(int) = nullptr;
    static constexpr int kHostToDevice = 1, kDeviceToHost = 2;
    static constexpr unsigned kStreamNonBlocking = 1;

    void open(const char *why) {
        if (lib != nullptr) return;
        const char *env = std::getenv("KILN_CUDART");
        const char *names[] = {env, "libcudart.so.13", "libcudart.so.12", "libcudart.so"};
        std::string tried;
        for (const char *n : names) {
            if (n == nullptr || n[0] == '\0') continue;
            lib = dlopen(n, RTLD_NOW | RTLD_GLOBAL);
            if (lib != nullptr) break;
            tried += std::string(tried.empty() ? "" : ", ") + n;
        }
        if (lib == nullptr) {
            die(std::string(why) + " needs the CUDA runtime; none of " + tried +
                " could be opened (set LD_LIBRARY_PATH to the directory holding libcudart, or "
                "KILN_CUDART to its path)");
        }
        malloc_ = reinterpret_cast<int (*)(void **, size_t)>(dlsym(lib, "cudaMalloc"));
        free_ = reinterpret_cast<int (*)(void *)>(dlsym(lib, "cudaFree"));
        memcpy_ =
            reinterpret_cast<int (*)(void *, const void *, size_t, int)>(dlsym(lib, "cudaMemcpy"));
        synchronize = reinterpret_cast<int (*)()>(dlsym(lib, "cudaDeviceSynchronize"));
        error_string = reinterpret_cast<const char *(*)(int)>(dlsym(lib, "cudaGetErrorString"));
        stream_create =
            reinterpret_cast<int (*)(void **, unsigned)>(dlsym(lib, "cudaStreamCreateWithFlags"));
        stream_synchronize = reinterpret_cast<int (*)(void *)>(dlsym(lib, "cudaStreamSynchronize"));
        stream_destroy = reinterpret_cast<int (*)(void *)>(dlsym(lib, "cudaStreamDestroy"));
        if (!malloc_ || !free_ || !memcpy_ || !synchronize || !error_string || !stream_create ||
            !stream_synchronize || !stream_destroy) {
            die("the CUDA runtime library lacks cudaMalloc/cudaFree/cudaMemcpy/"
                "cudaStreamCreateWithFlags/cudaStreamSynchronize/cudaStreamDestroy");
        }
    }
    void check(int rc, const char *what) const {
        if (rc != 0) die(std::string(what) + " failed: " + error_string(rc));
    }
    void *alloc(size_t n) {
        void *p = nullptr;
        check(malloc_(&p, n ? n : 1), "cudaMalloc");
        return p;
    }
};

// --- arguments

struct Args {
    std::string model, method = "forward", inputs, expected, save_outputs;
    std::vector<std::string> data;
    std::vector<std::pair<std::string, std::string>> options;
    double tolerance = 1e-4;
    bool max_relative = false; // tolerance relative to the output's largest |expected|
    int iterations = 10, warmup = 2;
    bool device_io = false, mmap = false, caller_stream = false;
    bool link_stats = false, expect_linked = false;
    unsigned seed = 0;
};

void usage(const char *argv0) {
    std::fprintf(stderr,
                 "usage: %s --model m.pte [--data m.ptd]... [--method forward] [--inputs in.bin]\n"
                 "       [--expected out.bin [--tolerance 1e-4] [--max-relative]]\n"
                 "       [--iterations 10] [--warmup 2]\n"
                 "       [--device-io] [--option NAME=VALUE]... [--save-outputs out.bin] [--mmap]\n"
                 "       [--seed N] [--caller-stream] [--link-stats] [--expect-linked]\n",
                 argv0);
    std::exit(2);
}

Args parse(int argc, char **argv) {
    Args a;
    for (int i = 1; i < argc; i++) {
        std::string k = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "kiln_runner: %s needs a value\n", k.c_str());
                usage(argv[0]);
            }
            return argv[++i];
        };
        auto number = [&](const std::string &v) {
            char *end = nullptr;
            double d = std::strtod(v.c_str(), &end);
            if (end == v.c_str() || *end != '\0') {
                std::fprintf(stderr, "kiln_runner: %s takes a number, got '%s'\n", k.c_str(),
                             v.c_str());
                usage(argv[0]);
            }
            return d;
        };
        if (k == "--model")
            a.model = value();
        else if (k == "--data")
            a.data.push_back(value());
        else if (k == "--method")
            a.method = value();
        else if (k == "--inputs")
            a.inputs = value();
        else if (k == "--expected")
            a.expected = value();
        else if (k == "--save-outputs")
            a.save_outputs = value();
        else if (k == "--tolerance")
            a.tolerance = number(value());
        else if (k == "--max-relative")
            a.max_relative = true;
        else if (k == "--iterations")
            a.iterations = static_cast<int>(number(value()));
        else if (k == "--warmup")
            a.warmup = static_cast<int>(number(value()));
        else if (k == "--seed")
            a.seed = static_cast<unsigned>(number(value()));
        else if (k == "--device-io")
            a.device_io = true;
        else if (k == "--mmap")
            a.mmap = true;
        else if (k == "--caller-stream")
            a.caller_stream = true;
        else if (k == "--link-stats")
            a.link_stats = true;
        else if (k == "--expect-linked")
            a.link_stats = a.expect_linked = true;
        else if (k == "--option") {
            std::string v = value();
            size_t eq = v.find('=');
            if (eq == std::string::npos || eq == 0) {
                std::fprintf(stderr, "kiln_runner: --option takes NAME=VALUE, got '%s'\n",
                             v.c_str());
                usage(argv[0]);
            }
            a.options.emplace_back(v.substr(0, eq), v.substr(eq + 1));
        } else if (k == "-h" || k == "--help")
            usage(argv[0]);
        else {
            std::fprintf(stderr, "kiln_runner: unknown argument '%s'\n", k.c_str());
            usage(argv[0]);
        }
    }
    if (a.model.empty()) usage(argv[0]);
    if (a.iterations < 1 || a.warmup < 0) die("--iterations must be >= 1 and --warmup >= 0");
    return a;
}

// --option NAME=VALUE -> a KilnBackend load option, typed by Kiln's option table.
std::vector<BackendOption> backend_options(const Args &a) {
    std::vector<BackendOption> out;
    for (const auto &[name, value] : a.options) {
        BackendOption o;
        if (name.size() >= sizeof o.key) die("option name '" + name + "' is too long");
        std::memcpy(o.key, name.c_str(), name.size() + 1);
        kiln_option_type type = KILN_OPTION_STRING;
        bool known = false;
        for (uint32_t i = 0; i < kiln_option_count(); i++) {
            const char *n, *def, *scope;
            kiln_option_type t;
            if (kiln_option_info(i, &n, &t, &def, &scope) == KILN_OK && name == n) {
                type = t;
                known = true;
            }
        }
        if (!known) die("unknown Kiln option '" + name + "' (kiln --help lists them)");
        if (type == KILN_OPTION_BOOL) {
            if (value != "true" && value != "false" && value != "1" && value != "0") {
                die("option '" + name + "' takes true or false, got '" + value + "'");
            }
            o.value = value == "true" || value == "1";
        } else if (type == KILN_OPTION_INT) {
            o.value = std::atoi(value.c_str());
        } else {
            std::array<char, executorch::runtime::kMaxOptionValueLength> v{};
            if (value.size() >= v.size()) die("option '" + name + "' value is too long");
            std::memcpy(v.data(), value.c_str(), value.size() + 1);
            o.value = v;
        }
        out.push_back(o);
    }
    return out;
}

HostTensor random_input(const TensorInfo &t, std::mt19937 &rng) {
    HostTensor h;
    h.dtype = from_scalar_type(t.scalar_type());
    if (h.dtype == KILN_DTYPE_INVALID) die("an input has a dtype this runner cannot generate");
    for (size_t d = 0; d < t.sizes().size(); d++) h.dims.push_back(t.sizes()[d]);
    h.data.resize(h.numel() * kiln_dtype_size(h.dtype));
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    for (size_t i = 0; i < h.numel(); i++) {
        float v = uni(rng);
        switch (h.dtype) {
        case KILN_DTYPE_F32: reinterpret_cast<float *>(h.data.data())[i] = v; break;
        case KILN_DTYPE_F16: {
            uint32_t x;
            std::memcpy(&x, &v, 4);
            uint32_t sign = (x >> 16) & 0x8000u, exp = (x >> 23) & 0xffu, man = x & 0x7fffffu;
            uint16_t r = exp < 113 ? static_cast<uint16_t>(sign)
                                   : static_cast<uint16_t>(sign | (exp - 112) << 10 | man >> 13);
            reinterpret_cast<uint16_t *>(h.data.data())[i] = r;
            break;
        }
        case KILN_DTYPE_BF16: {
            uint32_t x;
            std::memcpy(&x, &v, 4);
            reinterpret_cast<uint16_t *>(h.data.data())[i] = static_cast<uint16_t>(x >> 16);
            break;
        }
        case KILN_DTYPE_I32: reinterpret_cast<int32_t *>(h.data.data())[i] = rng() % 8; break;
        case KILN_DTYPE_I64: reinterpret_cast<int64_t *>(h.data.data())[i] = rng() % 8; break;
        case KILN_DTYPE_BOOL: h.data[i] = rng() & 1; break;
        default: break;
        }
    }
    return h;
}

} // namespace

int main(int argc, char **argv) {
    std::setvbuf(stdout, nullptr, _IOLBF, 0); // keep stdout in order with ExecuTorch's stderr log
    Args args = parse(argc, argv);
    std::printf("kiln_runner: Kiln %s, ExecuTorch %s, KilnBackend %s\n", kiln_version_string(),
                kiln_executorch_built_against(),
                kiln_executorch_owns_registration() ? "registered" : "NOT registered");
    if (!kiln_executorch_owns_registration()) {
        char code[16];
        std::snprintf(code, sizeof code, "0x%x", kiln_executorch_registration_error());
        die(std::string("KilnBackend is not registered (ExecuTorch error ") + code +
            "): link libkiln_executorch.so with --no-as-needed (kiln::executorch_backend)");
    }

    Module::LoadMode mode = args.mmap ? Module::LoadMode::Mmap : Module::LoadMode::File;
    std::unique_ptr<Module> module = args.data.empty()
                                         ? std::make_unique<Module>(args.model, mode)
                                         : std::make_unique<Module>(args.model, args.data, mode);
    std::vector<BackendOption> opts = backend_options(args);
    Error err;
    if (opts.empty()) {
        err = module->load();
    } else {
        LoadBackendOptionsMap map;
        err = map.set_options("KilnBackend",
                              executorch::runtime::Span<BackendOption>(opts.data(), opts.size()));
        if (err == Error::Ok) err = module->load(map);
    }
    if (err != Error::Ok) {
        die("loading '" + args.model + "' failed: ExecuTorch error " + et_error(err) +
            " (is it a .pte file? are the --data files the ones exported with it?)");
    }
    Result<MethodMeta> meta_r = module->method_meta(args.method);
    if (!meta_r.ok()) {
        std::string names;
        auto ns = module->method_names();
        if (ns.ok()) {
            for (const std::string &n : ns.get()) names += (names.empty() ? "" : ", ") + n;
        }
        die("the program has no method '" + args.method + "'; its methods: " + names);
    }
    MethodMeta meta = meta_r.get();
    std::printf("kiln_runner: method '%s': %zu inputs, %zu outputs, %s\n", args.method.c_str(),
                meta.num_inputs(), meta.num_outputs(),
                meta.uses_backend("KilnBackend") ? "delegates to KilnBackend"
                                                 : "does NOT use KilnBackend");

    kiln_clear_error();
    err = module->load_method(args.method);
    if (err != Error::Ok) {
        const char *kmsg = kiln_last_error();
        die("loading method '" + args.method + "' failed: ExecuTorch error " + et_error(err) +
            (kmsg[0] ? std::string(" (Kiln: ") + kmsg + ")" : std::string()) +
            (err == Error::OperatorMissing ? ": an operator has no kernel (link "
                                             "executorch::kernels_optimized)"
                                           : "") +
            (err == Error::InvalidExternalData ? ": pass the program's .ptd with --data" : ""));
    }

    // Inputs.
    std::vector<HostTensor> inputs;
    if (!args.inputs.empty()) {
        inputs = read_tensors(args.inputs);
        if (inputs.size() != meta.num_inputs()) {
            die("'" + args.inputs + "' holds " + std::to_string(inputs.size()) +
                " tensors, method '" + args.method + "' takes " +
                std::to_string(meta.num_inputs()) + " inputs");
        }
    } else {
        std::mt19937 rng(args.seed);
        for (size_t i = 0; i < meta.num_inputs(); i++) {
            Result<TensorInfo> ti = meta.input_tensor_meta(i);
            if (!ti.ok()) die("input " + std::to_string(i) + " is not a tensor");
            inputs.push_back(random_input(ti.get(), rng));
        }
    }
    Cuda cuda;
    if (args.device_io) cuda.open("--device-io");
    void *caller_stream = nullptr;
    if (args.caller_stream) {
        // The caller's stream reaches the delegate through Kiln's per-thread stream (the CPU
        // executorch build has no CallerStreamGuard); ignored when the engine runs on the CPU.
        cuda.open("--caller-stream");
        cuda.check(cuda.stream_create(&caller_stream, Cuda::kStreamNonBlocking),
                   "cudaStreamCreateWithFlags");
        if (kiln_set_thread_stream(caller_stream) != KILN_OK) {
            die(std::string("kiln_set_thread_stream failed: ") + kiln_last_error());
        }
    }
    std::printf("kiln_runner: caller stream: %s\n", caller_stream != nullptr ? "yes" : "no");
    std::vector<TensorPtr> in_tensors;
    std::vector<void *> device_buffers;
    for (size_t i = 0; i < inputs.size(); i++) {
        Result<TensorInfo> ti = meta.input_tensor_meta(i);
        if (!ti.ok()) die("input " + std::to_string(i) + " of the program is not a tensor");
        const HostTensor &h = inputs[i];
        ScalarType st = ScalarType::Float;
        to_scalar_type(h.dtype, &st);
        if (st != ti.get().scalar_type()) {
            die("input " + std::to_string(i) + " has dtype " + kiln_dtype_name(h.dtype) +
                ", the program expects " +
                kiln_dtype_name(from_scalar_type(ti.get().scalar_type())));
        }
        std::vector<SizesType> sizes(h.dims.begin(), h.dims.end());
        void *data = const_cast<uint8_t *>(h.data.data());
        Device dev(DeviceType::CPU);
        if (args.device_io) {
            if (ti.get().is_memory_planned()) {
                die("--device-io: input " + std::to_string(i) +
                    " is memory-planned (host memory); export with alloc_graph_input=False "
                    "(export_for_runner.py --device-io)");
            }
            data = cuda.alloc(h.data.size());
            device_buffers.push_back(data);
            cuda.check(cuda.memcpy_(data, h.data.data(), h.data.size(), Cuda::kHostToDevice),
                       "cudaMemcpy (input)");
            dev = Device(DeviceType::CUDA, 0);
        }
        in_tensors.push_back(
            executorch::extension::make_tensor_ptr(std::move(sizes), data, st, dev));
    }

    // Caller-owned outputs: every output that is not memory-planned.
    std::vector<HostTensor> host_out(meta.num_outputs());
    std::vector<void *> out_ptr(meta.num_outputs(), nullptr);
    std::vector<TensorPtr> out_tensors;
    for (size_t o = 0; o < meta.num_outputs(); o++) {
        Result<TensorInfo> ti = meta.output_tensor_meta(o);
        if (!ti.ok()) continue;
        if (ti.get().is_memory_planned()) {
            if (args.device_io) {
                die("--device-io: output " + std::to_string(o) +
                    " is memory-planned; export with alloc_graph_output=False "
                    "(export_for_runner.py --device-io)");
            }
            continue;
        }
        HostTensor &h = host_out[o];
        h.dtype = from_scalar_type(ti.get().scalar_type());
        for (size_t d = 0; d < ti.get().sizes().size(); d++) h.dims.push_back(ti.get().sizes()[d]);
        h.data.resize(ti.get().nbytes());
        void *data = h.data.data();
        Device dev(DeviceType::CPU);
        if (args.device_io) {
            data = cuda.alloc(h.data.size());
            device_buffers.push_back(data);
            dev = Device(DeviceType::CUDA, 0);
        }
        out_ptr[o] = data;
        std::vector<SizesType> sizes(h.dims.begin(), h.dims.end());
        out_tensors.push_back(executorch::extension::make_tensor_ptr(std::move(sizes), data,
                                                                     ti.get().scalar_type(), dev));
        err = module->set_output(args.method, EValue(*out_tensors.back()), o);
        if (err != Error::Ok) {
            die("binding output " + std::to_string(o) + " failed: ExecuTorch error " +
                et_error(err));
        }
    }

    // Run: warmup, then timed iterations (inputs bound before each execute, outside the timing).
    std::vector<double> ms;
    std::vector<EValue> outputs;
    for (int it = 0; it < args.warmup + args.iterations; it++) {
        for (size_t i = 0; i < in_tensors.size(); i++) {
            err = module->set_input(args.method, EValue(*in_tensors[i]), i);
            if (err != Error::Ok) {
                die("binding input " + std::to_string(i) + " (shape " + shape_str(inputs[i].dims) +
                    ") failed: ExecuTorch error " + et_error(err));
            }
        }
        kiln_clear_error();
        auto t0 = std::chrono::steady_clock::now();
        Result<std::vector<EValue>> r = module->execute(args.method);
        auto t1 = std::chrono::steady_clock::now();
        if (!r.ok()) {
            const char *kmsg = kiln_last_error();
            die("execute failed: ExecuTorch error " + std::string(et_error(r.error())) +
                (kmsg[0] ? std::string(" (Kiln: ") + kmsg + ")" : std::string()));
        }
        if (it >= args.warmup)
            ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        if (it + 1 == args.warmup + args.iterations) outputs = std::move(r.get());
    }

    if (caller_stream != nullptr) {
        // Execute returned with the work finished; this only proves the stream is still usable.
        cuda.check(cuda.stream_synchronize(caller_stream), "cudaStreamSynchronize (caller stream)");
    }

    // Outputs back on the host.
    for (size_t o = 0; o < outputs.size() && o < host_out.size(); o++) {
        if (!outputs[o].isTensor()) die("output " + std::to_string(o) + " is not a tensor");
        const auto &t = outputs[o].toTensor();
        HostTensor &h = host_out[o];
        h.dtype = from_scalar_type(t.scalar_type());
        h.dims.assign(t.sizes().begin(), t.sizes().end());
        if (out_ptr[o] != nullptr && args.device_io) {
            h.data.resize(t.nbytes());
            cuda.check(cuda.memcpy_(h.data.data(), out_ptr[o], t.nbytes(), Cuda::kDeviceToHost),
                       "cudaMemcpy (output)");
        } else {
            const uint8_t *p = static_cast<const uint8_t *>(t.const_data_ptr());
            h.data.assign(p, p + t.nbytes());
        }
    }

    int status = 0;
    for (size_t o = 0; o < host_out.size(); o++) {
        const HostTensor &h = host_out[o];
        double sum = 0.0;
        for (size_t k = 0; k < h.numel(); k++) sum += element(h.data.data(), h.dtype, k);
        std::printf("output %zu: %s %s sum=%.6g\n", o, kiln_dtype_name(h.dtype),
                    shape_str(h.dims).c_str(), sum);
    }
    if (!args.expected.empty()) {
        std::vector<HostTensor> exp = read_tensors(args.expected);
        if (exp.size() != host_out.size()) {
            die("'" + args.expected + "' holds " + std::to_string(exp.size()) +
                " tensors, the method returned " + std::to_string(host_out.size()));
        }
        for (size_t o = 0; o < exp.size(); o++) {
            const HostTensor &a = host_out[o], &e = exp[o];
            if (a.dtype != e.dtype || a.dims != e.dims) {
                std::printf("output %zu: MISMATCH: got %s %s, expected %s %s\n", o,
                            kiln_dtype_name(a.dtype), shape_str(a.dims).c_str(),
                            kiln_dtype_name(e.dtype), shape_str(e.dims).c_str());
                status = 1;
                continue;
            }
            bool exact = a.dtype == KILN_DTYPE_I32 || a.dtype == KILN_DTYPE_I64 ||
                         a.dtype == KILN_DTYPE_BOOL;
            double max_err = 0.0, scale = 0.0;
            size_t bad = 0, first_bad = 0;
            for (size_t k = 0; args.max_relative && k < a.numel(); k++) {
                double y = std::fabs(element(e.data.data(), e.dtype, k));
                if (!std::isnan(y)) scale = std::max(scale, y);
            }
            for (size_t k = 0; k < a.numel(); k++) {
                double x = element(a.data.data(), a.dtype, k),
                       y = element(e.data.data(), e.dtype, k);
                double d = std::fabs(x - y);
                if (std::isnan(x) != std::isnan(y)) d = INFINITY;
                if (std::isnan(x) && std::isnan(y)) d = 0.0;
                max_err = std::max(max_err, d);
                bool ok = exact               ? d == 0.0
                          : args.max_relative ? d <= args.tolerance * scale
                                              : d <= args.tolerance + args.tolerance * std::fabs(y);
                if (!ok && bad++ == 0) first_bad = k;
            }
            if (bad) {
                std::printf("output %zu: MISMATCH: %zu of %zu elements beyond tolerance %g "
                            "(max |err| %.3g; first at flat index %zu: got %.6g, expected %.6g)\n",
                            o, bad, a.numel(), args.tolerance, max_err, first_bad,
                            element(a.data.data(), a.dtype, first_bad),
                            element(e.data.data(), e.dtype, first_bad));
                status = 1;
            } else {
                std::printf("output %zu: matches expected (max |err| %.3g, tolerance %g)\n", o,
                            max_err, args.tolerance);
            }
        }
    }
    if (!args.save_outputs.empty()) write_tensors(args.save_outputs, host_out);
    if (args.link_stats) {
        kiln_executorch_link_stats ls{};
        kiln_executorch_link_stats_get(&ls);
        std::printf("link stats: inputs_linked=%llu inputs_host=%llu outputs_kept=%llu "
                    "outputs_copied=%llu outputs_materialized=%llu\n",
                    static_cast<unsigned long long>(ls.inputs_linked),
                    static_cast<unsigned long long>(ls.inputs_host),
                    static_cast<unsigned long long>(ls.outputs_kept),
                    static_cast<unsigned long long>(ls.outputs_copied),
                    static_cast<unsigned long long>(ls.outputs_materialized));
        if (args.expect_linked) {
            const int runs = args.warmup + args.iterations;
            const bool ok = ls.inputs_linked > 0 && ls.inputs_host == 0 &&
                            ls.outputs_materialized == 0 && (runs < 2 || ls.outputs_kept > 0);
            std::printf("link check: %s\n",
                        ok ? "every linked input read the producing engine's memory"
                           : "FAILED: a tensor between Kiln delegates went through host memory "
                             "(or the program has no linked delegates; rerun with "
                             "KILN_LOG_LEVEL=debug for the reason)");
            if (!ok) status = 1;
        }
    }

    std::vector<double> sorted = ms;
    std::sort(sorted.begin(), sorted.end());
    double mean = 0.0;
    for (double v : ms) mean += v / static_cast<double>(ms.size());
    size_t n = sorted.size();
    double median = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
    double p90 = sorted[std::min(n - 1, static_cast<size_t>(std::ceil(0.9 * n)) - 1)];
    std::printf("latency over %zu iterations (warmup %d): median %.4f ms, min %.4f ms, p90 %.4f "
                "ms, mean %.4f ms\n",
                n, args.warmup, median, sorted.front(), p90, mean);
    std::printf("kiln_runner: %s median_ms=%.4f\n", status == 0 ? "OK" : "FAILED", median);

    for (void *p : device_buffers) cuda.free_(p);
    if (caller_stream != nullptr) {
        kiln_set_thread_stream(nullptr);
        cuda.check(cuda.stream_destroy(caller_stream), "cudaStreamDestroy");
    }
    return status;
}
