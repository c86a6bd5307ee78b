// SPDX-License-Identifier: Apache-2.0
// The .pte check (kiln_pte_check, include/kiln/kiln_engine.h): an ExecuTorch program's
// flatbuffer walked in full before ExecuTorch loads it. ExecuTorch runs the flatbuffer Verifier
// (with InternalConsistency), but its method loader then dereferences fields that the Verifier
// allows to be absent (a BackendDelegate's processed data and compile specs, a compile spec's key,
// ...), so a damaged table crashes it. This check requires every field ExecuTorch's writer always
// writes (the fields that are not Optional in executorch/exir/schema.py) and checks the layout
// with the Verifier's rules (src/runtime/flatbuf.h). The schema below follows
// executorch/schema/program.fbs of the pinned ExecuTorch (1.5.1), field by field in declaration
// order.
//
// The file: [0, 4) root offset, [4, 8) "ET12", and at 8 an optional extended header "eh00",
// u32 length (>= 24), u64 program_size, u64 segment_base_offset[, u64 segment_data_size]; the
// flatbuffer is [0, program_size) (the whole file without the header), the segments follow.
#define _POSIX_C_SOURCE 200809L // sysconf
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/status.h"
#include "runtime/flatbuf.h"
#include "runtime/format.h"

enum {
    T_PROGRAM,
    T_PLAN,
    T_CONTAINER_META,
    T_EVALUE_NULL,
    T_INT,
    T_BOOL,
    T_DOUBLE,
    T_TENSOR,
    T_STRING,
    T_INT_LIST,
    T_DOUBLE_LIST,
    T_BOOL_LIST,
    T_TENSOR_LIST,
    T_OPT_TENSOR_LIST,
    T_ALLOCATION,
    T_EXTRA_TENSOR_INFO,
    T_EVALUE,
    T_CHAIN,
    T_INSTRUCTION,
    T_KERNEL_CALL,
    T_DELEGATE_CALL,
    T_MOVE_CALL,
    T_JUMP_FALSE_CALL,
    T_FREE_CALL,
    T_FRAME_LIST,
    T_FRAME,
    T_OPERATOR,
    T_DELEGATE,
    T_DELEGATE_REF,
    T_COMPILE_SPEC,
    T_BUFFER_DEVICE,
    T_BUFFER,
    T_INLINE_DATA,
    T_DATA_SEGMENT,
    T_SUBSEGMENTS,
    T_NAMED_DATA,
};
enum { U_KERNEL_TYPES, U_INSTRUCTION_ARGS };

#define S(name, n)                                                                                 \
    { name, KILN_FB_SCALAR, n, 0, 0 }
#define STR(name)                                                                                  \
    { name, KILN_FB_STRING, 1, 1, 0 }
#define OPT_STR(name)                                                                              \
    { name, KILN_FB_STRING, 1, 0, 0 }
#define VEC(name, n)                                                                               \
    { name, KILN_FB_VEC_SCALAR, n, 1, 0 }
#define VEC_T(name, t)                                                                             \
    { name, KILN_FB_VEC_TABLE, 4, 1, t }
#define OPT_VEC_T(name, t)                                                                         \
    { name, KILN_FB_VEC_TABLE, 4, 0, t }
#define TAB(name, t)                                                                               \
    { name, KILN_FB_TABLE, 4, 1, t }
#define OPT_TAB(name, t)                                                                           \
    { name, KILN_FB_TABLE, 4, 0, t }
#define UNION(name, u)                                                                             \
    { name, KILN_FB_UNION, 4, 1, u }
#define N(a) (uint32_t)(sizeof(a) / sizeof(a[0])), a

