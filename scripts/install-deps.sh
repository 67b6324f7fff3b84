#!/usr/bin/env bash
# Installs what building and testing distribute needs (Debian/Ubuntu, apt).
# Idempotent: checks first, and is silent when everything is already there.
set -euo pipefail

# Boost >= 1.75 for Boost.JSON (bookworm's default libboost-dev is 1.74, so name 1.81 explicitly).
PACKAGES=(g++ meson ninja-build pkg-config cmake libfmt-dev doctest-dev libboost1.81-dev libboost-json1.81-dev
          libbenchmark-dev libssl-dev libcereal-dev python3)

missing=()
have() { command -v "$1" >/dev/null 2>&1; }
for tool in g++ meson ninja pkg-config cmake python3; do
  have "$tool" || missing+=("$tool")
done
# Headers: ask the compiler (finds them wherever they are installed), else look in /usr/include.
has_header() {
  if have g++; then
    printf '#include <%s>\n' "$1" | g++ -std=c++20 -x c++ -E - -o /dev/null >/dev/null 2>&1
  else
    [ -f "/usr/include/$1" ]
  fi
}
for header in fmt/format.h doctest/doctest.h boost/json.hpp boost/asio.hpp benchmark/benchmark.h openssl/hmac.h \
              cereal/cereal.hpp; do
  has_header "$header" || missing+=("<$header>")
done

if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi

echo "install-deps: missing ${missing[*]}; installing: ${PACKAGES[*]}" >&2
if ! have apt-get; then
  echo "install-deps: apt-get not found; install these by hand: ${PACKAGES[*]}" >&2
  exit 1
fi
SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  if have sudo; then
    SUDO=(sudo)
  else
    echo "install-deps: not root and no sudo; install these by hand: ${PACKAGES[*]}" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y --no-install-recommends "${PACKAGES[@]}"
