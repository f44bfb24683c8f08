# How the GPU bundle (scripts/gpu_bundle.sh) runs on a machine that is not the one it was made on:
# which libraries it carries, where its binaries find them, and how its relocated Open MPI is set
# up. Sourced (bash) by gpu_bundle.sh, gpu_check.sh and the bundle tests
# (tests/gpu_bundle_library_loading.sh, tests/gpu_bundle_relocated_mpirun.sh), so the tests check
# exactly what runs on the GPU machine. Defines variables and functions only.
# shellcheck shell=bash
# shellcheck disable=SC2034  # the variables are for the scripts that source this file

# Libraries the GPU image brings itself, so the bundle never carries them and they may resolve
# outside it: the C runtime and the compiler's (the image's are at least as new, and its CUDA
# libraries need those), and CUDA's own (the image's match its driver).
BUNDLE_IMAGE_LIBS='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|libutil\.|libresolv\.|libstdc\+\+|libgcc_s|libcuda\.|libcudart|libcublas|libcudnn|libnccl|libnvrtc|libnvJitLink)'

# Open MPI plugins that need network-fabric libraries (UCX, libfabric, verbs, PSM) or OpenSHMEM:
# left out of the bundle, so the image cannot even try to load them; BUNDLE_MCA_PARAMS selects
# without them anyway. Matched against the libraries a plugin loads.
BUNDLE_FABRIC_LIBS='^(libuc[pstm]|libfabric|libibverbs|librdmacm|libefa|libpsm|libinfinipath|libmca_common_(ucx|ofi|verbs)|liboshmem)'

# Open MPI's and PMIx's settings for the bundle. On Debian, /etc/openmpi/openmpi-mca-params.conf
# makes these choices, but the relocated Open MPI does not read it (OPAL_SYSCONFDIR points into
# the bundle, and the GPU image has no /etc/openmpi): without them ob1 competes with UCX and OFI,
# and a container without ptrace rights prints CMA warnings.
# shellcheck disable=SC2054  # the commas are in the values
BUNDLE_MCA_PARAMS=(
  OMPI_MCA_plm=isolated                        # local ranks, started without ssh or a daemon
  OMPI_MCA_pml=ob1                             # point-to-point over the BTLs below
  OMPI_MCA_btl=self,vader,tcp                  # shared memory on one machine, TCP as fallback
  OMPI_MCA_btl_vader_single_copy_mechanism=none  # no CMA/XPMEM: needs no ptrace rights
  OMPI_MCA_btl_tcp_if_include=lo               # one machine: no guessing among its interfaces
  OMPI_MCA_oob_tcp_if_include=lo
  OMPI_MCA_btl_base_warn_component_unused=0
  OMPI_MCA_mtl='^ofi,psm,psm2'                 # only used by pml cm; named so none loads
  OMPI_MCA_osc='^ucx,pt2pt'                    # as Debian's file
  OMPI_MCA_hwloc_base_binding_policy=none      # no binding warnings inside a cgroup's CPU set
  OMPI_MCA_mca_base_component_show_load_errors=0
  PMIX_MCA_gds=hash                            # PMIx's shared-memory store warns in containers
  PMIX_MCA_mca_base_component_show_load_errors=0
  PMIX_MCA_pcompress_base_silence_warning=1    # should its zlib plugin not load there
)

# The image's CUDA libraries: the toolkit's and those of its Python packages (cuDNN, NCCL).
# Prints a colon-separated path.
cuda_library_path() {
  local dirs=(/usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/nvidia/lib64)
  local dir
  while read -r dir; do dirs+=("$dir"); done < <(python3 - <<'PY' 2>/dev/null
import os
try:
    import nvidia
    for base in nvidia.__path__:
        for name in sorted(os.listdir(base)):
            lib = os.path.join(base, name, "lib")
            if os.path.isdir(lib):
                print(lib)
except ImportError:
    pass
PY
)
  # Anything still missing is searched for where images keep libraries.
  local library found
  for library in libcudart.so.13 libcublasLt.so.13 libcudnn.so.9 libnccl.so.2; do
    found=0
    for dir in "${dirs[@]}"; do [ -e "$dir/$library" ] && found=1; done
    [ "$found" = 1 ] && continue
    dir=$(find /usr /opt /lib -name "$library" 2>/dev/null | head -n 1)
    [ -n "$dir" ] && dirs+=("$(dirname "$dir")")
  done
  local path=""
  for dir in "${dirs[@]}"; do [ -d "$dir" ] && path="$path${path:+:}$dir"; done
  echo "$path"
}