static const kiln_fb_field f_program[] = {
    S("version", 4),
    VEC_T("execution_plan", T_PLAN),
    VEC_T("constant_buffer", T_BUFFER),
    VEC_T("backend_delegate_data", T_INLINE_DATA),
    VEC_T("segments", T_DATA_SEGMENT),
    TAB("constant_segment", T_SUBSEGMENTS),
    OPT_VEC_T("mutable_data_segments", T_SUBSEGMENTS),
    OPT_VEC_T("named_data", T_NAMED_DATA),
};
static const kiln_fb_field f_plan[] = {
    STR("name"),
    TAB("container_meta_type", T_CONTAINER_META),
    VEC_T("values", T_EVALUE),
    VEC("inputs", 4),
    VEC("outputs", 4),
    VEC_T("chains", T_CHAIN),
    VEC_T("operators", T_OPERATOR),
    VEC_T("delegates", T_DELEGATE),
    VEC("non_const_buffer_sizes", 8),
    OPT_VEC_T("non_const_buffer_device", T_BUFFER_DEVICE),
};
static const kiln_fb_field f_container_meta[] = {STR("encoded_inp_str"), STR("encoded_out_str")};
static const kiln_fb_field f_int[] = {S("int_val", 8)};
static const kiln_fb_field f_bool[] = {S("bool_val", 1)};
static const kiln_fb_field f_double[] = {S("double_val", 8)};
static const kiln_fb_field f_tensor[] = {
    S("scalar_type", 1),
    S("storage_offset", 4),
    VEC("sizes", 4),
    VEC("dim_order", 1),
    S("requires_grad", 1),
    S("data_buffer_idx", 4),
    OPT_TAB("allocation_info", T_ALLOCATION),
    S("layout", 1),
    S("shape_dynamism", 1),
    OPT_TAB("extra_tensor_info", T_EXTRA_TENSOR_INFO),
};
static const kiln_fb_field f_string[] = {STR("string_val")};
static const kiln_fb_field f_int_list[] = {VEC("items", 8)};
static const kiln_fb_field f_double_list[] = {VEC("items", 8)};
static const kiln_fb_field f_bool_list[] = {VEC("items", 1)};
static const kiln_fb_field f_index_list[] = {VEC("items", 4)};
static const kiln_fb_field f_allocation[] = {S("memory_id", 4), S("memory_offset_low", 4),
                                             S("memory_offset_high", 4)};
static const kiln_fb_field f_extra_tensor_info[] = {
    S("mutable_data_segments_idx", 8), OPT_STR("fully_qualified_name"), S("location", 1),
    S("device_type", 1), S("device_index", 1)};
static const kiln_fb_field f_evalue[] = {UNION("val", U_KERNEL_TYPES)};
static const kiln_fb_field f_chain[] = {
    VEC("inputs", 4),
    VEC("outputs", 4),
    VEC_T("instructions", T_INSTRUCTION),
    OPT_VEC_T("stacktrace", T_FRAME_LIST),
};
static const kiln_fb_field f_instruction[] = {UNION("instr_args", U_INSTRUCTION_ARGS)};
static const kiln_fb_field f_kernel_call[] = {S("op_index", 4), VEC("args", 4)};
static const kiln_fb_field f_delegate_call[] = {S("delegate_index", 4), VEC("args", 4)};
static const kiln_fb_field f_move_call[] = {S("move_from", 4), S("move_to", 4)};
static const kiln_fb_field f_jump_false_call[] = {S("cond_value_index", 4),
                                                  S("destination_instruction", 4)};
static const kiln_fb_field f_free_call[] = {S("value_index", 4)};
static const kiln_fb_field f_frame_list[] = {VEC_T("items", T_FRAME)};
static const kiln_fb_field f_frame[] = {STR("filename"), S("lineno", 4), STR("name"),
                                        STR("context")};
static const kiln_fb_field f_operator[] = {STR("name"), STR("overload")};
static const kiln_fb_field f_delegate[] = {STR("id"), TAB("processed", T_DELEGATE_REF),
                                           VEC_T("compile_specs", T_COMPILE_SPEC)};
