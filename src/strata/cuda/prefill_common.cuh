// Device helpers of the prefill_*.cu kernels: the shared reductions and activations of device_math.cuh
// (the same ones the decode kernels use, so both paths round alike).
#pragma once

#include "strata/cuda/device_math.cuh"
