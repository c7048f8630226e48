#include "strata/serve/webui.h"

namespace strata::serve {

const WebAsset* find_webui_asset(std::string_view name) {
  for (const WebAsset& a : webui_assets())
    if (a.name == name) return &a;
  return nullptr;
}

const char* webui_content_type(std::string_view name) {
  const auto ends = [&](std::string_view ext) {
    return name.size() >= ext.size() && name.substr(name.size() - ext.size()) == ext;
  };
  if (ends(".html")) return "text/html; charset=utf-8";
  if (ends(".css")) return "text/css; charset=utf-8";
  if (ends(".js")) return "text/javascript; charset=utf-8";
  if (ends(".svg")) return "image/svg+xml";
  return "application/octet-stream";
}

}  // namespace strata::serve
