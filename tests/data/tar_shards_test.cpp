// TarShards: brace patterns, WebDataset's grouping of tar members (checked against Python's
// tarfile where python3 is there), the stream order (every sample once per epoch over 1, 2
// and 4 ranks, the shuffle buffer's reach), the same batches at 1, 2 and 4 workers, a
// mid-epoch seek equal to the uninterrupted run, and every bad shard or sample.
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "data/data_test_util.h"

using namespace nd;
using namespace nd::data;
using nd::testing::bitwise_equal;
namespace T = nd::data::transforms;
namespace fs = std::filesystem;

namespace {

// Shard s holds 2 + s % 3 samples "s<s>_<i>": an 8 x 6 PNG of seeded random pixels
// (pixels[key]) and a .cls of (s * 7 + i) % 5, plus a .txt member no sample needs.
struct Shards {
  std::string pattern;
  std::vector<std::string> paths;
  std::map<std::string, Tensor> pixels;  // "<path>:<key>" -> [3, 8, 6] u8
  std::map<std::string, int64_t> labels;
};

Shards make_shards(const TempDir& dir, int n) {
  Shards out;
  out.pattern = dir.file("train-{0000..") + (n - 1 < 10 ? "000" : "00") + std::to_string(n - 1) + "}.tar";
  Generator gen{7, 0};
  for (int s = 0; s < n; ++s) {
    char name[32];
    std::snprintf(name, sizeof name, "train-%04d.tar", s);
    const std::string path = dir.file(name);
    std::vector<TarMember> members;
    for (int i = 0; i < 2 + s % 3; ++i) {
      const std::string key = "s" + std::to_string(s) + "_" + std::to_string(i);
      const Tensor image = randint(0, 256, {3, 8, 6}, TensorOptions(kInt64), &gen).to(kUInt8);
      const std::string png = encode_png(image);
      members.push_back({key + ".png", Bytes(png.begin(), png.end())});
      members.push_back({key + ".cls", text_bytes(std::to_string((s * 7 + i) % 5) + "\n")});
      members.push_back({key + ".txt", text_bytes("a caption")});
      out.pixels[path + ":" + key] = image;
      out.labels[path + ":" + key] = (s * 7 + i) % 5;
    }
    write_bytes(path, make_tar(members));
    out.paths.push_back(path);
  }
  return out;
}

std::vector<Batch> epoch_batches(DataLoader& loader) {
  std::vector<Batch> out;
  while (auto b = loader.next()) out.push_back(std::move(*b));
  return out;
}

void require_equal(const std::vector<Batch>& a, const std::vector<Batch>& b) {
  REQUIRE(a.size() == b.size());
  for (size_t k = 0; k < a.size(); ++k) {
    CHECK(a[k].indices == b[k].indices);
    CHECK(bitwise_equal(a[k].images, b[k].images));
    CHECK(bitwise_equal(a[k].labels, b[k].labels));
  }
}

}  // namespace

TEST_CASE("expand_braces: ranges padded like braceexpand, lists, nesting, products, literals") {
  using V = std::vector<std::string>;
  CHECK(expand_braces("train-{000000..000003}.tar") ==
        V{"train-000000.tar", "train-000001.tar", "train-000002.tar", "train-000003.tar"});
  CHECK(expand_braces("{8..11}") == V{"8", "9", "10", "11"});
  CHECK(expand_braces("{08..11}") == V{"08", "09", "10", "11"});
  CHECK(expand_braces("{3..1}") == V{"3", "2", "1"});
  CHECK(expand_braces("{-1..1}") == V{"-1", "0", "1"});
  CHECK(expand_braces("{-02..1}") == V{"-02", "-01", "000", "001"});
  CHECK(expand_braces("{0..2}") == V{"0", "1", "2"});
  CHECK(expand_braces("{a..c}") == V{"{a..c}"});
  CHECK(expand_braces("{a,b}-{1..2}") == V{"a-1", "a-2", "b-1", "b-2"});
  CHECK(expand_braces("x{a,{b,c}d}y") == V{"xay", "xbdy", "xcdy"});
  CHECK(expand_braces("{a,}z") == V{"az", "z"});
  CHECK(expand_braces("{x}.tar") == V{"{x}.tar"});
  CHECK(expand_braces("{1..x}") == V{"{1..x}"});
  CHECK(expand_braces("plain.tar") == V{"plain.tar"});
  CHECK(expand_braces("a}b") == V{"a}b"});
  CHECK(error_message([] { expand_braces("train-{0..3.tar"); }) ==
        "expand_braces: 'train-{0..3.tar' has a '{' without its '}'");
  CHECK(error_message([] { expand_braces("{0..99999999}"); }) ==
        "expand_braces: the range {0..99999999} in '{0..99999999}' names more than 10 million paths");
}

