# The Python the Gymnasium bridge embeds, with the environment packages: the base of the
# learner's and the actor's `gym` images (deploy/build.sh --gym builds it). Multi-stage:
# pip runs in `venv`, which trusts the CA certificates the build context carries
# (certs/: copied from the host at build time by deploy/build.sh, where the host trusts
# extra ones, e.g. behind a TLS-intercepting proxy; never committed); `runtime` copies
# the virtualenv alone, so neither the certificates nor pip's cache reach the image.
ARG BASE=debian:bookworm-slim

FROM ${BASE} AS venv
RUN apt-get update -qq \
    && apt-get install -y -qq --no-install-recommends python3 python3-venv ca-certificates >/dev/null \
    && rm -rf /var/lib/apt/lists/*
COPY certs/ /usr/local/share/ca-certificates/
RUN update-ca-certificates >/dev/null
COPY requirements-gym.txt /tmp/
# pip reads the system store only when told (it ships its own bundle otherwise).
RUN python3 -m venv /opt/millrace/venv \
    && PIP_CERT=/etc/ssl/certs/ca-certificates.crt /opt/millrace/venv/bin/pip install \
        --quiet --no-cache-dir --disable-pip-version-check -r /tmp/requirements-gym.txt

FROM ${BASE} AS runtime
# The interpreter (libpython, the standard library) the bridge embeds; the binaries
# built on the host link libpython3.11, which bookworm's python3 provides.
RUN apt-get update -qq \
    && apt-get install -y -qq --no-install-recommends python3 libpython3.11 >/dev/null \
    && rm -rf /var/lib/apt/lists/*
COPY --from=venv /opt/millrace/venv /opt/millrace/venv
# Where the bridge finds the packages (actor/src/env/gym).
ENV VIRTUAL_ENV=/opt/millrace/venv
RUN /opt/millrace/venv/bin/python -c 'import gymnasium, ale_py, minatar, numpy'
