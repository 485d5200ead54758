#!/usr/bin/env bash
# Upload a folder packed by `wdstream pack` (or any folder of *.tar shards) to S3 or GCS with the
# cloud's own CLI: shards in parallel, each retried with backoff, sizes checked against a listing
# of the destination, and index.json uploaded last, only when every shard checked out. A reader
# that finds the manifest can then trust every shard it lists.
set -euo pipefail

usage() {
    cat >&2 <<'USAGE'
usage: upload-shards.sh [-j JOBS] [-r ATTEMPTS] LOCAL_DIR s3://bucket/prefix/|gs://bucket/prefix/

Uploads LOCAL_DIR/*.tar in parallel, then LOCAL_DIR/index.json last.
  -j JOBS      parallel uploads (default 8, or $UPLOAD_JOBS)
  -r ATTEMPTS  attempts per file before giving up (default 5, or $UPLOAD_ATTEMPTS)
Environment: UPLOAD_BACKOFF (seconds before the first retry, doubled each time; default 2),
UPLOAD_GCS_CLI (gcloud or gsutil for gs://; default gcloud when installed). Endpoints and
credentials come from the CLI's usual environment (AWS_ENDPOINT_URL, AWS_PROFILE, ...).
Exit status: 0 when every file is uploaded and verified, 1 on failure, 2 on bad usage.
USAGE
    exit 2
}

JOBS=${UPLOAD_JOBS:-8}
ATTEMPTS=${UPLOAD_ATTEMPTS:-5}
BACKOFF=${UPLOAD_BACKOFF:-2}
while getopts ":j:r:h" option; do
    case $option in
        j) JOBS=$OPTARG ;;
        r) ATTEMPTS=$OPTARG ;;
        *) usage ;;
    esac
done
shift $((OPTIND - 1))
[[ $# -eq 2 ]] || usage
LOCAL_DIR=$1
DEST=${2%/}/
[[ $JOBS =~ ^[1-9][0-9]*$ && $ATTEMPTS =~ ^[1-9][0-9]*$ && $BACKOFF =~ ^[0-9]+$ ]] || usage
[[ -d $LOCAL_DIR ]] || { echo "upload-shards: $LOCAL_DIR: not a directory" >&2; exit 2; }

case $DEST in
    s3://?*) CLOUD=s3 ;;
    gs://?*)
        CLOUD=${UPLOAD_GCS_CLI:-}
        if [[ -z $CLOUD ]]; then
            if command -v gcloud >/dev/null; then CLOUD=gcloud; else CLOUD=gsutil; fi
        fi
        [[ $CLOUD == gcloud || $CLOUD == gsutil ]] || usage
        ;;
    *) echo "upload-shards: destination must be s3://bucket/prefix/ or gs://bucket/prefix/" >&2; exit 2 ;;
esac
NEEDED=$([[ $CLOUD == s3 ]] && echo aws || echo "$CLOUD")
command -v "$NEEDED" >/dev/null || { echo "upload-shards: $NEEDED not found on PATH" >&2; exit 2; }

# One copy, quiet on success.
copy() {
    case $CLOUD in
        s3) aws s3 cp --only-show-errors "$1" "$2" ;;
        gcloud) gcloud storage cp "$1" "$2" ;;
        gsutil) gsutil -q cp "$1" "$2" ;;
    esac
}

# "SIZE NAME" for every object directly under DEST.
list_sizes() {
    case $CLOUD in
        s3) aws s3 ls "$DEST" | awk 'NF >= 4 && $1 != "PRE" { print $3, $4 }' ;;
        gcloud) gcloud storage ls -l "$DEST" | awk '$NF ~ /^gs:\/\// && $1 ~ /^[0-9]+$/ { n = split($NF, p, "/"); print $1, p[n] }' ;;
        gsutil) gsutil ls -l "$DEST" | awk '$NF ~ /^gs:\/\// && $1 ~ /^[0-9]+$/ { n = split($NF, p, "/"); print $1, p[n] }' ;;
    esac
}

# Upload one file with retries; the CLI's output is shown only if every attempt fails.
upload_one() {
    local file=$1 name log attempt
    name=$(basename "$file")
    log=$(mktemp)
    for ((attempt = 1; attempt <= ATTEMPTS; attempt++)); do
        if copy "$file" "$DEST$name" >"$log" 2>&1; then
            rm -f "$log"
            return 0
        fi
        if ((attempt < ATTEMPTS)); then
            echo "upload-shards: $name: attempt $attempt failed, retrying" >&2
            sleep $((BACKOFF * (1 << (attempt - 1))))
        fi
    done
    echo "upload-shards: $name: failed after $ATTEMPTS attempts:" >&2
    cat "$log" >&2
    rm -f "$log"
    return 1
}
export -f copy upload_one
export CLOUD DEST ATTEMPTS BACKOFF

shards=()
while IFS= read -r -d '' file; do shards+=("$file"); done \
    < <(find "$LOCAL_DIR" -maxdepth 1 -type f -name '*.tar' -print0 | sort -z)
if [[ ${#shards[@]} -eq 0 ]]; then
    echo "upload-shards: no *.tar files in $LOCAL_DIR" >&2
    exit 1
fi

echo "upload-shards: ${#shards[@]} shards -> $DEST ($JOBS at a time)" >&2
if ! printf '%s\0' "${shards[@]}" | xargs -0 -n 1 -P "$JOBS" bash -c 'upload_one "$1"' _; then
    echo "upload-shards: some shards failed to upload; index.json not uploaded" >&2
    exit 1
fi

# Check every shard's size in one listing, not one request per shard.
declare -A remote_size
while read -r size name; do remote_size[$name]=$size; done < <(list_sizes)
bad=0
for file in "${shards[@]}"; do
    name=$(basename "$file")
    local_size=$(stat -c %s "$file")
    if [[ ${remote_size[$name]:-missing} != "$local_size" ]]; then
        echo "upload-shards: $name: $local_size bytes here, ${remote_size[$name]:-missing} at $DEST" >&2
        bad=1
    fi
done
if ((bad)); then
    echo "upload-shards: verification failed; index.json not uploaded" >&2
    exit 1
fi

if [[ -f $LOCAL_DIR/index.json ]]; then
    upload_one "$LOCAL_DIR/index.json" || exit 1
    echo "upload-shards: ${#shards[@]} shards verified, index.json uploaded last: ${DEST}index.json" >&2
else
    echo "upload-shards: ${#shards[@]} shards verified; no index.json in $LOCAL_DIR (create one with: wdstream index $DEST)" >&2
fi
