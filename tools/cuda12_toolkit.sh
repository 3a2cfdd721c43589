#!/usr/bin/env bash
# Assembles a CUDA 12 toolkit folder (nvcc and the programs it runs, the CUDA headers, the static CUDA runtime)
# from packages alone, for tools/build_wheel.sh --variant cuda12x on a machine whose own nvcc is CUDA 13.
#
#   tools/cuda12_toolkit.sh DEST      # prints DEST/bin/nvcc when done; reuses DEST when it is already complete
#
# Why two sources: NVIDIA's CUDA 12 pip wheels carry the headers (nvidia-cuda-runtime-cu12, nvidia-cuda-nvcc-cu12's
# crt/, nvidia-cuda-cccl-cu12) and libcudart_static.a, but nvidia-cuda-nvcc-cu12 ships only ptxas and libdevice
# (every 12.x release: no nvcc driver, no cicc front end, no cudafe++, fatbinary or nvlink). Those programs come
# from Debian's nvidia-cuda-toolkit package (non-free, Debian 13 "trixie": CUDA 12.4; its nvcc needs glibc 2.34,
# so it runs on Debian 12). The .deb is downloaded with apt-get under a private configuration (its own source
# list and package lists below DEST's parent), never installed: the system's apt sources and packages are left
# as they are. The header wheels are pinned to the nvcc's major.minor version, so headers and compiler agree.
# Needs apt-get and dpkg-deb (Debian or Ubuntu) and network access to Debian's archive and PyPI.
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: tools/cuda12_toolkit.sh DEST" >&2; exit 2; }
dest="$1"
python="${PYTHON:-python3}"

complete() {
  [ -x "$dest/bin/nvcc" ] && [ -x "$dest/nvvm/bin/cicc" ] && [ -f "$dest/include/cuda_runtime.h" ] &&
    [ -f "$dest/include/crt/host_config.h" ] && [ -f "$dest/lib64/libcudart_static.a" ] &&
    [ -f "$dest/lib64/libcudadevrt.a" ] &&
    "$dest/bin/nvcc" --version 2>/dev/null | grep -q "release 12\."
}
if complete; then echo "$dest/bin/nvcc"; exit 0; fi
command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null ||
  { echo "cuda12_toolkit.sh: needs apt-get and dpkg-deb (Debian/Ubuntu) to fetch Debian's nvidia-cuda-toolkit" >&2; exit 2; }

mkdir -p "$dest"
dest="$(cd "$dest" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# ---- nvcc, cicc, cudafe++, fatbinary, nvlink, ptxas from Debian's nvidia-cuda-toolkit (trixie, non-free).
apt_dir="$(dirname "$dest")/cuda12-apt"
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
[ -f "$keyring" ] || { echo "cuda12_toolkit.sh: no $keyring (install Debian's debian-archive-keyring)" >&2; exit 2; }
echo "deb [signed-by=$keyring] http://deb.debian.org/debian trixie non-free" > "$apt_dir/sources.list"
apt_opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
          -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache" -o APT::Sandbox::User=root)