TEST_CASE("TarShards: samples grouped by key, pixels and classes as written, keys by WebDataset's rule") {
  TempDir dir;
  const Shards shards = make_shards(dir, 3);
  const TarShards ds(shards.pattern);
  CHECK(ds.all_shards() == shards.paths);
  CHECK(ds.shards() == shards.paths);
  REQUIRE(ds.size() == 2 + 3 + 4);
  CHECK(ds.classes().empty());
  for (int64_t i = 0; i < ds.size(); ++i) {
    Generator gen = sample_generator(0, 0, i);
    const Example e = ds.get(i, gen);
    INFO(ds.name(i));
    CHECK(bitwise_equal(e.data, shards.pixels.at(ds.name(i))));
    CHECK(e.target == shards.labels.at(ds.name(i)));
  }
  CHECK(ds.name(2) == shards.paths[1] + ":s1_0");  // shard order, then tar order
  CHECK(ds.sample_id(2) == (int64_t{1} << 32) + 0);

  // The key is the path up to the first dot of the basename: folders with dots, upper-case
  // extensions, members without a dot (skipped), a .cls with spaces around the digits.
  const std::string png = encode_png(full({3, 2, 2}, 9, TensorOptions(kUInt8)));
  write_bytes(dir.file("keys.tar"), make_tar({{"v1.0/a.b.seg.png", Bytes(png.begin(), png.end())},
                                              {"v1.0/a.JPG.cls", text_bytes("x")},
                                              {"README", text_bytes("no dot")},
                                              {"v1.0/c.PNG", Bytes(png.begin(), png.end())},
                                              {"v1.0/c.cls", text_bytes(" 12\n")}}));
  const TarShards keys(dir.file("keys.tar"));
  REQUIRE(keys.size() == 2);
  CHECK(keys.name(0) == dir.file("keys.tar") + ":v1.0/a");
  CHECK(keys.name(1) == dir.file("keys.tar") + ":v1.0/c");
  Generator gen = sample_generator(0, 0, 1);
  CHECK(keys.get(1, gen).target == 12);
  CHECK(error_message([&] { keys.get(0, gen); }) ==
        "TarShards: shard '" + dir.file("keys.tar") +
            "': sample 'v1.0/a': no image member (v1.0/a.jpg, .jpeg or .png)");
}

TEST_CASE("TarShards: every sample exactly once per epoch over 1, 2 and 4 ranks, each rank reading its own shards") {
  TempDir dir;
  const Shards shards = make_shards(dir, 8);
  for (int world : {1, 2, 4}) {
    for (int64_t epoch : {0, 1}) {
      std::multiset<std::string> seen;
      for (int rank = 0; rank < world; ++rank) {
        auto ds = std::make_shared<const TarShards>(shards.pattern, TarShardsOptions().rank(rank).world_size(world));
        std::vector<std::string> own;
        for (int s = rank; s < 8; s += world) own.push_back(shards.paths[s]);
        CHECK(ds->shards() == own);
        DataLoader loader(ds, DataLoaderOptions(3).seed(5).num_workers(2).sampler(ds->sampler(5, 4)));
        loader.set_epoch(epoch);
        for (const Batch& b : epoch_batches(loader))
          for (int64_t k = 0; k < b.images.size(0); ++k) {
            const std::string name = ds->name(b.indices[k]);
            seen.insert(name);
            CHECK(bitwise_equal(b.images.select(0, k), shards.pixels.at(name)));
            CHECK(b.labels.data_ptr<int64_t>()[k] == shards.labels.at(name));
          }
      }
      INFO("world " << world << ", epoch " << epoch);
      CHECK(seen.size() == shards.pixels.size());
      CHECK(std::set<std::string>(seen.begin(), seen.end()).size() == shards.pixels.size());
    }
  }
}

