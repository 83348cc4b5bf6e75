#!/usr/bin/env bash
# Installs the real Flyway that services/migrator/tests/flyway.rs checks dlock-migrate's histories
# against, idempotently, into $DLOCK_TOOLS_DIR/flyway:
#
#   lib/*.jar          org.flywaydb:flyway-core and flyway-database-postgresql $FLYWAY_VERSION and the
#                      PostgreSQL JDBC driver $PGJDBC_VERSION, with their runtime dependencies, from
#                      Maven Central (resolved by Maven with --strict-checksums: a jar whose SHA-1
#                      differs from the one Central publishes fails the install)
#   classes/           services/migrator/flyway/FlywayCheck.java compiled against them
#   run                the launcher: run JDBC_URL USER PASSWORD TABLE COMMAND LOCATION...
#   .version           the stamp: versions and the program's hash; a rerun with the same stamp does
#                      nothing
#
# Java 17 (java, javac) and Maven come from the machine's packages (Debian openjdk-17-jdk-headless,
# maven), installed with apt-get when missing and we are root or have passwordless sudo.
#
# Usage: scripts/flyway-tools.sh [--check]   (--check: exit 1 when not installed, install nothing)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

FLYWAY_VERSION="13.12.2"
PGJDBC_VERSION="42.7.14"
DIR="$DLOCK_TOOLS_DIR/flyway"
SRC="$DLOCK_ROOT/services/migrator/flyway/FlywayCheck.java"

stamp() {
  printf 'flyway %s pgjdbc %s program %s\n' "$FLYWAY_VERSION" "$PGJDBC_VERSION" "$(sha256sum "$SRC" | cut -d' ' -f1)"
}
installed() { [ -x "$DIR/run" ] && [ -f "$DIR/.version" ] && [ "$(cat "$DIR/.version")" = "$(stamp)" ]; }

if [ "${1:-}" = "--check" ]; then
  installed && exit 0
  echo "Flyway $FLYWAY_VERSION is not installed in $DIR: run scripts/flyway-tools.sh" >&2
  exit 1
fi
installed && exit 0

need_apt() { # need_apt PACKAGE COMMAND
  command -v "$2" >/dev/null && return 0
  say "installing $1 (for $2)"
  local sudo=()
  if [ "$(id -u)" != 0 ]; then
    sudo -n true 2>/dev/null || die "$2 is required: install the Debian package $1"
    sudo=(sudo -n)
  fi
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$1" >/dev/null ||
    { "${sudo[@]}" apt-get update >/dev/null &&
      "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$1" >/dev/null; }
  command -v "$2" >/dev/null || die "$2 is required: install the Debian package $1"
}
need_apt openjdk-17-jdk-headless javac
need_apt openjdk-17-jdk-headless java
need_apt maven mvn

say "installing Flyway $FLYWAY_VERSION into $DIR"
started=$SECONDS
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# The jars only: a throwaway project whose dependencies are what we want, copied out by Maven.
cat >"$work/pom.xml" <<EOF
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dlock.tools</groupId>
  <artifactId>flyway-jars</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.flywaydb</groupId><artifactId>flyway-core</artifactId><version>$FLYWAY_VERSION</version></dependency>
    <dependency><groupId>org.flywaydb</groupId><artifactId>flyway-database-postgresql</artifactId><version>$FLYWAY_VERSION</version></dependency>
    <dependency><groupId>org.postgresql</groupId><artifactId>postgresql</artifactId><version>$PGJDBC_VERSION</version></dependency>
  </dependencies>
</project>
EOF
rm -rf "$DIR/lib" "$DIR/classes" "$DIR/run" "$DIR/.version"
mkdir -p "$DIR/lib" "$DIR/classes"
# Maven's own cache under the tools dir: a rerun after a version bump fetches only what changed.
# Its output goes to a log, shown when it fails.
mvn --batch-mode --quiet --strict-checksums -Dstyle.color=never -f "$work/pom.xml" \
  -Dmaven.repo.local="$DIR/m2" \
  org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies \
  -DincludeScope=runtime -DoutputDirectory="$DIR/lib" >"$work/mvn.log" 2>&1 ||
  { cat "$work/mvn.log" >&2; die "could not fetch Flyway $FLYWAY_VERSION from Maven Central"; }
# Every jar we run, checked once more against the SHA-1 Central published for it (Maven keeps the
# .sha1 it downloaded beside the artifact).
for jar in "$DIR"/lib/*.jar; do
  name="$(basename "$jar")"
  published="$(find "$DIR/m2" -name "$name.sha1" -print -quit)"
  [ -n "$published" ] || die "no published SHA-1 for $name"
  [ "$(sha1sum "$jar" | cut -d' ' -f1)" = "$(cut -c1-40 "$published")" ] ||
    die "$name does not match the SHA-1 Maven Central publishes"
done
for jar in flyway-core flyway-database-postgresql; do
  [ -f "$DIR/lib/$jar-$FLYWAY_VERSION.jar" ] || die "$jar-$FLYWAY_VERSION.jar is missing after the fetch"
done
[ -f "$DIR/lib/postgresql-$PGJDBC_VERSION.jar" ] || die "postgresql-$PGJDBC_VERSION.jar is missing after the fetch"
javac -nowarn -d "$DIR/classes" -cp "$DIR/lib/*" "$SRC" || die "could not compile $SRC"
cat >"$DIR/run" <<EOF
#!/bin/sh
# FlywayCheck (services/migrator/flyway/FlywayCheck.java) on Flyway $FLYWAY_VERSION.
exec java -cp "$DIR/classes:$DIR/lib/*" FlywayCheck "\$@"
EOF
chmod 755 "$DIR/run"
stamp >"$DIR/.version"
say "Flyway $FLYWAY_VERSION installed in $((SECONDS - started)) s"
