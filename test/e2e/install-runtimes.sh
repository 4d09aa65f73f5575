#!/usr/bin/env bash
# Installs what `make e2e-runtimes` drives, when it is missing: Debian's containerd (1.6, with
# ctr and the runc v2 shim), runc, podman (4.x, with conmon; its CNI backend runs kubenet) and
# busybox-static (the test images are built from it: no registry is reachable; not busybox,
# though both install /bin/busybox: the image needs a static binary). util-linux provides nsenter,
# which runs commands inside each runtime's jail.
set -euo pipefail
exec "$(dirname "$0")/../../hack/ensure-deps.sh" \
  containerd:containerd ctr:containerd containerd-shim-runc-v2:containerd runc:runc \
  podman:podman conmon:conmon nsenter:util-linux busybox-static
