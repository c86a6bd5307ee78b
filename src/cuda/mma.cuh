// SPDX-License-Identifier: Apache-2.0
// Tensor-core helpers shared by the kernels that use mma.sync (sm_80 and later): the
// m16n8k16 float16/bfloat16 MMA with float32 accumulation, packing two floats into one
// 16-bit-pair register, and 16-byte cp.async copies. Fragment layouts (PTX ISA, mma.m16n8k16,
// g = lane / 4, t = lane % 4): A regs {(g, 2t..2t+1), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..)};
// B regs {(k 2t..2t+1, n g), (k 2t+8.., n g)}; C {(g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)}.
#ifndef KILN_CUDA_MMA_CUH
#define KILN_CUDA_MMA_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

// c += A B for one m16n8k16 tile (a: 4 registers, b0/b1: the 2 B registers) of element type TY
// ("f16" or "bf16").
#define KC_MMA_16816(TY, c, a, b0, b1)                                                             \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TY "." TY ".f32 {%0,%1,%2,%3}, "         \
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"                                        \
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                  \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))

template <typename T> struct kc_mma;
template <> struct kc_mma<__half> {
    static __device__ __forceinline__ void mma(float *c, const uint32_t *a, uint32_t b0,
                                               uint32_t b1) {
        KC_MMA_16816("f16", c, a, b0, b1);
    }
    // two floats as one register of the element type (.x, the low half, = lo)
    static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
        __half2 h = __floats2half2_rn(lo, hi);
        uint32_t u;
        memcpy(&u, &h, sizeof u);
        return u;
    }
};
template <> struct kc_mma<__nv_bfloat16> {
    static __device__ __forceinline__ void mma(float *c, const uint32_t *a, uint32_t b0,
                                               uint32_t b1) {
        KC_MMA_16816("bf16", c, a, b0, b1);
    }
    static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
        __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
        uint32_t u;
        memcpy(&u, &h, sizeof u);
        return u;
    }
};

// Four 8x8 16-bit matrices from shared memory (ldmatrix, not transposed): lane l gives the row
// address of matrix l / 8, row l % 8 (16-byte aligned); r[i] receives matrix i's fragment (row
// lane / 4, elements 2 (lane % 4), +1), the B operand layout of an [n][k] tile.
__device__ __forceinline__ void kc_ldmatrix_x4(uint32_t *r, const uint16_t *row) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

// The same, transposed (ldmatrix .trans): the B operand layout of a [k][n] tile (V in P V).
__device__ __forceinline__ void kc_ldmatrix_x4_t(uint32_t *r, const uint16_t *row) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

// 16 bytes global -> shared without a register round trip; `valid` 0 writes zeros.
__device__ __forceinline__ void kc_cp_async16(uint16_t *dst, const uint16_t *src, bool valid) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(dst);
    const int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(a), "l"(src), "r"(n)
                 : "memory");
}

// The same copy to a shared-memory address already converted (__cvta_generic_to_shared), so that a
// loop of copies adds constant offsets instead of converting each destination.
__device__ __forceinline__ void kc_cp_async16_s(unsigned dst, const uint16_t *src, bool valid) {
    const int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n)
                 : "memory");
}

#endif // KILN_CUDA_MMA_CUH
