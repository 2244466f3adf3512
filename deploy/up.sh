#!/usr/bin/env bash
# The local cluster in one command: builds the images (deploy/build.sh; cached after
# the first time), writes a random token to deploy/token when there is none, and starts
# the learner with N actor containers (default 2), training CartPole-v1 unless
# MILLRACE_ENV says otherwise (see deploy/docker-compose.yml for the settings).
#
#   deploy/up.sh [N] [docker-compose up flags...]
#
# Then: docker-compose -f deploy/docker-compose.yml ps | logs -f | up -d --scale actor=M
# | down [-v]. Build flags (--cuda, --gym) go in MILLRACE_BUILD_FLAGS.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
actors="${1:-2}"
[[ $# -eq 0 ]] || shift
# shellcheck disable=SC2086
"$here/build.sh" ${MILLRACE_BUILD_FLAGS:-}
token="${MILLRACE_TOKEN_FILE:-$here/token}"
# compose reads a relative path from deploy/; make it this shell's.
[[ "$token" == /* ]] || token="$PWD/$token"
if [[ ! -s "$token" ]]; then
    (umask 077 && head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$token")
    echo "up: wrote a new token to $token" >&2
fi
export MILLRACE_TOKEN_FILE="$token"
docker-compose -f "$here/docker-compose.yml" up -d --scale "actor=$actors" "$@"
echo "up: metrics on http://127.0.0.1:${MILLRACE_METRICS_PORT:-9100}/metrics; follow with" \
    "docker-compose -f $here/docker-compose.yml logs -f learner" >&2
