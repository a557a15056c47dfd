#pragma once
// A small CNN for Fashion-MNIST. Its penultimate features are the feature space of the
// GAN's FID and its accuracy anchors the MAE linear probe. No max-pool: stride-2
// convolutions downsample. Tests: tests/models/classifier_test.cpp.
#include "engine/nn/nn.h"
#include "engine/tensor.h"

namespace nd::models {

// images [N, 1, 28, 28] -> logits [N, num_classes], with w = width:
//   conv.0 Conv2d(1, w, 3, 1, 1)      conv.1 BN  conv.2 ReLU   -> [N, w, 28, 28]
//   conv.3 Conv2d(w, 2w, 4, 2, 1)     conv.4 BN  conv.5 ReLU   -> [N, 2w, 14, 14]
//   conv.6 Conv2d(2w, 4w, 4, 2, 1)    conv.7 BN  conv.8 ReLU   -> [N, 4w, 7, 7]
//   flatten -> fc Linear(4w * 49, feature_dim) + ReLU           -> features [N, feature_dim]
//   head Linear(feature_dim, num_classes)
// Convolutions have no bias (BatchNorm follows). PyTorch's default init.
class ClassifierImpl : public nn::Module {
 public:
  explicit ClassifierImpl(int64_t width = 32, int64_t feature_dim = 128, int64_t num_classes = 10);
  Tensor forward(const Tensor& images) override;
  // The penultimate (post-ReLU) activations [N, feature_dim].
  Tensor features(const Tensor& images);

  int64_t width, feature_dim, num_classes;
  nn::Sequential conv{nullptr};
  nn::Linear fc{nullptr}, head{nullptr};
};
ND_MODULE(Classifier);

}  // namespace nd::models
