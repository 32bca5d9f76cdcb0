#!/usr/bin/env bash
# Installs what the build needs when it is missing (cmake, a C compiler, OpenBLAS, and
# pkg-config for tests/install; for expert parallelism Open MPI with mpirun and, where the
# CUDA backend is built, NCCL from pip) and builds moex into build/ (or $MOEX_BUILD_DIR).
# Sourced by scripts/test.sh and scripts/run.sh.
# Without root or apt-get it says what is missing and builds without OpenBLAS (and MPI).
# The CUDA backend: MOEX_CUDA=AUTO (default: for this machine's GPUs, none without a GPU), ON
# or OFF from the environment (CMakeLists.txt, "CUDA"); a build directory configured with
# another value is configured again. MOEX_CMAKE_ARGS: more arguments for the first configure.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD_DIR=${MOEX_BUILD_DIR:-build}

missing=()
command -v cmake >/dev/null || missing+=(cmake)
command -v cc >/dev/null || missing+=(build-essential)
command -v python3 >/dev/null || missing+=(python3)
command -v pkg-config >/dev/null || missing+=(pkg-config)
# (any one of the places will do: `ls` of both fails when one of them is absent)
have_cblas=0
for f in /usr/include/*/openblas*/cblas.h /usr/include/openblas/cblas.h; do
  [ -f "$f" ] && have_cblas=1
done
[ $have_cblas = 1 ] || missing+=(libopenblas-dev)
# MPI (EP on the CPU backend, tests ep_mpi_np*): mpicc that finds mpi.h, and mpirun. Its own
# list, installed without Recommends (Debian's libopenmpi-dev recommends Fortran coarrays).
mpi_missing=()
if ! command -v mpirun >/dev/null || ! command -v mpicc >/dev/null ||
   ! echo '#include <mpi.h>' | mpicc -E -x c - >/dev/null 2>&1; then
  mpi_missing=(libopenmpi-dev openmpi-bin)
fi
if [ $(( ${#missing[@]} + ${#mpi_missing[@]} )) -gt 0 ]; then
  all=("${missing[@]}" "${mpi_missing[@]}")
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing ${all[*]}" >&2
    apt_install() { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"; }
    (apt-get update -qq &&
     { [ ${#missing[@]} = 0 ] || apt_install "${missing[@]}"; } &&
     { [ ${#mpi_missing[@]} = 0 ] || apt_install --no-install-recommends "${mpi_missing[@]}"; }) >/dev/null ||
      echo "setup: apt-get could not install ${all[*]}; continuing with what is here" >&2
  else
    echo "setup: missing ${all[*]} and cannot apt-get (not root); continuing without them" >&2
  fi
fi

# Will the build have the CUDA backend? MOEX_CUDA of MOEX_CMAKE_ARGS, else of the environment,
# else AUTO; AUTO builds it for the GPUs present (CMakeLists.txt asks the same two tools), or
# for CMAKE_CUDA_ARCHITECTURES / CUDAARCHS when given.
nvcc=$(command -v nvcc || true)
if [ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ]; then nvcc=/usr/local/cuda/bin/nvcc; fi
cuda_mode=${MOEX_CUDA:-AUTO}
[[ " ${MOEX_CMAKE_ARGS:-} " =~ -DMOEX_CUDA(:[A-Z]+)?=([A-Za-z0-9]+) ]] && cuda_mode=${BASH_REMATCH[2]}
cuda_mode=${cuda_mode^^}
want_cuda=0
case $cuda_mode in
  ON | 1 | TRUE | YES | Y) want_cuda=1 ;;
  AUTO)
    if [ -n "$nvcc" ]; then
      if [[ " ${MOEX_CMAKE_ARGS:-} " =~ -DCMAKE_CUDA_ARCHITECTURES ]] || [ -n "${CUDAARCHS:-}" ] ||
         "$(dirname "$nvcc")/__nvcc_device_query" >/dev/null 2>&1 ||
         nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
        want_cuda=1
      fi
    fi ;;
esac

# NCCL (EP on the CUDA backend): where the CUDA backend is built and no nccl.h is found where
# CMakeLists.txt looks (NCCL_ROOT, /usr, /usr/local, the CUDA toolkit, pip's
# nvidia-nccl-cu13), pip installs nvidia-nccl-cu13 for this python3 (CMake finds it there).
# Skipped when the build is told not to use NCCL (MOEX_CMAKE_ARGS).
if [ -n "$nvcc" ] && [ $want_cuda = 1 ] && ! [[ " ${MOEX_CMAKE_ARGS:-} " =~ -DMOEX_NCCL=(OFF|off|0|FALSE|false|NO|no)\  ]]; then
  cuda_home=$(cd "$(dirname "$(readlink -f "$nvcc")")/.." && pwd)
  have_nccl=0
  for f in ${NCCL_ROOT:+"$NCCL_ROOT/include/nccl.h"} /usr/include/nccl.h /usr/local/include/nccl.h \
           "$cuda_home"/include/nccl.h "$cuda_home"/targets/*/include/nccl.h; do
    [ -f "$f" ] && have_nccl=1
  done
  pip_nccl_h='import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "include", "nccl.h"))'
  if [ $have_nccl = 0 ] && command -v python3 >/dev/null; then
    f=$(python3 -c "$pip_nccl_h" 2>/dev/null || true)
    [ -n "$f" ] && [ -f "$f" ] && have_nccl=1
    if [ $have_nccl = 0 ]; then
      echo "setup: installing NCCL (pip nvidia-nccl-cu13)" >&2
      python3 -m pip install --quiet --disable-pip-version-check nvidia-nccl-cu13 ||
        echo "setup: pip could not install nvidia-nccl-cu13; building without EP over NCCL" >&2
    fi
  fi
fi

command -v cmake >/dev/null || { echo "setup: cmake is required" >&2; exit 1; }

gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD_DIR" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release ${MOEX_CUDA:+-DMOEX_CUDA="$MOEX_CUDA"} \
        ${MOEX_CMAKE_ARGS:-}
elif [ -n "${MOEX_CUDA:-}" ] && ! grep -qx "MOEX_CUDA:[A-Z]*=$MOEX_CUDA" "$BUILD_DIR/CMakeCache.txt"; then
  cmake "$BUILD_DIR" -DMOEX_CUDA="$MOEX_CUDA"
fi
cmake --build "$BUILD_DIR" -j "$(nproc)"
