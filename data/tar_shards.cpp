#include "data/tar_shards.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>

#include "engine/error.h"
#include "engine/factories.h"

namespace nd::data {

namespace fs = std::filesystem;
using nd::detail::str_cat;

// ---- brace expansion ------------------------------------------------------------------

namespace {

// The '}' closing the '{' at `open`, or npos.
size_t matching_brace(const std::string& s, size_t open) {
  int depth = 0;
  for (size_t i = open; i < s.size(); ++i) {
    if (s[i] == '{') ++depth;
    if (s[i] == '}' && --depth == 0) return i;
  }
  return std::string::npos;
}

bool is_integer(const std::string& s) {
  const size_t start = !s.empty() && s[0] == '-' ? 1 : 0;
  return s.size() > start && std::all_of(s.begin() + start, s.end(), [](unsigned char c) { return std::isdigit(c); });
}

// "{lo..hi}"'s numbers, or nothing when `body` is not a numeric range.
std::vector<std::string> numeric_range(const std::string& body, const std::string& pattern) {
  const size_t dots = body.find("..");
  if (dots == std::string::npos) return {};
  const std::string lo = body.substr(0, dots), hi = body.substr(dots + 2);
  if (!is_integer(lo) || !is_integer(hi) || lo.size() > 18 || hi.size() > 18) return {};
  const int64_t a = std::stoll(lo), b = std::stoll(hi);
  ND_CHECK(std::abs(b - a) < 10'000'000, "expand_braces: the range {", body, "} in '", pattern,
           "' names more than 10 million paths");
  // braceexpand's rule: a bound written with a leading zero (other than "0" itself) pads.
  auto padded = [](const std::string& v) {
    return v != "0" && v != "-0" && (v.starts_with('0') || v.starts_with("-0"));
  };
  const size_t width = padded(lo) || padded(hi) ? std::max(lo.size(), hi.size()) : 0;
  std::vector<std::string> out;
  for (int64_t v = a;; v += a <= b ? 1 : -1) {
    std::string digits = std::to_string(std::abs(v));
    const size_t sign = v < 0 ? 1 : 0;
    if (digits.size() + sign < width) digits.insert(0, width - digits.size() - sign, '0');
    out.push_back((v < 0 ? "-" : "") + digits);
    if (v == b) break;
  }
  return out;
}

std::vector<std::string> expand(const std::string& s, const std::string& pattern) {
  const size_t open = s.find('{');
  if (open == std::string::npos) return {s};
  const size_t close = matching_brace(s, open);
  ND_CHECK(close != std::string::npos, "expand_braces: '", pattern, "' has a '{' without its '}'");
  const std::string body = s.substr(open + 1, close - open - 1);
  std::vector<std::string> alternatives;  // split at the commas outside nested braces
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= body.size(); ++i) {
    if (i == body.size() || (body[i] == ',' && depth == 0)) {
      alternatives.push_back(body.substr(start, i - start));
      start = i + 1;
    } else if (body[i] == '{') {
      ++depth;
    } else if (body[i] == '}') {
      --depth;
    }
  }
  std::vector<std::string> middle;
  if (alternatives.size() > 1) {
    for (const std::string& alt : alternatives)
      for (std::string& e : expand(alt, pattern)) middle.push_back(std::move(e));
  } else {
    middle = numeric_range(body, pattern);
    if (middle.empty())  // "{x}": literal braces, as in the shell
      for (const std::string& e : expand(body, pattern)) middle.push_back("{" + e + "}");
  }
  // The product in the shell's order: the leftmost group varies slowest.
  const std::string head = s.substr(0, open);
  std::vector<std::string> ordered;
  const std::vector<std::string> tails = expand(s.substr(close + 1), pattern);
  for (const std::string& m : middle)
    for (const std::string& tail : tails) ordered.push_back(head + m + tail);
  return ordered;
}

}  // namespace

std::vector<std::string> expand_braces(const std::string& pattern) { return expand(pattern, pattern); }

// ---- reading tar headers --------------------------------------------------------------

