// Data-loading benchmark: images per second through ImageFolder + DataLoader with
// num_workers threads, for the two pipelines of the apps' kind of training:
//   crop   RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor + Normalize(ImageNet)
//          (ImageNet-style training: only the crop's region of each JPEG is decoded)
//   gan    Resize(64) + CenterCrop(64) + ToTensor + Normalize(0.5, 0.5) (a 64x64 GAN; the
//          whole image is decoded)
// over a folder of JPEGs (bench/make_bench_images.py), batches of --batch shuffled per epoch,
// as training reads them. A run is one whole epoch over the folder, timed from the first
// next() to the end (the workers start with the loader, so its construction, the folder
// scan excluded, is inside). Rows give the median of --repeats runs and their min and max.
// The PyTorch twin is bench/bench_data_torch.py (torchvision's ImageFolder and DataLoader
// with the same transforms and num_workers), which also runs this binary alternately with
// itself (--ours) for the "same run, alternated" comparison.
//
// Output: a table, then JSON lines (json_line.h) {"op","shape","dtype","impl","ms","gflops",
// "gbps","baseline","ratio"} plus "workers","batch","images","runs","images_per_s",
// "images_per_s_min","images_per_s_max"; ms is the median epoch.
// --fast 1 adds the gan pipeline with Resize(64).fast(true) (impl "nanoddp-fast": JPEGs decoded
// at a reduced DCT scale) and its PSNR against the exact mode over the folder ("psnr_db",
// "psnr_db_min": the mean and the lowest per image, 64x64 u8 after CenterCrop).
// --shards PATTERN adds rows reading the same images from tar shards (impl "nanoddp-shards";
// bench/make_bench_shards.py writes them from the folder), each shard epoch run right after
// a folder epoch, in the shards' stream order (a shuffle buffer of 1000); the shards'
// indexing time (construction, reading every member header) is printed, not in the rows.
// Usage: bench_data --root DIR [--pipeline crop|gan|all] [--workers 1,2] [--batch 64] [--repeats 3] [--fast 1]
//                   [--shards PATTERN]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include <nanoddp.h>

#include "json_line.h"

