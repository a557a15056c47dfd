#include "engine/nn/dropout.h"

#include "engine/error.h"
#include "engine/ops/dropout.h"

namespace nd::nn {

DropoutImpl::DropoutImpl(const DropoutOptions& options_) : Module("Dropout"), options(options_) {
  ND_CHECK(options.p() >= 0 && options.p() <= 1, "Dropout: p must be in [0, 1], got ", options.p());
}

Tensor DropoutImpl::forward(const Tensor& input) { return dropout(input, options.p(), is_training()); }

}  // namespace nd::nn