namespace {

constexpr int64_t kBlock = 512;

// A shard open for reading; closed when it goes.
struct File {
  std::string path;
  int fd = -1;
  int64_t size = 0;
  File(std::string p) : path(std::move(p)) {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    ND_CHECK(fd >= 0, "TarShards: cannot open the shard '", path, "': ", std::strerror(errno));
    const off_t end = ::lseek(fd, 0, SEEK_END);
    if (end < 0) {
      const int err = errno;
      ::close(fd);
      throw Error(str_cat("TarShards: cannot read the shard '", path, "': ", std::strerror(err)));
    }
    size = end;
  }
  ~File() { ::close(fd); }
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  // n bytes at `offset`; the caller checked they lie inside the file.
  void read(int64_t offset, int64_t n, uint8_t* out) const {
    while (n > 0) {
      const ssize_t got = ::pread(fd, out, static_cast<size_t>(n), offset);
      if (got < 0 && errno == EINTR) continue;
      ND_CHECK(got > 0, "TarShards: reading the shard '", path, "' at byte ", offset,
               " failed: ", got < 0 ? std::strerror(errno) : "the file ended early (did it shrink while being read?)");
      out += got, offset += got, n -= got;
    }
  }
};

// A header's numeric field: octal text (spaces and NULs around it), or base-256 when the
// first byte has its high bit set (GNU tar's sizes over 8 GiB). -1 when it is neither.
int64_t header_number(const uint8_t* field, int width) {
  if (field[0] & 0x80) {
    int64_t v = field[0] & 0x3f;
    for (int i = 1; i < width; ++i) v = (v << 8) | field[i];
    return v;
  }
  int i = 0;
  while (i < width && field[i] == ' ') ++i;
  int64_t v = 0;
  bool any = false;
  for (; i < width && field[i] >= '0' && field[i] <= '7'; ++i, any = true) v = v * 8 + (field[i] - '0');
  for (; i < width; ++i)
    if (field[i] != ' ' && field[i] != 0) return -1;
  return any ? v : -1;
}

std::string header_string(const uint8_t* field, size_t width) {
  const auto* c = reinterpret_cast<const char*>(field);
  return std::string(c, strnlen(c, width));
}

bool is_zero_block(const uint8_t* block) {
  return std::all_of(block, block + kBlock, [](uint8_t b) { return b == 0; });
}

// A tar member: its name (ustar prefix, a pax or GNU long name applied) and where its data is.
struct Member {
  std::string name;
  int64_t offset = 0, size = 0;
};

// Every regular-file member of the shard, in order (directories, links and others skipped,
// as WebDataset skips them). An nd::Error for anything that is not a whole tar file.
std::vector<Member> read_members(const File& file) {
  std::vector<Member> members;
  std::string long_name;  // from a pax 'x' or GNU 'L' member, for the next one
  uint8_t h[kBlock];
  auto where = [&](int64_t at) {
    return members.empty() ? str_cat("the header at byte ", at, " (the first)")
                           : str_cat("the header at byte ", at, " (after member '", members.back().name, "')");
  };
  ND_CHECK(file.size > 0, "TarShards: shard '", file.path, "' is empty (0 bytes): not a tar file");
  for (int64_t at = 0;;) {
    ND_CHECK(at < file.size, "TarShards: shard '", file.path, "': the file ends at byte ", file.size,
             members.empty() ? std::string(" before any member") : str_cat(" after member '", members.back().name, "'"),
             " without tar's end-of-archive blocks: cut off?");
    ND_CHECK(at + kBlock <= file.size, "TarShards: shard '", file.path, "': the file ends at byte ", file.size,
             " inside ", where(at), ": cut off?");
    file.read(at, kBlock, h);
    if (is_zero_block(h)) return members;
    int64_t sum = 0, signed_sum = 0;
    for (int i = 0; i < kBlock; ++i) {
      const bool in_checksum = i >= 148 && i < 156;
      sum += in_checksum ? ' ' : h[i];
      signed_sum += in_checksum ? ' ' : static_cast<int8_t>(h[i]);
    }
    const int64_t stored = header_number(h + 148, 8);
    ND_CHECK(stored == sum || stored == signed_sum, "TarShards: shard '", file.path, "': ", where(at),
             " has a bad checksum (stored ", stored < 0 ? std::string("none") : std::to_string(stored), ", computed ",
             sum, "): not a tar file, or damaged");
    const int64_t size = header_number(h + 124, 12);
    ND_CHECK(size >= 0, "TarShards: shard '", file.path, "': ", where(at), " has no valid size field");
    const char type = static_cast<char>(h[156]);
    std::string name = header_string(h, 100);
    const std::string prefix = header_string(h + 345, 155);
    if (std::memcmp(h + 257, "ustar\0", 6) == 0 && !prefix.empty()) name = prefix + "/" + name;
    const int64_t data = at + kBlock;
    ND_CHECK(data + size <= file.size, "TarShards: shard '", file.path, "': member '",
             long_name.empty() ? name : long_name, "' is cut off: its header says ", size, " bytes from byte ", data,
             ", but the file ends at byte ", file.size);
    if (type == 'x' || type == 'L') {  // a pax extended header or a GNU long name: the next member's name
      std::string text(static_cast<size_t>(size), '\0');
      file.read(data, size, reinterpret_cast<uint8_t*>(text.data()));
      if (type == 'L') {
        long_name = text.c_str();
      } else {  // records "<length> <key>=<value>\n"
        for (size_t p = 0; p < text.size();) {
          const size_t space = text.find(' ', p);
          const int64_t len = space == std::string::npos ? 0 : std::atoll(text.c_str() + p);
          if (len <= 0 || p + len > text.size()) break;
          const std::string record = text.substr(space + 1, p + len - space - 2);
          if (record.starts_with("path=")) long_name = record.substr(5);
          p += len;
        }
      }
    } else if (type == '0' || type == '\0' || type == '7') {
      members.push_back({long_name.empty() ? name : long_name, data, size});
      long_name.clear();
    } else {
      long_name.clear();
    }
    at = data + (size + kBlock - 1) / kBlock * kBlock;
  }
}

// WebDataset's rule: the key is the path up to the first dot of the basename, the
// extension (lower-cased) what follows. No dot: not part of any sample.
bool split_key(const std::string& name, std::string& key, std::string& ext) {
  const size_t slash = name.rfind('/');
  const size_t dot = name.find('.', slash == std::string::npos ? 0 : slash + 1);
  if (dot == std::string::npos || dot == 0) return false;
  key = name.substr(0, dot);
  ext = name.substr(dot + 1);
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return true;
}

}  // namespace

