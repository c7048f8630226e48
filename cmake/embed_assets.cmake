# Turns the web page's files into a C++ source (run at build time by the serve module's custom
# command): each file becomes a byte array, listed by its name in strata::serve::webui_assets().
# Inputs: ASSET_DIR (the folder), ASSET_FILES (names in it, ','-separated), OUTPUT (the .cpp).
string(REPLACE "," ";" ASSET_FILES "${ASSET_FILES}")
set(src "// Generated from ${ASSET_DIR} by cmake/embed_assets.cmake; do not edit.\n")
string(APPEND src "#include \"strata/serve/webui.h\"\n\nnamespace strata::serve {\nnamespace {\n")
set(table "")
set(i 0)
foreach(name IN LISTS ASSET_FILES)
  file(READ "${ASSET_DIR}/${name}" hex HEX)
  string(LENGTH "${hex}" hex_len)
  math(EXPR size "${hex_len} / 2")
  string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
  # Lines of a bounded length keep the generated file readable by compilers and editors alike.
  string(REGEX REPLACE "((0x[0-9a-f][0-9a-f],){32})" "\\1\n" bytes "${bytes}")
  string(APPEND src "const unsigned char asset${i}[] = {\n${bytes}0x00};\n")
  string(APPEND table "      {\"${name}\", std::string_view(reinterpret_cast<const char*>(asset${i}), ${size})},\n")
  math(EXPR i "${i} + 1")
endforeach()
string(APPEND src "}  // namespace\n\nconst std::vector<WebAsset>& webui_assets() {\n")
string(APPEND src "  static const std::vector<WebAsset> assets = {\n${table}  };\n  return assets;\n}\n\n}  // namespace strata::serve\n")
file(WRITE "${OUTPUT}.tmp" "${src}")
file(COPY_FILE "${OUTPUT}.tmp" "${OUTPUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUTPUT}.tmp")