TEST_CASE("TarShards: the stream order is a function of (seed, epoch, rank): shards shuffled, the buffer's reach") {
  TempDir dir;
  const Shards shards = make_shards(dir, 8);
  const TarShards ds(shards.pattern);
  const int64_t n = ds.size();
  std::vector<int64_t> tar_order(n);
  for (int64_t i = 0; i < n; ++i) tar_order[i] = i;
  CHECK(ds.stream_order(1, 0, 0) == tar_order);
  CHECK(ds.stream_order(1, 0, 4) == ds.stream_order(1, 0, 4));
  CHECK(ds.stream_order(1, 0, 4) != ds.stream_order(1, 1, 4));
  CHECK(ds.stream_order(1, 0, 4) != ds.stream_order(2, 0, 4));
  // Buffer 1: whole shards in a shuffled order, each in tar order.
  const std::vector<int64_t> by_shard = ds.stream_order(1, 0, 1);
  CHECK(by_shard != tar_order);
  for (size_t p = 1; p < by_shard.size(); ++p) {
    const bool same_shard = ds.sample_id(by_shard[p]) >> 32 == ds.sample_id(by_shard[p - 1]) >> 32;
    if (same_shard) CHECK(by_shard[p] == by_shard[p - 1] + 1);
  }
  // Buffer B: a permutation in which a sample arriving at stream position p leaves at
  // position p - B or later (B samples are held back), and which moves samples.
  for (int64_t buffer : {2, 5, 1000}) {
    const std::vector<int64_t> order = ds.stream_order(3, 2, buffer);
    std::vector<int64_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    CHECK(sorted == tar_order);
    std::map<int64_t, int64_t> out_pos;
    for (int64_t p = 0; p < n; ++p) out_pos[order[p]] = p;
    const std::vector<int64_t> stream = ds.stream_order(3, 2, 1);  // the same shard order, unbuffered
    int64_t moved = 0;
    for (int64_t p = 0; p < n; ++p) {
      CHECK(out_pos[stream[p]] >= p - buffer);
      moved += out_pos[stream[p]] != p;
    }
    CHECK(moved > n / 2);
  }
  // Rank r's shards at world 2 have their own stream.
  const TarShards r0(shards.pattern, TarShardsOptions().rank(0).world_size(2));
  const TarShards r1(shards.pattern, TarShardsOptions().rank(1).world_size(2));
  CHECK(r0.size() + r1.size() == n);
  CHECK(error_message([&] { ds.stream_order(1, 0, -1); }) == "TarShards: shuffle_buffer must be >= 0, got -1");
  CHECK(error_message([&] { ds.sampler(1, -2); }) == "TarShards: shuffle_buffer must be >= 0, got -2");

  // epoch_size: the first samples of the order, the same count on ranks of unequal shards.
  REQUIRE(r0.size() != r1.size());
  const int64_t common = std::min(r0.size(), r1.size());
  for (const TarShards* r : {&r0, &r1}) {
    const std::vector<int64_t> full = r->stream_order(4, 1, 3), cut = r->stream_order(4, 1, 3, common);
    CHECK(cut == std::vector<int64_t>(full.begin(), full.begin() + common));
    CHECK(r->sampler(4, 3, common)(1) == cut);
  }
  CHECK(error_message([&] { r0.sampler(4, 3, r0.size() + 1); }) ==
        "TarShards: epoch_size " + std::to_string(r0.size() + 1) + " is outside 0 to the " + std::to_string(r0.size()) +
            " samples of rank 0's shards");
}

