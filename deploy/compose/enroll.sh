#!/bin/sh
# Compose's one-shot enrolment: `edgeplex admin site add` for every site in
# EDGEPLEX_SITES ("site=region ..."), writing each site's join token and broker
# credentials to /enroll/<site>.env (mode 0600), which that agent sources.
# A site already enrolled keeps its file.
set -eu
for item in $EDGEPLEX_SITES; do
    site=${item%%=*}
    region=${item#*=}
    [ -s "/enroll/$site.env" ] && continue
    tries=0
    until edgeplex admin --tls-ca /pki/ca.pem site add "$site" --region "$region" \
        --env-file "/enroll/$site.env" --mqtt-url "$EDGEPLEX_BROKER_URL"; do
        tries=$((tries + 1))
        [ "$tries" -lt 60 ] || exit 1
        sleep 2
    done
done
