// Datasets (data/datasets.h): ImageFolder's classes and order (torchvision's rules), its
// file list, transforms per sample, concurrent get(); CIFAR-10/100 binary batches written
// here in the exact format; every error with its message.
#include <filesystem>
#include <thread>

#include "data_test_util.h"

using namespace nd;
namespace fs = std::filesystem;

namespace {

void copy_image(const std::string& name, const std::string& to) { write_bytes(to, data::read_file(golden_image(name))); }

// root/cat: B.png, a.jpg, sub/c.JPEG, notes.txt; root/dog: x.Png.
void make_folder(const TempDir& dir) {
  copy_image("rgb8.png", dir.file("cat/B.png"));
  copy_image("j420.jpg", dir.file("cat/a.jpg"));
  copy_image("j444.jpg", dir.file("cat/sub/c.JPEG"));
  write_bytes(dir.file("cat/notes.txt"), Bytes{'h', 'i'});
  copy_image("grey8.png", dir.file("dog/x.Png"));
}

}  // namespace

TEST_CASE("ImageFolder: sorted classes, torchvision's file order, any-case extensions, other files skipped") {
  TempDir dir;
  make_folder(dir);
  const data::ImageFolder folder(dir.path.string());
  CHECK(folder.classes() == std::vector<std::string>{"cat", "dog"});
  CHECK(folder.class_to_idx() == std::map<std::string, int64_t>{{"cat", 0}, {"dog", 1}});
  // sorted os.walk: a folder's files ('B' < 'a' by code point) before its subfolders'.
  const std::vector<std::pair<std::string, int64_t>> expected = {
      {dir.file("cat/B.png"), 0}, {dir.file("cat/a.jpg"), 0}, {dir.file("cat/sub/c.JPEG"), 0}, {dir.file("dog/x.Png"), 1}};
  CHECK(folder.samples() == expected);
  CHECK(folder.size() == 4);
  // A link back to a folder already walked is not entered again (os.walk would loop).
  fs::create_directory_symlink(dir.file("cat"), dir.file("cat/sub/loop"));
  CHECK(data::ImageFolder(dir.path.string()).samples() == expected);
  fs::remove(dir.file("cat/sub/loop"));

  // No transform: the decoded image as [3, H, W] u8, the target its class.
  Generator gen;
  const data::Example e = folder.get(1, gen);
  CHECK(e.target == 0);
  CHECK(e.data.dtype() == kUInt8);
  CHECK(e.data.sizes() == Shape{3, 61, 77});
  const data::Image decoded = data::decode_image(data::read_file(golden_image("j420.jpg")), "j420.jpg");
  CHECK(e.data.data_ptr<uint8_t>()[61 * 77 + 5] == decoded.pixels[5 * 3 + 1]);  // G of pixel (0, 5)
  CHECK(folder.get(3, gen).target == 1);

  // A file list naming the same files gives the same dataset, in the same order.
  const data::ImageFolder listed(
      dir.path.string(),
      data::ImageFolderOptions().files({"dog/x.Png", "cat/sub/c.JPEG", "cat/a.jpg", "cat/B.png"}));
  CHECK(listed.samples() == expected);
  CHECK(listed.classes() == folder.classes());
}

TEST_CASE("ImageFolder applies its transform per sample, with the sample's own random stream, from many threads") {
  TempDir dir;
  make_folder(dir);
  using namespace data::transforms;
  const data::ImageFolder folder(
      dir.path.string(),
      data::ImageFolderOptions().transform(Compose({RandomResizedCrop({12}), RandomHorizontalFlip(), ToTensor()})));
  std::vector<Tensor> serial;
  for (int64_t i = 0; i < 4 * folder.size(); ++i) {
    Generator gen = data::sample_generator(11, 0, i);
    serial.push_back(folder.get(i % folder.size(), gen).data);
    CHECK(serial.back().sizes() == Shape{3, 12, 12});
    CHECK(serial.back().dtype() == kFloat32);
  }
  std::vector<Tensor> threaded(serial.size());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (size_t i = t; i < threaded.size(); i += 4) {
        Generator gen = data::sample_generator(11, 0, static_cast<int64_t>(i));
        threaded[i] = folder.get(static_cast<int64_t>(i) % folder.size(), gen).data;
      }
    });
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < serial.size(); ++i) CHECK(nd::testing::to_vector(threaded[i]) == nd::testing::to_vector(serial[i]));
  // Same file, different sample index: a different crop.
  CHECK(nd::testing::to_vector(serial[0]) != nd::testing::to_vector(serial[4]));
}

