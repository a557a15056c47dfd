#pragma once
// Fréchet distance between two sets of feature vectors (FID when the features come
// from an image classifier): with means m1, m2 and covariances S1, S2,
//   d = |m1 - m2|^2 + tr(S1) + tr(S2) - 2 tr((S1^1/2 S2 S1^1/2)^1/2).
// tr(sqrt(S1 S2)) is computed as tr(sqrt(S1^1/2 S2 S1^1/2)), a symmetric PSD matrix,
// by two symmetric eigendecompositions (Eigen); negative round-off eigenvalues are
// clamped to 0. Tests: tests/apps/fid_test.cpp (closed forms), apps_test.cpp (train_gan --eval).
#include <nanoddp.h>

namespace app {

// a [N1, D], b [N2, D] (any float dtype, CPU or not); N1, N2 >= 2.
double frechet_distance(const nd::Tensor& a, const nd::Tensor& b);

}  // namespace app
