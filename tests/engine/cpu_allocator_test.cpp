// The caching CPU allocator (engine/cpu_allocator.h): reuse within a size class, the
// cache limit, empty_cache, the allocated bytes and their peak, several threads at once,
// and training steps that neither
// leak Storage objects nor read memory they did not write (every allocation poisoned).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "engine/cpu_allocator.h"
#include "harness.h"

using namespace nd;

namespace {

bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % cpu::kAlignment == 0; }

// Two training steps of the MAE tiny (AdamW) and of the DCGAN (Adam; D on real images and
// fake.detach(), then G through D), as the apps run them, on small batches; returns
// every loss and every parameter afterwards.
std::vector<std::vector<double>> train_two_steps() {
  using nd::testing::to_vector;
  std::vector<std::vector<double>> out;
  manual_seed(7);
  models::MAE mae(models::MAEConfig::tiny());
  optim::AdamW mae_opt(mae->parameters(), optim::AdamWOptions(1e-3));
  models::DCGANGenerator g(16, 32);
  models::DCGANDiscriminator d(32);
  optim::Adam g_opt(g->parameters(), optim::AdamOptions(2e-4).betas({0.5, 0.999}));
  optim::Adam d_opt(d->parameters(), optim::AdamOptions(2e-4).betas({0.5, 0.999}));
  for (int step = 0; step < 2; ++step) {
    const Tensor images = rand({16, 1, 28, 28}) * 2 - 1;
    mae_opt.zero_grad();
    Tensor loss = mae(images).loss;
    loss.backward();
    mae_opt.step();
    out.push_back(to_vector(loss));

    const Tensor fake = g(randn({16, 16}));
    d_opt.zero_grad();
    Tensor d_loss = binary_cross_entropy_with_logits(d(images), ones({16})) +
                    binary_cross_entropy_with_logits(d(fake.detach()), zeros({16}));
    d_loss.backward();
    d_opt.step();
    g_opt.zero_grad();
    Tensor g_loss = binary_cross_entropy_with_logits(d(fake), ones({16}));
    g_loss.backward();
    g_opt.step();
    out.push_back(to_vector(d_loss));
    out.push_back(to_vector(g_loss));
  }
  for (nn::Module* m : std::vector<nn::Module*>{mae.get(), g.get(), d.get()})
    for (const auto& [name, p] : m->named_parameters()) out.push_back(to_vector(p));
  return out;
}

}  // namespace

TEST_CASE("cpu allocator: a released block comes back for a request of its size class, small and huge ones are not cached") {
  cpu::empty_cache();
  CHECK(cpu::allocate(0) == nullptr);
  cpu::release(nullptr, 0);

  const size_t n = 100000;  // class 114688 (7 * 2^14): 100000 and 114000 share it
  void* a = cpu::allocate(n);
  REQUIRE(a != nullptr);
  CHECK(aligned(a));
  std::memset(a, 1, n);
  const cpu::AllocatorStats s0 = cpu::memory_stats();
  cpu::release(a, n);
  CHECK(cpu::memory_stats().cached_bytes == s0.cached_bytes + 114688);
  void* b = cpu::allocate(114000);
  CHECK(b == a);
  CHECK(cpu::memory_stats().num_cache_hits == s0.num_cache_hits + 1);
  CHECK(cpu::memory_stats().cached_bytes == s0.cached_bytes);
  // Another class is a fresh block, and the one in use is never handed out twice.
  void* c = cpu::allocate(n);
  void* e = cpu::allocate(200000);
  CHECK(c != b);
  CHECK(e != b);
  CHECK(e != c);
  CHECK(aligned(e));
  CHECK(cpu::memory_stats().num_mallocs == s0.num_mallocs + 2);
  cpu::release(b, 114000);
  cpu::release(c, n);
  cpu::release(e, 200000);

  const int64_t cached = cpu::memory_stats().cached_bytes;
  for (size_t n : {size_t{1}, size_t{63}, size_t{4096}, cpu::kMinCachedBytes - 1, cpu::kMaxCachedBytes + 1}) {
    void* p = cpu::allocate(n);
    REQUIRE(p != nullptr);
    CHECK(aligned(p));
    std::memset(p, 2, n);
    cpu::release(p, n);
    CHECK(cpu::memory_stats().cached_bytes == cached);
  }
  cpu::empty_cache();
}