static const kiln_fb_field f_delegate_ref[] = {S("location", 1), S("index", 4)};
static const kiln_fb_field f_compile_spec[] = {STR("key"), VEC("value", 1)};
static const kiln_fb_field f_buffer_device[] = {S("buffer_idx", 4), S("device_type", 1),
                                                S("device_index", 1)};
static const kiln_fb_field f_buffer[] = {VEC("storage", 1)};
static const kiln_fb_field f_inline_data[] = {VEC("data", 1)};
static const kiln_fb_field f_data_segment[] = {S("offset", 8), S("size", 8)};
static const kiln_fb_field f_subsegments[] = {S("segment_index", 4), VEC("offsets", 8)};
static const kiln_fb_field f_named_data[] = {STR("key"), S("segment_index", 4)};

static const kiln_fb_table tables[] = {
    [T_PROGRAM] = {"Program", N(f_program)},
    [T_PLAN] = {"ExecutionPlan", N(f_plan)},
    [T_CONTAINER_META] = {"ContainerMetadata", N(f_container_meta)},
    [T_EVALUE_NULL] = {"Null", 0, NULL},
    [T_INT] = {"Int", N(f_int)},
    [T_BOOL] = {"Bool", N(f_bool)},
    [T_DOUBLE] = {"Double", N(f_double)},
    [T_TENSOR] = {"Tensor", N(f_tensor)},
    [T_STRING] = {"String", N(f_string)},
    [T_INT_LIST] = {"IntList", N(f_int_list)},
    [T_DOUBLE_LIST] = {"DoubleList", N(f_double_list)},
    [T_BOOL_LIST] = {"BoolList", N(f_bool_list)},
    [T_TENSOR_LIST] = {"TensorList", N(f_index_list)},
    [T_OPT_TENSOR_LIST] = {"OptionalTensorList", N(f_index_list)},
    [T_ALLOCATION] = {"AllocationDetails", N(f_allocation)},
    [T_EXTRA_TENSOR_INFO] = {"ExtraTensorInfo", N(f_extra_tensor_info)},
    [T_EVALUE] = {"EValue", N(f_evalue)},
    [T_CHAIN] = {"Chain", N(f_chain)},
    [T_INSTRUCTION] = {"Instruction", N(f_instruction)},
    [T_KERNEL_CALL] = {"KernelCall", N(f_kernel_call)},
    [T_DELEGATE_CALL] = {"DelegateCall", N(f_delegate_call)},
    [T_MOVE_CALL] = {"MoveCall", N(f_move_call)},
    [T_JUMP_FALSE_CALL] = {"JumpFalseCall", N(f_jump_false_call)},
    [T_FREE_CALL] = {"FreeCall", N(f_free_call)},
    [T_FRAME_LIST] = {"FrameList", N(f_frame_list)},
    [T_FRAME] = {"Frame", N(f_frame)},
    [T_OPERATOR] = {"Operator", N(f_operator)},
    [T_DELEGATE] = {"BackendDelegate", N(f_delegate)},
    [T_DELEGATE_REF] = {"BackendDelegateDataReference", N(f_delegate_ref)},
    [T_COMPILE_SPEC] = {"CompileSpec", N(f_compile_spec)},
    [T_BUFFER_DEVICE] = {"NonConstBufferDevice", N(f_buffer_device)},
    [T_BUFFER] = {"Buffer", N(f_buffer)},
    [T_INLINE_DATA] = {"BackendDelegateInlineData", N(f_inline_data)},
    [T_DATA_SEGMENT] = {"DataSegment", N(f_data_segment)},
    [T_SUBSEGMENTS] = {"SubsegmentOffsets", N(f_subsegments)},
    [T_NAMED_DATA] = {"NamedData", N(f_named_data)},
};

