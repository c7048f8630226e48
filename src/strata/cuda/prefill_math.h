// The arithmetic of the batched GPU prefill (GpuPrefill, prefill.h), as a named option.
//
// Exact: every product in float32 (projections through cuBLAS SGEMM on weights decoded to float, routed
//   experts through a grouped fp32 kernel). Logits equal the token-by-token decode path's to float
//   rounding of the sums (~1e-6 relative); the price is CUDA-core speed (~50 TFLOP/s at best on an H100).
// Fast: the projections and the routed / shared experts multiply weights decoded to fp16 with activations
//   rounded to fp16 on the tensor cores, accumulating in float32 (cuBLAS GemmEx for the dense matrices, a
//   WMMA grouped kernel for the experts). Rounding the activations and weights to 11-bit mantissas moves
//   logits by ~1e-3 relative; greedy tokens normally stay the same but can flip where two candidates are
//   that close. The router, the shared-expert gate, the output projection, every norm, the attention and
//   the DeltaNet recurrence stay float32 in both modes, so expert choice is as exact as in Exact mode
//   unless two router probabilities tie within that rounding of the FFN input.
// Plain C++ header.
#pragma once

namespace strata::cuda {

enum class PrefillMath { Exact, Fast };

inline const char* prefill_math_name(PrefillMath m) { return m == PrefillMath::Exact ? "exact" : "fast"; }

}  // namespace strata::cuda
