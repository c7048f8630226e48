#include "strata/engine/cli_support.h"

#include <omp.h>

#include <cerrno>
#include <cstdlib>

#include "strata/base/error.h"

namespace strata {

std::vector<int32_t> parse_token_list(const std::string& text, const char* option_name) {
  std::vector<int32_t> ids;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(start, end - start);
    const size_t a = item.find_first_not_of(" \t");
    const size_t b = item.find_last_not_of(" \t");
    item = a == std::string::npos ? "" : item.substr(a, b - a + 1);
    if (item.empty()) fail(option_name, ": empty entry in token list '", text, "'");
    char* stop = nullptr;
    errno = 0;
    const long long v = std::strtoll(item.c_str(), &stop, 10);
    if (*stop != '\0' || errno != 0 || v < 0 || v > INT32_MAX)
      fail(option_name, ": '", item, "' is not a token id (non-negative integer)");
    ids.push_back(static_cast<int32_t>(v));
    start = end + 1;
  }
  return ids;
}

void set_cpu_threads(int n) {
  if (n > 0) omp_set_num_threads(n);
}

}  // namespace strata
