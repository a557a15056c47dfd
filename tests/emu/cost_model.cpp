// nanoddp_emu_cost_model: the cost model's estimates (include/emu_cost.h, cost_estimate.h) for
// the library's CUDA kernels on the rows of bench/cost_model_row_list.h (which bench_kernels'
// "model" family times on a GPU), with no GPU: each row's launchers run once in the emulator
// with counting on, every launch's counts become a time on each GPU of cost_estimate.h's
// kDevices (H200, H100), and the row's time is the sum over its launches. Prints a table per
// launch and per row, and JSON lines (bench/json_line.h's fields; "ms" is the ESTIMATE, impl
// "model", "device" the GPU's rates: all the H200's rows, then the H100's).
//
//   build/tests/emu/nanoddp_emu_cost_model [--only SUBSTRING] [--resources PATH] [--sass PATH] [--fill-sms]
//
// --resources: bench/kernel_resources.md (registers and static shared memory: occupancy);
// --sass: bench/kernel_sass.md (the main loops' instructions per mma: the issue term).
//
// --fill-sms: conv's tile kernels under ConvSplit::kFillSms (kernels/cuda/conv.h), the
// model's side of bench_kernels' "fill-sms" rows (bench/cost_model_rows.h); the committed
// bench/cost_model.jsonl is the default rule's.
//
// The emulator runs one OS thread per CUDA thread, so the shapes are small (seconds per row
// on two cores), not bench_kernels' model-sized ones: an estimate is for the shape printed.
// Anchors (published or measured elsewhere, never in this run) stand beside the estimates;
// tests/emu/README.md ("The cost model") gives the rates, their sources and what is ignored.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iterator>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "bench/cost_model_row_list.h"
#include "bench/json_line.h"
#include "cost_estimate.h"
#include "cuda_runtime.h"
#include "emu_cost.h"
#include "engine/error.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/batch_norm.h"
#include "kernels/cuda/conv.h"
#include "kernels/cuda/copy.h"
#include "kernels/cuda/layer_norm.h"
#include "kernels/cuda/optim.h"
#include "kernels/cuda/softmax.h"

namespace {

using namespace nd::kernels;
using nd::BFloat16;

namespace rows = nd::bench::cost_rows;

// A row of bench/cost_model_row_list.h as the tool runs it.
struct Row {
  rows::Key key;
  std::string anchor;  // what the anchor is, with its source ("copy": the device's copy rate)
  double anchor_tflops = 0;
  bool copy_anchor = false;  // anchored on the device's measured copy bandwidth
  std::function<void()> run;
  // The row stands for `replicate` copies of what run() launches (see the attention row).
  int64_t replicate = 1;
};

// k copies of a launch's blocks: every count k times, the launch itself once.
emu_cost::LaunchCounts replicated(emu_cost::LaunchCounts c, int64_t k) {
  for (int64_t* v : {&c.blocks, &c.read_sectors, &c.write_sectors, &c.unique_read_sectors, &c.unique_write_sectors,
                     &c.global_requests, &c.shared_requests, &c.shared_wavefronts, &c.barriers, &c.mma_flops})
    *v *= k;
  return c;
}

// Device memory for the rows: 256-byte aligned as cudaMalloc's, so that sector counts do not
// depend on where the heap put a buffer (std::vector's 16 bytes moved them by a few percent).
template <class T>
struct DeviceAllocator {
  using value_type = T;
  DeviceAllocator() = default;
  template <class U>
  DeviceAllocator(const DeviceAllocator<U>&) {}  // NOLINT: implicit, as allocators convert
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(256))); }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t(256)); }
  template <class U>
  bool operator==(const DeviceAllocator<U>&) const { return true; }
};
template <class T>
using DeviceVector = std::vector<T, DeviceAllocator<T>>;

template <class T>
DeviceVector<T> filled(size_t n, float scale = 1.0f) {
  DeviceVector<T> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = T(scale * float(int(i * 2654435761u % 2001) - 1000) / 1000.0f);
  return v;
}