// union KernelTypes { Null, Int, Bool, Double, Tensor, String, IntList, DoubleList, BoolList,
// TensorList, OptionalTensorList } and union InstructionArguments { KernelCall, DelegateCall,
// MoveCall, JumpFalseCall, FreeCall }, in program.fbs order (type 1 first).
static const int8_t kernel_types[] = {T_EVALUE_NULL, T_INT,         T_BOOL,           T_DOUBLE,
                                      T_TENSOR,      T_STRING,      T_INT_LIST,       T_DOUBLE_LIST,
                                      T_BOOL_LIST,   T_TENSOR_LIST, T_OPT_TENSOR_LIST};
static const int8_t instruction_args[] = {T_KERNEL_CALL, T_DELEGATE_CALL, T_MOVE_CALL,
                                          T_JUMP_FALSE_CALL, T_FREE_CALL};
static const kiln_fb_union unions[] = {
    [U_KERNEL_TYPES] = {"KernelTypes", N(kernel_types)},
    [U_INSTRUCTION_ARGS] = {"InstructionArguments", N(instruction_args)},
};

static const kiln_fb_schema program_schema = {".pte", tables, unions, T_PROGRAM};

#define PTE_HEADER_AT 8
#define PTE_HEADER_MIN 24u

// The flatbuffer's length: program_size from the extended header, or the whole file.
static kiln_status program_size(const uint8_t *head, size_t head_n, uint64_t file_n,
                                uint64_t *out) {
    KILN_CHECK(file_n >= 8 && head_n >= 8 && memcmp(head + 4, "ET12", 4) == 0, KILN_ERR_CORRUPT,
               ".pte: not an ExecuTorch program (file identifier %s, expected \"ET12\"); pass the "
               ".pte written by kiln.executorch.save or ExecutorchProgramManager",
               file_n >= 8 && head_n >= 8 ? "differs" : "missing: the file is too short");
    *out = file_n;
    if (head_n < PTE_HEADER_AT + PTE_HEADER_MIN || memcmp(head + PTE_HEADER_AT, "eh00", 4) != 0) {
        return KILN_OK; // no extended header: the flatbuffer is the whole file
    }
    uint32_t len = kiln_rd_u32(head + 12);
    uint64_t size = kiln_rd_u64(head + 16), base = kiln_rd_u64(head + 24);
    KILN_CHECK(len >= PTE_HEADER_MIN, KILN_ERR_CORRUPT,
               ".pte: extended header length %" PRIu32 " is below %u: the file is damaged; "
               "re-export it, or the file was damaged in transit",
               len, PTE_HEADER_MIN);
    KILN_CHECK(
        size >= PTE_HEADER_AT + PTE_HEADER_MIN && size <= file_n && base >= size && base <= file_n,
        KILN_ERR_CORRUPT,
        ".pte: program_size %" PRIu64 " and segment_base_offset %" PRIu64 " do not fit the %" PRIu64
        "-byte file: the file is damaged; re-export it, or the file was damaged in transit",
        size, base, file_n);
    if (len >= 32) {
        uint64_t data = kiln_rd_u64(head + 32), end;
        KILN_CHECK(kiln_add_u64(base, data, &end) && end <= file_n, KILN_ERR_CORRUPT,
                   ".pte: segment_base_offset %" PRIu64 " + segment_data_size %" PRIu64
                   " runs past the %" PRIu64 "-byte file: the file is damaged or truncated; "
                   "re-export it, or the file was damaged in transit",
                   base, data, file_n);
    }
    *out = size;
    return KILN_OK;
}

// --- what the indices in a program mean: every index stays inside what it indexes. ExecuTorch
// checks some of these where it uses them and aborts or reads out of bounds on others (an output
// value index, for one, reaches an assert that aborts the process).

#define IDX_MSG "; the file is damaged; re-export it, or the file was damaged in transit"

static int64_t i32_at(const uint8_t *b, uint64_t vec, uint32_t i) {
    uint32_t u = kiln_rd_u32(b + vec + 4 + 4 * (uint64_t)i);
    return u <= INT32_MAX ? (int64_t)u : (int64_t)u - 4294967296;
}