TEST_CASE("TarShards: the same batches at 1, 2 and 4 workers, augmentations per sample whatever the world size") {
  TempDir dir;
  const Shards shards = make_shards(dir, 6);
  const auto transform = T::Compose({T::RandomResizedCrop({4}), T::RandomHorizontalFlip()});
  auto ds = std::make_shared<const TarShards>(shards.pattern, TarShardsOptions().transform(transform));
  auto batches = [&](int64_t workers, int64_t prefetch) {
    DataLoader loader(ds,
                      DataLoaderOptions(4).seed(9).num_workers(workers).prefetch(prefetch).sampler(ds->sampler(9, 3)));
    std::vector<Batch> all = epoch_batches(loader);
    for (Batch& b : epoch_batches(loader)) all.push_back(std::move(b));
    return all;
  };
  const std::vector<Batch> one = batches(1, 1);
  REQUIRE(one.size() == 2 * 5);  // 18 samples: 4 full batches and one of 2, two epochs
  for (auto [workers, prefetch] : {std::pair{2, 1}, {4, 2}, {4, 5}}) {
    INFO(workers << " workers, prefetch " << prefetch);
    require_equal(one, batches(workers, prefetch));
  }
  // Row k of a batch is the sample's own get() under sample_generator(seed, epoch, sample_id).
  const Batch& b = one[5];  // epoch 1
  for (int64_t k = 0; k < b.images.size(0); ++k) {
    Generator gen = sample_generator(9, 1, ds->sample_id(b.indices[k]));
    CHECK(bitwise_equal(b.images.select(0, k), ds->get(b.indices[k], gen).data));
  }
  // A sample's stream does not depend on which rank holds it.
  const TarShards r1(shards.pattern, TarShardsOptions().rank(1).world_size(2).transform(transform));
  Generator g1 = sample_generator(9, 0, r1.sample_id(0)), g0 = sample_generator(9, 0, ds->sample_id(2));
  REQUIRE(r1.name(0) == ds->name(2));  // shard 1's first sample
  CHECK(bitwise_equal(r1.get(0, g1).data, ds->get(2, g0).data));
}

TEST_CASE("TarShards: a resumed run (seek mid-epoch) gets the uninterrupted run's batches") {
  TempDir dir;
  const Shards shards = make_shards(dir, 5);
  auto ds = std::make_shared<const TarShards>(shards.pattern, TarShardsOptions().transform(T::RandomResizedCrop({4})));
  auto options = [&] { return DataLoaderOptions(2).seed(3).drop_last(true).num_workers(3).sampler(ds->sampler(3, 6)); };
  DataLoader full(ds, options());
  std::vector<Batch> e0 = epoch_batches(full), e1 = epoch_batches(full);
  for (int64_t k : {int64_t{0}, int64_t{1}, int64_t{3}}) {
    DataLoader resumed(ds, options());
    resumed.seek(1, k);
    std::vector<Batch> rest = epoch_batches(resumed);
    require_equal(std::vector<Batch>(e1.begin() + k, e1.end()), rest);
  }
  DataLoader resumed(ds, options());
  resumed.seek(0, 2);
  epoch_batches(resumed);
  require_equal(e1, epoch_batches(resumed));
}

// ---- bad input ------------------------------------------------------------------------

namespace {

// Samples a, b, c: a 4 x 4 PNG and a .cls of "1" each.
std::vector<TarMember> abc_members() {
  std::vector<TarMember> members;
  Generator gen{3, 0};
  for (const char* key : {"a", "b", "c"}) {
    const std::string png = encode_png(randint(0, 256, {3, 4, 4}, TensorOptions(kInt64), &gen).to(kUInt8));
    members.push_back({std::string(key) + ".png", Bytes(png.begin(), png.end())});
    members.push_back({std::string(key) + ".cls", text_bytes("1")});
  }
  return members;
}

// The byte where each member's header starts in make_tar(members).
std::map<std::string, int64_t> header_offsets(const std::vector<TarMember>& members) {
  std::map<std::string, int64_t> at;
  int64_t offset = 0;
  for (const TarMember& m : members) {
    at[m.name] = offset;
    offset += 512 + (static_cast<int64_t>(m.data.size()) + 511) / 512 * 512;
  }
  return at;
}

// The checksum a header block needs (its checksum field counted as spaces).
int64_t header_sum(const Bytes& b, int64_t at) {
  int64_t sum = 0;
  for (int64_t i = 0; i < 512; ++i) sum += i >= 148 && i < 156 ? ' ' : b[at + i];
  return sum;
}

// next()'s error at sample `bad` (samples in tar order, one a batch), again on the call
// after it, at 1 and 3 workers.
void check_loader_error(const std::string& path, int64_t bad, const std::string& expected) {
  for (int64_t workers : {1, 3}) {
    INFO(workers << " workers");
    auto ds = std::make_shared<const TarShards>(path);
    DataLoader loader(ds, DataLoaderOptions(1).num_workers(workers).sampler(ds->sampler(0, 0)));
    for (int64_t i = 0; i < bad; ++i) REQUIRE(loader.next().has_value());
    CHECK(error_message([&] { loader.next(); }) == expected);
    CHECK(error_message([&] { loader.next(); }) == expected);
  }
}

}  // namespace