apt-get "${apt_opts[@]}" update -q >/dev/null
(cd "$work" && apt-get "${apt_opts[@]}" download -q nvidia-cuda-toolkit >/dev/null)
deb="$(ls "$work"/nvidia-cuda-toolkit_*.deb)"
dpkg-deb -x "$deb" "$work/deb"
lib="$work/deb/usr/lib/nvidia-cuda-toolkit"
rm -rf "$dest/bin" "$dest/nvvm" "$dest/include" "$dest/lib64"
mkdir -p "$dest/bin" "$dest/nvvm/bin" "$dest/nvvm/libdevice" "$dest/include" "$dest/lib64"
cp "$lib/bin/nvcc" "$lib/bin/cicc" "$dest/bin/"
mv "$dest/bin/cicc" "$dest/nvvm/bin/cicc"
cp -r "$lib/bin/crt" "$dest/bin/"
cp "$lib/libdevice/libdevice.10.bc" "$dest/nvvm/libdevice/"
# cuobjdump: to list the GPU code a build carries (.ci/wheels.sh checks sm_80, sm_90 and PTX with it).
for tool in cudafe++ fatbinary nvlink ptxas bin2c cuobjdump; do cp "$work/deb/usr/bin/$tool" "$dest/bin/"; done
# The layout of NVIDIA's own installs (what nvcc finds next to itself); Debian's profile points into /usr instead.
cat > "$dest/bin/nvcc.profile" <<'EOF'
TOP              = $(_HERE_)/..
CICC_PATH        = $(TOP)/nvvm/bin
NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice
LD_LIBRARY_PATH += $(TOP)/lib64:
PATH            += $(CICC_PATH):$(_HERE_):
INCLUDES        +=  "-I$(TOP)/include" $(_SPACE_)
LIBRARIES        =+ $(_SPACE_) "-L$(TOP)/lib64/stubs" "-L$(TOP)/lib64"
CUDAFE_FLAGS    +=
PTXAS_FLAGS     +=
EOF
release="$("$dest/bin/nvcc" --version | sed -n 's/.*release \([0-9]*\.[0-9]*\),.*/\1/p')"
case "$release" in
  12.*) ;;
  *) echo "cuda12_toolkit.sh: Debian's nvidia-cuda-toolkit is now CUDA '$release', not 12.x; pin an older one" >&2; exit 1 ;;
esac

# ---- headers from NVIDIA's CUDA 12 wheels of the nvcc's major.minor (crt/ must match cicc and cudafe++).
"$python" -m pip download -q --disable-pip-version-check --no-deps --only-binary :all: -d "$work/wheels" \
  "nvidia-cuda-runtime-cu12==$release.*" "nvidia-cuda-nvcc-cu12==$release.*" "nvidia-cuda-cccl-cu12==$release.*"
for wheel in "$work"/wheels/*.whl; do "$python" -m zipfile -e "$wheel" "$work/pkgs"; done
nv="$work/pkgs/nvidia"
cp -r "$nv/cuda_runtime/include/." "$nv/cuda_nvcc/include/." "$nv/cuda_cccl/include/." "$dest/include/"
find "$dest/include" -name __init__.py -delete
# ---- the static runtime (CMakeLists.txt links CUDA::cudart_static): the cu12 runtime wheels carry
# libcudart_static.a only from 12.9 on (12.4-12.8 have libcudart.so.12 alone). A 12.9 runtime runs the code of a
# 12.4 nvcc (CUDA's minor-version compatibility: any 12.x runtime, any driver >= 525), and its API is a superset.
"$python" -m pip download -q --disable-pip-version-check --no-deps --only-binary :all: -d "$work/static" \
  "nvidia-cuda-runtime-cu12>=12.9,<13"
"$python" -m zipfile -e "$(ls "$work"/static/*.whl)" "$work/static/pkg"
rt="$work/static/pkg/nvidia/cuda_runtime/lib"
cp "$rt/libcudart_static.a" "$rt/libculibos.a" "$rt/libcudart.so.12" "$dest/lib64/"
# nvcc adds -lcudadevrt (the device runtime for kernels that launch kernels, code built with -rdc) to every link it
# drives, CMake's compiler checks among them; no 12.4 wheel ships it, and nvlink refuses 12.9's ("newer than
# toolkit"). singa_lite's kernels are compiled whole (no -rdc) and launch nothing from the device, so an empty
# archive stands in for it (nvlink skips it with a warning).
ar rcs "$dest/lib64/libcudadevrt.a"
ln -sf libcudart.so.12 "$dest/lib64/libcudart.so"
chmod +x "$dest/bin/nvcc" "$dest/nvvm/bin/cicc"
complete || { echo "cuda12_toolkit.sh: $dest is still incomplete after assembling it" >&2; exit 1; }
echo "$dest/bin/nvcc"