// Every entry of an int vector in [lo, n) (lo -1: "none" allowed).
static kiln_status check_indices(const uint8_t *b, uint64_t vec, int64_t lo, uint64_t n,
                                 uint32_t plan, const char *what, uint32_t at_index) {
    for (uint32_t i = 0; i < kiln_fb_len(b, vec); i++) {
        int64_t v = i32_at(b, vec, i);
        KILN_CHECK(v >= lo && (v < 0 || (uint64_t)v < n), KILN_ERR_CORRUPT,
                   ".pte: execution_plan[%" PRIu32 "].%s %" PRIu32 ": index %" PRId64
                   " (entry %" PRIu32 ") is outside 0..%" PRIu64 IDX_MSG,
                   plan, what, at_index, v, i, n);
    }
    return KILN_OK;
}

static kiln_status check_index(int64_t v, uint64_t n, uint32_t plan, const char *what,
                               uint32_t at_index) {
    KILN_CHECK(v >= 0 && (uint64_t)v < n, KILN_ERR_CORRUPT,
               ".pte: execution_plan[%" PRIu32 "].%s %" PRIu32 ": index %" PRId64
               " is outside 0..%" PRIu64 IDX_MSG,
               plan, what, at_index, v, n);
    return KILN_OK;
}

static kiln_status check_tensor(const uint8_t *b, uint64_t t, uint32_t plan, uint32_t value,
                                uint64_t n_data, uint64_t n_planned) {
    uint64_t sizes = kiln_fb_ref_field(b, t, 2), order = kiln_fb_ref_field(b, t, 3);
    uint32_t rank = kiln_fb_len(b, sizes);
    KILN_CHECK(kiln_fb_len(b, order) == rank && rank <= 64, KILN_ERR_CORRUPT,
               ".pte: execution_plan[%" PRIu32 "].values %" PRIu32 ": a tensor of %" PRIu32
               " sizes has %" PRIu32 " dim_order entries" IDX_MSG,
               plan, value, rank, kiln_fb_len(b, order));
    uint64_t seen = 0;
    for (uint32_t d = 0; d < rank; d++) {
        uint8_t o = b[order + 4 + d];
        KILN_CHECK(
            i32_at(b, sizes, d) >= 0 && o < rank && !(seen >> o & 1u), KILN_ERR_CORRUPT,
            ".pte: execution_plan[%" PRIu32 "].values %" PRIu32
            ": a tensor has a negative size or a dim_order that is not a permutation" IDX_MSG,
            plan, value);
        seen |= UINT64_C(1) << o;
    }
    uint64_t buf = kiln_fb_u(b, t, 5, 4);
    KILN_CHECK(buf == 0 || buf < n_data, KILN_ERR_CORRUPT,
               ".pte: execution_plan[%" PRIu32 "].values %" PRIu32 ": data_buffer_idx %" PRIu64
               " is outside the %" PRIu64 " constant buffers" IDX_MSG,
               plan, value, buf, n_data);
    uint64_t alloc = kiln_fb_ref_field(b, t, 6);
    if (alloc != 0) {
        uint64_t mem = kiln_fb_u(b, alloc, 0, 4);
        KILN_CHECK(mem < n_planned, KILN_ERR_CORRUPT,
                   ".pte: execution_plan[%" PRIu32 "].values %" PRIu32 ": memory_id %" PRIu64
                   " is outside the %" PRIu64 " planned buffers" IDX_MSG,
                   plan, value, mem, n_planned);
    }
    return KILN_OK;
}

// The machine's physical memory (UINT64_MAX when unknown).
static uint64_t physical_memory(void) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : UINT64_MAX;
}

