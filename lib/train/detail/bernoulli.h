#pragma once

// Internal to dkit (TrainStep's dropout); not one of the installed headers.

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

namespace dkit::detail {

/// Fills `out` with 0 and 1 as `out.bernoulli_(p, generator)` does on the CPU, bit for bit, and leaves `generator`
/// (the default CPU generator when undefined) in the state bernoulli_ leaves it in, faster: LibTorch draws each
/// element's two Mersenne Twister outputs through a call, this draws them a block at a time. Returns false, having
/// drawn nothing, when `out` is not a contiguous float32, float64 or bfloat16 CPU tensor, `generator` not a CPU one
/// or in a state the Twister does not reach (a hand-made one), or bernoulli_matches() is false; the caller then calls
/// bernoulli_ itself.
bool fill_bernoulli(at::Tensor& out, double p, const at::Generator& generator = {});

/// Whether fill_bernoulli() gives this LibTorch's bernoulli_ bits and generator state: checked once per process,
/// on generators of its own, at sizes across the Twister's block boundaries, three probabilities and each dtype.
bool bernoulli_matches();

} // namespace dkit::detail
