# The wasmop host: one static binary (x86_64-unknown-linux-musl) on distroless, non-root.
#
#   docker build -t ghcr.io/wasmop/wasmop:0.1.0 .
#
# Kept simple and not built here: no container engine runs where wasmop is developed. The
# static build itself is what `cargo build --release --target x86_64-unknown-linux-musl
# -p wasmop` produces with musl-tools installed (ring's C code needs musl-gcc), and the
# wasm32-wasip2 target, for the script interpreter the binary carries.
FROM rust:1.95-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/* \
 && rustup target add x86_64-unknown-linux-musl wasm32-wasip2
WORKDIR /src
COPY . .
RUN cargo build --release --locked --target x86_64-unknown-linux-musl -p wasmop \
 && cp target/x86_64-unknown-linux-musl/release/wasmop /wasmop

# No shell, no libc: the binary is static. The nonroot variant runs as 65532:65532, the user
# deploy/host/deployment.yaml asks for.
FROM gcr.io/distroless/static:nonroot
COPY --from=build /wasmop /wasmop
USER 65532:65532
ENTRYPOINT ["/wasmop"]
CMD ["run"]