TEST_CASE("TarShards: a damaged tar is an error naming the shard, the member and what is wrong") {
  TempDir dir;
  const std::string p = dir.file("bad.tar");
  const std::vector<TarMember> members = abc_members();
  std::map<std::string, int64_t> at = header_offsets(members);
  const Bytes good = make_tar(members);
  auto error_with = [&](const Bytes& bytes) {
    write_bytes(p, bytes);
    return error_message([&] { TarShards ds(p); });
  };
  const std::string prefix = "TarShards: shard '" + p + "': ";
  const int64_t c_png = at["c.png"] + 512;
  CHECK(error_with(Bytes(good.begin(), good.begin() + c_png + 10)) ==
        prefix + "member 'c.png' is cut off: its header says " + std::to_string(members[4].data.size()) +
            " bytes from byte " + std::to_string(c_png) + ", but the file ends at byte " + std::to_string(c_png + 10));
  CHECK(error_with(Bytes(good.begin(), good.begin() + at["c.png"] + 100)) ==
        prefix + "the file ends at byte " + std::to_string(at["c.png"] + 100) + " inside the header at byte " +
            std::to_string(at["c.png"]) + " (after member 'b.cls'): cut off?");
  CHECK(error_with(Bytes(good.begin(), good.end() - 1024)) ==
        prefix + "the file ends at byte " + std::to_string(good.size() - 1024) +
            " after member 'c.cls' without tar's end-of-archive blocks: cut off?");
  Bytes flipped = good;
  const int64_t stored = header_sum(good, at["b.png"]);
  flipped[at["b.png"]] = 'c';  // "b.png" -> "c.png": one more than the stored sum
  CHECK(error_with(flipped) == prefix + "the header at byte " + std::to_string(at["b.png"]) +
                                   " (after member 'a.cls') has a bad checksum (stored " + std::to_string(stored) +
                                   ", computed " + std::to_string(stored + 1) + "): not a tar file, or damaged");
  Bytes text;
  for (int i = 0; i < 100; ++i)
    for (char ch : std::string("not a tar ")) text.push_back(static_cast<uint8_t>(ch));
  CHECK(error_with(text) == prefix + "the header at byte 0 (the first) has a bad checksum (stored none, computed " +
                                std::to_string(header_sum(text, 0)) + "): not a tar file, or damaged");
  CHECK(error_with({}) == prefix.substr(0, prefix.size() - 2) + " is empty (0 bytes): not a tar file");
  CHECK(error_with(Bytes(good.begin(), good.begin() + at["b.png"])) ==
        prefix + "the file ends at byte " + std::to_string(at["b.png"]) +
            " after member 'a.cls' without tar's end-of-archive blocks: cut off?");
  CHECK(error_with(Bytes(1024, 0)) ==
        "TarShards: the shards of rank 0 of 1 hold no sample (no member named <key>.<extension>)");
}

