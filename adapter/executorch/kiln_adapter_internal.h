// SPDX-License-Identifier: Apache-2.0
// What the two files of libkiln_executorch.so share (not exported: see kiln_executorch.map).
#ifndef KILN_ADAPTER_INTERNAL_H
#define KILN_ADAPTER_INTERNAL_H

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/kiln_engine.h"
#include "kiln/kiln_program.h"

// The most memory one method may plan: kiln_program_set_planned_limit's value, or the machine's
// physical memory when none was set. Applies to ExecuTorch's planned buffers (the program API)
// and to the activation arena of a Kiln engine that runs on the CPU (the delegate).
uint64_t kiln_adapter_planned_limit();

// --- links between the Kiln delegates of a method (kiln_links.cpp; docs/runtime.md, "Between
// delegates")
namespace kiln_link {

// The compile spec that carries a delegate's link record.
constexpr const char *kSpecKey = "kiln.link";

// A delegate's link record, as the export writes it (docs/runtime.md has the byte layout).
struct OutputLink {
    uint32_t output;    // the engine's output index
    uint32_t n_readers; // Kiln delegate inputs of the method that read it
    bool host;          // a reader outside Kiln (a kernel, the method's outputs) needs it too
};
struct InputLink {
    uint32_t input;           // the engine's input index
    uint32_t producer;        // the delegate (its id in the group) whose output it is
    uint32_t producer_output; // that delegate's output index
};
struct Record {
    uint64_t group = 0;    // the same for every Kiln delegate of a method
    uint32_t delegate = 0; // this delegate's id in the group
    std::vector<OutputLink> outputs;
    std::vector<InputLink> inputs;
};

enum class Parse { kOk, kNewer, kCorrupt };
// Checks a record (magic, version, CRC-32, sizes, every index against the engine's counts) and
// reads it. kNewer: written by a newer Kiln (not used); kCorrupt: damaged; *why says what.
Parse parse_record(const void *data, size_t nbytes, uint32_t n_inputs, uint32_t n_outputs,
                   Record *out, std::string *why);

struct Slot;

// One delegate's side of its links: the memory and publications of its linked outputs, the
// producers of its linked inputs. Used by the thread that executes the delegate; what other
// delegates read of it is guarded by a process-wide mutex.
class DelegateLinks {
  public:
    DelegateLinks() = default;
    DelegateLinks(const DelegateLinks &) = delete;
    DelegateLinks &operator=(const DelegateLinks &) = delete;
    ~DelegateLinks(); // unpublishes its outputs, then frees their memory

    // Allocates memory where the engine runs for each linked output (on the CPU only up to
    // host_limit bytes) and registers it. An output without memory stays unlinked: *notes says
    // why (then it is copied to its host buffer as without links).
    void setup(const kiln_engine *engine, const Record &record, uint64_t host_limit,
               std::string *notes);
    bool has_outputs() const { return !slots_.empty(); }
    bool has_inputs() const { return !inputs_.empty(); }

    // Producer, before binding: clears this delegate's publications (a failed execute leaves
    // none).
    void begin_execute();
    // The memory to bind output `output` to (nullptr: not linked; bind the host buffer).
    void *output_memory(uint32_t output, size_t *capacity) const;
    // Producer, after a successful execute: copies a linked output to its host buffer unless no
    // reader outside Kiln needs it and every Kiln reader took the link last run, then publishes
    // it (its host buffer, dtype and shape) for the readers of this run. An output whose host
    // tensor has another size than the engine's output is copied, not published (larger: a
    // failure, *why says why; otherwise Kiln's message is kiln_last_error()).
    kiln_status publish(uint32_t output, void *host, size_t host_nbytes, kiln_dtype dtype,
                        uint32_t rank, const int64_t *dims, std::string *why);
    // Reader: the memory to bind input `input` to: the producer's memory when its publication of
    // this run stands for `host` with this dtype and shape on this device, else `host` (written
    // from the producer's memory first if the producer kept it there). *why is set the first
    // time an input falls back, with the reason.
    kiln_status input_memory(uint32_t input, const void *host, kiln_dtype dtype, uint32_t rank,
                             const int64_t *dims, const void **out, std::string *why);

  private:
    const kiln_engine *engine_ = nullptr;
    uint64_t group_ = 0;
    uint32_t delegate_ = 0;
    std::vector<Slot *> slots_; // owned
    std::vector<int> slot_of_;  // per engine output: index in slots_, -1: not linked
    std::vector<InputLink> inputs_;
    std::vector<int> input_of_; // per engine input: index in inputs_, -1: not linked
    std::vector<char> input_noted_;
};

void stats_get(kiln_executorch_link_stats *out);
void stats_reset();

} // namespace kiln_link

#endif // KILN_ADAPTER_INTERNAL_H