namespace {

namespace T = nd::data::transforms;

struct Options {
  std::string root, pipeline = "all", workers = "1,2";
  std::string shards;  // --shards PATTERN: the same images from tar shards too, alternated with the folder
  int64_t batch = 64, repeats = 3;
  int64_t fast = 0;  // --fast 1: the gan pipeline again with Resize(...).fast(true), and its PSNR
};

T::AnyTransform pipeline_transform(const std::string& name) {
  if (name == "crop")
    return T::Compose({T::RandomResizedCrop({224}), T::RandomHorizontalFlip(), T::ToTensor(),
                       T::Normalize({0.485, 0.456, 0.406}, {0.229, 0.224, 0.225})});
  return T::Compose({T::Resize({64}).fast(name == "gan-fast"), T::CenterCrop({64}), T::ToTensor(),
                     T::Normalize({0.5, 0.5, 0.5}, {0.5, 0.5, 0.5})});
}

// The fast mode's PSNR against the exact mode over the folder (Resize 64 + CenterCrop 64, u8):
// {mean over images, lowest}.
std::pair<double, double> fast_psnr(const std::string& root) {
  const nd::data::ImageFolder exact(root, nd::data::ImageFolderOptions().transform(
                                               T::Compose({T::Resize({64}), T::CenterCrop({64})})));
  const nd::data::ImageFolder fast(root, nd::data::ImageFolderOptions().transform(
                                              T::Compose({T::Resize({64}).fast(true), T::CenterCrop({64})})));
  double sum = 0, lowest = 1e9;
  nd::Generator gen;
  for (int64_t i = 0; i < exact.size(); ++i) {
    const nd::Tensor a = exact.get(i, gen).data, b = fast.get(i, gen).data;
    double se = 0;
    for (int64_t k = 0; k < a.numel(); ++k) {
      const double d = double(a.data_ptr<uint8_t>()[k]) - double(b.data_ptr<uint8_t>()[k]);
      se += d * d;
    }
    const double psnr = se == 0 ? 99.0 : 10 * std::log10(255.0 * 255.0 * double(a.numel()) / se);
    sum += psnr;
    lowest = std::min(lowest, psnr);
  }
  return {sum / double(exact.size()), lowest};
}

// One epoch's wall time in seconds: the folder shuffled, or tar shards in their stream
// order (shards shuffled, a shuffle buffer of 1000 samples).
double epoch_seconds(const std::shared_ptr<const nd::data::ImageDataset>& data, int64_t workers, int64_t batch,
                     int64_t epoch) {
  const auto start = std::chrono::steady_clock::now();
  auto options = nd::data::DataLoaderOptions(batch).seed(1).num_workers(workers);
  if (const auto* shards = dynamic_cast<const nd::data::TarShards*>(data.get()))
    options.sampler(shards->sampler(1, 1000));
  else
    options.shuffle(true);
  nd::data::DataLoader loader(data, options);
  loader.set_epoch(epoch);
  int64_t images = 0;
  while (auto b = loader.next()) images += b->images.size(0);
  if (images != data->size()) std::fprintf(stderr, "bench_data: an epoch gave %lld images\n", (long long)images);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Prints why and the usage line; returns the exit status (0 for --help, 2 for a bad command line).
int usage(const std::string& why, int status = 2) {
  std::fprintf(status ? stderr : stdout,
               "bench_data: %s\nUsage: bench_data --root DIR [--pipeline crop|gan|all] [--workers 1,2] "
               "[--batch 64] [--repeats 3] [--fast 1] [--shards PATTERN]\n",
               why.c_str());
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  // "--flag value" pairs into a map, then each flag read from it.
  std::map<std::string, std::string> given;
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") return usage("images per second of ImageFolder + DataLoader", 0);
    if (flag != "--root" && flag != "--pipeline" && flag != "--workers" && flag != "--batch" && flag != "--repeats" &&
        flag != "--fast" && flag != "--shards")
      return usage("unknown flag " + flag);
    if (i + 1 >= argc) return usage("expected a value after " + flag);
    given[flag] = argv[i + 1];
  }
  Options o;
  auto read = [&](const char* flag, auto& target) {
    if (!given.count(flag)) return;
    if constexpr (std::is_same_v<std::decay_t<decltype(target)>, std::string>) target = given[flag];
    else target = std::atoll(given[flag].c_str());
  };
  read("--root", o.root);
  read("--pipeline", o.pipeline);
  read("--workers", o.workers);
  read("--batch", o.batch);
  read("--repeats", o.repeats);
  read("--fast", o.fast);
  read("--shards", o.shards);
  if (o.root.empty()) return usage("--root DIR is required (a folder made by bench/make_bench_images.py)");
  if (o.pipeline != "crop" && o.pipeline != "gan" && o.pipeline != "all")
    return usage("--pipeline expects crop, gan or all");
  if (o.batch < 1 || o.repeats < 1) return usage("--batch and --repeats must be >= 1");
  std::vector<int64_t> workers;
  std::stringstream list(o.workers);
  for (std::string w; std::getline(list, w, ',');) workers.push_back(std::atoll(w.c_str()));
  if (workers.empty() || *std::min_element(workers.begin(), workers.end()) < 1)
    return usage("--workers expects a comma-separated list of numbers >= 1");

  std::vector<nd::bench::JsonLine> lines;
  std::printf("%-8s %8s %8s %12s %12s %12s\n", "pipe", "workers", "images", "img/s", "img/s min", "img/s max");
  try {
    for (const std::string pipeline : {"crop", "gan", "gan-fast"}) {
      if (o.pipeline != "all" && o.pipeline != pipeline && !(pipeline == "gan-fast" && o.pipeline == "gan")) continue;
      if (pipeline == "gan-fast" && !o.fast) continue;
      const auto folder = std::make_shared<const nd::data::ImageFolder>(
          o.root, nd::data::ImageFolderOptions().transform(pipeline_transform(pipeline)));
      std::shared_ptr<const nd::data::ImageDataset> shards;
      if (!o.shards.empty()) {
        const auto start = std::chrono::steady_clock::now();
        shards = std::make_shared<const nd::data::TarShards>(
            o.shards, nd::data::TarShardsOptions().transform(pipeline_transform(pipeline)));
        std::printf("tar shards %s: %lld samples indexed in %.1f ms\n", o.shards.c_str(), (long long)shards->size(),
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() * 1e3);
      }
      for (int64_t w : workers) {
        std::vector<double> seconds, shard_seconds;
        for (int64_t r = 0; r < o.repeats; ++r) {
          seconds.push_back(epoch_seconds(folder, w, o.batch, r));
          if (shards) shard_seconds.push_back(epoch_seconds(shards, w, o.batch, r));
        }
        for (const bool from_shards : {false, true}) {
          if (from_shards && !shards) continue;
          std::vector<double>& s = from_shards ? shard_seconds : seconds;
          const std::string impl = from_shards ? "nanoddp-shards" : pipeline == "gan-fast" ? "nanoddp-fast" : "nanoddp";
          std::sort(s.begin(), s.end());
          const double median = s[s.size() / 2], n = static_cast<double>(folder->size());
          std::printf("%-8s %8lld %8lld %12.1f %12.1f %12.1f%s\n", pipeline.c_str(), (long long)w,
                      (long long)folder->size(), n / median, n / s.back(), n / s.front(),
                      from_shards ? "  (tar shards)" : "");
          auto line = nd::bench::JsonLine::row("data_loader", pipeline == "crop" ? "crop224" : "gan64", "f32", impl);
          line.number("ms", median * 1e3, "%.1f").null("gflops").null("gbps").null("baseline").null("ratio");
          line.integer("workers", w).integer("batch", o.batch).integer("images", folder->size());
          line.integer("runs", o.repeats).number("images_per_s", n / median, "%.1f");
          line.number("images_per_s_min", n / s.back(), "%.1f").number("images_per_s_max", n / s.front(), "%.1f");
          if (pipeline == "gan-fast" && w == workers.front() && !from_shards) {
            const auto [mean, lowest] = fast_psnr(o.root);
            std::printf("gan-fast PSNR against the exact mode: mean %.2f dB, lowest %.2f dB\n", mean, lowest);
            line.number("psnr_db", mean, "%.2f").number("psnr_db_min", lowest, "%.2f");
          }
          lines.push_back(line);
        }
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_data: %s\n", e.what());
    return 1;
  }
  for (const auto& line : lines) line.print();
  return 0;
}
