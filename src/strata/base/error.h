// Errors: strata reports every problem a user can cause (bad file, bad option, bad request) by
// throwing strata::Error with a message that names what was wrong and where. Callers at the edge
// (CLI, server) catch it and print it; nothing inside swallows it.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace strata {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Concatenates anything streamable into one string: cat("layer ", 3, ": ", name).
template <class... Args>
std::string cat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

// Throws strata::Error with the concatenated message.
template <class... Args>
[[noreturn]] void fail(const Args&... args) {
  throw Error(cat(args...));
}

}  // namespace strata