// ---- the dataset ----------------------------------------------------------------------

TarShards::TarShards(const std::string& pattern, TarShardsOptions options)
    : TarShards(
          [&] {
            std::vector<std::string> paths = expand_braces(pattern);
            std::error_code ec;
            std::vector<std::string> missing;
            for (const std::string& p : paths)
              if (!fs::exists(p, ec)) missing.push_back(p);
            ND_CHECK(missing.size() < paths.size(), "TarShards: '", pattern, "' names ", paths.size(),
                     paths.size() == 1 ? " file, which does not exist" : " files and none of them exists",
                     paths.size() == 1 ? std::string() : str_cat(" (the first: '", paths[0], "')"));
            return paths;
          }(),
          std::move(options)) {}

TarShards::TarShards(std::vector<std::string> paths, TarShardsOptions options)
    : options_(std::move(options)), all_shards_(std::move(paths)) {
  const int64_t n = static_cast<int64_t>(all_shards_.size()), world = options_.world_size();
  ND_CHECK(world >= 1 && options_.rank() >= 0 && options_.rank() < world,
           "TarShards: expected 0 <= rank < world_size, got rank ", options_.rank(), " of ", world);
  ND_CHECK(n >= world, "TarShards: ", n, " shard", n == 1 ? "" : "s", " for ", world,
           " ranks: each rank reads its own shards (shard i goes to rank i % world_size), so there must be at least as "
           "many shards as ranks");
  std::error_code ec;
  for (const std::string& p : all_shards_) {
    ND_CHECK(fs::exists(p, ec), "TarShards: the shard '", p, "' does not exist");
    ND_CHECK(fs::is_regular_file(p, ec), "TarShards: the shard '", p, "' is not a file");
  }
  for (int64_t i = options_.rank(); i < n; i += world) index_shard(i);
  ND_CHECK(!samples_.empty(), "TarShards: the shards of rank ", options_.rank(), " of ", world,
           " hold no sample (no member named <key>.<extension>)");
}