constexpr double kFlashAttention2Tflops = 0.35 * 989;  // FlashAttention-2 forward on H100: ~35% of bf16 peak

// Emulates BH = 2 (batch x heads) and stands for BH = 2 x replicate: without a mask or dropout
// every (b, h) runs the same instructions (causality depends on i and j alone) on its own
// slices of q, k, v, out and lse (whole sectors apart: S x D x 2 bytes and S x 4 bytes are
// multiples of 32), so each count for 2 x replicate heads is exactly replicate times the count
// for 2.
Row make(const rows::AttentionRow& a) {
  const int64_t BH = 2, S = a.S, D = a.D;
  const bool backward = a.backward, causal = a.causal;
  ND_CHECK(a.BH % BH == 0, "cost model: expected an even BH for an attention row, found ", a.BH);
  Row r;
  r.key = rows::key(a);
  r.replicate = a.BH / BH;
  if (!backward) r.anchor = "FlashAttention-2 fwd, H100: ~35% of 989 TFLOP/s", r.anchor_tflops = kFlashAttention2Tflops;
  r.run = [=] {
    const size_t n = size_t(BH * S * D);
    auto q = filled<BFloat16>(n), k = filled<BFloat16>(n, 0.5f), v = filled<BFloat16>(n, 2.0f), out = q, dout = v;
    auto dq = q, dk = k, dv = v;
    DeviceVector<float> lse(size_t(BH * S));
    const double scale = 1.0 / std::sqrt(double(D));
    cuda::scaled_dot_product_attention_forward(q.data(), k.data(), v.data(), {}, 1, BH, S, S, D, D, causal, scale, {},
                                               out.data(), lse.data(), nullptr);
    if (backward)
      cuda::scaled_dot_product_attention_backward(dout.data(), q.data(), k.data(), v.data(), {}, out.data(),
                                                  lse.data(), 1, BH, S, S, D, D, causal, scale, {}, dq.data(),
                                                  dk.data(), dv.data(), nullptr);
  };
  return r;
}

Row make(const rows::ConvRow& c) {
  const nd::kernels::Conv2dShape s = c.shape();
  const auto ops = c.bf16 ? cuda::ConvOperands::kBf16 : cuda::ConvOperands::kExact;
  const std::string pass = c.pass;
  Row r;
  r.key = rows::key(c), r.anchor = "none published for this shape: bench_kernels' cuDNN row on the GPU";
  r.run = [=] {
    auto x = filled<float>(size_t(s.N * s.C_in * s.H * s.W));
    auto w = filled<float>(size_t(s.C_out * s.C_in * s.kH * s.kW), 0.1f);
    auto y = filled<float>(size_t(s.N * s.C_out * s.out_h() * s.out_w()), 0.5f);
    if (pass == "fwd")
      cuda::conv2d_forward<float>(s, x.data(), w.data(), nullptr, y.data(), nullptr, ops);
    else if (pass == "dgrad")
      cuda::conv2d_backward_input<float>(s, y.data(), w.data(), x.data(), nullptr, ops);
    else
      cuda::conv2d_backward_weight<float>(s, x.data(), y.data(), w.data(), nullptr, ops);
  };
  return r;
}

Row make(const rows::CopyRow& c) {
  Row r;
  r.key = rows::key(c), r.anchor = "device-to-device copy, measured", r.copy_anchor = true;
  r.run = [n = c.n] {
    auto src = filled<float>(size_t(n));
    DeviceVector<float> dst(static_cast<size_t>(n));
    const int64_t shape[] = {n}, strides[] = {1};
    cuda::copy_strided<float, float>(1, shape, src.data(), strides, dst.data(), strides, nullptr);
  };
  return r;
}

