# Sourced by the set-up scripts: apt_ensure PKG... installs the Debian packages not installed yet (one
# apt-get update, only when something is missing). Idempotent.
apt_ensure() {
  local missing="" p
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
  [ -n "$missing" ] || return 0
  echo "[setup] apt-get install$missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends $missing >/dev/null
}
