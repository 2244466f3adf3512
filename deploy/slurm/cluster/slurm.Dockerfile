# The test cluster's image (deploy/slurm/cluster): Debian's Slurm (22.05) and munge,
# with millrace's learner and actor copied from their images (deploy/build.sh), on the
# base image deploy/base-image.sh makes offline. One image for the controller and the
# compute nodes; the entrypoint's argument picks the daemon.
#
# Users: `millrace` (UID 1000), who submits and runs the jobs, and `other` (UID 1001),
# who must not be able to read a job's token; the same UIDs on every node, as a real
# cluster's directory service gives them.
ARG BASE=debian:bookworm-slim
ARG LEARNER_IMAGE=millrace/learner:cpu
ARG ACTOR_IMAGE=millrace/actor:native

FROM ${LEARNER_IMAGE} AS learner
FROM ${ACTOR_IMAGE} AS actor

# Slurm alone (`--target slurm`: the cluster without millrace, e.g. to check the
# configuration with `srun hostname`).
FROM ${BASE} AS slurm
RUN apt-get update -qq \
    && apt-get install -y -qq --no-install-recommends slurm-wlm munge procps >/dev/null \
    && rm -rf /var/lib/apt/lists/* /usr/share/doc/* /usr/share/man/*
RUN useradd -u 1000 -m -s /bin/bash millrace && useradd -u 1001 -m -s /bin/bash other
COPY slurm.conf /etc/slurm/slurm.conf
COPY entrypoint.sh /usr/local/bin/slurm-entrypoint
ENTRYPOINT ["slurm-entrypoint"]
CMD ["node"]

FROM slurm
COPY --from=learner /opt/millrace/ /opt/millrace/
COPY --from=actor /opt/millrace/bin/actor /opt/millrace/bin/
RUN ! ldd /opt/millrace/bin/learner | grep 'not found' && /opt/millrace/bin/learner --version \
    && /opt/millrace/bin/actor --version
ENV PATH=/opt/millrace/bin:$PATH
