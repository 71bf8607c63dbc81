#!/bin/sh
# One-shot: create the admin user (once) and an API token for vmd (once), idempotently.
# Runs as the gitea user against the data volume of the running gitea service.
set -eu
: "${GITEA_ADMIN_USER:?}" "${GITEA_ADMIN_PASSWORD:?}" "${GITEA_ADMIN_EMAIL:?}" "${GITEA_TOKEN_FILE:?}"
CONFIG=/data/gitea/conf/app.ini
gitea_cli() { gitea --config "$CONFIG" --work-path /data/gitea "$@"; }

if gitea_cli admin user list --admin | awk 'NR > 1 {print $2}' | grep -qx "$GITEA_ADMIN_USER"; then
    echo "gitea-init: admin $GITEA_ADMIN_USER exists"
else
    gitea_cli admin user create --admin --username "$GITEA_ADMIN_USER" \
        --password "$GITEA_ADMIN_PASSWORD" --email "$GITEA_ADMIN_EMAIL" --must-change-password=false
    echo "gitea-init: created admin $GITEA_ADMIN_USER"
fi

if [ -s "$GITEA_TOKEN_FILE" ]; then
    echo "gitea-init: token already written"
    exit 0
fi
umask 077
gitea_cli admin user generate-access-token --username "$GITEA_ADMIN_USER" \
    --token-name "vmd-$(date +%s)" --scopes all --raw > "$GITEA_TOKEN_FILE.tmp"
mv "$GITEA_TOKEN_FILE.tmp" "$GITEA_TOKEN_FILE"
echo "gitea-init: token written for vmd"
