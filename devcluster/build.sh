#!/usr/bin/env bash
# Builds the upstream binaries Pilotfish's local control plane runs (etcd, kube-apiserver,
# kube-scheduler, kube-controller-manager, kubectl, kwok, helm) from the Go wrapper modules
# beside this script, into a cache outside the checkout.
#
# Each tool family lands in its own directory keyed by its pinned version and a hash of its
# go.mod/go.sum, so changing one pin rebuilds one family. A combined bin/ of symlinks, keyed
# by every family's key, is what callers use.
#
#   devcluster/build.sh              build what is missing, print the bin directory
#   devcluster/build.sh --print      print the bin directory without building (exit 1 if absent)
#
# Environment: PILOTFISH_CACHE (default ~/.cache/pilotfish).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
cache=${PILOTFISH_CACHE:-$HOME/.cache/pilotfish}
mkdir -p "$cache"

log() { printf 'devcluster/build: %s\n' "$*" >&2; }

family_key() { # family version -> key
  local sum
  sum=$(cat "$here/$1/go.mod" "$here/$1/go.sum" | sha256sum | cut -c1-12)
  printf '%s-%s-%s' "$1" "$2" "$sum"
}

k8s_key=$(family_key k8s "$KUBERNETES_VERSION")
etcd_key=$(family_key etcd "$ETCD_VERSION")
kwok_key=$(family_key kwok "$KWOK_VERSION")
helm_key=$(family_key helm "$HELM_VERSION")
combined=$(printf '%s\n' "$k8s_key" "$etcd_key" "$kwok_key" "$helm_key" | sha256sum | cut -c1-12)
out="$cache/$combined"

if [[ "${1:-}" == "--print" ]]; then
  [[ -x "$out/bin/kube-apiserver" ]] || exit 1
  echo "$out/bin"
  exit 0
fi

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false"
build_date=$(date -u +%Y-%m-%dT%H:%M:%SZ)

go_build() { # family key ldflags packages... ; builds into $cache/key/bin atomically
  local family=$1 key=$2 ldflags=$3
  shift 3
  if [[ -d "$cache/$key/bin" ]]; then return 0; fi
  local tmp="$cache/.tmp-$key-$$"
  rm -rf "$tmp" && mkdir -p "$tmp/bin"
  log "building $family ($key): $*"
  local start=$SECONDS
  local dest="$tmp/bin/"
  [[ "$family" == etcd ]] && dest="$tmp/bin/etcd"  # the module root would be named "server"
  (cd "$here/$family" && go build -trimpath -tags selinux,notest,grpcnotrace \
     -ldflags "-s -w $ldflags" -o "$dest" "$@")
  if [[ "$family" == kwok ]]; then
    # kwok v0.8 has no built-in stages: ship the upstream stage documents beside the binary.
    local dir
    dir=$(cd "$here/kwok" && go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | sed -n 's/.*"Dir": "\(.*\)",/\1/p')
    mkdir -p "$tmp/stage" && cp -r "$dir/kustomize/stage/." "$tmp/stage/" && chmod -R u+w "$tmp/stage"
  fi
  mv "$tmp" "$cache/$key"
  log "built $family in $((SECONDS - start))s"
}

k8s_stamp() {
  local v=$1 minor
  minor=$(echo "$v" | cut -d. -f2)
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    printf -- '-X %s.gitVersion=%s -X %s.gitMajor=1 -X %s.gitMinor=%s -X %s.gitCommit=%s ' \
      "$pkg" "$v" "$pkg" "$pkg" "$minor" "$pkg" "$v"
    printf -- '-X %s.gitTreeState=clean -X %s.buildDate=%s ' "$pkg" "$pkg" "$build_date"
  done
}

exec 9>"$cache/.build.lock"
flock 9

go_build etcd "$etcd_key" "" go.etcd.io/etcd/server/v3
go_build k8s "$k8s_key" "$(k8s_stamp "$KUBERNETES_VERSION")" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler \
  k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kubectl
go_build kwok "$kwok_key" "-X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION -X sigs.k8s.io/kwok/pkg/consts.KubeVersion=$KUBERNETES_VERSION" \
  sigs.k8s.io/kwok/cmd/kwok
helm_minor=$(echo "$KUBERNETES_VERSION" | cut -d. -f2)
go_build helm "$helm_key" "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$helm_minor" \
  helm.sh/helm/v3/cmd/helm

if [[ ! -x "$out/bin/kube-apiserver" ]]; then
  rm -rf "$out.tmp" && mkdir -p "$out.tmp/bin"
  for key in "$etcd_key" "$k8s_key" "$kwok_key" "$helm_key"; do
    for b in "$cache/$key/bin/"*; do ln -sf "$b" "$out.tmp/bin/"; done
  done
  ln -sfn "$cache/$kwok_key/stage" "$out.tmp/kwok-stage"
  printf 'kubernetes=%s etcd=%s kwok=%s helm=%s\n' "$KUBERNETES_VERSION" "$ETCD_VERSION" "$KWOK_VERSION" "$HELM_VERSION" > "$out.tmp/VERSIONS"
  rm -rf "$out" && mv "$out.tmp" "$out"
fi
echo "$out/bin"
