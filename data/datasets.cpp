#include "data/datasets.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <set>

#include "engine/error.h"

namespace nd::data {

namespace fs = std::filesystem;
using nd::detail::str_cat;

void ImageDataset::check_index(int64_t index, const char* who) const {
  ND_CHECK(index >= 0 && index < size(), who, ": index ", index, " is out of range for a dataset of ", size(),
           " samples");
}

namespace {

constexpr const char* kExtensions = ".jpg, .jpeg, .png (in any case)";

bool has_image_extension(const std::string& name) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const char* ext : {".jpg", ".jpeg", ".png"})
    if (lower.ends_with(ext)) return true;  // torchvision: filename.lower().endswith(extensions)
  return false;
}

// The image files under `dir`, following symbolic links (a link back to a folder already
// walked is not entered again, so a cycle cannot hang the scan), in torchvision's order:
// sorted os.walk, i.e. by folder, then by name within a folder.
std::vector<std::string> image_files_under(const fs::path& dir) {
  std::vector<std::pair<std::string, std::string>> found;  // (folder, name)
  std::set<fs::path> walked = {fs::canonical(dir)};
  auto it = fs::recursive_directory_iterator(dir, fs::directory_options::follow_directory_symlink);
  for (; it != fs::recursive_directory_iterator(); ++it) {
    if (it->is_directory()) {
      if (!walked.insert(fs::canonical(it->path())).second) it.disable_recursion_pending();
      continue;
    }
    if (has_image_extension(it->path().filename().string()))
      found.emplace_back(it->path().parent_path().string(), it->path().filename().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> paths;
  for (const auto& [folder, name] : found) paths.push_back((fs::path(folder) / name).string());
  return paths;
}

std::string quoted_list(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) out += (i ? ", '" : "'") + names[i] + "'";
  return out;
}

}  // namespace

ImageFolder::ImageFolder(std::string root, ImageFolderOptions options)
    : root_(std::move(root)), options_(std::move(options)) {
  std::error_code ec;
  ND_CHECK(fs::exists(root_, ec), "ImageFolder: the root folder '", root_, "' does not exist");
  ND_CHECK(fs::is_directory(root_, ec), "ImageFolder: the root '", root_, "' is not a folder");
  std::map<std::string, std::vector<std::string>> files_of;  // class -> paths
  if (options_.files().empty()) {
    try {
      for (const auto& entry : fs::directory_iterator(root_))
        if (entry.is_directory()) files_of[entry.path().filename().string()];
      ND_CHECK(!files_of.empty(), "ImageFolder: found no class folder in '", root_,
               "'; expected one subfolder per class holding its images");
      for (auto& [name, paths] : files_of) paths = image_files_under(fs::path(root_) / name);
    } catch (const fs::filesystem_error& e) {  // an unreadable folder, a broken link
      throw Error(str_cat("ImageFolder: scanning '", root_, "' failed: ", e.what()));
    }
  } else {
    for (const std::string& file : options_.files()) {
      const fs::path rel(file);
      ND_CHECK(!rel.is_absolute() && std::distance(rel.begin(), rel.end()) >= 2, "ImageFolder: the file list entry '",
               file, "' names no class folder; expected '<class>/<file>' relative to the root '", root_, "'");
      ND_CHECK(has_image_extension(rel.filename().string()), "ImageFolder: the file list entry '", file,
               "' is not an image file; expected one of ", kExtensions);
      files_of[rel.begin()->string()].push_back((fs::path(root_) / rel).string());
    }
    for (auto& [name, paths] : files_of) {  // the order a scan would give
      std::sort(paths.begin(), paths.end(), [](const std::string& a, const std::string& b) {
        const fs::path pa(a), pb(b);
        return std::pair(pa.parent_path().string(), pa.filename().string()) <
               std::pair(pb.parent_path().string(), pb.filename().string());
      });
    }
  }
  std::vector<std::string> empty;
  for (const auto& [name, paths] : files_of) {
    class_to_idx_[name] = static_cast<int64_t>(classes_.size());
    classes_.push_back(name);
    if (paths.empty()) empty.push_back(name);
    for (const std::string& p : paths) samples_.emplace_back(p, class_to_idx_[name]);
  }
  ND_CHECK(empty.empty(), "ImageFolder: found no image file for the class", empty.size() > 1 ? "es " : " ",
           quoted_list(empty), " in '", root_, "'; supported extensions are ", kExtensions);
}

