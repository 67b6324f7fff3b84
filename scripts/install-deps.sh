#!/usr/bin/env bash
# Installs what building and testing distribute needs (Debian/Ubuntu, apt).
# Idempotent: checks first, and is silent when everything is already there.
set -euo pipefail

# Boost comes from boost_packages below (Boost.JSON needs >= 1.75, and the distributions' default
# libboost-dev differs: 1.74 on Debian bookworm, 1.83 on Ubuntu 24.04).
# python3-venv: tests/check_safetensors_numpy.py makes a virtual environment for numpy, safetensors
# and ml_dtypes (from PyPI); without it that test is skipped. clang: CI builds with both compilers,
# and the compile-fail tests check both compilers' diagnostics. time and nlohmann-json3-dev:
# bench/compile_cost.py (/usr/bin/time -v, and its yardstick).
# cmake and git: the CMake consumer checks (tests/consumer: add_subdirectory, FetchContent, cmake --install).
PACKAGES=(g++ clang meson ninja-build pkg-config cmake git libfmt-dev doctest-dev libbenchmark-dev libssl-dev
          libcereal-dev python3 python3-venv time nlohmann-json3-dev)

# The Boost packages to install, after `apt-get update`: the default ones when they are >= 1.75,
# else the newest versioned pair >= 1.75 (bookworm: libboost1.81-dev + libboost-json1.81-dev), else
# the default headers alone (the library then builds without its networking parts).
boost_packages() {
  local candidate newest
  candidate="$(apt-cache policy libboost-json-dev 2>/dev/null | awk '/Candidate:/ { print $2 }')"
  if [ -n "$candidate" ] && [ "$candidate" != "(none)" ] && dpkg --compare-versions "$candidate" ge 1.75; then
    echo "libboost-dev libboost-json-dev"
    return
  fi
  newest="$(apt-cache pkgnames libboost-json1. 2>/dev/null |
            sed -n 's/^libboost-json1\.\([0-9][0-9]*\)-dev$/\1/p' | sort -n | tail -1)"
  if [ -n "$newest" ] && [ "$newest" -ge 75 ]; then
    echo "libboost1.$newest-dev libboost-json1.$newest-dev"
    return
  fi
  echo "install-deps: no Boost >= 1.75 in the package lists; installing libboost-dev (no Boost.JSON: the" \
       "cluster, networking and checkpoint parts will be left out)" >&2
  echo "libboost-dev"
}

missing=()
have() { command -v "$1" >/dev/null 2>&1; }
for tool in g++ clang++ meson ninja pkg-config cmake git python3; do
  have "$tool" || missing+=("$tool")
done
if have python3 && ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
  missing+=(python3-venv)
fi
# Headers: ask the compiler (finds them wherever they are installed), else look in /usr/include.
has_header() {
  if have g++; then
    printf '#include <%s>\n' "$1" | g++ -std=c++20 -x c++ -E - -o /dev/null >/dev/null 2>&1
  else
    [ -f "/usr/include/$1" ]
  fi
}
[ -x /usr/bin/time ] || missing+=(/usr/bin/time)
for header in fmt/format.h doctest/doctest.h boost/json.hpp boost/asio.hpp benchmark/benchmark.h openssl/hmac.h \
              cereal/cereal.hpp nlohmann/json.hpp; do
  has_header "$header" || missing+=("<$header>")
done

# The adapters' libraries (include/distribute/adapters/): optional. Their test suites build where
# the headers are found and report SKIP where they are not; installed when the package exists.
OPTIONAL_PACKAGES=()
optional() {  # HEADER PACKAGE (a header that needs other include paths is looked for as a file)
  { has_header "$1" || [ -f "/usr/include/$1" ]; } && return 0
  OPTIONAL_PACKAGES+=("$2")
  missing+=("<$1>")
}
optional eigen3/Eigen/Core libeigen3-dev
optional torch/csrc/api/include/torch/torch.h libtorch-dev  # Debian puts the C++ API under torch/csrc/api/include
optional dlpack/dlpack.h libdlpack-dev
optional xtensor/xarray.hpp libxtensor-dev
# MPI (net/mpi.hpp; the 'mpi' suite runs under both): Open MPI and MPICH, each with its launcher.
have mpirun.openmpi || { OPTIONAL_PACKAGES+=(openmpi-bin libopenmpi-dev); missing+=(openmpi); }
have mpiexec.mpich || { OPTIONAL_PACKAGES+=(mpich libmpich-dev); missing+=(mpich); }

# libFuzzer (scripts/fuzz.sh): clang's runtime libraries, Debian's libclang-rt-<clang version>-dev.
fuzzer_links() {
  have clang++ && printf 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }\n' |
    clang++ -fsanitize=fuzzer -x c++ - -o /dev/null >/dev/null 2>&1
}
if have clang++ && ! fuzzer_links; then
  missing+=(libFuzzer)
fi

if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi

echo "install-deps: missing ${missing[*]}" >&2
if ! have apt-get; then
  echo "install-deps: apt-get not found; install these by hand: ${PACKAGES[*]} and Boost >= 1.75 (headers," \
       "Boost.JSON)" >&2
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
read -r -a BOOST <<<"$(boost_packages)"
echo "install-deps: installing ${PACKAGES[*]} ${BOOST[*]}" >&2
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y --no-install-recommends "${PACKAGES[@]}" "${BOOST[@]}"
if have clang++ && ! fuzzer_links; then
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
    "libclang-rt-$(clang++ -dumpversion | cut -d. -f1)-dev" ||
    echo "install-deps: no libclang-rt package for this clang; scripts/fuzz.sh will not build" >&2
fi
for package in "${OPTIONAL_PACKAGES[@]}"; do
  candidate="$(apt-cache policy "$package" 2>/dev/null | awk '/Candidate:/ { print $2 }')"
  if [ -z "$candidate" ] || [ "$candidate" = "(none)" ]; then
    echo "install-deps: $package is not in the package lists; its adapter's tests will be skipped" >&2
    continue
  fi
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$package"
done
