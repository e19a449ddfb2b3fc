# edgelimit container image.
#
#   docker build -t edgelimit .
#   docker run --rm -p 8081:8081 -p 9090:9090 edgelimit            # embedded backend, policies/
#   docker run --rm ... edgelimit --config /etc/edgelimit/edgelimit.yaml
#
# Build stage: the toolchain image; `--locked` builds exactly Cargo.lock.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY crates ./crates
COPY lua ./lua
COPY proto ./proto
COPY examples ./examples
COPY benches ./benches
RUN cargo build --release --locked --bin edgelimit

# Runtime stage: glibc only (no TLS or C libraries are linked dynamically besides libc).
FROM debian:bookworm-slim
RUN groupadd --system --gid 10001 edgelimit \
 && useradd --system --uid 10001 --gid edgelimit --no-create-home --shell /usr/sbin/nologin edgelimit
COPY --from=build /src/target/release/edgelimit /usr/local/bin/edgelimit
# Started as /bin/ratelimit (the reference's command, as Envoy Gateway and the reference's
# manifests run it), edgelimit configures itself from the reference's environment variables.
RUN ln -s /usr/local/bin/edgelimit /bin/ratelimit
# Example policies; mount your own directory (or a ConfigMap) over it. Reloads are automatic.
COPY policies /etc/edgelimit/policies
WORKDIR /etc/edgelimit
USER 10001:10001
# 8081: gRPC (Envoy RateLimitService, health, reflection); 9090: /metrics, /healthz, /readyz.
EXPOSE 8081 9090
# SIGTERM drains in-flight requests (config `shutdown_grace`) and exits 0.
STOPSIGNAL SIGTERM
# No arguments: the default policy_dir, `policies`, is /etc/edgelimit/policies from this WORKDIR,
# and an argument here would override the directory reference environment mode derives from
# RUNTIME_ROOT.
ENTRYPOINT ["edgelimit", "serve"]