TEST_CASE("TarShards: missing, unreadable and too few shards") {
  TempDir dir;
  const std::string d = dir.path.string();
  CHECK(error_message([&] { TarShards ds(d + "/none-{0..3}.tar"); }) ==
        "TarShards: '" + d + "/none-{0..3}.tar' names 4 files and none of them exists (the first: '" + d +
            "/none-0.tar')");
  CHECK(error_message([&] { TarShards ds(d + "/none.tar"); }) ==
        "TarShards: '" + d + "/none.tar' names 1 file, which does not exist");
  write_bytes(dir.file("part-0.tar"), make_tar(abc_members()));
  write_bytes(dir.file("part-2.tar"), make_tar(abc_members()));
  CHECK(error_message([&] { TarShards ds(d + "/part-{0..2}.tar"); }) ==
        "TarShards: the shard '" + d + "/part-1.tar' does not exist");
  fs::create_directories(dir.file("folder.tar"));
  CHECK(error_message([&] { TarShards ds(std::vector<std::string>{dir.file("folder.tar")}); }) ==
        "TarShards: the shard '" + dir.file("folder.tar") + "' is not a file");
  CHECK(error_message([&] { TarShards ds(d + "/part-{0,2}.tar", TarShardsOptions().rank(1).world_size(4)); }) ==
        "TarShards: 2 shards for 4 ranks: each rank reads its own shards (shard i goes to rank i % world_size), so "
        "there must be at least as many shards as ranks");
  CHECK(error_message([&] { TarShards ds(d + "/part-0.tar", TarShardsOptions().rank(1)); }) ==
        "TarShards: expected 0 <= rank < world_size, got rank 1 of 1");
}

TEST_CASE("TarShards: a shard without read permission") {
  if (::geteuid() == 0) {
    MESSAGE("SKIPPED: running as root, which reads any file");
    return;
  }
  TempDir dir;
  write_bytes(dir.file("part-0.tar"), make_tar(abc_members()));
  write_bytes(dir.file("part-1.tar"), make_tar(abc_members()));
  ::chmod(dir.file("part-1.tar").c_str(), 0);
  CHECK(error_message([&] { TarShards ds(dir.path.string() + "/part-{0..1}.tar"); }) ==
        "TarShards: cannot open the shard '" + dir.file("part-1.tar") + "': Permission denied");
}

TEST_CASE("TarShards: a bad sample is raised by next() naming shard and member at 1 and 3 workers, or skipped") {
  TempDir dir;
  const std::string p = dir.file("s.tar");
  const std::string prefix = "TarShards: shard '" + p + "': ";
  std::vector<TarMember> members = abc_members();
  auto write_without = [&](const std::string& name) {
    std::vector<TarMember> kept;
    for (const TarMember& m : members)
      if (m.name != name) kept.push_back(m);
    write_bytes(p, make_tar(kept));
  };
  write_without("b.cls");
  check_loader_error(p, 1, prefix + "sample 'b': no class member (b.cls)");
  write_without("b.png");
  check_loader_error(p, 1, prefix + "sample 'b': no image member (b.jpg, .jpeg or .png)");
  for (const char* cls : {"seven", "-1", "", "1.5"}) {
    members[3].data = text_bytes(cls);
    write_bytes(p, make_tar(members));
    check_loader_error(p, 1, prefix + "member 'b.cls' holds '" + cls + "', not a class index (decimal digits, >= 0)");
  }
  members[3].data = text_bytes("1");
  std::vector<TarMember> two = members;
  two.insert(two.begin() + 3, TarMember{"b.jpg", members[2].data});
  write_bytes(p, make_tar(two));
  check_loader_error(p, 1, prefix + "sample 'b': two image members, 'b.png' and 'b.jpg'");
  // A PNG cut inside the tar: the decoder's own error, naming "<shard>:<member>".
  const Bytes png = members[2].data;
  members[2].data.resize(png.size() - 20);
  write_bytes(p, make_tar(members));
  const std::string decoder_error = error_message([&] { decode_image(members[2].data, p + ":b.png"); });
  CHECK(decoder_error.starts_with("decode_image: '" + p + ":b.png': "));
  check_loader_error(p, 1, decoder_error);

  // skip_unreadable: b left out of its batch and listed once, a and c served.
  members[2].data = png;
  write_without("b.cls");
  for (int64_t workers : {1, 3}) {
    auto ds = std::make_shared<const TarShards>(p);
    DataLoader loader(ds, DataLoaderOptions(3).num_workers(workers).skip_unreadable(true).sampler(ds->sampler(0, 0)));
    std::optional<Batch> b = loader.next();
    REQUIRE(b.has_value());
    CHECK(b->indices == std::vector<int64_t>{0, 2});
    REQUIRE(loader.skipped().size() == 1);
    CHECK(loader.skipped()[0].index == 1);
    CHECK(loader.skipped()[0].error == prefix + "sample 'b': no class member (b.cls)");
  }
}