TEST_CASE("ImageFolder errors: missing root, no class folder, a class without images, bad file list, bad file") {
  TempDir dir;
  CHECK(error_message([&] { data::ImageFolder(dir.file("nope")); }) ==
        "ImageFolder: the root folder '" + dir.file("nope") + "' does not exist");
  write_bytes(dir.file("file.txt"), Bytes{'x'});
  CHECK(error_message([&] { data::ImageFolder(dir.file("file.txt")); }) ==
        "ImageFolder: the root '" + dir.file("file.txt") + "' is not a folder");
  CHECK(error_message([&] { data::ImageFolder(dir.path.string()); }) ==
        "ImageFolder: found no class folder in '" + dir.path.string() +
            "'; expected one subfolder per class holding its images");
  make_folder(dir);
  fs::create_directories(dir.file("empty"));
  write_bytes(dir.file("texts/readme.md"), Bytes{'x'});
  CHECK(error_message([&] { data::ImageFolder(dir.path.string()); }) ==
        "ImageFolder: found no image file for the classes 'empty', 'texts' in '" + dir.path.string() +
            "'; supported extensions are .jpg, .jpeg, .png (in any case)");
  CHECK(error_message([&] { data::ImageFolder(dir.path.string(), data::ImageFolderOptions().files({"a.jpg"})); }) ==
        "ImageFolder: the file list entry 'a.jpg' names no class folder; expected '<class>/<file>' relative to the "
        "root '" + dir.path.string() + "'");
  CHECK(error_message([&] { data::ImageFolder(dir.path.string(), data::ImageFolderOptions().files({"cat/a.gif"})); }) ==
        "ImageFolder: the file list entry 'cat/a.gif' is not an image file; expected one of .jpg, .jpeg, .png (in any "
        "case)");

  // A file that only looks like an image fails when read, naming itself; so does a listed
  // file that is missing, and an index out of range.
  fs::remove_all(dir.file("empty"));
  fs::remove_all(dir.file("texts"));
  write_bytes(dir.file("dog/y.jpg"), Bytes{'n', 'o', 't', ' ', 'a', 'n', ' ', 'i', 'm', 'a', 'g', 'e'});
  const data::ImageFolder folder(dir.path.string());
  Generator gen;
  CHECK(error_message([&] { folder.get(4, gen); }) ==
        "decode_image: '" + dir.file("dog/y.jpg") +
            "': not a JPEG or PNG image (it starts with bytes 6E 6F 74 20; a JPEG starts with FF D8 FF, a PNG with 89 "
            "50 4E 47)");
  CHECK(error_message([&] { folder.get(5, gen); }) == "ImageFolder: index 5 is out of range for a dataset of 5 samples");
  const data::ImageFolder listed(dir.path.string(), data::ImageFolderOptions().files({"cat/gone.png"}));
  CHECK(error_message([&] { listed.get(0, gen); }) ==
        "decode_image: '" + dir.file("cat/gone.png") + "': cannot open it: No such file or directory");
}

namespace {

// A CIFAR record: label byte(s), then 3072 pixel bytes that encode (record, channel, y, x).
Bytes cifar_records(int64_t n, Bytes (*labels)(int64_t), int64_t first) {
  Bytes out;
  for (int64_t k = 0; k < n; ++k) {
    for (uint8_t l : labels(first + k)) out.push_back(l);
    for (int64_t i = 0; i < 3072; ++i) out.push_back(static_cast<uint8_t>((first + k) * 7 + i * 3 + i / 1024));
  }
  return out;
}

uint8_t cifar_pixel(int64_t record, int c, int y, int x) {
  const int64_t i = c * 1024 + y * 32 + x;
  return static_cast<uint8_t>(record * 7 + i * 3 + i / 1024);
}

Bytes cifar10_label(int64_t k) { return {static_cast<uint8_t>(k % 10)}; }
Bytes cifar100_labels(int64_t k) {  // coarse, fine
  return {static_cast<uint8_t>(k % 20), static_cast<uint8_t>((k * 13) % 100)};
}

}  // namespace

