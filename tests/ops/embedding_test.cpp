// embedding op: gradcheck with repeated indices and padding_idx, known values,
// int32 indices, argument errors.
#include "engine/ops/embedding.h"
#include "harness.h"

using namespace nd;
using nd::testing::OpCase;

TEST_CASE("embedding: gradcheck table (f64, repeats, non-contiguous weight)") {
  using V = std::vector<Tensor>;
  const Tensor idx = tensor({3, 0, 3, 6, 2, 3}, kInt64).reshape({2, 3});
  const Tensor one = tensor({5}, kInt64);
  const std::vector<OpCase> cases = {
      {"embedding [2, 3] indices", {{7, 4}}, [&](const V& x) { return embedding(x[0], idx); }},
      // padding_idx has no gradcheck row: by definition its row gets 0, not the true derivative.
      {"embedding padding_idx unused", {{7, 4}}, [&](const V& x) { return embedding(x[0], idx, 5); }},
      {"embedding batch size 1", {{7, 5}}, [&](const V& x) { return embedding(x[0], one); }},
      {"embedding then tanh", {{7, 3}}, [&](const V& x) { return tanh(embedding(x[0], idx) * 2.0); }},
  };
  for (const OpCase& c : cases) {
    CAPTURE(c.name);
    nd::testing::run_gradcheck(c);
  }
}

TEST_CASE("embedding: known values, shapes, padding row gets no gradient") {
  Tensor w = tensor({0, 1, 10, 11, 20, 21}, kFloat64).reshape({3, 2}).requires_grad_();
  Tensor idx = tensor({2, 0, 2, 1}, kInt64).reshape({2, 2});
  Tensor out = embedding(w, idx, 1);
  CHECK(out.sizes() == Shape{2, 2, 2});
  nd::testing::check_close(out, {20, 21, 0, 1, 20, 21, 10, 11}, 0, 0, "gather");
  out.sum().backward();
  nd::testing::check_close(w.grad(), {1, 1, 0, 0, 2, 2}, 0, 0, "scatter-add, padding row 1 zero");
  Tensor idx32 = tensor({1, 2}, kInt32);
  nd::testing::check_close(embedding(w.detach().to(kFloat32), idx32), {10, 11, 20, 21}, 0, 0, "int32 indices");
  CHECK(embedding(w, tensor({}, kInt64)).sizes() == Shape{0, 2});
}

TEST_CASE("embedding: argument errors") {
  using nd::testing::error_message;
  const Tensor w = ones({10, 3});
  const std::string bad = error_message([&] { embedding(w, tensor({1, 2, 12}, kInt64)); });
  CHECK_MESSAGE(bad.find("embedding: index 12 out of range for weight [cpu f32 [10, 3]] with 10 rows "
                         "(num_embeddings); expected indices in [0, 10), found it at flat position 2") !=
                    std::string::npos,
                bad);
  CHECK(error_message([&] { embedding(w, tensor({-1}, kInt64)); }).find("index -1 out of range") != std::string::npos);
  CHECK(error_message([&] { embedding(w, tensor({1.0})); })
            .find("embedding: expected indices of dtype i64 or i32, found [cpu f32 [1]]") != std::string::npos);
  CHECK(error_message([&] { embedding(ones({10}), tensor({1}, kInt64)); })
            .find("expected weight of 2 dims ([num_embeddings, embedding_dim]), found [cpu f32 [10]]") !=
        std::string::npos);
  CHECK(error_message([&] { embedding(w, tensor({1}, kInt64), 10); })
            .find("expected padding_idx in [-1, 10) (-1 = none), found 10") != std::string::npos);
}
