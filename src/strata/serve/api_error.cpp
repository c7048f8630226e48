#include "strata/serve/api_error.h"

#include <nlohmann/json.hpp>

namespace strata::serve {

std::string error_type_for_status(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 408: return "timeout_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "server_overloaded";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

std::string error_body(int status, const std::string& type, const std::string& message, const std::string& param,
                       const std::string& code) {
  nlohmann::ordered_json inner;
  inner["message"] = message;
  inner["type"] = type.empty() ? error_type_for_status(status) : type;
  inner["param"] = param.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(param);
  inner["code"] = code.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(code);
  nlohmann::ordered_json body;
  body["error"] = std::move(inner);
  // replace: a message may quote request bytes that are not valid UTF-8.
  return body.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

std::string error_body(const ApiError& e) { return error_body(e.status, e.type, e.what(), e.param, e.code); }

}  // namespace strata::serve
