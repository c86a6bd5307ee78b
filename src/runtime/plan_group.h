// SPDX-License-Identifier: Apache-2.0
// A fused group of the plan as a backend runs it: a head layer, then n_tail TAIL layers that
// each read the running value once and write it in place (the loader proves this shape, so
// backends walk groups without re-checking). Header-only: the CUDA plugin, which does not link
// libkiln, uses it too.
#ifndef KILN_RUNTIME_PLAN_GROUP_H
#define KILN_RUNTIME_PLAN_GROUP_H

#include <string.h>

#include "runtime/kernel.h"
#include "runtime/plan.h"

// The tensor the group of head li writes last (the head's output, or its last tail's).
static inline int32_t kiln_plan_group_output(const kiln_plan *p, uint32_t li) {
    const kiln_plan_layer *l = &p->layers[li];
    int32_t running = p->ids[l->output_begin];
    for (uint32_t t = 0; t < l->n_tail && li + 1 + t < p->n_layers; t++) {
        running = p->ids[p->layers[li + 1 + t].output_begin];
    }
    return running;
}

// The kernel arguments of head layer li over views (one per plan tensor); tails (KILN_MAX_TAIL
// entries) receives its fused tail. The head writes the group's final tensor (tails write the
// head's output in place, so it is the head's own output) and the tails then run over it.
static inline void kiln_plan_group_args(const kiln_plan *p, uint32_t li, kiln_tensor *views,
                                        kiln_tail_op *tails, kiln_kernel_args *args) {
    const kiln_plan_layer *l = &p->layers[li];
    int32_t running = p->ids[l->output_begin];
    memset(args, 0, sizeof *args);
    args->op = l->op;
    args->attrs = kiln_plan_layer_attrs(p, l);
    for (uint32_t j = 0; j < l->n_inputs && j < KILN_MAX_INPUTS; j++) {
        int32_t id = p->ids[l->input_begin + j];
        args->in[j] = id < 0 ? NULL : &views[id];
    }
    args->n_in = l->n_inputs;
    for (uint32_t t = 0; t < l->n_tail && t < KILN_MAX_TAIL; t++) {
        const kiln_plan_layer *tl = &p->layers[li + 1 + t];
        int32_t a = p->ids[tl->input_begin];
        int32_t b = tl->n_inputs > 1 ? p->ids[tl->input_begin + 1] : -1;
        tails[t].op = tl->op;
        tails[t].attrs = kiln_plan_layer_attrs(p, tl);
        tails[t].running_is_lhs = a == running;
        // y = op(y, y) reads the running value as its operand too: the operand is the output.
        tails[t].operand = tl->n_inputs < 2 ? NULL : a == running ? &views[b] : &views[a];
        running = p->ids[tl->output_begin];
    }
    args->out = &views[running];
    args->tail = tails;
    args->n_tail = l->n_tail;
}

#endif // KILN_RUNTIME_PLAN_GROUP_H
