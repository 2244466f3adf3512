# The learner image. Its context is staged by deploy/build.sh: bin/learner (built on the
# host, stripped) and lib/ (the libtorch libraries it loads, found through its
# $ORIGIN/../lib rpath): CPU-only (millrace/learner:cpu) or with libtorch_cuda and
# CUDA's libraries (millrace/learner:cuda), as the staged binary and libraries are. No
# Rust toolchain in the image.
#
# BASE is any Debian bookworm image: debian:bookworm-slim from a registry, the one
# deploy/base-image.sh makes where there is none (the Rust environments: no Python at
# all), or millrace/python:bookworm (python.Dockerfile) for a learner built with the
# Gymnasium bridge (millrace/learner:gym: `gym:` ids and Atari, whose spaces and
# evaluation episodes the learner runs itself).
ARG BASE=debian:bookworm-slim

FROM ${BASE}
COPY lib/ /opt/millrace/lib/
# PyTorch's version.py, which `learner doctor` reads beside lib/.
COPY version.py /opt/millrace/
COPY bin/ /opt/millrace/bin/
# Fails the build, not the first start, when a library is missing.
RUN ! ldd /opt/millrace/bin/learner | grep 'not found' && /opt/millrace/bin/learner --version \
    && /opt/millrace/bin/millrace-health --version
ENV PATH=/opt/millrace/bin:$PATH
# Remote actors; Prometheus metrics and health.
EXPOSE 7787 9100
# Logs and checkpoints (`--logdir /runs/<run>`).
VOLUME /runs
WORKDIR /runs
HEALTHCHECK --interval=5s --timeout=4s --start-period=60s --retries=3 \
    CMD ["millrace-health", "--metrics-addr", "127.0.0.1:9100"]
ENTRYPOINT ["learner"]

