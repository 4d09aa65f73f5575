#!/usr/bin/env bash
# Installs what `make e2e-runtimes` drives, when it is missing: Debian's containerd (1.6, with
# ctr and the runc v2 shim), runc, podman (4.x, with conmon; its CNI backend runs kubenet) and
# busybox-static (the test images are built from it: no registry is reachable). util-linux
# provides nsenter, which runs commands inside each runtime's jail.
set -euo pipefail

declare -A pkg_of=(
  [containerd]=containerd [ctr]=containerd [containerd-shim-runc-v2]=containerd
  [runc]=runc [podman]=podman [conmon]=conmon [nsenter]=util-linux
)
missing=()
for cmd in "${!pkg_of[@]}"; do
  PATH="$PATH:/usr/sbin:/sbin" command -v "$cmd" >/dev/null 2>&1 || missing+=("${pkg_of[$cmd]}")
done
# busybox-static, not busybox: the image needs a static binary. Both install /bin/busybox.
if ! dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q 'ok installed'; then
  missing+=(busybox-static)
fi
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
mapfile -t pkgs < <(printf '%s\n' "${missing[@]}" | sort -u)
if [ "$(id -u)" -ne 0 ]; then
  echo "missing packages: ${pkgs[*]}; run as root (the runtime tests need root anyway)" >&2
  exit 1
fi
echo "installing: ${pkgs[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
