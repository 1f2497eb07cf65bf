# syntax=docker/dockerfile:1
# floodgate container image: build the release binary with the official Rust image, then copy it
# alone into a distroless runtime (glibc + libgcc + CA certificates; no shell, no package
# manager). The binary links no OpenSSL (Redis TLS is rustls), so distroless/cc is all it needs.
#
#   docker build -t floodgate:0.1.0 .
#   docker run --rm -p 8080:8080 -p 8081:8081 floodgate:0.1.0
#
# The default command serves the example limits baked in at /etc/floodgate/limits; in
# Kubernetes the limits ConfigMap is mounted over that directory (deploy/kubernetes).

FROM rust:1-bookworm AS build
WORKDIR /src
# Only what the build reads (see .dockerignore): the manifest, the build script and the code
# generated from the protos (proto/gen, which it copies into place), the Lua script embedded
# with include_str!, the sources.
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto proto
COPY lua lua
COPY src src
# The cache mounts keep the registry and target directory between builds; the binary is copied
# out of the cached target directory in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --profile production --locked --bin floodgate \
    && install -D -m 0755 target/production/floodgate /out/floodgate

# :nonroot runs as uid/gid 65532 ("nonroot") and has no shell.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/floodgate /floodgate
# The reference image's command, which Envoy Gateway's rate-limit deployment runs: invoked as
# `ratelimit`, floodgate serves as `floodgate serve` from the reference's environment.
COPY --from=build /out/floodgate /bin/ratelimit
COPY examples/limits /etc/floodgate/limits
USER 65532:65532
# 8081: gRPC (envoy.service.ratelimit.v3, grpc.health.v1, reflection); 8080: HTTP
# (/healthcheck, /metrics, /json, /rlconfig).
EXPOSE 8081 8080
# No HEALTHCHECK: there is no shell or client in the image to run one, and the orchestrator
# probes the gRPC health service directly (Kubernetes `grpc:` probes, see deploy/kubernetes).
HEALTHCHECK NONE
ENTRYPOINT ["/floodgate"]
CMD ["serve", "--config", "/etc/floodgate/limits"]
