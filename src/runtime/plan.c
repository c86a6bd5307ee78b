// SPDX-License-Identifier: Apache-2.0
// Releasing a plan: every array is kiln_malloc'd with its size given by the plan's counts.
#include <string.h>

#include "core/alloc.h"
#include "runtime/plan.h"

void kiln_plan_release(kiln_plan *plan) {
    if (plan == NULL) return;
    kiln_free(plan->tensors, (size_t)plan->n_tensors * sizeof *plan->tensors);
    kiln_free(plan->layers, (size_t)plan->n_layers * sizeof *plan->layers);
    kiln_free(plan->ids, (size_t)plan->n_ids * sizeof *plan->ids);
    kiln_free(plan->attr_refs, (size_t)plan->n_attr_refs * sizeof *plan->attr_refs);
    kiln_free(plan->ints, (size_t)plan->n_ints * sizeof *plan->ints);
    kiln_free(plan->floats, (size_t)plan->n_floats * sizeof *plan->floats);
    kiln_free(plan->inputs, (size_t)plan->n_inputs * sizeof *plan->inputs);
    kiln_free(plan->outputs, (size_t)plan->n_outputs * sizeof *plan->outputs);
    kiln_free(plan->strings, (size_t)plan->strings_nbytes);
    kiln_free(plan->weights, (size_t)plan->weights_nbytes);
    memset(plan, 0, sizeof *plan);
}
