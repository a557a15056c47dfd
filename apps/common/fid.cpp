#include "common/fid.h"

// GCC 12 reports -W(maybe-)uninitialized inside Eigen's AVX-512 packet code once it is
// inlined here (a known false positive, as in kernels/cpu/matmul.cpp).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <Eigen/Dense>

namespace app {

namespace {

using Matrix = Eigen::MatrixXd;

Matrix to_matrix(const nd::Tensor& t) {
  ND_CHECK(t.dim() == 2 && t.size(0) >= 2, "frechet_distance: expected [N >= 2, D] features, got ", t.dim(),
           "-d with ", t.dim() ? t.size(0) : 0, " rows");
  const nd::Tensor c = t.detach().cpu().to(nd::kFloat64).contiguous();
  return Eigen::Map<const Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(
      c.data_ptr<double>(), c.size(0), c.size(1));
}

// Symmetric PSD square root through the eigendecomposition V diag(sqrt(max(l, 0))) V^T.
Matrix sqrt_psd(const Matrix& m) {
  Eigen::SelfAdjointEigenSolver<Matrix> eig(m);
  const Eigen::VectorXd root = eig.eigenvalues().cwiseMax(0.0).cwiseSqrt();
  return eig.eigenvectors() * root.asDiagonal() * eig.eigenvectors().transpose();
}

}  // namespace

double frechet_distance(const nd::Tensor& a, const nd::Tensor& b) {
  const Matrix x = to_matrix(a), y = to_matrix(b);
  ND_CHECK(x.cols() == y.cols(), "frechet_distance: feature sizes differ (", x.cols(), " vs ", y.cols(), ")");
  const Eigen::RowVectorXd mx = x.colwise().mean(), my = y.colwise().mean();
  const Matrix cx = x.rowwise() - mx, cy = y.rowwise() - my;
  const Matrix s1 = cx.transpose() * cx / static_cast<double>(x.rows() - 1);  // unbiased, as numpy.cov
  const Matrix s2 = cy.transpose() * cy / static_cast<double>(y.rows() - 1);
  const Matrix r1 = sqrt_psd(s1);
  const Matrix inner = r1 * s2 * r1;
  Eigen::SelfAdjointEigenSolver<Matrix> eig(0.5 * (inner + inner.transpose()), Eigen::EigenvaluesOnly);
  const double tr_sqrt = eig.eigenvalues().cwiseMax(0.0).cwiseSqrt().sum();
  return (mx - my).squaredNorm() + s1.trace() + s2.trace() - 2 * tr_sqrt;
}

}  // namespace app