TEST_CASE("CIFAR10 and CIFAR100 read the binary batches: labels, CHW planes to pixels, class names") {
  TempDir dir;
  const std::string c10 = dir.file("cifar-10-batches-bin");
  for (int b = 1; b <= 5; ++b)
    write_bytes(c10 + "/data_batch_" + std::to_string(b) + ".bin", cifar_records(3, cifar10_label, (b - 1) * 3));
  write_bytes(c10 + "/test_batch.bin", cifar_records(4, cifar10_label, 100));
  const std::string names = "airplane\nautomobile\nbird\ncat\ndeer\ndog\nfrog\nhorse\nship\ntruck\n\n";
  write_bytes(c10 + "/batches.meta.txt", Bytes(names.begin(), names.end()));

  const data::CIFAR10 train(dir.path.string());  // the folder holding cifar-10-batches-bin
  CHECK(train.size() == 15);
  CHECK(train.classes().size() == 10);
  CHECK(train.classes()[9] == "truck");
  for (int64_t k = 0; k < 15; ++k) CHECK(train.targets()[k] == k % 10);
  const data::Image img = train.image(7);
  CHECK(img.pixels[(5 * 32 + 9) * 3 + 2] == cifar_pixel(7, 2, 5, 9));  // blue at (5, 9)
  CHECK(img.pixels[(31 * 32 + 31) * 3 + 0] == cifar_pixel(7, 0, 31, 31));
  const data::CIFAR10 test(c10, /*train=*/false, data::transforms::ToTensor());  // the folder itself
  CHECK(test.size() == 4);
  Generator gen;
  const data::Example e = test.get(2, gen);
  CHECK(e.target == 102 % 10);
  CHECK(e.data.sizes() == Shape{3, 32, 32});
  CHECK(e.data.data_ptr<float>()[1 * 1024 + 3 * 32 + 4] == static_cast<float>(cifar_pixel(102, 1, 3, 4)) / 255.0f);

  const std::string c100 = dir.file("cifar-100-binary");
  write_bytes(c100 + "/train.bin", cifar_records(6, cifar100_labels, 0));
  const data::CIFAR100 hundred(dir.path.string());
  CHECK(hundred.size() == 6);
  CHECK(hundred.targets()[5] == (5 * 13) % 100);  // the fine label
  CHECK(hundred.classes().empty());                // no fine_label_names.txt
  CHECK(hundred.get(5, gen).data.data_ptr<uint8_t>()[2 * 1024] == cifar_pixel(5, 2, 0, 0));
}

TEST_CASE("CIFAR errors: a missing batch, a cut-off batch, a label out of range") {
  TempDir dir;
  CHECK(error_message([&] { data::CIFAR10(dir.path.string(), false); }) ==
        "CIFAR10: cannot find '" + dir.file("test_batch.bin") + "'");
  Bytes cut = cifar_records(2, cifar10_label, 0);
  cut.resize(cut.size() - 100);
  write_bytes(dir.file("test_batch.bin"), cut);
  CHECK(error_message([&] { data::CIFAR10(dir.path.string(), false); }) ==
        "CIFAR10: '" + dir.file("test_batch.bin") +
            "' holds 6046 bytes, not a whole number of 3073-byte records (1 label byte + 3072 pixels); is it cut off?");
  Bytes bad = cifar_records(3, cifar100_labels, 0);
  bad[2 * 3074 + 1] = 100;
  write_bytes(dir.file("test.bin"), bad);
  CHECK(error_message([&] { data::CIFAR100(dir.path.string(), false); }) ==
        "CIFAR100: '" + dir.file("test.bin") + "' record 2 has label 100; expected 0 to 99");
}