Example ImageFolder::get(int64_t index, Generator& gen) const {
  check_index(index, "ImageFolder");
  const auto& [path, target] = samples_[index];
  transforms::Sample sample = read_image(path);
  options_.transform()(sample, gen);
  return {transforms::as_tensor(std::move(sample)), target};
}

// ---- CIFAR ----------------------------------------------------------------------------

namespace {

constexpr int64_t kCifarPixels = 3 * 32 * 32;

std::vector<uint8_t> read_whole(const std::string& path, const char* who) {
  std::error_code ec;
  ND_CHECK(fs::is_regular_file(path, ec), who, ": cannot find '", path, "'");
  return read_file(path);
}

}  // namespace

CifarBinary::CifarBinary(const Format& format, const std::string& root, bool train, transforms::AnyTransform transform)
    : name_(format.name), transform_(std::move(transform)) {
  const fs::path dir = fs::is_directory(fs::path(root) / format.folder) ? fs::path(root) / format.folder : fs::path(root);
  const int64_t record = format.label_bytes + kCifarPixels;
  for (const std::string& file : train ? format.train_files : format.test_files) {
    const std::string path = (dir / file).string();
    const std::vector<uint8_t> bytes = read_whole(path, format.name);
    ND_CHECK(!bytes.empty() && static_cast<int64_t>(bytes.size()) % record == 0, format.name, ": '", path, "' holds ",
             bytes.size(), " bytes, not a whole number of ", record, "-byte records (", format.label_bytes,
             " label byte", format.label_bytes > 1 ? "s" : "", " + 3072 pixels); is it cut off?");
    const int64_t n = static_cast<int64_t>(bytes.size()) / record;
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t* r = bytes.data() + i * record;
      const int64_t label = r[format.label_byte];
      ND_CHECK(label < format.num_classes, format.name, ": '", path, "' record ", i, " has label ", label,
               "; expected 0 to ", format.num_classes - 1);
      targets_.push_back(label);
      pixels_.insert(pixels_.end(), r + format.label_bytes, r + record);
    }
  }
  std::ifstream names(dir / format.names_file);
  for (std::string line; std::getline(names, line);)
    if (!line.empty()) classes_.push_back(line);
}

Image CifarBinary::image(int64_t index) const {
  check_index(index, name_);
  Image out(32, 32);
  const uint8_t* planes = pixels_.data() + index * kCifarPixels;
  for (int64_t p = 0; p < 32 * 32; ++p)
    for (int c = 0; c < 3; ++c) out.pixels[p * 3 + c] = planes[c * 32 * 32 + p];
  return out;
}

Example CifarBinary::get(int64_t index, Generator& gen) const {
  transforms::Sample sample = image(index);
  transform_(sample, gen);
  return {transforms::as_tensor(std::move(sample)), targets_[index]};
}

CIFAR10::CIFAR10(const std::string& root, bool train, transforms::AnyTransform transform)
    : CifarBinary({"CIFAR10",
                   "cifar-10-batches-bin",
                   {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin", "data_batch_5.bin"},
                   {"test_batch.bin"},
                   1,
                   0,
                   10,
                   "batches.meta.txt"},
                  root, train, std::move(transform)) {}

CIFAR100::CIFAR100(const std::string& root, bool train, transforms::AnyTransform transform)
    : CifarBinary({"CIFAR100", "cifar-100-binary", {"train.bin"}, {"test.bin"}, 2, 1, 100, "fine_label_names.txt"}, root,
                  train, std::move(transform)) {}

}  // namespace nd::data
