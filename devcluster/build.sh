#!/usr/bin/env bash
# Builds the upstream binaries Pilotfish's local control plane runs (etcd, kube-apiserver,
# kube-scheduler, kube-controller-manager, kubectl, kwok, helm, prometheus, promtool) from the
# Go wrapper modules beside this script, into a cache outside the checkout.
#
# Each tool family lands in its own directory keyed by its pinned version and a hash of its
# go.mod/go.sum, so changing one pin rebuilds one family. A combined bin/ of symlinks, keyed
# by every family's key, is what callers use.
#
#   devcluster/build.sh              build what is missing, print the bin directory
#   devcluster/build.sh --print      print the bin directory without building (exit 1 if absent)
#
# The real node's binaries are opt-in (`pilotfish dev up --real-node`), outside that key:
#   devcluster/build.sh node         build kubelet, pause and the CNI plugins, print their
#                                    directory (bin/: kubelet, pause; cni/: bridge, host-local,
#                                    loopback, portmap)
#   devcluster/build.sh --print-node print that directory without building (exit 1 if absent)
#
# Environment: PILOTFISH_CACHE (default ~/.cache/pilotfish).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
cache=${PILOTFISH_CACHE:-$HOME/.cache/pilotfish}
mkdir -p "$cache"

log() { printf 'devcluster/build: %s\n' "$*" >&2; }

family_key() { # family version [extra files of the family...] -> key
  local family=$1 version=$2 sum
  shift 2
  sum=$(cd "$here/$family" && cat go.mod go.sum "$@" | sha256sum | cut -c1-12)
  printf '%s-%s-%s' "$family" "$version" "$sum"
}

k8s_key=$(family_key k8s "$KUBERNETES_VERSION")
etcd_key=$(family_key etcd "$ETCD_VERSION")
kwok_key=$(family_key kwok "$KWOK_VERSION")
helm_key=$(family_key helm "$HELM_VERSION")
prometheus_key=$(family_key prometheus "$PROMETHEUS_VERSION")
combined=$(printf '%s\n' "$k8s_key" "$etcd_key" "$kwok_key" "$helm_key" "$prometheus_key" | sha256sum | cut -c1-12)
out="$cache/$combined"

node_key=$(family_key node "$KUBERNETES_VERSION" pause/main.go)
cni_key=$(family_key cni "$CNI_PLUGINS_VERSION")
node_out="$cache/node-$(printf '%s\n' "$node_key" "$cni_key" | sha256sum | cut -c1-12)"
node_built() { [[ -x "$node_out/bin/kubelet" && -x "$node_out/bin/pause" && -x "$node_out/cni/bridge" ]]; }
if [[ "${1:-}" == "--print-node" ]]; then
  node_built || exit 1
  echo "$node_out"
  exit 0
fi

if [[ "${1:-}" == "--print" ]]; then
  [[ -x "$out/bin/kube-apiserver" && -x "$out/bin/prometheus" && -d "$out/kwok-crd" ]] || exit 1
  echo "$out/bin"
  exit 0
fi

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false"
build_date=$(date -u +%Y-%m-%dT%H:%M:%SZ)

go_build() { # family key ldflags packages... ; builds into $cache/key/bin atomically
  local family=$1 key=$2 ldflags=$3 tags=${BUILD_TAGS:-selinux,notest,grpcnotrace}
  shift 3
  if [[ -d "$cache/$key/bin" ]]; then return 0; fi
  local tmp="$cache/.tmp-$key-$$"
  rm -rf "$tmp" && mkdir -p "$tmp/bin"
  log "building $family ($key): $*"
  local start=$SECONDS
  local dest="$tmp/bin/"
  [[ "$family" == etcd ]] && dest="$tmp/bin/etcd"  # the module root would be named "server"
  (cd "$here/$family" && go build -trimpath -tags "$tags" \
     -ldflags "-s -w $ldflags" -o "$dest" "$@")
  mv "$tmp" "$cache/$key"
  log "built $family in $((SECONDS - start))s"
}

