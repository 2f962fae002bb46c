# shellcheck shell=bash
# Private network namespaces for interop runs. Source this file, then:
#
#   netns_init                    # install the cleanup trap (EXIT ERR INT TERM)
#   netns_create VAR [TAG]        # new namespace "iwp<pid>x<TAG>", name -> $VAR
#   netns_tap_name VAR [N]        # a tap name (<= 15 chars) for this run -> $VAR
#   netns_subnet VAR              # a free-to-use X for 198.18.X.0/24 -> $VAR
#   netns_bg VAR NS CMD...        # run CMD in NS in the background, pid -> $VAR
#   netns_on_exit CMD...          # extra cleanup command (run before the
#                                 # namespaces go, in reverse order)
#   netns_release NAME            # NAME outlives this process: whoever it is
#                                 # handed to removes it (by exact name)
#   netns_cleanup                 # what the trap runs; safe to call twice
#
# Only namespaces and processes created through these functions are ever
# removed or signalled, by exact name / pid. Addresses come from the
# benchmarking block 198.18.0.0/15 and live only inside the namespace.

_NETNS_OWNED=()
_NETNS_PIDS=()
_NETNS_HOOKS=()
_NETNS_SEQ=0
_NETNS_CLEANED=0

netns_init() {
    trap 'netns_cleanup' EXIT
    trap 'netns_cleanup; exit 130' INT
    trap 'netns_cleanup; exit 143' TERM
    trap 'netns_cleanup' ERR
}

netns_create() {
    local __var="$1" tag="${2:-$_NETNS_SEQ}" name
    _NETNS_SEQ=$((_NETNS_SEQ + 1))
    name="iwp$$x${tag}"
    if ip netns list | awk '{print $1}' | grep -qx -- "$name"; then
        echo "netns: $name already exists (not ours to reuse)" >&2
        return 1
    fi
    ip netns add "$name" || return 1
    _NETNS_OWNED+=("$name")
    ip -n "$name" link set lo up
    printf -v "$__var" '%s' "$name"
}

netns_tap_name() {
    local __var="$1" n="${2:-0}" name
    name="iwp$$t${n}"
    if ((${#name} > 15)); then
        name="iwp$((($$ % 100000)))t${n}"
    fi
    printf -v "$__var" '%s' "$name"
}

netns_subnet() {
    # Any value works (each namespace is private); derive it from the pid so
    # concurrent runs are easy to tell apart in captures.
    printf -v "$1" '%d' "$((($$ % 250) + 1))"
}

netns_bg() {
    local __var="$1" ns="$2"
    shift 2
    ip netns exec "$ns" "$@" &
    local pid=$!
    _NETNS_PIDS+=("$pid")
    printf -v "$__var" '%s' "$pid"
}

netns_on_exit() {
    _NETNS_HOOKS+=("$*")
}

netns_release() {
    local ns kept=()
    for ns in "${_NETNS_OWNED[@]}"; do
        [[ "$ns" == "$1" ]] || kept+=("$ns")
    done
    _NETNS_OWNED=("${kept[@]}")
}

netns_cleanup() {
    ((_NETNS_CLEANED)) && return 0
    _NETNS_CLEANED=1
    set +e
    local i pid ns
    for ((i = ${#_NETNS_HOOKS[@]} - 1; i >= 0; i--)); do
        eval "${_NETNS_HOOKS[$i]}" >/dev/null 2>&1
    done
    for pid in "${_NETNS_PIDS[@]}"; do
        kill "$pid" 2>/dev/null
    done
    for pid in "${_NETNS_PIDS[@]}"; do
        for _ in 1 2 3 4 5 6 7 8 9 10; do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.2
        done
        kill -9 "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    done
    for ns in "${_NETNS_OWNED[@]}"; do
        ip netns del "$ns" 2>/dev/null
    done
    _NETNS_OWNED=()
    return 0
}
