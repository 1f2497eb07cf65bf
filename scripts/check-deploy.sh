#!/usr/bin/env bash
# Offline checks of the deployment artifacts (tools from scripts/install-test-tools.sh, in
# .tools/venv): every plain Kubernetes manifest and both rendered kustomize overlays against
# the Kubernetes 1.30 schemas (strict: unknown fields are errors), and checkov over the
# rendered manifests, the Istio EnvoyFilters and the Dockerfile with no failed check (the few
# skips are annotations on the objects, each with its reason). The Envoy bootstrap, the
# EnvoyFilters' contents and the limits files are checked by tests/deploy.rs.
# Prints one line per check and ends with `deploy: N passed, M failed`; exits 1 on a failure.
set -uo pipefail
cd "$(dirname "$0")/.."

BIN=.tools/venv/bin
K8S_VERSION=1.30.0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0
failed=0

check() { # check NAME COMMAND...: runs COMMAND, output shown only on failure
    local name=$1
    shift
    if "$@" >"$work/out" 2>&1; then
        echo "deploy check $name ... ok"
        passed=$((passed + 1))
    else
        echo "deploy check $name ... FAILED"
        sed 's/^/    /' "$work/out"
        failed=$((failed + 1))
    fi
}

# Schema validation that also fails on warnings (e.g. a kind without a schema, a typo in
# apiVersion): kubernetes-validate only warns about those.
validate() {
    local out
    out=$("$BIN/kubernetes-validate" -k "$K8S_VERSION" --strict --quiet "$@" 2>&1)
    local rc=$?
    [ -n "$out" ] && echo "$out"
    [ "$rc" -eq 0 ] && [ -z "$out" ]
}

render() { # render OVERLAY: kubectl kustomize, offline
    "$BIN/kubectl" kustomize "deploy/kubernetes/overlays/$1" >"$work/rendered/$1.yaml"
}

mkdir -p "$work/rendered"
mapfile -t plain < <(find deploy/kubernetes -name '*.yaml' ! -name kustomization.yaml \
    ! -name '*-patch.yaml' ! -path '*/limits/*' | sort)
for file in "${plain[@]}"; do
    check "schema $file" validate "$file"
done
check "schema deploy/envoy-gateway/envoy-gateway-config.yaml" \
    validate deploy/envoy-gateway/envoy-gateway-config.yaml
for overlay in redis memory redis-tls; do
    check "render overlays/$overlay" render "$overlay"
    check "schema overlays/$overlay (rendered)" validate "$work/rendered/$overlay.yaml"
done

# With TLS on the gRPC port the kubelet's grpc probes (plaintext only) would fail: the
# component must have replaced every one of them in the rendered Deployment.
no_grpc_probe() {
    ! grep -nE '^ +grpc:' "$work/rendered/redis-tls.yaml"
}
check "overlays/redis-tls has no gRPC probe" no_grpc_probe

cp Dockerfile "$work/rendered/Dockerfile"
cp deploy/istio/*.yaml "$work/rendered/"
check "checkov (rendered overlays, Istio filters, Dockerfile)" \
    "$BIN/checkov" --directory "$work/rendered" --framework kubernetes dockerfile \
    --skip-download --compact --quiet

echo "deploy: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
