#!/usr/bin/env bash
# Builds the chart checks' tools and prints their paths, one a line: helm, then the validator.
#   helm:      helm.sh/helm/v4 at HELM_VERSION, from the Go module proxy (go install; built once, then cached)
#   validator: this module (versions pinned by go.mod / go.sum); go's build cache makes a rebuild a link
# Cache: $EMBEDSTREAM_GO_TOOLS (default ~/.cache/embedstream/go-tools); modules in go's own cache (~/go).
# First build on 2 vCPUs: helm ~4 CPU-minutes, the validator ~2, plus the downloads.
set -euo pipefail
HELM_VERSION=v4.3.2
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${EMBEDSTREAM_GO_TOOLS:-$HOME/.cache/embedstream/go-tools}"
export GOFLAGS=-buildvcs=false
helm="$cache/helm-$HELM_VERSION/helm"
if [ ! -x "$helm" ]; then
    GOBIN="$cache/helm-$HELM_VERSION" nice -n 10 go install "helm.sh/helm/v4/cmd/helm@$HELM_VERSION" >&2
fi
validate="$cache/validate/validate"
(cd "$here" && nice -n 10 go build -o "$validate" .) >&2
echo "$helm"
echo "$validate"