kwok_documents() { # key ; ships kwok's upstream documents beside its binary, each dir atomically
  # kwok v0.8 has no built-in stages, and its CRDs (Metric, ClusterResourceUsage, ...) and the
  # kubelet-style metrics documents live only in its module source.
  local key=$1 dir name src
  dir=$(cd "$here/kwok" && go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | sed -n 's/.*"Dir": "\(.*\)",/\1/p')
  for name in stage:stage crd:crd/bases metrics:metrics; do
    src=${name#*:} name=${name%%:*}
    [[ -d "$cache/$key/$name" ]] && continue
    rm -rf "$cache/$key/.$name-$$" && mkdir -p "$cache/$key/.$name-$$"
    cp -r "$dir/kustomize/$src/." "$cache/$key/.$name-$$/" && chmod -R u+w "$cache/$key/.$name-$$"
    mv "$cache/$key/.$name-$$" "$cache/$key/$name"
  done
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

if [[ "${1:-}" == "node" ]]; then
  go_build node "$node_key" "$(k8s_stamp "$KUBERNETES_VERSION")" \
    k8s.io/kubernetes/cmd/kubelet ./pause
  cni=github.com/containernetworking/plugins/plugins
  go_build cni "$cni_key" "-X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$CNI_PLUGINS_VERSION" \
    "$cni/main/bridge" "$cni/ipam/host-local" "$cni/main/loopback" "$cni/meta/portmap"
  if ! node_built; then
    rm -rf "$node_out.tmp" && mkdir -p "$node_out.tmp/bin"
    for b in "$cache/$node_key/bin/"*; do ln -sf "$b" "$node_out.tmp/bin/"; done
    ln -sfn "$cache/$cni_key/bin" "$node_out.tmp/cni"
    printf 'kubernetes=%s cni-plugins=%s\n' "$KUBERNETES_VERSION" "$CNI_PLUGINS_VERSION" > "$node_out.tmp/VERSIONS"
    rm -rf "$node_out" && mv "$node_out.tmp" "$node_out"
  fi
  echo "$node_out"
  exit 0
fi

go_build etcd "$etcd_key" "" go.etcd.io/etcd/server/v3
go_build k8s "$k8s_key" "$(k8s_stamp "$KUBERNETES_VERSION")" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler \
  k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kubectl
go_build kwok "$kwok_key" "-X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION -X sigs.k8s.io/kwok/pkg/consts.KubeVersion=$KUBERNETES_VERSION" \
  sigs.k8s.io/kwok/cmd/kwok
kwok_documents "$kwok_key"
helm_minor=$(echo "$KUBERNETES_VERSION" | cut -d. -f2)
go_build helm "$helm_key" "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$helm_minor" \
  helm.sh/helm/v3/cmd/helm
# Prometheus 3.x is module v0.3xx: v0.316.0 is 3.16.0. The web UI's assets are generated by
# npm upstream, so the build leaves them out (no builtinassets tag): the HTTP API works, the UI
# does not. Only the Kubernetes service discovery is compiled in.
prom_version=${PROMETHEUS_VERSION#v0.}
prom_version="${prom_version:0:1}.$((10#${prom_version:1:2})).${prom_version#*.}"
BUILD_TAGS=remove_all_sd,enable_kubernetes_sd go_build prometheus "$prometheus_key" \
  "-X github.com/prometheus/common/version.Version=$prom_version -X github.com/prometheus/common/version.Revision=$PROMETHEUS_VERSION -X github.com/prometheus/common/version.Branch=release -X github.com/prometheus/common/version.BuildDate=$build_date" \
  github.com/prometheus/prometheus/cmd/prometheus github.com/prometheus/prometheus/cmd/promtool

if [[ ! -x "$out/bin/prometheus" ]]; then
  rm -rf "$out.tmp" && mkdir -p "$out.tmp/bin"
  for key in "$etcd_key" "$k8s_key" "$kwok_key" "$helm_key" "$prometheus_key"; do
    for b in "$cache/$key/bin/"*; do ln -sf "$b" "$out.tmp/bin/"; done
  done
  ln -sfn "$cache/$kwok_key/stage" "$out.tmp/kwok-stage"
  ln -sfn "$cache/$kwok_key/crd" "$out.tmp/kwok-crd"
  ln -sfn "$cache/$kwok_key/metrics" "$out.tmp/kwok-metrics"
  printf 'kubernetes=%s etcd=%s kwok=%s helm=%s prometheus=%s\n' "$KUBERNETES_VERSION" "$ETCD_VERSION" "$KWOK_VERSION" "$HELM_VERSION" "$PROMETHEUS_VERSION" > "$out.tmp/VERSIONS"
  rm -rf "$out" && mv "$out.tmp" "$out"
fi
echo "$out/bin"
