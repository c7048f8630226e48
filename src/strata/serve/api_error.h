// Errors the HTTP API returns, shaped as OpenAI returns them:
//   {"error": {"message": "...", "type": "invalid_request_error", "param": "max_tokens", "code": null}}
// Request handlers throw ApiError; the server turns it into that body with its HTTP status.
#pragma once

#include <stdexcept>
#include <string>

#include "strata/base/error.h"

namespace strata::serve {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string type, std::string param, std::string code, const std::string& message)
      : std::runtime_error(message), status(status), type(std::move(type)), param(std::move(param)),
        code(std::move(code)) {}
  int status;
  std::string type;   // "invalid_request_error", "authentication_error", "not_found_error", "server_error", ...
  std::string param;  // the request field at fault, or ""
  std::string code;   // a machine-readable code ("context_length_exceeded"), or ""
};

// 400 invalid_request_error naming the field at fault.
template <class... Args>
[[noreturn]] void bad_request(const std::string& param, const Args&... message) {
  throw ApiError(400, "invalid_request_error", param, "", cat(message...));
}

// The JSON body for an error (never throws, whatever bytes the message holds).
std::string error_body(int status, const std::string& type, const std::string& message,
                       const std::string& param = "", const std::string& code = "");
std::string error_body(const ApiError& e);

// The error type OpenAI uses for an HTTP status (400 -> invalid_request_error, 401 -> authentication_error, ...).
std::string error_type_for_status(int status);

}  // namespace strata::serve
