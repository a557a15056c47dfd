// emu_rewrite IN OUT: rewrites a kernels/cuda .cu or .cuh file into C++ the emulator
// (tests/emu/include) compiles with g++. Three rewrites, nothing else changes:
//   kern<T, D><<<grid, block, smem, stream>>>(a, b);
//     -> emu_launch(grid, block, smem, stream, emu_cost::kernel<&kern<T, D>>("kern<T, D>"),
//                   [emu_k = &kern<T, D>, emu_a = emu_kernel_args(&kern<T, D>, a, b)] {
//                     std::apply(emu_k, emu_a); });
//      (the sanitizer's reports name the kernel as written; emu_cost.h, the cost model, learns
//      the instantiation from the function's address as a template argument; the arguments
//      are converted to the kernel's parameter types and copied at the launch, as CUDA does,
//      so that a launch captured into a graph (cuda_runtime.h) replays with them)
//   extern __shared__ __align__(16) unsigned char smem[];
//     -> unsigned char* smem = reinterpret_cast<unsigned char*>(emu_dynamic_shared(16));
//   __shared__ __align__(32) float tile[16][17];   (at the start of a line)
//     -> static char emu_shared_tag_tile;
//        auto& tile = *reinterpret_cast<float(*)[16][17]>(emu_static_shared(&emu_shared_tag_tile,
//                                                   sizeof(float[16][17]), 32, "tile"));
//      so that the sanitizer places every shared array in its arena (include/emu_sanitizer.h).
// Newlines inside a launch are kept, and the output starts with a #line naming IN, so
// compiler messages point at the original file and line. Built and run at build time by
// tests/emu/CMakeLists.txt (CI has no guaranteed python3, hence C++).
#include <cctype>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <regex>
#include <sstream>
#include <string>

namespace {

[[noreturn]] void fail(const std::string& in, const std::string& what) {
  std::cerr << "emu_rewrite: " << in << ": " << what << "\n";
  std::exit(1);
}

// Start of the callee expression (`name`, `ns::name`, `name<T, (D > 2)>`) that ends
// just before s[end]: walks back over white space (a launch may start its line with
// <<<), then identifier characters, `::` and balanced <...>.
size_t callee_start(const std::string& s, size_t end) {
  size_t j = end;
  while (j > 0 && std::isspace(static_cast<unsigned char>(s[j - 1]))) --j;
  while (j > 0) {
    const char c = s[j - 1];
    if (c == '>') {  // template arguments: skip the balanced <...>
      int depth = 0;
      while (j > 0) {
        --j;
        if (s[j] == '>') ++depth;
        else if (s[j] == '<' && --depth == 0) break;
      }
      continue;
    }
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == ':') {
      --j;
      continue;
    }
    break;
  }
  return j;
}

std::string rewrite_launches(const std::string& in, const std::string& src) {
  std::string out;
  size_t pos = 0;
  for (;;) {
    const size_t open = src.find("<<<", pos);
    if (open == std::string::npos) break;
    const size_t start = callee_start(src, open);
    if (start == open || std::isspace(static_cast<unsigned char>(src[start]))) fail(in, "no kernel name before <<< at offset " + std::to_string(open));
    const size_t close = src.find(">>>", open);
    if (close == std::string::npos) fail(in, "<<< without >>>");
    size_t p = close + 3;
    while (p < src.size() && std::isspace(static_cast<unsigned char>(src[p]))) ++p;
    if (p >= src.size() || src[p] != '(') fail(in, "no argument list after >>> at offset " + std::to_string(close));
    int depth = 0;
    size_t q = p;
    for (; q < src.size(); ++q) {
      if (src[q] == '(') ++depth;
      else if (src[q] == ')' && --depth == 0) break;
    }
    if (q >= src.size()) fail(in, "unbalanced parentheses in a launch's arguments");
    out.append(src, pos, start - pos);
    std::string name = src.substr(start, open - start);
    name = std::regex_replace(name, std::regex(R"(\s+)"), " ");
    while (!name.empty() && name.back() == ' ') name.pop_back();
    const std::string args = src.substr(p + 1, q - p - 1);
    const bool no_args = args.find_first_not_of(" \t\n") == std::string::npos;
    out += "emu_launch(" + src.substr(open + 3, close - open - 3) + ", emu_cost::kernel<&" + name + ">(\"" + name +
           "\"), [emu_k = &" + src.substr(start, open - start) + ", emu_a = emu_kernel_args(&" + name + (no_args ? "" : ", ") +
           args + ")] { std::apply(emu_k, emu_a); })";
    pos = q + 1;
  }
  out.append(src, pos, std::string::npos);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: emu_rewrite IN.cu OUT.cpp\n";
    return 2;
  }
  const std::string in = argv[1], out_path = argv[2];
  std::ifstream f(in, std::ios::binary);
  if (!f) fail(in, "cannot open");
  std::stringstream buf;
  buf << f.rdbuf();
  std::string src = rewrite_launches(in, buf.str());
  // With __align__(A) the pointer is aligned to A, without to alignof(T) (both at least
  // 16, CUDA's guarantee): emu_dynamic_shared in include/emu_core.h.
  static const std::regex aligned(
      R"(extern\s+__shared__\s+__align__\((\d+)\)\s+([\w:<> ]+?)\s+(\w+)\s*\[\s*\]\s*;)");
  static const std::regex plain(R"(extern\s+__shared__\s+([\w:<> ]+?)\s+(\w+)\s*\[\s*\]\s*;)");
  src = std::regex_replace(src, aligned, "$2* $3 = reinterpret_cast<$2*>(emu_dynamic_shared($1));");
  src = std::regex_replace(src, plain, "$1* $2 = reinterpret_cast<$1*>(emu_dynamic_shared(alignof($1)));");
  // Static shared arrays: type $2, name $3, dimensions $4 (none for a single object).
  static const std::regex shared(
      R"((^|\n)([ \t]*)__shared__\s+(?:__align__\((\d+)\)\s+)?([\w:<>, ]+?)\s+(\w+)\s*((?:\[[^\]\n]+\])*)\s*;)");
  std::string rewritten;
  auto it = std::sregex_iterator(src.begin(), src.end(), shared);
  size_t last = 0;
  for (; it != std::sregex_iterator(); ++it) {
    const std::smatch& m = *it;
    const std::string type = m[4], name = m[5], dims = m[6];
    const std::string align = m[3].matched ? m[3].str() : "alignof(" + type + ")";
    rewritten.append(src, last, size_t(m.position(0)) - last);
    rewritten += m[1].str() + m[2].str() + "static char emu_shared_tag_" + name + "; auto& " + name +
                 " = *reinterpret_cast<" + type + "(*)" + dims + ">(emu_static_shared(&emu_shared_tag_" + name +
                 ", sizeof(" + type + dims + "), " + align + ", \"" + name + "\"));";
    last = size_t(m.position(0) + m.length(0));
  }
  rewritten.append(src, last, std::string::npos);
  src = rewritten;
  std::ofstream o(out_path, std::ios::binary);
  o << "#line 1 \"" << in << "\"\n" << src;
  if (!o) fail(out_path, "cannot write");
  return 0;
}