// The training forward; the training backward with both parameter gradients: reads dy and x
// (twice: the sums, then dx; the second read an L1/L2 hit where one launch does both), writes dx.
Row make(const rows::BatchNormRow& b) {
  const int64_t N = b.N, C = b.C, S = b.S;
  Row r;
  r.key = rows::key(b), r.copy_anchor = true;
  r.anchor = b.backward ? "copy bandwidth (reads dy x, writes dx)" : "copy bandwidth (reads x, writes y)";
  if (!b.backward) {
    r.run = [=] {
      auto x = filled<float>(size_t(N * C * S)), weight = filled<float>(size_t(C)), bias = filled<float>(size_t(C));
      const auto c = static_cast<size_t>(C);
      DeviceVector<float> y(x.size()), mean(c), invstd(c), rm(c, 0.0f), rv(c, 1.0f);
      cuda::batch_norm_forward_training<float>(x.data(), weight.data(), bias.data(), rm.data(), rv.data(), N, C, S,
                                               0.1, 1e-5, y.data(), mean.data(), invstd.data(), nullptr);
    };
    return r;
  }
  r.run = [=] {
    auto x = filled<float>(size_t(N * C * S)), dy = filled<float>(size_t(N * C * S), 0.01f);
    const auto c = static_cast<size_t>(C);
    auto weight = filled<float>(c), mean = filled<float>(c), invstd = filled<float>(c);
    DeviceVector<float> dx(x.size()), dweight(c), dbias(c);
    cuda::batch_norm_backward<float>(dy.data(), x.data(), mean.data(), invstd.data(), weight.data(), N, C, S, true,
                                     dx.data(), dweight.data(), dbias.data(), nullptr);
  };
  return r;
}

Row make(const rows::AdamwRow& a) {
  Row r;
  r.key = rows::key(a), r.anchor = "copy bandwidth (reads p g m v, writes p m v)", r.copy_anchor = true;
  r.run = [tensors = a.tensors, each = a.each] {
    std::vector<DeviceVector<float>> p, g, m, v;
    for (int t = 0; t < tensors; ++t) {
      p.push_back(filled<float>(size_t(each))), g.push_back(filled<float>(size_t(each), 0.01f));
      m.push_back(DeviceVector<float>(static_cast<size_t>(each))), v.push_back(m.back());
    }
    std::vector<nd::kernels::AdamTensor<float>> list;
    for (int t = 0; t < tensors; ++t)
      list.push_back({each, p[t].data(), g[t].data(), m[t].data(), v[t].data(), nullptr, 1});
    nd::kernels::AdamParams hp;
    hp.lr = 1e-3, hp.weight_decay = 0.01, hp.decoupled_weight_decay = true;
    cuda::adam_step<float>(0, list, hp, nullptr);
  };
  return r;
}

// The training backward: reads dy and x (twice: dweight and dbias, then dx), writes dx.
Row make(const rows::LayerNormRow& l) {
  const int64_t M = l.M, D = l.D;
  Row r;
  r.key = rows::key(l), r.anchor = "copy bandwidth (reads dy x, writes dx)", r.copy_anchor = true;
  r.run = [=] {
    auto x = filled<float>(size_t(M * D)), dy = filled<float>(size_t(M * D), 0.01f), weight = filled<float>(size_t(D));
    auto mean = filled<float>(size_t(M), 0.1f), rstd = filled<float>(size_t(M));
    DeviceVector<float> dx(x.size()), dweight(static_cast<size_t>(D)), dbias(static_cast<size_t>(D));
    cuda::layer_norm_backward<float>(dy.data(), x.data(), mean.data(), rstd.data(), weight.data(), M, D, dx.data(),
                                     dweight.data(), dbias.data(), nullptr);
  };
  return r;
}

Row make(const rows::SoftmaxRow& s) {
  const int64_t M = s.M, D = s.D;
  const bool log = s.log;
  Row r;
  r.key = rows::key(s), r.anchor = "copy bandwidth (reads x, writes y)", r.copy_anchor = true;
  r.run = [=] {
    auto x = filled<float>(size_t(M * D), 5.0f);
    DeviceVector<float> y(x.size());
    if (log) cuda::log_softmax_forward<float>(x.data(), M, D, y.data(), nullptr);
    else cuda::softmax_forward<float>(x.data(), M, D, y.data(), nullptr);
  };
  return r;
}

