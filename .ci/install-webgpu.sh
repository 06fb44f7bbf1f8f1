#!/usr/bin/env bash
# Software Vulkan for the WebGPU plugin EP: Dawn rejects bookworm's Mesa 22.x, so take Mesa 25.x
# from bookworm-backports (same mirror as the existing Debian sources). Idempotent.
set -euo pipefail
if [ ! -f /etc/apt/sources.list.d/bookworm-backports.sources ]; then
    cat > /etc/apt/sources.list.d/bookworm-backports.sources <<'SRC'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq -t bookworm-backports mesa-vulkan-drivers libvulkan1 >/dev/null
