// DataLoader over image datasets: [B, C, H, W] batches equal to the dataset's own samples
// under sample_generator(seed, epoch, index); the same batches at 1, 2 and 4 workers;
// seek() mid-epoch equal to the uninterrupted run; corrupt files raised in the caller's
// thread (at 1 and several workers; every kind of bad file) or skipped and listed with
// skip_unreadable.
#include <algorithm>
#include <set>

#include "data_test_util.h"

using namespace nd;
namespace T = nd::data::transforms;

namespace {

T::AnyTransform train_transform() {
  return T::Compose({T::RandomResizedCrop({16}), T::RandomHorizontalFlip(), T::ToTensor(),
                     T::Normalize({0.5, 0.4, 0.3}, {0.2, 0.25, 0.3})});
}

std::shared_ptr<const data::ImageFolder> folder_of(const TempDir& dir, T::AnyTransform transform = train_transform()) {
  return std::make_shared<const data::ImageFolder>(dir.path.string(), data::ImageFolderOptions().transform(transform));
}

// Every batch of `epochs` epochs, through next().
std::vector<data::Batch> run(data::DataLoader& loader, int epochs) {
  std::vector<data::Batch> out;
  for (int e = 0; e < epochs; ++e)
    while (auto batch = loader.next()) out.push_back(std::move(*batch));
  return out;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.sizes() == b.sizes() && a.dtype() == b.dtype() &&
         std::equal(a.contiguous().data_ptr<float>(), a.contiguous().data_ptr<float>() + a.numel(),
                    b.contiguous().data_ptr<float>());
}

void check_same(const std::vector<data::Batch>& a, const std::vector<data::Batch>& b) {
  REQUIRE(a.size() == b.size());
  for (size_t k = 0; k < a.size(); ++k) {
    CAPTURE(k);
    CHECK(a[k].indices == b[k].indices);
    CHECK(same_bits(a[k].images, b[k].images));
    CHECK(nd::testing::to_vector(a[k].labels) == nd::testing::to_vector(b[k].labels));
  }
}

}  // namespace

TEST_CASE("image DataLoader: [B, 3, H, W] f32 batches of get(i, sample_generator(seed, epoch, i)) in epoch order") {
  TempDir dir;
  make_image_folder(dir.path, 30);
  const auto folder = folder_of(dir);
  data::DataLoader loader(folder, data::DataLoaderOptions(8).shuffle(true).seed(5).num_workers(2));
  CHECK(loader.dataset_size() == 32);
  CHECK(loader.size() == 4);
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    const std::vector<int64_t> order = loader.epoch_order(epoch);
    std::vector<int64_t> seen;
    std::vector<int64_t> sizes;
    while (auto batch = loader.next()) {
      sizes.push_back(batch->images.size(0));
      CHECK(batch->images.dtype() == kFloat32);
      CHECK(batch->images.sizes() == Shape{batch->images.size(0), 3, 16, 16});
      const auto labels = nd::testing::to_vector(batch->labels);
      for (size_t j = 0; j < batch->indices.size(); ++j) {
        const int64_t i = batch->indices[j];
        Generator gen = data::sample_generator(5, epoch, i);
        const data::Example expected = folder->get(i, gen);
        CHECK(same_bits(batch->images.select(0, static_cast<int64_t>(j)), expected.data));
        CHECK(labels[j] == expected.target);
        CHECK(expected.target == folder->samples()[i].second);
      }
      seen.insert(seen.end(), batch->indices.begin(), batch->indices.end());
    }
    CHECK(seen == order);
    CHECK(sizes == std::vector<int64_t>{8, 8, 8, 8});
  }
  // Epochs differ in order and augmentation, and so do seeds.
  CHECK(loader.epoch_order(0) != loader.epoch_order(1));
}

TEST_CASE("image DataLoader: identical batches at 1, 2 and 4 workers, any prefetch, with drop_last and shards") {
  TempDir dir;
  make_image_folder(dir.path, 40);
  const auto folder = folder_of(dir);
  std::vector<int64_t> shard;
  for (int64_t i = 1; i < 42; i += 2) shard.push_back(i);  // 21 samples: 2 batches of 8, 5 dropped
  auto options = data::DataLoaderOptions(8).shuffle(true).seed(11).drop_last(true).indices(shard);
  data::DataLoader one(folder, data::DataLoaderOptions(options).num_workers(1).prefetch(1));
  const auto reference = run(one, 3);
  CHECK(reference.size() == 6);
  for (int64_t workers : {2, 4}) {
    for (int64_t prefetch : {1, 3}) {
      CAPTURE(workers);
      CAPTURE(prefetch);
      data::DataLoader many(folder, data::DataLoaderOptions(options).num_workers(workers).prefetch(prefetch));
      check_same(run(many, 3), reference);
    }
  }
  // Another seed: other orders and other crops.
  data::DataLoader other(folder, data::DataLoaderOptions(options).seed(12).num_workers(2));
  const auto b = run(other, 1);
  CHECK(b[0].indices != reference[0].indices);
  for (int64_t i : reference[0].indices) CHECK(std::set<int64_t>(shard.begin(), shard.end()).count(i) == 1);
}

