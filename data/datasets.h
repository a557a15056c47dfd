#pragma once
// Image datasets with torchvision's names and meaning (nd::data): ImageFolder, CIFAR10,
// CIFAR100. Tests: tests/data/datasets_test.cpp.
//
// A DataLoader's worker threads call get() on one dataset at once: get() is const, keeps
// no state between calls, reads its file itself, and takes its random draws from the
// Generator it is handed (data/transforms.h: sample_generator(seed, epoch, index)).
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "data/transforms.h"
#include "engine/nn/module.h"  // ND_ARG

namespace nd::data {

// One sample (LibTorch's Example<Tensor, int64_t>): the image after the dataset's transform
// as a tensor ([3, H, W] u8 when the transform ends before ToTensor, its tensor otherwise)
// and its class index.
struct Example {
  Tensor data;
  int64_t target = 0;
};

class ImageDataset {
 public:
  virtual ~ImageDataset() = default;
  virtual int64_t size() const = 0;
  // Sample `index` (0 <= index < size()) through the transform, drawing from `gen`.
  virtual Example get(int64_t index, Generator& gen) const = 0;
  // Class names, by class index.
  virtual const std::vector<std::string>& classes() const = 0;
  // The number a DataLoader draws sample `index`'s augmentation stream from
  // (sample_generator(seed, epoch, sample_id(index))): the index itself, unless the indices
  // of a dataset depend on how it was split (TarShards: its shard and position).
  virtual int64_t sample_id(int64_t index) const { return index; }

 protected:
  // The index check every get() runs: an nd::Error naming `who` when out of range.
  void check_index(int64_t index, const char* who) const;
};

struct ImageFolderOptions {
  // Applied to each sample (it starts encoded: a leading crop decodes only its box).
  ND_ARG(transforms::AnyTransform, transform);
  // Instead of scanning the root: the image files, as paths relative to the root whose first
  // folder names the class ("dog/1.jpg", "dog/more/2.png"). Not checked for existence (a
  // list spares a scan of a slow file system); a missing file is an error when read.
  ND_ARG(std::vector<std::string>, files);
};

// torchvision's ImageFolder: root/<class>/**/<file>.{jpg,jpeg,png} (extensions in any case;
// other files are skipped, as torchvision skips them). Classes are the sorted names of the
// root's subfolders, class_to_idx their positions; samples are sorted by folder, then file
// name within a folder (torchvision's sorted os.walk), class by class.
// Errors (nd::Error naming the folder): a missing root, a root with no class folder, class
// folders without a single image file (torchvision's FileNotFoundError), a file list entry
// without a class folder or with another extension.
class ImageFolder : public ImageDataset {
 public:
  explicit ImageFolder(std::string root, ImageFolderOptions options = {});
  int64_t size() const override { return static_cast<int64_t>(samples_.size()); }
  Example get(int64_t index, Generator& gen) const override;
  const std::vector<std::string>& classes() const override { return classes_; }
  const std::map<std::string, int64_t>& class_to_idx() const { return class_to_idx_; }
  // (path, class index) of every sample, in order.
  const std::vector<std::pair<std::string, int64_t>>& samples() const { return samples_; }
  const std::string& root() const { return root_; }

 private:
  std::string root_;
  ImageFolderOptions options_;
  std::vector<std::string> classes_;
  std::map<std::string, int64_t> class_to_idx_;
  std::vector<std::pair<std::string, int64_t>> samples_;
};

// The binary version of CIFAR-10 and CIFAR-100 (the "binary version" tars): records of label
// byte(s) then 3072 bytes, the 32 x 32 red, green and blue planes, row-major. Everything is
// read into memory at construction (CIFAR-10's training set: 150 MiB). classes() are the
// lines of the tar's class-names file when it is there, empty otherwise. Every malformed file
// (missing, not a whole number of records, a label out of range) is an nd::Error naming it.
class CifarBinary : public ImageDataset {
 public:
  int64_t size() const override { return static_cast<int64_t>(targets_.size()); }
  Example get(int64_t index, Generator& gen) const override;
  const std::vector<std::string>& classes() const override { return classes_; }
  const std::vector<int64_t>& targets() const { return targets_; }
  // Image `index` as stored, without the transform.
  Image image(int64_t index) const;

 protected:
  struct Format {
    const char* name;          // "CIFAR10"
    const char* folder;        // the tar's folder: "cifar-10-batches-bin"
    std::vector<std::string> train_files, test_files;
    int label_bytes;           // 1 (CIFAR-10) or 2 (CIFAR-100: coarse, fine)
    int label_byte;            // which one is the target
    int64_t num_classes;
    const char* names_file;    // the class names, one a line
  };
  CifarBinary(const Format& format, const std::string& root, bool train, transforms::AnyTransform transform);

 private:
  const char* name_;
  transforms::AnyTransform transform_;
  std::vector<uint8_t> pixels_;  // 3072 bytes an image, CHW as stored
  std::vector<int64_t> targets_;
  std::vector<std::string> classes_;
};

// root: the folder holding cifar-10-batches-bin (data_batch_1.bin .. data_batch_5.bin,
// test_batch.bin, batches.meta.txt), or that folder itself.
class CIFAR10 : public CifarBinary {
 public:
  explicit CIFAR10(const std::string& root, bool train = true, transforms::AnyTransform transform = {});
};

// root: the folder holding cifar-100-binary (train.bin, test.bin, fine_label_names.txt), or
// that folder itself. Targets are the fine labels (100 classes), as in torchvision.
class CIFAR100 : public CifarBinary {
 public:
  explicit CIFAR100(const std::string& root, bool train = true, transforms::AnyTransform transform = {});
};

}  // namespace nd::data
