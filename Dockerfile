# syntax=docker/dockerfile:1.7
#
# One image for every dlock binary; the operator runs its children (lock-server, migration Jobs, ...)
# from it. Build: docker build -t dlock:dev .
#
#   builder  rust:1.95-bookworm, release build of the service binaries (cached registry and target)
#   runtime  distroless/cc (glibc + libgcc, no shell), user 65532, migrations under /migrations
#
# Without a registry to pull rust/distroless from, Dockerfile.prebuilt gives the same image (paths,
# user, /migrations, entrypoint) from host-built binaries on a local Debian base (the kind tier).

FROM rust:1.95-bookworm AS builder
WORKDIR /src

# Only what the build needs: every workspace member (cargo loads the whole workspace, hence
# services/, operator/ and e2e/), the OpenAPI documents the services embed with include_str!, and
# the migrations. No target/, no charts.
COPY Cargo.toml Cargo.lock rustfmt.toml ./
COPY services ./services
COPY operator ./operator
COPY e2e ./e2e
COPY docs/openapi ./docs/openapi
COPY migrations ./migrations

# --locked: the image is built from exactly the versions in Cargo.lock. The target dir is a cache
# mount, so the binaries are copied out of it within the same step. The packages are named (-p):
# built alone they are built with their default features only, so the fault injection the dev-only
# test kit turns on for the workspace's tests (cargo feature `fault-injection`) is not in the image
# (services/testkit/tests/shipped.rs checks both the packages and that feature).
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked \
        -p lock-server -p payment-resource -p rail-proxy -p rail-stub -p payout-executor \
        -p dlock-migrate -p dlock-fastforward -p dlock-operator -p kubectl-dlock -p dlock-cli \
        --bin lock-server \
        --bin payment-resource \
        --bin rail-proxy \
        --bin rail-stub \
        --bin payout-executor \
        --bin dlock-migrate \
        --bin dlock-fastforward \
        --bin dlock-operator \
        --bin kubectl-dlock \
        --bin dlock \
    && mkdir -p /out \
    && cp target/release/lock-server target/release/payment-resource target/release/rail-proxy \
          target/release/rail-stub target/release/payout-executor target/release/dlock-migrate \
          target/release/dlock-fastforward target/release/dlock-operator target/release/kubectl-dlock \
          target/release/dlock /out/

# Same Debian release as the builder, so the glibc the binaries link against is present.
FROM gcr.io/distroless/cc-debian12:nonroot AS runtime

LABEL org.opencontainers.image.title="dlock" \
      org.opencontainers.image.description="dlock: fenced distributed locks, the payments stack that proves them, and the Kubernetes operator" \
      org.opencontainers.image.licenses="Apache-2.0"

COPY --from=builder /out/ /usr/local/bin/
# The two Flyway-style histories; migration Jobs run e.g.
#   dlock-migrate --dir /migrations/lockdb (DATABASE_URL from a Secret)
COPY --chown=0:0 migrations/ /migrations/

# distroless "nonroot" is uid/gid 65532; stated numerically so runAsNonRoot can verify it.
USER 65532:65532
ENV RUST_LOG=info
# Default entrypoint is the operator; Deployments and Jobs override `command` per binary.
ENTRYPOINT ["/usr/local/bin/dlock-operator"]
