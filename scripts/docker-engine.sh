#!/usr/bin/env bash
# A Docker engine for the image scripts: use the one that answers, else start dockerd with its
# own data-root under build/ and stop it afterwards (scripts/docker-test.sh sources this file).
#
#   source scripts/docker-engine.sh; engine_up || exit; ...; engine_down
#
# Sets DOCKER (the client: Debian's /usr/bin/docker 20.10 where present, since a newer client
# without buildx refuses BuildKit builds) and exports DOCKER_HOST when it starts an engine.
# ENGINE_WHY says why no engine could start (engine_up returns 1 then).
#   IRPE_DOCKER_DATA  data-root of a started engine (default build/docker: images survive runs)

DOCKER="${DOCKER:-$( [ -x /usr/bin/docker ] && echo /usr/bin/docker || command -v docker || true)}"
ENGINE_PID=
ENGINE_DIR=
ENGINE_WHY=

engine_answers() { [ -n "$DOCKER" ] && "$DOCKER" version --format '{{.Server.Version}}' >/dev/null 2>&1; }

# Use a running engine, else start dockerd (root only); 1 with ENGINE_WHY set when neither.
engine_up() {
  if [ -z "$DOCKER" ]; then ENGINE_WHY="no docker client (apt-get install docker.io)"; return 1; fi
  if engine_answers; then echo "docker-engine: using the running engine (${DOCKER_HOST:-default socket})"; return 0; fi
  command -v dockerd >/dev/null || { ENGINE_WHY="no engine answers and dockerd is not installed (apt-get install docker.io)"; return 1; }
  [ "$(id -u)" = 0 ] || { ENGINE_WHY="no engine answers and starting dockerd needs root"; return 1; }
  local data="${IRPE_DOCKER_DATA:-$PWD/build/docker}"
  mkdir -p "$data"
  # sockets and run state in a short /tmp path (unix socket paths are limited to 108 bytes)
  ENGINE_DIR="$(mktemp -d /tmp/irpe-docker.XXXXXX)"
  dockerd --data-root "$data" --exec-root "$ENGINE_DIR/exec" --pidfile "$ENGINE_DIR/dockerd.pid" \
    --host "unix://$ENGINE_DIR/docker.sock" >"$ENGINE_DIR/dockerd.log" 2>&1 &
  ENGINE_PID=$!
  export DOCKER_HOST="unix://$ENGINE_DIR/docker.sock"
  local i
  for i in $(seq 1 120); do
    engine_answers && { echo "docker-engine: started dockerd (pid $ENGINE_PID, data-root $data)"; return 0; }
    kill -0 "$ENGINE_PID" 2>/dev/null || break
    sleep 0.5
  done
  ENGINE_WHY="dockerd did not start: $(tail -n 3 "$ENGINE_DIR/dockerd.log" | tr '\n' ' ')"
  engine_down
  return 1
}

# Stop the engine engine_up started (its containers stop with it); nothing when it found one.
engine_down() {
  [ -n "$ENGINE_PID" ] || return 0
  if kill -0 "$ENGINE_PID" 2>/dev/null; then
    kill -TERM "$ENGINE_PID"
    local i
    for i in $(seq 1 60); do kill -0 "$ENGINE_PID" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$ENGINE_PID" 2>/dev/null && kill -KILL "$ENGINE_PID"
    wait "$ENGINE_PID" 2>/dev/null || true
    echo "docker-engine: stopped dockerd (pid $ENGINE_PID)"
  fi
  ENGINE_PID=
  unset DOCKER_HOST
  [ -n "$ENGINE_DIR" ] && rm -rf "$ENGINE_DIR"
  ENGINE_DIR=
}
