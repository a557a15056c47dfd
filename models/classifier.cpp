#include "models/classifier.h"
#include "engine/error.h"
#include "engine/ops/elementwise.h"
#include "engine/ops/view.h"

namespace nd::models {

ClassifierImpl::ClassifierImpl(int64_t width_, int64_t feature_dim_, int64_t num_classes_)
    : nn::Module("Classifier"), width(width_), feature_dim(feature_dim_), num_classes(num_classes_) {
  ND_CHECK(width > 0 && feature_dim > 0 && num_classes > 1, "Classifier: expected positive width and feature_dim and ",
           "at least 2 classes, got width=", width, ", feature_dim=", feature_dim, ", num_classes=", num_classes);
  using Opt = nn::Conv2dOptions;
  const int64_t w = width;
  conv = register_module(
      "conv", nn::Sequential(nn::Conv2d(Opt(1, w, 3).padding(1).bias(false)), nn::BatchNorm2d(w), nn::ReLU(),
                             nn::Conv2d(Opt(w, 2 * w, 4).stride(2).padding(1).bias(false)), nn::BatchNorm2d(2 * w),
                             nn::ReLU(), nn::Conv2d(Opt(2 * w, 4 * w, 4).stride(2).padding(1).bias(false)),
                             nn::BatchNorm2d(4 * w), nn::ReLU()));
  fc = register_module("fc", nn::Linear(4 * w * 7 * 7, feature_dim));
  head = register_module("head", nn::Linear(feature_dim, num_classes));
}

Tensor ClassifierImpl::features(const Tensor& images) {
  ND_CHECK(images.dim() == 4 && images.size(1) == 1 && images.size(2) == 28 && images.size(3) == 28,
           "Classifier: expected images of shape [N, 1, 28, 28], found ", images.describe());
  return fc(conv(images).flatten(1)).relu();
}

Tensor ClassifierImpl::forward(const Tensor& images) { return head(features(images)); }

}  // namespace nd::models