void TarShards::index_shard(int64_t number) {
  Shard shard{all_shards_[number], number, static_cast<int64_t>(samples_.size()), 0};
  const File file(shard.path);
  const std::vector<Member> members = read_members(file);
  const auto shard_index = static_cast<int32_t>(shards_.size());
  auto sample_error = [&](Sample& s, const std::string& what) {
    if (s.error.empty()) s.error = str_cat("TarShards: shard '", shard.path, "': sample '", s.key, "': ", what);
  };
  for (const Member& m : members) {
    std::string key, ext;
    if (!split_key(m.name, key, ext)) continue;
    // Consecutive members with one key are a sample (WebDataset's group_by_keys).
    if (samples_.size() == static_cast<size_t>(shard.first) || samples_.back().key != key) {
      Sample s;
      s.shard = shard_index;
      s.position = static_cast<int64_t>(samples_.size()) - shard.first;
      s.key = key;
      samples_.push_back(std::move(s));
    }
    Sample& s = samples_.back();
    if (ext == "jpg" || ext == "jpeg" || ext == "png") {
      if (!s.image.empty()) sample_error(s, str_cat("two image members, '", s.image, "' and '", m.name, "'"));
      s.image = m.name;
      s.image_offset = m.offset;
      s.image_size = m.size;
    } else if (ext == "cls") {
      if (s.cls_offset >= 0) sample_error(s, str_cat("two members '", m.name, "'"));
      s.cls_offset = m.offset;
      s.cls_size = m.size;
    }
  }
  shard.count = static_cast<int64_t>(samples_.size()) - shard.first;
  for (int64_t i = shard.first; i < shard.first + shard.count; ++i) {
    Sample& s = samples_[i];
    if (s.image.empty()) sample_error(s, "no image member (" + s.key + ".jpg, .jpeg or .png)");
    if (s.cls_offset < 0) sample_error(s, "no class member (" + s.key + ".cls)");
  }
  shards_.push_back(std::move(shard));
}

std::vector<std::string> TarShards::shards() const {
  std::vector<std::string> out;
  for (const Shard& s : shards_) out.push_back(s.path);
  return out;
}

std::string TarShards::name(int64_t index) const {
  check_index(index, "TarShards");
  return shards_[samples_[index].shard].path + ":" + samples_[index].key;
}

int64_t TarShards::sample_id(int64_t index) const {
  check_index(index, "TarShards");
  return (shards_[samples_[index].shard].number << 32) + samples_[index].position;
}

Example TarShards::get(int64_t index, Generator& gen) const {
  check_index(index, "TarShards");
  const Sample& s = samples_[index];
  if (!s.error.empty()) throw Error(s.error);
  const Shard& shard = shards_[s.shard];
  const File file(shard.path);
  std::string cls(static_cast<size_t>(s.cls_size), '\0');
  file.read(s.cls_offset, s.cls_size, reinterpret_cast<uint8_t*>(cls.data()));
  // Python's int(text) on ASCII digits: whitespace around, no sign (a class is >= 0).
  const size_t begin = cls.find_first_not_of(" \t\r\n"), end = cls.find_last_not_of(" \t\r\n");
  const std::string digits = begin == std::string::npos ? std::string() : cls.substr(begin, end - begin + 1);
  const bool valid = !digits.empty() && digits.size() <= 18 &&
                     std::all_of(digits.begin(), digits.end(), [](unsigned char c) { return std::isdigit(c); });
  ND_CHECK(valid, "TarShards: shard '", shard.path, "': member '", s.key, ".cls' holds '",
           cls.size() > 40 ? cls.substr(0, 40) + "..." : cls, "', not a class index (decimal digits, >= 0)");
  EncodedImage image;
  image.path = shard.path + ":" + s.image;
  image.bytes.resize(static_cast<size_t>(s.image_size));
  file.read(s.image_offset, s.image_size, image.bytes.data());
  image.info = image_info(image.bytes, image.path);
  transforms::Sample sample = std::move(image);
  options_.transform()(sample, gen);
  return {transforms::as_tensor(std::move(sample)), std::stoll(digits)};
}

