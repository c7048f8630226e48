# Debian packages the build and the tests need. Sourced by scripts/setup and scripts/test.
STRATA_APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  libgtest-dev libgmock-dev libbenchmark-dev libomp-dev
  libpcre2-dev nlohmann-json3-dev libcli11-dev libcpp-httplib-dev
  chromium
)
# node/npm fetch test data and run the OpenAI SDK client tests; any installed npm will do,
# so the Debian packages are only installed when the commands are missing.

# Installs the packages above when any is missing (idempotent: does nothing when all are present).
strata_install_deps() {
  local missing=()
  local p
  for p in "${STRATA_APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  command -v node >/dev/null 2>&1 || missing+=(nodejs)
  command -v npm >/dev/null 2>&1 || missing+=(npm)
  if [ ${#missing[@]} -eq 0 ]; then return 0; fi
  local sudo=""
  if [ "$(id -u)" != 0 ]; then sudo=sudo; fi
  echo "strata: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}
