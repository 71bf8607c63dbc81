#!/bin/sh
# One-shot, idempotent: the site admin (once), a bot user for vmd that is no admin (once),
# and an API token of the bot's for vmd (once). The admin's password stays here, in the
# provisioning step; vmd holds only the bot's token, which can do what the bot may: create
# the service's organisation (the bot then owns it: Gitea puts an organisation's creator in
# its Owners team), create repositories in it and push. A leaked vmd token is then one
# organisation's repositories, not the whole Gitea.
# Starts as root: the token's volume is new and root's, so root makes the token's folder
# the gitea user's; the gitea commands then run as that user (Gitea refuses root), against
# the data volume of the running gitea service.
set -eu
: "${GITEA_ADMIN_USER:?}" "${GITEA_ADMIN_PASSWORD:?}" "${GITEA_ADMIN_EMAIL:?}" "${GITEA_TOKEN_FILE:?}"
: "${GITEA_TOKEN_SCOPES:=write:repository,write:organization,read:user}"
: "${GITEA_BOT_USER:=vmd-bot}" "${GITEA_BOT_EMAIL:=vmd-bot@localhost}"
CONFIG=/data/gitea/conf/app.ini
GITEA_USER=${GITEA_USER:-git}
command -v su-exec >/dev/null || { echo "gitea-init: su-exec is missing from this gitea image; use the gitea/gitea image the compose file names" >&2; exit 1; }
as_gitea() { su-exec "$GITEA_USER" "$@"; }
gitea_cli() { as_gitea gitea --config "$CONFIG" --work-path /data/gitea "$@"; }

token_dir=$(dirname "$GITEA_TOKEN_FILE")
mkdir -p "$token_dir"
chown "$GITEA_USER" "$token_dir"
chmod 0700 "$token_dir"

if gitea_cli admin user list --admin | awk 'NR > 1 {print $2}' | grep -qx "$GITEA_ADMIN_USER"; then
    echo "gitea-init: admin $GITEA_ADMIN_USER exists"
else
    gitea_cli admin user create --admin --username "$GITEA_ADMIN_USER" \
        --password "$GITEA_ADMIN_PASSWORD" --email "$GITEA_ADMIN_EMAIL" --must-change-password=false
    echo "gitea-init: created admin $GITEA_ADMIN_USER"
fi

if gitea_cli admin user list | awk 'NR > 1 {print $2}' | grep -qx "$GITEA_BOT_USER"; then
    echo "gitea-init: bot $GITEA_BOT_USER exists"
else
    # No --admin; a random password nobody keeps (the bot signs in with its token only).
    gitea_cli admin user create --username "$GITEA_BOT_USER" --email "$GITEA_BOT_EMAIL" \
        --random-password --must-change-password=false >/dev/null
    echo "gitea-init: created the bot $GITEA_BOT_USER (not a site admin)"
fi

if [ -s "$GITEA_TOKEN_FILE" ]; then
    echo "gitea-init: token already written"
    exit 0
fi
# The scopes vmd uses and `vmd doctor` checks: read:user (who it is), write:repository
# (create and push), write:organization (the service's organisation for people's
# projects), all of them as the bot. GITEA_CREATE_USERS needs a site admin's token, which
# this setup does not hand vmd.
as_gitea sh -c 'umask 077; gitea --config "$1" --work-path /data/gitea admin user generate-access-token \
    --username "$2" --token-name "vmd-$(date +%s)" --scopes "$3" --raw > "$4.tmp" && mv "$4.tmp" "$4"' \
    sh "$CONFIG" "$GITEA_BOT_USER" "$GITEA_TOKEN_SCOPES" "$GITEA_TOKEN_FILE"
echo "gitea-init: token of $GITEA_BOT_USER written for vmd (scopes $GITEA_TOKEN_SCOPES)"
