// The web page `strata serve` answers at / (issue 26): HTML, CSS and JavaScript from webui/, built into
// the binary as byte arrays (cmake/embed_assets.cmake), so the page works offline and asks nothing of
// any other host.
#pragma once

#include <string_view>
#include <vector>

namespace strata::serve {

struct WebAsset {
  std::string_view name;  // the file's name under webui/, e.g. "app.js"
  std::string_view body;
};

// Every file of the page (generated at build time).
const std::vector<WebAsset>& webui_assets();
// The asset of that name, or nullptr.
const WebAsset* find_webui_asset(std::string_view name);
// Its Content-Type, from the name's extension.
const char* webui_content_type(std::string_view name);

}  // namespace strata::serve