TEST_CASE("image DataLoader: seek(epoch, batch) continues exactly where the uninterrupted run was") {
  TempDir dir;
  make_image_folder(dir.path, 34);
  const auto folder = folder_of(dir);
  auto options = data::DataLoaderOptions(5).shuffle(true).seed(3).num_workers(3);
  data::DataLoader whole(folder, options);
  const auto all = run(whole, 2);  // 36 samples: 8 batches an epoch, the last of 1
  REQUIRE(all.size() == 16);
  CHECK(all[7].images.size(0) == 1);
  for (int64_t at : {0, 3, 7, 8, 11}) {
    CAPTURE(at);
    data::DataLoader resumed(folder, options);
    resumed.next();  // something in flight that the seek must drop
    resumed.seek(at / 8, at % 8);
    CHECK(resumed.epoch() == at / 8);
    std::vector<data::Batch> rest;
    for (int64_t k = at; k < 16; ++k) {
      auto batch = resumed.next();
      if (!batch) batch = resumed.next();  // the end of epoch 0
      REQUIRE(batch);
      rest.push_back(std::move(*batch));
    }
    check_same(rest, std::vector<data::Batch>(all.begin() + at, all.end()));
  }
  // Seeking to an epoch's end serves its end, then the next epoch.
  data::DataLoader end(folder, options);
  end.seek(0, 8);
  CHECK(!end.next());
  CHECK(end.next()->indices == all[8].indices);
  CHECK(error_message([&] { end.seek(0, 9); }) == "DataLoader::seek: batch 9 is outside epoch 0 (0 to 8 batches)");
  CHECK(error_message([&] { end.seek(-1, 0); }) == "DataLoader: expected epoch >= 0, got -1");
}

TEST_CASE("image DataLoader: a corrupt or non-image file is an nd::Error in the caller's thread naming it") {
  TempDir dir;
  make_image_folder(dir.path, 14);  // a: 000, 002 .. 012.png, j420.jpg (samples 0-7); b: 001 .. 013.png, j444.jpg (8-15)
  const Bytes good = data::read_file(golden_image("j420.jpg"));
  write_bytes(dir.file("a/j420.jpg"), Bytes(good.begin(), good.begin() + static_cast<long>(good.size() / 2)));
  write_bytes(dir.file("b/013.png"), Bytes{'n', 'o', 't', ' ', 'a', 'n', ' ', 'i', 'm', 'a', 'g', 'e'});
  // Resize then CenterCrop: the whole file is decoded, so the cut-off half is seen.
  const auto folder = folder_of(dir, T::Compose({T::Resize({12}), T::CenterCrop({12}), T::ToTensor()}));
  REQUIRE(folder->samples()[7].first == dir.file("a/j420.jpg"));
  REQUIRE(folder->samples()[14].first == dir.file("b/013.png"));
  const std::string cut = "decode_image: '" + dir.file("a/j420.jpg") + "': not a valid JPEG: Premature end of JPEG file";
  const std::string not_image = "decode_image: '" + dir.file("b/013.png") +
                                "': not a JPEG or PNG image (it starts with bytes 6E 6F 74 20; a JPEG starts with FF "
                                "D8 FF, a PNG with 89 50 4E 47)";
  for (int64_t workers : {1, 2, 4}) {
    CAPTURE(workers);
    data::DataLoader loader(folder, data::DataLoaderOptions(4).num_workers(workers));
    CHECK(loader.next()->indices == std::vector<int64_t>{0, 1, 2, 3});
    CHECK(error_message([&] { loader.next(); }) == cut);
    CHECK(error_message([&] { loader.next(); }) == cut);  // the same batch again, not the one after it
    loader.seek(0, 2);
    CHECK(loader.next()->indices == std::vector<int64_t>{8, 9, 10, 11});
    CHECK(error_message([&] { loader.next(); }) == not_image);
    // Destroyed with an error pending and workers busy: joins, no hang.
  }
  // skip_unreadable: the two files are left out of their batches and listed once each.
  for (int64_t workers : {1, 3}) {
    CAPTURE(workers);
    data::DataLoader loader(folder, data::DataLoaderOptions(4).num_workers(workers).skip_unreadable(true));
    const auto batches = run(loader, 2);
    REQUIRE(batches.size() == 8);
    CHECK(batches[1].indices == std::vector<int64_t>{4, 5, 6});
    CHECK(batches[1].images.sizes() == Shape{3, 3, 12, 12});
    CHECK(batches[3].indices == std::vector<int64_t>{12, 13, 15});
    CHECK(nd::testing::to_vector(batches[3].labels) == std::vector<double>{1, 1, 1});
    const auto skipped = loader.skipped();
    REQUIRE(skipped.size() == 2);
    CHECK(skipped[0].index == 7);
    CHECK(skipped[0].error == cut);
    CHECK(skipped[1].index == 14);
    CHECK(skipped[1].error == not_image);
  }
  // A batch of nothing but unreadable files is an error naming the first.
  data::DataLoader lone(folder, data::DataLoaderOptions(1).skip_unreadable(true));
  lone.seek(0, 7);
  CHECK(error_message([&] { lone.next(); }) ==
        "DataLoader: skip_unreadable left none of the 1 samples of a batch (the first: " + cut + ")");
}

