#!/usr/bin/env bash
# What the browser and multi-host tests need from Debian: chromium (driven by Playwright),
# iproute2 (network namespaces), OpenSSH (the SSH launcher), and Slurm with munge (the Slurm
# launcher's tests start their own munged, slurmctld and slurmd). Installed where we can
# (root with apt-get); elsewhere those tests skip and print why.
set -uo pipefail
missing=()
command -v chromium >/dev/null || missing+=(chromium)
command -v ip >/dev/null || missing+=(iproute2)
[ -x /usr/sbin/sshd ] || missing+=(openssh-server)
command -v ssh >/dev/null || missing+=(openssh-client)
{ command -v sbatch >/dev/null && [ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ]; } || missing+=(slurm-wlm)
[ -x /usr/sbin/munged ] || missing+=(munge)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "system packages: cannot install ${missing[*]} (needs root and apt-get); the tests that need them will skip" >&2
  exit 0
fi
echo "system packages: installing ${missing[*]}" >&2
{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; } \
  || echo "system packages: could not install ${missing[*]}; the tests that need them will skip" >&2
exit 0
