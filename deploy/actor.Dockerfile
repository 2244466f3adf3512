# The actor image. Its context is staged by deploy/build.sh: bin/actor (built on the
# host, stripped). Actors run inference in plain Rust: no libtorch here.
#
# BASE is any Debian bookworm image: debian:bookworm-slim from a registry, the one
# deploy/base-image.sh makes where there is none (millrace/actor:native, the Rust
# environments: no Python either), or millrace/python:bookworm (python.Dockerfile) for
# an actor built with the Gymnasium bridge (millrace/actor:gym: `gym:` ids, MinAtar,
# Atari).
ARG BASE=debian:bookworm-slim

FROM ${BASE}
COPY bin/ /opt/millrace/bin/
RUN ! ldd /opt/millrace/bin/actor | grep 'not found' && /opt/millrace/bin/actor --version \
    && /opt/millrace/bin/millrace-health --version
ENV PATH=/opt/millrace/bin:$PATH
EXPOSE 9101
HEALTHCHECK --interval=5s --timeout=4s --start-period=30s --retries=3 \
    CMD ["millrace-health", "--metrics-addr", "127.0.0.1:9101"]
ENTRYPOINT ["actor"]

