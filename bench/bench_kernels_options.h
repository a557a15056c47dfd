#pragma once
// bench_kernels' command line (bench_kernels.cpp's header has the usage): which families run
// and which rows (--dtype, --shape) they time. parse() checks every name and flag before the
// program looks for a GPU, so a bad one is the same error on any machine.
#include <nanoddp.h>

#include <algorithm>
#include <optional>
#include <regex>
#include <string>
#include <vector>

namespace nd::bench {

inline std::string joined(const std::vector<std::string>& parts, const char* sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? sep : "") + parts[i];
  return out;
}

struct KernelsOptions {
  std::string device = "cuda";
  std::vector<std::string> families, dtypes;  // empty: all
  std::optional<std::regex> shape;            // none: all

  // nd::Error naming what was expected and found, for an unknown flag or family, a flag
  // without its value, a dtype outside f32/bf16/f16, or a --shape that is no ECMAScript regex.
  static KernelsOptions parse(int argc, char** argv, const std::vector<std::string>& family_names) {
    static const std::vector<std::string> kDtypes = {"f32", "bf16", "f16"};
    const auto has = [](const std::vector<std::string>& v, const std::string& x) {
      return std::find(v.begin(), v.end(), x) != v.end();
    };
    KernelsOptions o;
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      const bool flag = arg.rfind("--", 0) == 0;
      if (flag && arg != "--device" && arg != "--dtype" && arg != "--shape")
        throw Error("bench_kernels: expected a flag of --device, --dtype, --shape, or a benchmark name, found '" +
                    arg + "'");
      if (flag && i + 1 == argc) throw Error("bench_kernels: " + arg + " expects a value, found none");
      if (arg == "--device") {
        o.device = argv[++i];
      } else if (arg == "--dtype") {
        const std::string list = argv[++i];
        for (size_t at = 0, comma; at <= list.size(); at = comma + 1) {
          comma = std::min(list.find(',', at), list.size());
          const std::string d = list.substr(at, comma - at);
          if (!has(kDtypes, d))
            throw Error("bench_kernels: --dtype expects " + joined(kDtypes, ", ") + " (comma-separated), found '" + d +
                        "' in '" + list + "'");
          o.dtypes.push_back(d);
        }
      } else if (arg == "--shape") {
        try {
          o.shape.emplace(argv[++i], std::regex::ECMAScript);
        } catch (const std::regex_error& e) {
          throw Error("bench_kernels: --shape expects an ECMAScript regular expression, found '" +
                      std::string(argv[i]) + "' (" + e.what() + ")");
        }
      } else if (!has(family_names, arg)) {
        throw Error("bench_kernels: expected a benchmark name (" + joined(family_names, " ") + "), found '" + arg + "'");
      } else {
        o.families.push_back(arg);
      }
    }
    return o;
  }

  bool runs(const std::string& family) const {
    return families.empty() || std::find(families.begin(), families.end(), family) != families.end();
  }
  // Whether a row of this shape and dtype is timed (regex_search: a match anywhere in the shape).
  bool keeps(const std::string& row_shape, const std::string& row_dtype) const {
    return (dtypes.empty() || std::find(dtypes.begin(), dtypes.end(), row_dtype) != dtypes.end()) &&
           (!shape || std::regex_search(row_shape, *shape));
  }
};

}  // namespace nd::bench
