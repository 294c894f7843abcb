# Sourced by scripts/gpu-check.sh and scripts/gpu-probe.sh on the GPU machine, with G (the carried
# bench-out/gpu-check), WORK (a scratch folder) and a `say` function set: unpacks the carried
# `decision` binary into $BIN (BUILD=autotune: the one built with Burn's kernel autotuning,
# decision-autotune.xz), brings the Vulkan loader and GLVND where the system lacks them, and
# points the loader at NVIDIA's Vulkan driver (VK_DRIVER_FILES); exits 3 when there is none.

# The binary: carried compressed (xz, or Python's lzma where xz is missing).
BIN=$WORK/decision${BUILD:+-$BUILD}
if [ ! -x "$BIN" ]; then
    packed="$G/$(basename "$BIN").xz"
    [ -f "$packed" ] || { say "no $packed: run \`make gpu-check-prepare\` and carry $G"; exit 2; }
    if command -v xz >/dev/null; then xz -dc "$packed" > "$BIN"; else
        python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" "$packed" "$BIN"
    fi
    chmod +x "$BIN"
fi
"$BIN" --version

# The Vulkan loader, and GLVND (libGLdispatch, which NVIDIA's Vulkan driver, libGLX_nvidia, needs:
# without it the loader finds the driver but cannot get its vkCreateInstance): the system's, else
# the carried .debs unpacked into $WORK/vulkan.
for pkg in libvulkan1:libvulkan.so.1 libglvnd0:libGLdispatch.so.0 libglx0:libGLX.so.0 libegl1:libEGL.so.1 \
    libgl1:libGL.so.1 libopengl0:libOpenGL.so.0 libgles2:libGLESv2.so.2; do
    if ! ldconfig -p 2>/dev/null | grep -q "${pkg#*:} "; then
        deb=$(ls "$G/${pkg%%:*}"_*.deb | head -1)
        mkdir -p "$WORK/vulkan"
        if command -v dpkg-deb >/dev/null; then dpkg-deb -x "$deb" "$WORK/vulkan"; else
            (cd "$WORK/vulkan" && ar x "$(realpath "$deb")" && tar xf data.tar.*)
        fi
        say "${pkg#*:} from $deb"
    fi
done
if [ -d "$WORK/vulkan" ]; then
    lib=$(dirname "$(find "$WORK/vulkan" -name 'lib*.so.*' | head -1)")
    export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

# A driver the caller names (VK_DRIVER_FILES set: another GPU's, or lavapipe's for a dry run) is
# used as it is.
if [ -n "${VK_DRIVER_FILES:-}" ]; then
    say "Vulkan driver as set: VK_DRIVER_FILES=$VK_DRIVER_FILES"
else
    # NVIDIA's Vulkan driver: the driver's ICD manifest if installed, else one written for
    # libGLX_nvidia.so.0 (the driver's Vulkan implementation). A container gets that library only with
    # the `graphics` driver capability (NVIDIA_DRIVER_CAPABILITIES=all, or one that lists graphics).
    caps=${NVIDIA_DRIVER_CAPABILITIES:-}
    say "NVIDIA_DRIVER_CAPABILITIES=${caps:-(unset)}"
    icd=""
    # A driver mounted into a container (/usr/local/nvidia) need not be on the loader's search path:
    # the manifest written here names the library by its full path, and its folder (where the driver's
    # other libraries are) joins LD_LIBRARY_PATH.
    for d in /usr/local/nvidia/share/vulkan/icd.d /usr/share/vulkan/icd.d /etc/vulkan/icd.d /usr/local/share/vulkan/icd.d; do
        [ -f "$d/nvidia_icd.json" ] && icd="$d/nvidia_icd.json" && break
    done
    glx=$(ldconfig -p 2>/dev/null | awk '/libGLX_nvidia.so.0 / {print $NF; exit}' || true)
    [ -n "$glx" ] || glx=$(find /usr/local/nvidia /usr/lib /usr/lib64 /usr/local -name 'libGLX_nvidia.so.0' 2>/dev/null | head -1 || true)
    if [ -n "$glx" ]; then
        [ -n "$icd" ] && say "driver manifest $icd: $(tr -d '\n' < "$icd")"
        icd="$WORK/nvidia_icd.json"
        printf '{"file_format_version": "1.0.1", "ICD": {"library_path": "%s", "api_version": "1.3"}}\n' "$glx" > "$icd"
        export LD_LIBRARY_PATH="$(dirname "$glx")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
    if [ -z "$icd" ]; then
        say "no NVIDIA Vulkan driver here (ICD manifest: ${icd:-none}; libGLX_nvidia.so.0: ${glx:-none}): our side cannot run."
        case ",$caps," in
            *,all,*|*,graphics,*) say "the container has the graphics capability, so the driver's user-space Vulkan files are missing" ;;
            *) say "in a container, start it with NVIDIA_DRIVER_CAPABILITIES=all (or compute,utility,graphics)" ;;
        esac
        exit 3
    fi
    export VK_DRIVER_FILES="$icd" VK_ICD_FILENAMES="$icd"
    say "Vulkan ICD $icd -> $glx"
fi