TEST_CASE("cpu allocator: the cache holds at most kCacheLimitBytes, and empty_cache frees every block") {
  cpu::empty_cache();
  const size_t big = cpu::kMaxCachedBytes;  // 32 MiB, its own class; untouched: address space only
  std::vector<void*> blocks;
  for (int i = 0; i < 10; ++i) blocks.push_back(cpu::allocate(big));
  const cpu::AllocatorStats s0 = cpu::memory_stats();
  for (void* p : blocks) cpu::release(p, big);
  const cpu::AllocatorStats s1 = cpu::memory_stats();
  CHECK(s1.cached_bytes == int64_t{8} * static_cast<int64_t>(big));  // 256 MiB; a ninth would pass it
  CHECK(s1.num_frees == s0.num_frees + 2);
  CHECK(s1.cached_bytes <= static_cast<int64_t>(cpu::kCacheLimitBytes));

  cpu::empty_cache();
  const cpu::AllocatorStats s2 = cpu::memory_stats();
  CHECK(s2.cached_bytes == 0);
  CHECK(s2.num_frees == s1.num_frees + 8);
  void* p = cpu::allocate(big);
  CHECK(cpu::memory_stats().num_mallocs == s2.num_mallocs + 1);  // nothing left to reuse
  cpu::release(p, big);
  cpu::empty_cache();
}

TEST_CASE("cpu allocator: allocated_bytes counts every live block, the peak its maximum until reset") {
  cpu::empty_cache();
  const int64_t base = cpu::memory_stats().allocated_bytes;
  cpu::reset_peak_memory_stats();
  CHECK(cpu::memory_stats().peak_allocated_bytes == base);
  // 100 B: a multiple of 64; 100 KB: its size class (four per power of two: 112 KiB); 40 MiB: exact.
  void* small = cpu::allocate(100);
  void* mid = cpu::allocate(100000);
  void* huge = cpu::allocate(size_t{40} << 20);
  const int64_t blocks = 128 + (112 << 10) + (int64_t{40} << 20);
  CHECK(cpu::memory_stats().allocated_bytes == base + blocks);
  cpu::release(huge, size_t{40} << 20);
  cpu::release(mid, 100000);
  CHECK(cpu::memory_stats().allocated_bytes == base + 128);
  CHECK(cpu::memory_stats().peak_allocated_bytes == base + blocks);
  cpu::reset_peak_memory_stats();
  CHECK(cpu::memory_stats().peak_allocated_bytes == base + 128);
  void* again = cpu::allocate(100000);  // from the cache: counted as allocated all the same
  cpu::release(again, 100000);
  cpu::release(small, 100);
  const cpu::AllocatorStats s = cpu::memory_stats();
  CHECK(s.allocated_bytes == base);
  CHECK(s.peak_allocated_bytes == base + 128 + (112 << 10));
}

TEST_CASE("cpu allocator: threads allocating and releasing at once never share a block") {
  // Each thread fills its blocks with its own byte and checks the fill before release:
  // a block handed to two threads at once would show the other thread's byte.
  const std::vector<size_t> sizes{cpu::kMinCachedBytes, 70000, 100000, 150001, 300000};
  constexpr int kThreads = 4, kIters = 300, kHeld = 3;
  std::vector<int> bad(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::pair<unsigned char*, size_t>> held;
      for (int i = 0; i < kIters; ++i) {
        const size_t n = sizes[(i * 7 + t) % sizes.size()];
        auto* p = static_cast<unsigned char*>(cpu::allocate(n));
        std::memset(p, t + 1, n);
        held.emplace_back(p, n);
        if (held.size() > kHeld || i == kIters - 1) {
          for (auto [q, m] : held) {
            for (size_t k = 0; k < m; k += 997) bad[t] += q[k] != t + 1;
            bad[t] += q[m - 1] != t + 1;
            cpu::release(q, m);
          }
          held.clear();
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) CHECK(bad[t] == 0);
  CHECK(cpu::memory_stats().num_cache_hits > 0);
  cpu::empty_cache();
}

TEST_CASE("cpu allocator: training steps free every Storage and never read unwritten memory") {
  cpu::empty_cache();
  const int64_t live = Storage::live_count();
  const int64_t hits = cpu::memory_stats().num_cache_hits;
  const std::vector<std::vector<double>> plain = train_two_steps();
  CHECK(Storage::live_count() == live);
  CHECK(cpu::memory_stats().num_cache_hits > hits);  // the second step reused the first's blocks

  // Poisoned: every new and every reused block starts as NaN, so an op that reads an
  // output element it did not write (or relies on zeroed memory) changes the results.
  cpu::set_fill_on_allocate(true);
  CHECK(std::isnan(empty({20000}).sum().item()));  // poisoning is on, above and below kMinCachedBytes
  CHECK(std::isnan(empty({3}).sum().item()));
  const std::vector<std::vector<double>> poisoned = train_two_steps();
  cpu::set_fill_on_allocate(false);
  CHECK(Storage::live_count() == live);
  REQUIRE(poisoned.size() == plain.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    CAPTURE(i);
    CHECK(poisoned[i] == plain[i]);
  }
  cpu::empty_cache();
  CHECK(cpu::memory_stats().cached_bytes == 0);
}