# bundle_unpack BUNDLE DIR: unpacks BUNDLE into an empty DIR with tar's xz, or with Python's
# tarfile where the image has no xz.
bundle_unpack() {
  local bundle=$1 dir=$2
  rm -rf "$dir" && mkdir -p "$dir" || return 1
  tar -C "$dir" -xJf "$bundle" && return 0
  echo "bundle: tar -xJf failed (no xz?); unpacking with Python's tarfile"
  rm -rf "$dir" && mkdir -p "$dir" || return 1
  python3 - "$bundle" "$dir" <<'PY'
import sys, tarfile
with tarfile.open(sys.argv[1]) as bundle:
    try:
        bundle.extractall(sys.argv[2], filter="fully_trusted")  # ours; keeps modes and links
    except TypeError:  # a Python without extraction filters
        bundle.extractall(sys.argv[2])
PY
}

# bundle_files DIR: every binary and plugin of the unpacked bundle DIR, one a line: what the
# library check (bundle_ldd_check) must be able to load.
bundle_files() {
  local dir=$1
  find "$dir/bin" "$dir/ompi/usr/bin" -type f
  find "$dir/ompi/usr/lib" -type f -name '*.so'
}

# bundle_env_setup DIR: makes the unpacked bundle DIR runnable. Exports Open MPI's relocation
# (OPAL_PREFIX, OPAL_SYSCONFDIR, PMIx's plugin and help folders) and BUNDLE_MCA_PARAMS, which
# no program but Open MPI reads. The library path is not exported: the image's own programs
# (python3, nvidia-smi, tar) keep the image's libraries. Instead it writes two wrappers:
#   BUNDLE_RUN=DIR/wrap/run        runs its arguments with the bundle's libraries first
#   BUNDLE_MPIRUN=DIR/wrap/mpirun  the bundle's mpirun, likewise (its ranks inherit the path)
# and sets BUNDLE_LIBRARY_PATH (the bundle's libraries, then the image's CUDA libraries).
bundle_env_setup() {
  local dir
  dir=$(cd "$1" && pwd) || return 1
  local ompi=$dir/ompi/usr
  BUNDLE_LIBRARY_PATH="$dir/lib:$(cuda_library_path)"
  BUNDLE_LIBRARY_PATH=${BUNDLE_LIBRARY_PATH%:}
  export OPAL_PREFIX=$ompi OPAL_SYSCONFDIR=$ompi/etc
  # PMIx finds its plugins and help texts by the absolute paths it was built with, unless told.
  export PMIX_PKGLIBDIR=$ompi/lib/x86_64-linux-gnu/pmix2/lib/pmix
  export PMIX_PKGDATADIR=$ompi/lib/x86_64-linux-gnu/pmix2/share/pmix
  local setting
  for setting in "${BUNDLE_MCA_PARAMS[@]}"; do export "${setting?}"; done
  mkdir -p "$dir/wrap" || return 1
  {
    echo '#!/bin/sh'
    echo '# Runs its arguments with the GPU bundle'"'"'s libraries first (scripts/gpu_bundle_env.sh).'
    # shellcheck disable=SC2016  # expanded when the wrapper runs
    printf 'LD_LIBRARY_PATH=%q${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec "$@"\n' "$BUNDLE_LIBRARY_PATH"
  } > "$dir/wrap/run"
  printf '#!/bin/sh\nexec %q %q "$@"\n' "$dir/wrap/run" "$ompi/bin/mpirun" > "$dir/wrap/mpirun"
  chmod +x "$dir/wrap/run" "$dir/wrap/mpirun"
  BUNDLE_RUN=$dir/wrap/run
  BUNDLE_MPIRUN=$dir/wrap/mpirun
}

# bundle_ldd_check MODE FILE...: runs ldd on each FILE with BUNDLE_LIBRARY_PATH (call
# bundle_env_setup first) and prints every library that is not found, and every symbol version
# the loaded libraries lack. In MODE strict (on the build machine) it also prints each library
# that resolves outside the bundle although the image does not bring it (BUNDLE_IMAGE_LIBS):
# found here in /usr/lib, it would be missing on the GPU image. Returns 1 when it printed any.
bundle_ldd_check() {
  local mode=$1 bundle_lib=${BUNDLE_LIBRARY_PATH%%:*} bad=0 file line name path
  shift
  for file in "$@"; do
    while IFS= read -r line; do
      case $line in
        *"not found"*) echo "$file: $line"; bad=1; continue ;;
      esac
      [ "$mode" = strict ] || continue
      read -r name _ path _ <<< "$line"
      [[ $path == /* ]] || continue  # linux-vdso, and the loader's own line
      [[ $name =~ $BUNDLE_IMAGE_LIBS ]] && continue
      [[ $path == "$bundle_lib"/* ]] && continue
      echo "$file: $name resolves outside the bundle ($path), and the GPU image may lack it"
      bad=1
    done < <(LD_LIBRARY_PATH=$BUNDLE_LIBRARY_PATH ldd "$file" 2>&1)
  done
  return "$bad"
}