std::vector<int64_t> TarShards::order(const std::vector<Shard>& shards, int64_t rank, uint64_t seed, int64_t epoch,
                                      int64_t shuffle_buffer, int64_t epoch_size) {
  ND_CHECK(epoch >= 0, "TarShards: expected epoch >= 0, got ", epoch);
  // Two streams of draws from (seed, epoch, rank): the shards' Fisher-Yates, the buffer's.
  const uint64_t key = random_bits(random_bits(seed, static_cast<uint64_t>(epoch)), static_cast<uint64_t>(rank));
  const uint64_t shard_key = random_bits(key, 0), buffer_key = random_bits(key, 1);
  std::vector<size_t> shard_order(shards.size());
  for (size_t i = 0; i < shard_order.size(); ++i) shard_order[i] = i;
  if (shuffle_buffer > 0)
    for (size_t i = shard_order.size(); i > 1; --i)
      std::swap(shard_order[i - 1], shard_order[random_bits(shard_key, i) % i]);
  std::vector<int64_t> out, buffer;
  uint64_t draw = 0;
  for (size_t s : shard_order) {
    for (int64_t i = shards[s].first; i < shards[s].first + shards[s].count; ++i) {
      if (static_cast<int64_t>(buffer.size()) < std::max<int64_t>(shuffle_buffer, 1)) {
        buffer.push_back(i);
        continue;
      }
      const size_t j = shuffle_buffer > 1 ? random_bits(buffer_key, draw++) % buffer.size() : 0;
      out.push_back(buffer[j]);
      buffer[j] = i;
    }
  }
  for (size_t i = buffer.size(); shuffle_buffer > 1 && i > 1; --i)
    std::swap(buffer[i - 1], buffer[random_bits(buffer_key, draw++) % i]);
  out.insert(out.end(), buffer.begin(), buffer.end());
  if (epoch_size > 0) out.resize(static_cast<size_t>(epoch_size));
  return out;
}

void TarShards::check_order_options(int64_t shuffle_buffer, int64_t epoch_size) const {
  ND_CHECK(shuffle_buffer >= 0, "TarShards: shuffle_buffer must be >= 0, got ", shuffle_buffer);
  ND_CHECK(epoch_size >= 0 && epoch_size <= size(), "TarShards: epoch_size ", epoch_size, " is outside 0 to the ",
           size(), " samples of rank ", options_.rank(), "'s shards");
}

std::vector<int64_t> TarShards::stream_order(uint64_t seed, int64_t epoch, int64_t shuffle_buffer,
                                             int64_t epoch_size) const {
  check_order_options(shuffle_buffer, epoch_size);
  return order(shards_, options_.rank(), seed, epoch, shuffle_buffer, epoch_size);
}

std::function<std::vector<int64_t>(int64_t)> TarShards::sampler(uint64_t seed, int64_t shuffle_buffer,
                                                                int64_t epoch_size) const {
  check_order_options(shuffle_buffer, epoch_size);
  return [shards = shards_, rank = options_.rank(), seed, shuffle_buffer, epoch_size](int64_t epoch) {
    return order(shards, rank, seed, epoch, shuffle_buffer, epoch_size);
  };
}

}  // namespace nd::data
