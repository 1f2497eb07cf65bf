# Sourced by the bench scripts: h2load (installed when missing), a scratch directory $WORK
# whose processes (pushed on PIDS) are stopped and which is removed when the script exits,
# and free_port for loopback listeners.

need_h2load() {
    command -v h2load >/dev/null || {
        echo "installing nghttp2-client (h2load)"
        local sudo=""
        [ "$(id -u)" -eq 0 ] || sudo=sudo
        $sudo apt-get update -qq && $sudo apt-get install -y -qq nghttp2-client >/dev/null
    }
}

WORK=$(mktemp -d)
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