TEST_CASE("image DataLoader: samples of different shapes, a failing sampler and bad options are clear errors") {
  TempDir dir;
  make_image_folder(dir.path, 4);
  const auto raw = folder_of(dir, {});  // no transform: each image its own size, u8
  data::DataLoader loader(raw, data::DataLoaderOptions(2).num_workers(2));
  CHECK(error_message([&] { loader.next(); }) ==
        "DataLoader: sample 1 is [3, 26, 22] u8 but sample 0 of the same batch is [3, 24, 20] u8: a batch needs one "
        "shape; give the dataset a transform that makes every image one size (Resize + CenterCrop, or "
        "RandomResizedCrop)");
  // A sampler that fails at epoch 1: the error reaches next(), the loader waits for a seek.
  auto sampler = [](int64_t epoch) {
    if (epoch == 1) throw Error("no shard for epoch 1");
    return std::vector<int64_t>{0, 1, 2};
  };
  data::DataLoader failing(folder_of(dir), data::DataLoaderOptions(2).sampler(sampler).num_workers(2));
  CHECK(run(failing, 1).size() == 2);
  CHECK(error_message([&] { failing.next(); }) == "no shard for epoch 1");
  CHECK(error_message([&] { failing.next(); }) == "no shard for epoch 1");
  failing.set_epoch(0);
  CHECK(failing.next()->indices == std::vector<int64_t>{0, 1});
  CHECK(error_message([&] { data::DataLoader l(raw, data::DataLoaderOptions(2).num_workers(0)); }) ==
        "DataLoader: num_workers must be at least 1, got 0 (batches are always built by worker threads)");
  CHECK(error_message([&] {
          data::DataLoader l(data::Dataset{zeros({2, 1, 28, 28}), zeros({2}, kInt64)},
                             data::DataLoaderOptions(2).skip_unreadable(true));
        }) == "DataLoader: skip_unreadable needs an image dataset (files to skip)");
  CHECK(error_message([&] { data::DataLoader l(std::shared_ptr<const data::ImageDataset>(), {}); }) ==
        "DataLoader: the image dataset is null");
}

TEST_CASE("image DataLoader: every kind of bad file is an nd::Error naming it, at 1 and 3 workers") {
  const Bytes png = data::read_file(golden_image("rgb8.png"));
  size_t idat = 0;
  while (!(png[idat] == 'I' && png[idat + 1] == 'D' && png[idat + 2] == 'A' && png[idat + 3] == 'T')) ++idat;
  Bytes bad_crc = png;
  bad_crc[idat + 4 + ((png[idat - 2] << 8) | png[idat - 1])] ^= 0x01;  // IDAT's CRC (a short chunk: length < 65536)
  const std::vector<std::pair<Bytes, std::string>> kinds = {
      {bad_crc, "not a valid PNG: IDAT: CRC error"},
      {Bytes(png.begin(), png.end() - 12), "not a valid PNG: the file ends early (it is truncated)"},
      {Bytes{}, "the file is empty; expected a JPEG or PNG image"},
      {Bytes{0xFF, 0xD8, 0xFF}, "not a valid JPEG: Premature end of JPEG file"},
  };
  for (const auto& [bytes, what] : kinds) {
    TempDir dir;
    make_image_folder(dir.path, 6);  // a: 0-3, b: 001, 003, 005, j444 (4-7), then b/zzz (8)
    write_bytes(dir.file("b/zzz.png"), bytes);
    const auto folder = folder_of(dir, T::Compose({T::Resize({12}), T::CenterCrop({12}), T::ToTensor()}));
    for (int64_t workers : {1, 3}) {
      CAPTURE(what);
      CAPTURE(workers);
      data::DataLoader loader(folder, data::DataLoaderOptions(3).num_workers(workers));
      CHECK(loader.next()->indices == std::vector<int64_t>{0, 1, 2});
      CHECK(loader.next()->indices == std::vector<int64_t>{3, 4, 5});
      CHECK(error_message([&] { loader.next(); }) == "decode_image: '" + dir.file("b/zzz.png") + "': " + what);
    }
  }
  // A listed file that is not there.
  TempDir dir;
  make_image_folder(dir.path, 2);
  const auto listed = std::make_shared<const data::ImageFolder>(
      dir.path.string(), data::ImageFolderOptions().files({"a/000.png", "b/001.png", "b/gone.png"}));
  for (int64_t workers : {1, 3}) {
    data::DataLoader loader(listed, data::DataLoaderOptions(3).num_workers(workers));
    CHECK(error_message([&] { loader.next(); }) ==
          "decode_image: '" + dir.file("b/gone.png") + "': cannot open it: No such file or directory");
  }
}
