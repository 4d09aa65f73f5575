#!/usr/bin/env bash
# Installs missing system packages with apt-get.
#
#   ensure-deps.sh [COMMAND:PACKAGE | PACKAGE]...
#
# COMMAND:PACKAGE installs PACKAGE when COMMAND is not on the PATH; a bare PACKAGE installs it
# unless dpkg has it. Without arguments: the tools kubenet's tests and demo use to inspect state
# the way an operator would (nft, iptables, conntrack, tc, ip) — the plugin itself needs none of
# them, it talks netlink —, iperf3 for `make bench`'s datapath workload, and Go.
set -euo pipefail

wanted=("$@")
if [ ${#wanted[@]} -eq 0 ]; then
  wanted=(ip:iproute2 tc:iproute2 iptables:iptables ip6tables:iptables nft:nftables
    ebtables:ebtables conntrack:conntrack nsenter:util-linux iperf3:iperf3)
  command -v go >/dev/null 2>&1 || [ -x /usr/local/go/bin/go ] || wanted+=(golang-go)
fi
missing=()
for want in "${wanted[@]}"; do
  case "$want" in
  *:*)
    PATH="$PATH:/usr/sbin:/sbin" command -v "${want%%:*}" >/dev/null 2>&1 || missing+=("${want#*:}") ;;
  *)
    dpkg-query -W -f='${Status}' "$want" 2>/dev/null | grep -q 'ok installed' || missing+=("$want") ;;
  esac
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
mapfile -t pkgs < <(printf '%s\n' "${missing[@]}" | sort -u)
if [ "$(id -u)" -ne 0 ]; then
  echo "missing packages: ${pkgs[*]}; run as root (the tests need root anyway)" >&2
  exit 1
fi
echo "installing: ${pkgs[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
