#pragma once
// Activation checkpointing: torch.utils.checkpoint.checkpoint(fn, *inputs,
// use_reentrant=False). The forward runs fn with grad mode off, so none of its
// intermediate activations are kept; the graph gets one CheckpointBackward node holding
// only the inputs, the default generator's (seed, offset) and the autocast state. Its
// backward runs fn again with grad mode on, from the same generator state (dropout draws
// the same masks) and the same autocast state, backpropagates through that recomputed
// graph and frees it. Memory: a model of n checkpointed blocks keeps each block's input
// instead of all its activations, at the price of a second forward of each block.
//
// The gradients are those of fn run plainly, bit for bit (the recomputation does the same
// operations in the same order). Like the non-reentrant PyTorch version, gradients also
// flow to tensors fn reads that are not among `inputs` (a module's parameters, tensors it
// closes over): the node has an edge to each of them, found by watching the no-grad
// forward for tensors that require grad (autograd::detail::ReadCapture), so each
// parameter's AccumulateGrad and its post-accumulate hooks (DDP's) run once, in the outer
// backward, exactly as without checkpointing. fn must be deterministic in what it reads
// and computes apart from the generator: a recomputation that reads another tensor that
// requires grad, or returns other shapes, is an nd::Error. A module that changes its own
// state in forward (BatchNorm's running statistics in training mode) changes it again in
// the recomputation, as under PyTorch's checkpoint.
//
// Grad mode off when checkpoint is called: fn runs plainly. No input and nothing fn reads
// requires grad: fn's outputs, with no graph (as PyTorch). fn must return at least one
// tensor, all defined (PyTorch's non-tensor outputs have no C++ counterpart; an undefined
// Tensor is the error). A second backward through the node without retain_graph is the
// usual "backward through the graph a second time" error; an input changed in place
// between forward and backward, the usual version-counter error.
// Tests: tests/engine/activation_checkpoint_test.cpp; under DDP,
// tests/dist/ddp_checkpoint_test.cpp.
#include <functional>
#include <type_traits>
#include <utility>
#include <vector>

#include "engine/tensor.h"

namespace nd {

using CheckpointFunction = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

std::vector<Tensor> checkpoint(CheckpointFunction fn, const std::vector<Tensor>& inputs);

// Tensors in, one tensor out: checkpoint([&](const Tensor& x) { return block(x); }, x).
template <class Fn, class... Ts>
  requires(sizeof...(Ts) > 0 && (std::is_same_v<Ts, Tensor> && ...) &&
           std::is_invocable_r_v<Tensor, Fn&, const Ts&...>)
Tensor checkpoint(Fn fn, const Ts&... inputs) {
  auto call = [fn = std::move(fn)](const std::vector<Tensor>& in) mutable {
    return [&]<size_t... I>(std::index_sequence<I...>) {
      return std::vector<Tensor>{fn(in[I]...)};
    }(std::index_sequence_for<Ts...>{});
  };
  return checkpoint(CheckpointFunction(std::move(call)), std::vector<Tensor>{inputs...})[0];
}

}  // namespace nd
