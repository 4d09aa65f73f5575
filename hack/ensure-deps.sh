#!/usr/bin/env bash
# Installs the system tools kubenet's tests and demo use, when they are missing.
# The plugin itself needs none of them (it talks netlink); the tests use them to inspect state
# the way an operator would (nft, iptables, conntrack, tc, ip).
set -euo pipefail

declare -A pkg_of=(
  [ip]=iproute2 [tc]=iproute2 [iptables]=iptables [ip6tables]=iptables [nft]=nftables
  [ebtables]=ebtables [conntrack]=conntrack
)
missing=()
for cmd in "${!pkg_of[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || PATH="$PATH:/usr/sbin:/sbin" command -v "$cmd" >/dev/null 2>&1 || missing+=("${pkg_of[$cmd]}")
done
if ! command -v go >/dev/null 2>&1 && [ ! -x /usr/local/go/bin/go ]; then
  missing+=(golang-go)
fi
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
mapfile -t pkgs < <(printf '%s\n' "${missing[@]}" | sort -u)
if [ "$(id -u)" -ne 0 ]; then
  echo "missing packages: ${pkgs[*]}; run as root (make test/demo need root anyway)" >&2
  exit 1
fi
echo "installing: ${pkgs[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
