#!/usr/bin/env bash
# A local S3 endpoint for trying wdstream without a cloud account: a moto server on 127.0.0.1
# with one bucket. Prints the environment to use it, on stdout, so that
#   eval "$(tools/local-s3.sh --background)"
# sets it in the current shell.
set -euo pipefail

usage() {
    cat >&2 <<'USAGE'
usage: local-s3.sh [--bucket NAME] [--background [--pid-file FILE]] [PORT]

Starts a moto S3 server on 127.0.0.1:PORT (default 9000, or a free port if 9000 is taken),
creates the bucket (default $LOCAL_S3_BUCKET or "wdstream") and prints export lines for
AWS_ENDPOINT_URL and test credentials. Runs in the foreground until Ctrl-C; with --background
it returns at once, leaves the server running and writes its pid to FILE (default
./local-s3.pid): stop it with  kill "$(cat local-s3.pid)".
Needs moto_server (pip install 'moto[server]').
USAGE
    exit 2
}

BUCKET=${LOCAL_S3_BUCKET:-wdstream}
BACKGROUND=0
PID_FILE=local-s3.pid
PORT=
while [[ $# -gt 0 ]]; do
    case $1 in
        --bucket) [[ $# -ge 2 ]] || usage; BUCKET=$2; shift 2 ;;
        --background) BACKGROUND=1; shift ;;
        --pid-file) [[ $# -ge 2 ]] || usage; PID_FILE=$2; shift 2 ;;
        -h|--help) usage ;;
        -*) usage ;;
        *) [[ -z $PORT ]] || usage; PORT=$1; shift ;;
    esac
done
[[ -z $PORT || $PORT =~ ^[0-9]+$ ]] || usage
[[ $BUCKET =~ ^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$ ]] || { echo "local-s3: bad bucket name: $BUCKET" >&2; exit 2; }
command -v moto_server >/dev/null || { echo "local-s3: moto_server not found (pip install 'moto[server]')" >&2; exit 2; }

in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

if [[ -z $PORT ]]; then
    PORT=9000
    if in_use "$PORT"; then PORT=$(free_port); fi
elif in_use "$PORT"; then
    echo "local-s3: port $PORT is in use" >&2
    exit 1
fi

LOG=${TMPDIR:-/tmp}/local-s3-$PORT.log
# The server's output goes to a log file, never to our stdout, which callers capture.
if ((BACKGROUND)); then
    nohup moto_server -H 127.0.0.1 -p "$PORT" >"$LOG" 2>&1 </dev/null &
else
    moto_server -H 127.0.0.1 -p "$PORT" >"$LOG" 2>&1 </dev/null &
fi
SERVER=$!
stop_server() { kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; }
((BACKGROUND)) || trap stop_server EXIT

for _ in $(seq 300); do
    in_use "$PORT" && break
    kill -0 "$SERVER" 2>/dev/null || { echo "local-s3: moto_server exited; see $LOG" >&2; exit 1; }
    sleep 0.1
done
in_use "$PORT" || { stop_server; echo "local-s3: no server on port $PORT after 30 s; see $LOG" >&2; exit 1; }

ENDPOINT=http://127.0.0.1:$PORT
# moto accepts unsigned requests, so a plain PUT creates the bucket without the aws CLI.
if ! curl -sf -o /dev/null -X PUT "$ENDPOINT/$BUCKET"; then
    stop_server
    echo "local-s3: could not create bucket $BUCKET" >&2
    exit 1
fi

cat <<ENV
export AWS_ENDPOINT_URL=$ENDPOINT
export AWS_ACCESS_KEY_ID=testing
export AWS_SECRET_ACCESS_KEY=testing
export AWS_DEFAULT_REGION=us-east-1
# bucket: s3://$BUCKET/
ENV

if ((BACKGROUND)); then
    echo "$SERVER" >"$PID_FILE"
    echo "local-s3: S3 on $ENDPOINT, bucket s3://$BUCKET/ (pid $SERVER in $PID_FILE; stop: kill \"\$(cat $PID_FILE)\")" >&2
else
    echo "local-s3: S3 on $ENDPOINT, bucket s3://$BUCKET/; Ctrl-C to stop" >&2
    trap 'exit 0' INT TERM
    wait "$SERVER"
fi
