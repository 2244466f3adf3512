# The learner and actor images built from source inside Docker, for users who prefer
# that to deploy/build.sh (which builds on the host): nothing is needed on the host but
# Docker. Run from the repository root:
#
#   docker build -f deploy/source.Dockerfile --target learner -t millrace/learner:cpu .
#   docker build -f deploy/source.Dockerfile --target actor -t millrace/actor:native .
#
# Stages: `build` (a Rust image; scripts/setup.sh installs PyTorch 2.11.0 from PyPI, the
# libtorch tch links; deploy/stage.sh builds and lays out the CPU-only learner and the
# native actor exactly as deploy/build.sh does), then `learner` and `actor` on BASE with
# the staged files alone: no toolchain, no Python, no pip cache in them. Where the host
# trusts extra CA certificates (a TLS-intercepting proxy), copy them into deploy/certs/
# first (*.crt there are ignored by git): the build stage trusts them, the images never
# see them. The classic builder builds every stage before its target, so `--target
# actor` builds `learner` too (a copy: seconds).
ARG RUST_IMAGE=rust:1-bookworm
ARG BASE=debian:bookworm-slim

FROM ${RUST_IMAGE} AS build
RUN apt-get update -qq \
    && apt-get install -y -qq --no-install-recommends python3 python3-venv ca-certificates >/dev/null \
    && rm -rf /var/lib/apt/lists/*
COPY deploy/certs/ /usr/local/share/ca-certificates/
RUN update-ca-certificates >/dev/null
# pip and cargo read the system store only when told.
ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    CARGO_HTTP_CAINFO=/etc/ssl/certs/ca-certificates.crt \
    MILLRACE_CACHE=/cache
WORKDIR /src
# The virtualenv first, from the pins alone, so a source change does not reinstall it.
COPY scripts/ scripts/
RUN scripts/setup.sh
COPY . .
RUN bash -c 'source scripts/env.sh && source deploy/stage.sh \
    && stage_learner /stage/learner "" && stage_actor /stage/actor ""'

FROM ${BASE} AS learner
COPY --from=build /stage/learner/ /opt/millrace/
RUN ! ldd /opt/millrace/bin/learner | grep 'not found' && /opt/millrace/bin/learner --version
ENV PATH=/opt/millrace/bin:$PATH
EXPOSE 7787 9100
VOLUME /runs
WORKDIR /runs
HEALTHCHECK --interval=5s --timeout=4s --start-period=60s --retries=3 \
    CMD ["millrace-health", "--metrics-addr", "127.0.0.1:9100"]
ENTRYPOINT ["learner"]

FROM ${BASE} AS actor
COPY --from=build /stage/actor/ /opt/millrace/
RUN ! ldd /opt/millrace/bin/actor | grep 'not found' && /opt/millrace/bin/actor --version
ENV PATH=/opt/millrace/bin:$PATH
EXPOSE 9101
HEALTHCHECK --interval=5s --timeout=4s --start-period=30s --retries=3 \
    CMD ["millrace-health", "--metrics-addr", "127.0.0.1:9101"]
ENTRYPOINT ["actor"]