// ExecuTorch allocates (and zeroes) a method's planned buffers as the file sizes them, when the
// program or the method loads: a damaged size must not take the machine's memory.
static kiln_status check_planned(const uint8_t *b, uint64_t sizes, uint32_t pi) {
    uint64_t total = 0, limit = physical_memory();
    for (uint32_t i = 0; i < kiln_fb_len(b, sizes); i++) {
        uint64_t u = kiln_rd_u64(b + sizes + 4 + 8 * (uint64_t)i);
        KILN_CHECK(u <= INT64_MAX, KILN_ERR_CORRUPT,
                   ".pte: execution_plan[%" PRIu32 "].non_const_buffer_sizes[%" PRIu32
                   "] is negative" IDX_MSG,
                   pi, i);
        KILN_CHECK(kiln_add_u64(total, u, &total) && total <= limit, KILN_ERR_NO_MEMORY,
                   ".pte: execution_plan[%" PRIu32 "] plans more than %" PRIu64
                   " bytes of memory (buffer %" PRIu32 ": %" PRIu64
                   " bytes), this machine's physical memory: the program is damaged, or too "
                   "large for this machine; re-export it",
                   pi, limit, i, u);
    }
    return KILN_OK;
}

static kiln_status check_plan(const uint8_t *b, uint64_t p, uint32_t pi, uint64_t n_data,
                              uint64_t n_inline, uint64_t n_segments) {
    uint64_t values = kiln_fb_ref_field(b, p, 2), chains = kiln_fb_ref_field(b, p, 5);
    uint64_t nv = kiln_fb_len(b, values), nops = kiln_fb_len(b, kiln_fb_ref_field(b, p, 6));
    uint64_t delegates = kiln_fb_ref_field(b, p, 7);
    uint64_t nd = kiln_fb_len(b, delegates), nbuf = kiln_fb_len(b, kiln_fb_ref_field(b, p, 8));
    KILN_TRY(check_planned(b, kiln_fb_ref_field(b, p, 8), pi));
    KILN_TRY(check_indices(b, kiln_fb_ref_field(b, p, 3), 0, nv, pi, "inputs", 0));
    KILN_TRY(check_indices(b, kiln_fb_ref_field(b, p, 4), 0, nv, pi, "outputs", 0));
    for (uint32_t i = 0; i < nv; i++) {
        uint64_t ev = kiln_fb_elem(b, values, i);
        uint32_t type = b[kiln_fb_slot(b, ev, 0)]; // the walk checked it is present and valid
        uint64_t val = kiln_fb_ref_field(b, ev, 1);
        if (type == 5) KILN_TRY(check_tensor(b, val, pi, i, n_data, nbuf));
        if (type == 10)
            KILN_TRY(check_indices(b, kiln_fb_ref_field(b, val, 0), 0, nv, pi, "values", i));
        if (type == 11)
            KILN_TRY(check_indices(b, kiln_fb_ref_field(b, val, 0), -1, nv, pi, "values", i));
    }
    for (uint32_t c = 0; c < kiln_fb_len(b, chains); c++) {
        uint64_t ch = kiln_fb_elem(b, chains, c), ins = kiln_fb_ref_field(b, ch, 2);
        uint32_t n_ins = kiln_fb_len(b, ins);
        KILN_TRY(check_indices(b, kiln_fb_ref_field(b, ch, 0), 0, nv, pi, "chains.inputs", c));
        KILN_TRY(check_indices(b, kiln_fb_ref_field(b, ch, 1), 0, nv, pi, "chains.outputs", c));
        for (uint32_t k = 0; k < n_ins; k++) {
            uint64_t in = kiln_fb_elem(b, ins, k);
            uint32_t type = b[kiln_fb_slot(b, in, 0)];
            uint64_t a = kiln_fb_ref_field(b, in, 1);
            switch (type) {
            case 1: // KernelCall
                KILN_TRY(check_index(kiln_fb_i32(b, a, 0), nops, pi, "kernel call", k));
                KILN_TRY(check_indices(b, kiln_fb_ref_field(b, a, 1), 0, nv, pi, "kernel call", k));
                break;
            case 2: // DelegateCall
                KILN_TRY(check_index(kiln_fb_i32(b, a, 0), nd, pi, "delegate call", k));
                KILN_TRY(
                    check_indices(b, kiln_fb_ref_field(b, a, 1), 0, nv, pi, "delegate call", k));
                break;
            case 3: // MoveCall
                KILN_TRY(check_index(kiln_fb_i32(b, a, 0), nv, pi, "move", k));
                KILN_TRY(check_index(kiln_fb_i32(b, a, 1), nv, pi, "move", k));
                break;
            case 4: // JumpFalseCall
                KILN_TRY(check_index(kiln_fb_i32(b, a, 0), nv, pi, "jump", k));
                KILN_TRY(check_index(kiln_fb_i32(b, a, 1), (uint64_t)n_ins + 1, pi, "jump", k));
                break;
            default: // FreeCall
                KILN_TRY(check_index(kiln_fb_i32(b, a, 0), nv, pi, "free", k));
                break;
            }
        }
    }
    for (uint32_t i = 0; i < nd; i++) {
        uint64_t ref = kiln_fb_ref_field(b, kiln_fb_elem(b, delegates, i), 1);
        uint64_t loc = kiln_fb_u(b, ref, 0, 1), idx = kiln_fb_u(b, ref, 1, 4);
        KILN_CHECK(loc <= 1 && idx < (loc == 0 ? n_inline : n_segments), KILN_ERR_CORRUPT,
                   ".pte: execution_plan[%" PRIu32 "].delegates %" PRIu32
                   ": its data (location %" PRIu64 ", index %" PRIu64
                   ") is neither an inline blob (%" PRIu64 ") nor a segment (%" PRIu64 ")" IDX_MSG,
                   pi, i, loc, idx, n_inline, n_segments);
    }
    uint64_t devs = kiln_fb_ref_field(b, p, 9);
    for (uint32_t i = 0; i < kiln_fb_len(b, devs); i++) {
        uint64_t d = kiln_fb_elem(b, devs, i);
        KILN_TRY(check_index(kiln_fb_i32(b, d, 0), nbuf, pi, "non_const_buffer_device", i));
        KILN_CHECK(kiln_fb_u(b, d, 1, 1) <= 1, KILN_ERR_CORRUPT,
                   ".pte: execution_plan[%" PRIu32 "].non_const_buffer_device %" PRIu32
                   ": device type %" PRIu64 " is not CPU (0) or CUDA (1)" IDX_MSG,
                   pi, i, kiln_fb_u(b, d, 1, 1));
    }
    return KILN_OK;
}

