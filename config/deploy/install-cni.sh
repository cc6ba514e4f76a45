#!/bin/bash
# Install the npaudit CNI plugin on a node: a one-line wrapper in $CNI_BIN_DIR/npaudit that runs
# `npaudit cni` from a zipapp of the plugin's stdlib-only modules with the host's python3 (so the
# host needs no venv), and the conflist in $CNI_CONF_DIR. Idempotent: a file whose content is
# already right is left alone (same inode, same mtime), so kubelet sees no config change.
#
# Variables (defaults in brackets):
#   DESTDIR       prefix for every path written, for packaging and tests [""]
#   CNI_BIN_DIR   where runtimes look for plugins [/opt/cni/bin]
#   CNI_CONF_DIR  where runtimes read network configurations [/etc/cni/net.d]
#   NPAUDIT_DIR   where the zipapp goes on the host [/opt/npaudit]
#   HOST_PYTHON   python3 (3.11 or later) on the host that runs the zipapp [/usr/bin/python3]
#   PYTHON        python that has the npaudit package installed (finds and zips it) [python3]
#   CONFLIST      conflist to install [cni/10-npaudit.conflist next to this script]
set -euo pipefail

CNI_BIN_DIR=${CNI_BIN_DIR:-/opt/cni/bin}
CNI_CONF_DIR=${CNI_CONF_DIR:-/etc/cni/net.d}
NPAUDIT_DIR=${NPAUDIT_DIR:-/opt/npaudit}
HOST_PYTHON=${HOST_PYTHON:-/usr/bin/python3}
PYTHON=${PYTHON:-python3}
CONFLIST=${CONFLIST:-$(dirname "$(readlink -f "$0")")/cni/10-npaudit.conflist}
DESTDIR=${DESTDIR:-}

# What `npaudit cni` imports (tests/unit/policy_agent/test_rpc.py holds the plugin to this list).
MODULES="__init__.py cli/__init__.py cli/main.py errors.py rpc.py cni/__init__.py cni/plugin.py cni/wire.py"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# put SRC DEST MODE: replace DEST (atomically) only when its content differs.
put() {
    if [ -f "$2" ] && cmp -s "$1" "$2"; then
        echo "unchanged: $2"
        return
    fi
    mkdir -p "$(dirname "$2")"
    install -m "$3" "$1" "$2.npaudit-new"
    mv -f "$2.npaudit-new" "$2"
    echo "installed: $2"
}

# A zip of fixed timestamps and order: the same sources always give the same bytes.
"$PYTHON" - "$work/npaudit-cni.pyz" $MODULES <<'PY'
import pathlib, sys, zipfile
import policy_agent
pkg = pathlib.Path(policy_agent.__file__).parent
entries = {f"policy_agent/{m}": (pkg / m).read_bytes() for m in sys.argv[2:]}
entries["__main__.py"] = b"import sys\nfrom policy_agent.cli.main import main\nsys.exit(main())\n"
with zipfile.ZipFile(sys.argv[1], "w", zipfile.ZIP_DEFLATED) as z:
    for name in sorted(entries):
        z.writestr(zipfile.ZipInfo(name, date_time=(2000, 1, 1, 0, 0, 0)), entries[name], zipfile.ZIP_DEFLATED)
PY
printf '#!/bin/sh\nexec %s -I %s/npaudit-cni.pyz cni\n' "$HOST_PYTHON" "$NPAUDIT_DIR" > "$work/wrapper"

"$PYTHON" -c 'import json, sys; json.load(open(sys.argv[1]))' "$CONFLIST"
put "$work/npaudit-cni.pyz" "$DESTDIR$NPAUDIT_DIR/npaudit-cni.pyz" 0644
put "$work/wrapper" "$DESTDIR$CNI_BIN_DIR/npaudit" 0755
put "$CONFLIST" "$DESTDIR$CNI_CONF_DIR/10-npaudit.conflist" 0644