TEST_CASE("TarShards: shards written by Python's tarfile (ustar, pax, GNU), grouped as WebDataset groups them") {
  if (std::system("python3 -c 'import tarfile' >/dev/null 2>&1") != 0) {
    MESSAGE("SKIPPED: no python3 to write the shards with tarfile");
    return;
  }
  TempDir dir;
  const std::string png = encode_png(full({3, 2, 3}, 200, TensorOptions(kUInt8)));
  write_bytes(dir.file("x.png"), Bytes(png.begin(), png.end()));
  // Long names take the ustar prefix field, a pax 'x' header or a GNU 'L' member; a folder
  // member and a link are skipped; the keys Python prints follow webdataset's
  // base_plus_ext and group_by_keys.
  const std::string script = R"PY(
import io, re, sys, tarfile
out, png = sys.argv[1], open(sys.argv[2], 'rb').read()
def add(tf, name, data):
    ti = tarfile.TarInfo(name); ti.size = len(data); tf.addfile(ti, io.BytesIO(data))
formats = {'ustar': tarfile.USTAR_FORMAT, 'pax': tarfile.PAX_FORMAT, 'gnu': tarfile.GNU_FORMAT}
for name, fmt in formats.items():
    with tarfile.open(f'{out}/{name}.tar', 'w', format=fmt) as tf:
        d = tarfile.TarInfo('top'); d.type = tarfile.DIRTYPE; tf.addfile(d)
        keys = ['top/k0', 'p' * 120 + '.d/k1', 'top/K2']
        if fmt != tarfile.USTAR_FORMAT: keys += ['q' * 130, 'top/\u00e9t\u00e9']
        for i, key in enumerate(keys):
            add(tf, key + ('.PNG' if i == 2 else '.png'), png)
            add(tf, key + '.cls', f'{i * 3}\n'.encode())
        link = tarfile.TarInfo('top/link.png'); link.type = tarfile.SYMTYPE; link.linkname = 'k0.png'; tf.addfile(link)
    with tarfile.open(f'{out}/{name}.tar') as tf:
        samples = []
        for m in tf:
            if not m.isreg(): continue
            match = re.match(r'^((?:.*/|)[^.]+)[.]([^/]*)$', m.name)
            if not match: continue
            key, ext = match.groups()
            if not samples or samples[-1]['__key__'] != key: samples.append({'__key__': key})
            samples[-1][ext.lower()] = tf.extractfile(m).read()
        for s in samples: print(name, s['__key__'], int(s['cls']))
)PY";
  write_bytes(dir.file("make.py"), text_bytes(script));
  const std::string listing = dir.file("samples.txt");
  REQUIRE(std::system(("PYTHONIOENCODING=utf-8 python3 " + dir.file("make.py") + " " + dir.path.string() + " " +
                       dir.file("x.png") + " > " + listing)
                          .c_str()) == 0);
  std::map<std::string, std::vector<std::pair<std::string, int64_t>>> expected;  // format -> (key, class)
  std::ifstream in(listing);
  for (std::string format, key; in >> format >> key;) {
    int64_t cls = 0;
    in >> cls;
    expected[format].emplace_back(key, cls);
  }
  REQUIRE(expected.size() == 3);
  CHECK(expected["ustar"].size() == 3);
  CHECK(expected["pax"].size() == 5);
  for (const auto& [format, samples] : expected) {
    INFO(format);
    const std::string path = dir.file(format + ".tar");
    const TarShards ds(path);
    REQUIRE(ds.size() == static_cast<int64_t>(samples.size()));
    for (int64_t i = 0; i < ds.size(); ++i) {
      Generator gen = sample_generator(0, 0, i);
      const Example e = ds.get(i, gen);
      CHECK(ds.name(i) == path + ":" + samples[i].first);
      CHECK(e.target == samples[i].second);
      CHECK(bitwise_equal(e.data, full({3, 2, 3}, 200, TensorOptions(kUInt8))));
    }
  }
}
