// Uses nanoddp through its one public header: builds a tensor, runs backward and checks
// the gradient against the closed form. Exits 0 when it matches, 1 otherwise.
#include <nanoddp.h>

#include <cmath>
#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  if (argc > 1) {  // no options: --help says so, anything else is an error
    const bool help = std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h";
    std::fprintf(help ? stdout : stderr, "usage: %s\nChecks a gradient through the installed nanoddp; takes no options.\n",
                 argv[0]);
    return help ? 0 : 2;
  }
  // loss = sum(w * w * x) with x = [1, 2, 3]: d loss / d w = 2 * w * x.
  nd::Tensor w = nd::tensor({0.5, -1.0, 2.0}).set_name("w").requires_grad_(true);
  nd::Tensor x = nd::tensor({1.0, 2.0, 3.0});
  nd::Tensor loss = (w * w * x).sum();
  loss.backward();

  const double expected[] = {1.0, -4.0, 12.0};
  const float* grad = w.grad().data_ptr<float>();
  bool ok = std::abs(loss.item() - (0.25 + 2.0 + 12.0)) < 1e-6;
  for (int i = 0; i < 3; ++i) ok = ok && std::abs(grad[i] - expected[i]) < 1e-6;
  std::printf("loss %.4f, dloss/dw [%.4f, %.4f, %.4f] (expected [1, -4, 12]): %s\n", loss.item(), grad[0], grad[1],
              grad[2], ok ? "ok" : "MISMATCH");
  return ok ? 0 : 1;
}