std::string grid_text(const emu_cost::LaunchCounts& c) {
  return std::to_string(c.blocks) + " @" + std::to_string(c.threads_per_block);
}

}  // namespace

int main(int argc, char** argv) {
  emu_rt::check_pointers = false;  // host memory stands in for device memory, as in the per-kernel tests
  std::string only, resources_path = NANODDP_SOURCE_DIR "/bench/kernel_resources.md",
                    sass_path = NANODDP_SOURCE_DIR "/bench/kernel_sass.md";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--only" || a == "--resources" || a == "--sass") && i + 1 < argc)
      (a == "--only" ? only : a == "--resources" ? resources_path : sass_path) = argv[++i];
    else if (a == "--fill-sms") nd::kernels::cuda::set_conv_split(nd::kernels::cuda::ConvSplit::kFillSms);
    else {
      std::fprintf(stderr,
                   "usage: nanoddp_emu_cost_model [--only SUBSTRING] [--resources PATH] [--sass PATH] [--fill-sms]\n");
      return 2;
    }
  }
  try {
    const auto resources = emu_cost::read_resources(resources_path);
    const auto issue = emu_cost::read_issue(sass_path);
    constexpr size_t kNumDevices = std::size(emu_cost::kDevices);
    std::vector<std::string> summary[kNumDevices], json[kNumDevices];
    std::printf("%-36s %-11s %4s %9s %9s %9s %8s %8s %8s %8s %8s", "kernel", "grid", "occ", "L2 MB", "DRAM MB",
                "wavefr.", "conflict", "MFLOP", "inst/mma", "barriers", "waves");
    for (const emu_cost::Device& d : emu_cost::kDevices) std::printf(" %5s us %-7s", d.name, "bound");
    std::printf("\n");
    for (const rows::Row& spec : rows::rows()) {
      Row row = std::visit([](const auto& x) { return make(x); }, spec);
      const rows::Key& key = row.key;
      if (!only.empty() && (key.op + " " + key.shape).find(only) == std::string::npos) continue;
      emu_cost::clear();
      emu_cost::set_enabled(true);
      const auto t0 = std::chrono::steady_clock::now();
      row.run();
      const double emu_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      emu_cost::set_enabled(false);
      double total_s[kNumDevices] = {}, l2_bytes = 0, dram_bytes = 0;
      std::string bounds[kNumDevices];
      std::printf("-- %s %s %s%s\n", key.op.c_str(), key.shape.c_str(), key.dtype.c_str(),
                  row.replicate > 1 ? (" (emulated 1/" + std::to_string(row.replicate) + " of it)").c_str() : "");
      for (const auto& emulated : emu_cost::launches()) {
        const auto c = replicated(emulated, row.replicate);
        const emu_cost::Resources* res = emu_cost::find_row(resources, c.kernel);
        const emu_cost::Issue* iss = emu_cost::find_row(issue, c.kernel);
        l2_bytes += double(c.read_sectors + c.write_sectors) * 32;
        dram_bytes += double(c.unique_read_sectors + c.unique_write_sectors) * 32;
        // occupancy and waves: the same SMs on every device
        const auto first = emu_cost::estimate(c, res, iss, emu_cost::kDevices[0]);
        std::printf("%-36.36s %-11s %4s %9.3f %9.3f %9lld %8.2f %8.1f %8s %8lld %8lld", c.kernel.c_str(),
                    grid_text(c).c_str(), first.blocks_per_sm ? std::to_string(first.blocks_per_sm).c_str() : "?",
                    double(c.read_sectors + c.write_sectors) * 32 / 1e6,
                    double(c.unique_read_sectors + c.unique_write_sectors) * 32 / 1e6,
                    static_cast<long long>(c.shared_wavefronts),
                    c.shared_requests ? double(c.shared_wavefronts) / double(c.shared_requests) : 0.0,
                    double(c.mma_flops) / 1e6,
                    iss ? std::to_string(iss->instructions_per_mma).substr(0, 5).c_str() : "-",
                    static_cast<long long>(c.barriers), static_cast<long long>(first.waves));
        for (size_t d = 0; d < kNumDevices; ++d) {
          const auto e = emu_cost::estimate(c, res, iss, emu_cost::kDevices[d]);
          total_s[d] += e.total_s;
          if (bounds[d].find(e.bound) == std::string::npos) bounds[d] += (bounds[d].empty() ? "" : "+") + e.bound;
          std::printf(" %8.2f %-7s", e.total_s * 1e6, e.bound.c_str());
        }
        std::printf("\n");
      }
      const size_t launches = emu_cost::launches().size();
      for (size_t d = 0; d < kNumDevices; ++d) {
        const emu_cost::Device& dev = emu_cost::kDevices[d];
        const double tflops = key.flops / total_s[d] / 1e12, gbps = key.bytes / total_s[d] / 1e9;
        const double anchor_gbps = row.copy_anchor ? dev.dram_bytes_per_s / 1e9 : 0;
        char line[400];
        std::snprintf(line, sizeof line, "| %s | %s | %s | %s | %zu | %.2f | %s | %s | %s | %s | %.0f |", dev.name,
                      key.op.c_str(), key.shape.c_str(), key.dtype.c_str(), launches, total_s[d] * 1e6,
                      key.flops > 0 ? std::to_string(int(tflops + 0.5)).c_str() : "-",
                      std::to_string(int(gbps + 0.5)).c_str(), bounds[d].c_str(),
                      row.anchor_tflops > 0 ? (std::to_string(int(row.anchor_tflops)) + " TFLOP/s").c_str()
                      : anchor_gbps > 0     ? (std::to_string(int(anchor_gbps)) + " GB/s").c_str()
                                            : "-",
                      emu_s);
        summary[d].push_back(line);
        std::printf("   row on the %s: %zu launches, %.2f us estimated, %.3f TFLOP/s, %.0f GB/s\n", dev.name, launches,
                    total_s[d] * 1e6, tflops, gbps);
        json[d].push_back(nd::bench::JsonLine::row(key.op, key.shape, key.dtype, "model")
                              .text("device", dev.name)
                              .number("ms", total_s[d] * 1e3, "%.5f")
                              .positive_or_null("gflops", key.flops / total_s[d] / 1e9, "%.1f")
                              .number("gbps", gbps, "%.1f")
                              .null("baseline")
                              .null("ratio")
                              .integer("launches", int64_t(launches))
                              .text("bound", bounds[d])
                              .positive_or_null("anchor_gflops", row.anchor_tflops * 1e3, "%.0f")
                              .positive_or_null("anchor_gbps", anchor_gbps, "%.0f")
                              .text("anchor", row.anchor)
                              .str());
      }
      std::printf("   L2 %.2f MB, DRAM %.2f MB; emulated in %.0f s\n", l2_bytes / 1e6, dram_bytes / 1e6, emu_s);
      std::fflush(stdout);
    }
    std::printf(
        "\n| device | op | shape | dtype | launches | estimated us | TFLOP/s | GB/s | bound | anchor | emulated s |\n");
    std::printf(
        "|--------|----|-------|-------|---------:|-------------:|--------:|-----:|-------|--------|-----------:|\n");
    for (const auto& device_rows : summary)
      for (const auto& s : device_rows) std::printf("%s\n", s.c_str());
    std::printf("\n");
    for (const auto& device_rows : json)
      for (const auto& j : device_rows) std::printf("%s\n", j.c_str());
  } catch (const nd::Error& e) {
    std::fprintf(stderr, "nanoddp_emu_cost_model: %s\n", e.what());
    return 1;
  }
  return 0;
}
