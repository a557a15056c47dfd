// cross_entropy with class-probability targets (soft labels) against PyTorch's
// F.cross_entropy (tests/golden/make_soft_cross_entropy_golden.py, f64): [N, C], [C] and
// [N, C, d] inputs, class weights, label smoothing, every reduction; the loss (also through
// nn::CrossEntropyLoss) and the gradients of input and target. Tolerance: log_softmax and the sums in another order than
// PyTorch's, a few ulps of the largest term: 1e-12 relative to the largest magnitude.
#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "harness.h"

using namespace nd;
using nd::testing::to_vector;

namespace {

using Golden = std::map<std::string, std::vector<double>>;
const Golden& golden() {
  static const Golden g =
      nd::testing::read_golden_table(std::string(NANODDP_SOURCE_DIR) + "/tests/golden/soft_cross_entropy_golden.txt");
  return g;
}
bool has(const std::string& key) { return golden().count(key) > 0; }
const std::vector<double>& row(const std::string& key) {
  REQUIRE_MESSAGE(has(key), "soft_cross_entropy_golden.txt has no row ", key);
  return golden().at(key);
}

void check_close(const char* what, const std::vector<double>& got, const std::vector<double>& want) {
  INFO(what);
  REQUIRE(got.size() == want.size());
  double scale = 0;
  for (double v : want) scale = std::max(scale, std::abs(v));
  for (size_t i = 0; i < got.size(); ++i) CHECK(std::abs(got[i] - want[i]) <= 1e-12 * std::max(scale, 1.0));
}

TEST_CASE("cross_entropy with class probabilities equals PyTorch's: loss and both gradients") {
  for (const char* name : {"nc_mean", "nc_sum_weight", "nc_none_weight_smooth", "nc_mean_weight_smooth", "c_only",
                           "ncd_none_weight", "ncd_mean_smooth"}) {
    const std::string n = name;
    INFO(n);
    Shape shape;
    for (double s : row(n + ".shape")) shape.push_back(static_cast<int64_t>(s));
    const TensorOptions f64(kFloat64);
    Tensor x = tensor(row(n + ".x"), f64).reshape(shape).requires_grad_(true);
    Tensor t = tensor(row(n + ".t"), f64).reshape(shape).requires_grad_(true);
    Tensor w = has(n + ".w") ? tensor(row(n + ".w"), f64) : Tensor();
    const std::vector<double>& opts = row(n + ".opts");
    const Reduction reduction = opts[0] == 0 ? Reduction::None : opts[0] == 1 ? Reduction::Mean : Reduction::Sum;
    Tensor loss = cross_entropy(x, t, w, reduction, -100, opts[1]);
    check_close("loss", to_vector(loss), row(n + ".loss"));
    Tensor v = arange(1, double(loss.numel() + 1), 1, f64).reshape(loss.sizes());
    (loss * v).sum().backward();
    check_close("d input", to_vector(x.grad()), row(n + ".dx"));
    check_close("d target", to_vector(t.grad()), row(n + ".dt"));
    // The module takes probabilities too (nn::CrossEntropyLoss calls cross_entropy).
    nn::CrossEntropyLoss module(nn::CrossEntropyLossOptions().weight(w).reduction(reduction).label_smoothing(opts[1]));
    check_close("nn::CrossEntropyLoss", to_vector(module(x.detach(), t.detach())), row(n + ".loss"));
  }
}

TEST_CASE("cross_entropy with one-hot probabilities equals it with class indices") {
  Tensor x = tensor({0.5, -1.0, 2.0, 0.1, 0.3, -0.2}, TensorOptions(kFloat64)).reshape({2, 3});
  Tensor w = tensor({1.0, 2.0, 0.5}, TensorOptions(kFloat64));
  Tensor idx = tensor({2, 0}, kInt64);
  Tensor onehot = tensor({0, 0, 1, 1, 0, 0}, TensorOptions(kFloat64)).reshape({2, 3});
  // Sum and None agree for any weights; Mean only without weights (indices divide by the
  // weights' sum, probabilities by the sample count, as in PyTorch).
  for (Reduction r : {Reduction::None, Reduction::Sum})
    check_close("weighted", to_vector(cross_entropy(x, onehot, w, r)), to_vector(cross_entropy(x, idx, w, r)));
  check_close("mean", to_vector(cross_entropy(x, onehot)), to_vector(cross_entropy(x, idx)));
  check_close("smoothed", to_vector(cross_entropy(x, onehot, {}, Reduction::Mean, -100, 0.2)),
              to_vector(cross_entropy(x, idx, {}, Reduction::Mean, -100, 0.2)));
}

}  // namespace
