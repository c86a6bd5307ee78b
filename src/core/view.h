// SPDX-License-Identifier: Apache-2.0
// The strides of a reshape done as a view (no bytes moved), shared by the builder's view pass and
// the CUDA backend's attention fold.
#ifndef KILN_CORE_VIEW_H
#define KILN_CORE_VIEW_H

#include <stdint.h>

// The strides nst of a view of sizes nsz (m dims) over a tensor of sizes osz and strides ost (n
// dims), when one exists without a copy (PyTorch's rule for Tensor.view: each run of dims
// contiguous with each other is split or merged only within itself); 0 otherwise.
static inline int kiln_view_strides(const int64_t *osz, const int64_t *ost, int n,
                                    const int64_t *nsz, int m, int64_t *nst) {
    if (n == 0) {
        for (int i = 0; i < m; i++) nst[i] = 1;
        return 1;
    }
    int view_d = m - 1;
    int64_t base = ost[n - 1], tensor_numel = 1, view_numel = 1;
    for (int d = n - 1; d >= 0; d--) {
        tensor_numel *= osz[d];
        if (d == 0 || (osz[d - 1] != 1 && ost[d - 1] != tensor_numel * base)) {
            while (view_d >= 0 && (view_numel < tensor_numel || nsz[view_d] == 1)) {
                nst[view_d] = view_numel * base;
                view_numel *= nsz[view_d];
                view_d--;
            }
            if (view_numel != tensor_numel) return 0;
            if (d > 0) {
                base = ost[d - 1];
                tensor_numel = view_numel = 1;
            }
        }
    }
    return view_d == -1;
}

#endif // KILN_CORE_VIEW_H
