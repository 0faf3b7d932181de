# kvlab in a container: the one `kvlab` binary on Debian slim.
#
#   docker build -t kvlab .
#   docker run --rm -p 11211:11211 kvlab                      # a plain cache on 11211
#   docker run --rm kvlab server --cluster etcd://etcd:2379/kvlab --cluster-node HOST:11211 ...
#
# deploy/k8s/ runs it as a cluster (StatefulSet of nodes, etcd, a Job that creates the ring).

# --- build ------------------------------------------------------------------------------
FROM rust:1.95-bookworm AS build
# Nothing to install: etcd's protobuf API compiles with protox, in Rust (no protoc).
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY crates ./crates
# The lab's built-in experiments are compiled into the binary.
COPY experiments ./experiments
# Only the binary (no tests, benches or lab experiments) with the release profile.
RUN cargo build --release --locked -p kvlab \
    && install -m 0755 target/release/kvlab /usr/local/bin/kvlab

# --- run --------------------------------------------------------------------------------
FROM debian:bookworm-slim
COPY --from=build /usr/local/bin/kvlab /usr/local/bin/kvlab
# No shell tools needed at run time; an unprivileged user of its own.
RUN useradd --system --no-create-home --uid 10001 kvlab
USER 10001
EXPOSE 11211
ENTRYPOINT ["kvlab"]
CMD ["server", "-l", "0.0.0.0", "-p", "11211"]