static kiln_status check_program(const uint8_t *b) {
    uint64_t prog = kiln_fb_root(b);
    uint64_t plans = kiln_fb_ref_field(b, prog, 1), segments = kiln_fb_ref_field(b, prog, 4);
    uint64_t n_segments = kiln_fb_len(b, segments);
    uint64_t n_inline = kiln_fb_len(b, kiln_fb_ref_field(b, prog, 3));
    uint64_t constant = kiln_fb_ref_field(b, prog, 5);
    uint64_t n_offsets = kiln_fb_len(b, kiln_fb_ref_field(b, constant, 1));
    // data_buffer_idx indexes constant_buffer, or the constant segment's offsets when the
    // program keeps its constants in a segment.
    uint64_t n_data = kiln_fb_len(b, kiln_fb_ref_field(b, prog, 2));
    if (n_offsets > n_data) n_data = n_offsets;
    KILN_CHECK(n_offsets == 0 || kiln_fb_u(b, constant, 0, 4) < n_segments, KILN_ERR_CORRUPT,
               ".pte: constant_segment.segment_index %" PRIu64 " is outside the %" PRIu64
               " segments" IDX_MSG,
               kiln_fb_u(b, constant, 0, 4), n_segments);
    uint64_t named = kiln_fb_ref_field(b, prog, 7);
    for (uint32_t i = 0; i < kiln_fb_len(b, named); i++) {
        uint64_t seg = kiln_fb_u(b, kiln_fb_elem(b, named, i), 1, 4);
        KILN_CHECK(seg < n_segments, KILN_ERR_CORRUPT,
                   ".pte: named_data[%" PRIu32 "].segment_index %" PRIu64 " is outside the %" PRIu64
                   " segments" IDX_MSG,
                   i, seg, n_segments);
    }
    uint64_t mutables = kiln_fb_ref_field(b, prog, 6);
    for (uint32_t i = 0; i < kiln_fb_len(b, mutables); i++) {
        uint64_t m = kiln_fb_elem(b, mutables, i);
        KILN_CHECK(kiln_fb_len(b, kiln_fb_ref_field(b, m, 1)) == 0 ||
                       kiln_fb_u(b, m, 0, 4) < n_segments,
                   KILN_ERR_CORRUPT,
                   ".pte: mutable_data_segments[%" PRIu32 "].segment_index is outside the %" PRIu64
                   " segments" IDX_MSG,
                   i, n_segments);
    }
    for (uint32_t p = 0; p < kiln_fb_len(b, plans); p++) {
        KILN_TRY(check_plan(b, kiln_fb_elem(b, plans, p), p, n_data, n_inline, n_segments));
    }
    return KILN_OK;
}

