#!/usr/bin/env bash
# What the browser and multi-host tests need from Debian: chromium (driven by Playwright),
# iproute2 (network namespaces), OpenSSH (the SSH launcher), Slurm with munge (the Slurm
# launcher's tests start their own munged, slurmctld and slurmd), Node.js with
# JupyterHub's proxy, configurable-http-proxy, from npm (the hub tests), and Debian's
# soupsieve for the system Python the tests' Unix users run (see tests/users.py). Installed where we
# can (root with apt-get); elsewhere those tests skip and print why.
set -uo pipefail
missing=()
command -v chromium >/dev/null || missing+=(chromium)
command -v ip >/dev/null || missing+=(iproute2)
[ -x /usr/sbin/sshd ] || missing+=(openssh-server)
command -v ssh >/dev/null || missing+=(openssh-client)
{ command -v sbatch >/dev/null && [ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ]; } || missing+=(slurm-wlm)
[ -x /usr/sbin/munged ] || missing+=(munge)
command -v npm >/dev/null || missing+=(nodejs npm)
[ -d /usr/lib/python3/dist-packages/soupsieve ] || missing+=(python3-soupsieve)
proxy() {
  command -v configurable-http-proxy >/dev/null && return 0
  if [ "$(id -u)" = 0 ] && command -v npm >/dev/null; then
    npm install -g --silent configurable-http-proxy@5 >/dev/null 2>&1 \
      || echo "system packages: could not install configurable-http-proxy; the hub tests will skip" >&2
  fi
}
if [ ${#missing[@]} -eq 0 ]; then proxy; exit 0; fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "system packages: cannot install ${missing[*]} (needs root and apt-get); the tests that need them will skip" >&2
  exit 0
fi
echo "system packages: installing ${missing[*]}" >&2
{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; } \
  || echo "system packages: could not install ${missing[*]}; the tests that need them will skip" >&2
proxy
exit 0