static kiln_status check_all(const uint8_t *b, uint64_t size) {
    KILN_TRY(kiln_fb_check(&program_schema, b, size));
    return check_program(b);
}

kiln_status kiln_pte_check(const void *data, size_t nbytes) {
    KILN_CHECK(data != NULL || nbytes == 0, KILN_ERR_INVALID_ARG,
               "kiln_pte_check: data is NULL but nbytes = %zu", nbytes);
    if (data == NULL) data = "";
    uint64_t size = 0;
    KILN_TRY(program_size(data, nbytes, nbytes, &size));
    return check_all(data, size);
}

kiln_status kiln_pte_check_file(const char *path) {
    KILN_CHECK(path != NULL, KILN_ERR_INVALID_ARG, "kiln_pte_check_file: path is NULL");
    FILE *fp = fopen(path, "rb");
    KILN_CHECK(fp != NULL, KILN_ERR_IO, "cannot open the program '%s'", path);
    uint8_t head[PTE_HEADER_AT + 32];
    size_t got = fread(head, 1, sizeof head, fp);
    int read_error = ferror(fp);
    long end = -1;
    if (fseek(fp, 0, SEEK_END) == 0) end = ftell(fp);
    uint64_t size = 0;
    kiln_status st;
    if (read_error || end < 0) {
        st = kiln_fail(KILN_ERR_IO, "cannot read the program '%s' (a directory?)", path);
    } else if ((st = program_size(head, got, (uint64_t)end, &size)) == KILN_OK) {
        // The flatbuffer only, not the segments (the engines and weights: checked at load).
        uint8_t *buf = size <= SIZE_MAX ? kiln_malloc((size_t)size + 1, KILN_ALIGN) : NULL;
        if (buf == NULL) {
            st =
                kiln_fail(KILN_ERR_NO_MEMORY,
                          "out of memory reading the %" PRIu64 "-byte program of '%s'", size, path);
        } else {
            if (fseek(fp, 0, SEEK_SET) != 0 || fread(buf, 1, (size_t)size, fp) != (size_t)size)
                st = kiln_fail(KILN_ERR_IO, "cannot read the program '%s'", path);
            else
                st = check_all(buf, size);
            kiln_free(buf, (size_t)size + 1);
        }
    }
    fclose(fp);
    if (st == KILN_ERR_CORRUPT) {
        char msg[3072];
        snprintf(msg, sizeof msg, "%s", kiln_last_error());
        return kiln_fail(st, "program '%s': %s", path, msg);
    }
    return st;
}
